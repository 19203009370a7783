"""Reading, verifying and writing a ledger document (JSON Lines under an HMAC chain), and creating one."""

from __future__ import annotations

import os
import secrets
from datetime import datetime
from pathlib import Path
from typing import Any

from dpcli.core.accounting import budget as bud
from dpcli.core.events import PrivacyEvent
from dpcli.errors import BudgetError, StateError, UsageError
from dpcli.state.atomic import atomic_write_bytes
from dpcli.state.ledger.format import (
    ENTRY_DOMAIN,
    GENESIS_DOMAIN,
    HEADER_FIELDS,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    current_mac_key,
    dump_document,
    hwm_path,
    iso_time,
    load_document,
    mac,
    mac_keys,
    parse_time,
    same_mac,
    seal,
    utc_now,
)
from dpcli.state.ledger.mark import MarkTotals, verify_mark, write_mark
from dpcli.state.ledger.model import Ledger, Tail, entry_cost
from dpcli.state.lock import exclusive_lock
from dpcli.state.paths import ensure_state_dir, existing_state_dir, ledger_path, lock_path


def read_ledger_bytes(path: Path, analyst: str) -> tuple[bytes, int]:
    """The ledger's bytes and the ctime of the very file read."""
    try:
        with open(path, "rb") as fh:
            return fh.read(), os.fstat(fh.fileno()).st_ctime_ns
    except FileNotFoundError:
        raise BudgetError(f"analyst {analyst!r} has no budget ledger",
                          fix=f"create one with: dpcli budget init {analyst} --mode ...") from None
    except OSError:
        raise StateError(f"cannot read ledger {path}") from None


def header_fields(path: Path, data: dict[str, Any]) -> tuple[bud.Limits, datetime, int | None, float, str, list[Any]]:
    try:
        limits = bud.Limits.from_json(data["limits"])
        created = parse_time(data["created"])
        refresh = data.get("refresh_days")
        if refresh is not None and (not isinstance(refresh, int) or refresh < 1):
            raise ValueError("refresh_days")
        report_delta = float(data.get("report_delta", 1e-9))
        analyst = data["analyst"]
        entries = data["entries"]
        if not isinstance(analyst, str) or not isinstance(entries, list):
            raise TypeError("analyst or entries")
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"ledger {path} is corrupt ({type(exc).__name__})") from None
    return limits, created, refresh, report_delta, analyst, entries


def check_events(path: Path, entries: list[Any]) -> None:
    """Every entry's events (and a pld ledger's recorded cost) must parse."""
    for i, entry in enumerate(entries, start=1):
        try:
            for ev in entry["events"]:
                PrivacyEvent.from_json(ev)
            if "cost" in entry:
                cost = entry_cost(entry)
                if cost is None or cost.epsilon < 0 or not 0 <= cost.delta < 1:
                    raise ValueError("cost")
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"ledger {path} entry {i} has an invalid event ({type(exc).__name__})") from None


def verify_chain(path: Path, entries: list[Any], genesis: str, digest: Any) -> None:
    prev = genesis
    for i, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or entry.get("seq") != i or entry.get("prev") != prev:
            raise StateError(f"ledger {path} fails verification at entry {i} (edited, deleted or reordered entries)")
        if not same_mac(digest(entry), entry.get("hash")):
            raise StateError(f"ledger {path} fails verification at entry {i} (entry was modified)")
        prev = entry["hash"]


def parse_ledger(path: Path, raw: bytes, ctime_ns: int, analyst: str, root: Path, check_mark: bool = True) -> Ledger:
    """Parse and verify a schema-2 ledger: header seal, entry chain, then (optionally) its high-water mark."""
    data, complete = load_document(path, raw)
    version = data["schema_version"]
    _check_version(path, version, analyst)
    limits, created, refresh, report_delta, owner, entries = header_fields(path, data)
    if owner != analyst:
        raise StateError(f"ledger {path} belongs to analyst {owner!r}, not {analyst!r} (renamed or copied?)")
    header = {f: data.get(f) for f in HEADER_FIELDS}
    if not isinstance(header["ledger_id"], str):
        raise StateError(f"ledger {path} is corrupt (no ledger_id)")
    key = _header_key(path, header, data.get("genesis"), root)
    verify_chain(path, entries, data["genesis"],
                 lambda e: mac(key, ENTRY_DOMAIN, {k: v for k, v in e.items() if k != "hash"}))
    check_events(path, entries)
    led = Ledger(path, owner, header["ledger_id"], limits, created, refresh, report_delta, tuple(entries),
                 data["genesis"], header, Tail(version, complete, key == current_mac_key(root)))
    if check_mark:
        led = verify_mark(led, ctime_ns, root, raw)
    return led


def _check_version(path: Path, version: Any, analyst: str) -> None:
    """A schema this dpcli reads (schema 1, unsealed, is upgraded by the operator's reseal)."""
    if version == 1:
        raise StateError(f"ledger {path} has schema_version 1 (no keyed seal)",
                         fix=f"check it, then upgrade it once with: dpcli budget verify {analyst} --reseal")
    if version not in READABLE_VERSIONS:
        raise StateError(f"ledger {path} has schema_version {version!r}; this dpcli reads {SCHEMA_VERSION}: upgrade "
                         "dpcli")


def _header_key(path: Path, header: dict[str, Any], genesis: Any, root: Path) -> bytes:
    """The key (current or retired) the header's seal ``genesis`` verifies with."""
    key = next((k for k in mac_keys(root) if same_mac(mac(k, GENESIS_DOMAIN, header), genesis)), None)
    if key is None:
        raise StateError(
            f"ledger {path} fails verification of its header (edited, or sealed with another secret key: "
            "copied from another state directory?)"
        )
    return key


def write_ledger(root: Path, path: Path, doc: dict[str, Any], when: datetime | None = None) -> None:
    """Seal ``doc`` with the current key, replace the whole ledger file, then its high-water mark (both atomic).

    For a new ledger, a reseal, a schema upgrade or a key rotation; a charge appends (:func:`_append`).
    """
    key = current_mac_key(root)
    doc["schema_version"] = SCHEMA_VERSION  # a schema-2 document is upgraded by this write
    seal(doc, key)
    data = dump_document(doc)
    atomic_write_bytes(path, data, mode=0o600)
    led = ledger_of(path, doc)
    write_mark(root, led, MarkTotals.of(led, when or utc_now()), len(data))


def ledger_of(path: Path, doc: dict[str, Any]) -> Ledger:
    """The Ledger of a sealed document (already verified, or just written by us)."""
    header = {f: doc.get(f) for f in HEADER_FIELDS}
    return Ledger(path, doc["analyst"], doc["ledger_id"], bud.Limits.from_json(doc["limits"]),
                  parse_time(doc["created"]), doc["refresh_days"], doc["report_delta"], tuple(doc["entries"]),
                  doc["genesis"], header)


def document_of(led: Ledger, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {**led.header, "genesis": None, "entries": [dict(e) for e in entries]}


def load_ledger(root: Path, analyst: str) -> Ledger:
    path = ledger_path(root, analyst)
    raw, ctime = read_ledger_bytes(path, analyst)
    return parse_ledger(path, raw, ctime, analyst, root)


def read_ledger(root: Path, analyst: str, lock_timeout: float = 30.0) -> Ledger:
    """Load and verify an analyst's ledger (briefly under its lock, so ledger and mark are read as a pair)."""
    path = ledger_path(root, analyst)
    if not path.exists():
        existing_state_dir(root)  # a state directory that does not exist is named as such (exit 78)
        read_ledger_bytes(path, analyst)  # the "no budget ledger" error
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        return load_ledger(root, analyst)


def init_ledger(
    root: Path,
    analyst: str,
    limits: bud.Limits,
    refresh_days: int | None = None,
    report_delta: float = 1e-9,
    lock_timeout: float = 30.0,
) -> Ledger:
    """Create a ledger. An existing ledger is never replaced (that would hand back budget)."""
    ensure_state_dir(root)
    path = ledger_path(root, analyst)
    if refresh_days is not None and refresh_days < 1:
        raise UsageError("must be ≥ 1", field="refresh_days")
    if not 0 < report_delta < 1:
        raise UsageError("must be in (0, 1)", field="report_delta")
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        if path.exists() or hwm_path(path).exists():
            raise UsageError(
                f"analyst {analyst!r} already has a ledger ({path}); budgets cannot be reset: use another analyst name"
            )
        doc = {
            "schema_version": SCHEMA_VERSION,
            "analyst": analyst,
            "ledger_id": secrets.token_hex(16),
            "created": iso_time(utc_now()),
            "limits": limits.to_json(),
            "refresh_days": refresh_days,
            "report_delta": report_delta,
            "genesis": None,
            "entries": [],
        }
        write_ledger(root, path, doc)
        return load_ledger(root, analyst)


def wrote(led: Ledger, digest: str) -> bool:
    """Did a release recorded in this ledger write a file with this digest (``-o``)?"""
    return any(e.get("output") == digest for e in led.entries)


def remaining_text(ledger: Ledger, when: datetime | None = None, spent: bud.Spend | None = None) -> dict[str, str]:
    """What is left of each limit, as exact text (RDP: the ε reached so far); ``spent``: if already computed."""
    return ledger.accountant.remaining(ledger.spend(when) if spent is None else spent)
