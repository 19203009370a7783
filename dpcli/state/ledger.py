"""Per-analyst privacy-budget ledgers: lock → read → check → debit (durable) → unlock.

A ledger is one JSON file with ``schema_version``, the analyst's accounting
mode and limits, an optional refresh period, and an append-only list of
entries. Each entry records when, which command, the query and seed ids, and
the privacy events charged; entries are hash-chained, and a high-water mark
(count and last hash, in a separate ``.hwm`` file) detects a rollback to an
older copy. Any inconsistency is an error: a ledger is never silently reset.

Replays: an entry whose seed id was already charged in the current period is
recorded with ``replay_of`` and charged nothing (identical noise on identical
data is post-processing of the earlier release).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dpcli.core import budget as bud
from dpcli.core.events import PrivacyEvent, fraction_text
from dpcli.errors import BudgetError, StateError, UsageError
from dpcli.state.atomic import atomic_write_bytes
from dpcli.state.lock import exclusive_lock
from dpcli.state.paths import ensure_state_dir, ledger_path, lock_path

SCHEMA_VERSION = 1
_GENESIS = "0" * 64


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _entry_hash(entry: dict[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Ledger:
    """A parsed, verified ledger."""

    path: Path
    analyst: str
    limits: bud.Limits
    created: datetime
    refresh_days: int | None
    report_delta: float
    entries: tuple[dict[str, Any], ...]

    def period(self, when: datetime) -> int:
        """Index of the refresh period containing ``when`` (always 0 without refresh)."""
        if not self.refresh_days:
            return 0
        days = (when - self.created).total_seconds() / 86400.0
        return max(0, math.floor(days / self.refresh_days))

    def current_entries(self, when: datetime | None = None) -> list[dict[str, Any]]:
        p = self.period(when or _now())
        return [e for e in self.entries if e.get("period", 0) == p]

    def spend(self, when: datetime | None = None) -> bud.Spend:
        events = [PrivacyEvent.from_json(ev) for e in self.current_entries(when) for ev in e["events"]]
        return bud.total_spend(self.limits.mode, events, self.limits)

    def guarantee(self, when: datetime | None = None) -> tuple[float, float]:
        return bud.guarantee(self.limits, self.spend(when), self.report_delta)


@dataclass(frozen=True)
class Receipt:
    """What :func:`charge` did."""

    analyst: str
    replay: bool
    seq: int
    spent: bud.Spend
    guarantee: tuple[float, float]
    limits: bud.Limits

    def to_json(self) -> dict[str, Any]:
        return {
            "analyst": self.analyst,
            "replay": self.replay,
            "entry": self.seq,
            "mode": self.limits.mode,
            "limits": self.limits.to_json(),
            "spent": self.spent.to_json(self.limits.mode),
            "guarantee": {"epsilon": self.guarantee[0], "delta": self.guarantee[1]},
        }


def _hwm_path(path: Path) -> Path:
    return path.with_suffix(".hwm")


def _parse(path: Path, raw: bytes) -> Ledger:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"ledger {path} is corrupt (not valid JSON: {exc.msg if hasattr(exc, 'msg') else exc})") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise StateError(f"ledger {path} is corrupt (no schema_version)")
    version = data["schema_version"]
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise StateError(f"ledger {path} has schema_version {version!r}; this dpcli reads ≤ {SCHEMA_VERSION}: upgrade dpcli")
    try:
        limits = bud.Limits.from_json(data["limits"])
        entries = data["entries"]
        created = _parse_time(data["created"])
        refresh = data.get("refresh_days")
        report_delta = float(data.get("report_delta", 1e-9))
        analyst = str(data["analyst"])
        if not isinstance(entries, list):
            raise TypeError("entries")
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"ledger {path} is corrupt ({exc})") from None
    prev = data.get("genesis", _GENESIS)
    for i, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or entry.get("seq") != i or entry.get("prev") != prev:
            raise StateError(f"ledger {path} fails verification at entry {i} (edited, deleted or reordered entries)")
        if _entry_hash(entry) != entry.get("hash"):
            raise StateError(f"ledger {path} fails verification at entry {i} (entry was modified)")
        try:
            for ev in entry["events"]:
                PrivacyEvent.from_json(ev)
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"ledger {path} entry {i} has an invalid event ({exc})") from None
        prev = entry["hash"]
    ledger = Ledger(path, analyst, limits, created, refresh, report_delta, tuple(entries))
    _check_high_water_mark(ledger)
    return ledger


def _check_high_water_mark(ledger: Ledger) -> None:
    hwm = _hwm_path(ledger.path)
    if not hwm.exists():
        return
    try:
        mark = json.loads(hwm.read_text())
        count, last = int(mark["count"]), str(mark["hash"])
    except (ValueError, KeyError, TypeError):
        raise StateError(f"high-water mark {hwm} is corrupt") from None
    if count > len(ledger.entries) or (count and ledger.entries[count - 1]["hash"] != last):
        raise StateError(
            f"ledger {ledger.path} is older than its high-water mark ({len(ledger.entries)} entries, "
            f"{count} recorded): it was rolled back or replaced"
        )


def _serialise(ledger_json: dict[str, Any]) -> bytes:
    return (json.dumps(ledger_json, indent=1, sort_keys=False) + "\n").encode()


def _write(path: Path, ledger_json: dict[str, Any]) -> None:
    atomic_write_bytes(path, _serialise(ledger_json), mode=0o600)
    entries = ledger_json["entries"]
    mark = {"count": len(entries), "hash": entries[-1]["hash"] if entries else _GENESIS}
    atomic_write_bytes(_hwm_path(path), json.dumps(mark).encode(), mode=0o600)


def read_ledger(root: Path, analyst: str) -> Ledger:
    """Load and verify an analyst's ledger (no lock needed: files are replaced atomically)."""
    path = ledger_path(root, analyst)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BudgetError(
            f"analyst {analyst!r} has no budget ledger; create one with: dpcli budget init {analyst} --mode ..."
        ) from None
    except OSError as exc:
        raise StateError(f"cannot read ledger {path}: {exc.strerror}") from None
    return _parse(path, raw)


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
        raise UsageError("--refresh-days must be ≥ 1")
    if not 0 < report_delta < 1:
        raise UsageError("--report-delta must be in (0, 1)")
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        if path.exists() or _hwm_path(path).exists():
            raise UsageError(
                f"analyst {analyst!r} already has a ledger ({path}); budgets cannot be reset: use another analyst name"
            )
        doc = {
            "schema_version": SCHEMA_VERSION,
            "analyst": analyst,
            "created": _iso(_now()),
            "limits": limits.to_json(),
            "refresh_days": refresh_days,
            "report_delta": report_delta,
            "genesis": _GENESIS,
            "entries": [],
        }
        _write(path, doc)
    return read_ledger(root, analyst)


def charge(
    root: Path,
    analyst: str,
    *,
    command: str,
    query_id: str,
    seed_id: str,
    reserve: list[PrivacyEvent],
    actual: list[PrivacyEvent] | None = None,
    summary: str = "",
    lock_timeout: float = 30.0,
    now: datetime | None = None,
    covered_by: str | None = None,
) -> Receipt:
    """Debit a release durably, before its output is written.

    ``reserve`` is the largest cost the query can have, decided without looking
    at the data (so a refusal reveals nothing); ``actual`` (≤ reserve, default
    the same) is what the release really cost, e.g. UnkGumb's 2|o| + 1 - 1{⊥}.
    Under the lock: a seed already charged this period is a free replay;
    otherwise the reserve must fit the remaining budget and the actual cost is
    appended and fsynced. Raises :class:`BudgetError` when it does not fit.

    ``covered_by`` names the seed id of an earlier entry that already paid for
    this release (a schedule's up-front reservation): the release is recorded
    with no cost of its own, and refused if that reservation is not in the
    current period.
    """
    actual = reserve if actual is None else actual
    path = ledger_path(root, analyst)
    ensure_state_dir(root)
    when = now or _now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        ledger = read_ledger(root, analyst)
        doc = json.loads(path.read_bytes())
        period = ledger.period(when)
        current = ledger.current_entries(when)
        replay_of = next(
            (e["seq"] for e in current if e["seed_id"] == seed_id and not e.get("replay_of")), None
        )
        mode = ledger.limits.mode
        spent = ledger.spend(when)
        events_json: list[dict[str, Any]] = []
        covered_seq = None
        if replay_of is None and covered_by is not None:
            covered_seq = next(
                (e["seq"] for e in current if e["seed_id"] == covered_by and e["events"]), None
            )
            if covered_seq is None:
                raise BudgetError(f"analyst {analyst!r}: the schedule's reservation is not in this ledger period")
        elif replay_of is None:
            try:
                need = bud.total_spend(mode, reserve, ledger.limits)
                actual_spend = bud.total_spend(mode, actual, ledger.limits)
            except bud.ChargeRefused as exc:
                raise BudgetError(f"analyst {analyst!r} ({mode} ledger): {exc}") from None
            short = bud.check_fits(ledger.limits, spent, need)
            if short is not None:
                raise BudgetError(
                    f"budget refused for analyst {analyst!r}: {short} (see: dpcli budget show {analyst})"
                )
            if bud.check_fits(ledger.limits, spent, actual_spend) is not None:
                raise BudgetError("internal: actual cost exceeds the reserved cost")
            events_json = [ev.to_json() for ev in actual]
        entries = doc["entries"]
        entry: dict[str, Any] = {
            "seq": len(entries) + 1,
            "time": _iso(when),
            "period": period,
            "command": command,
            "query_id": query_id,
            "seed_id": seed_id,
            "events": events_json,
        }
        if replay_of is not None:
            entry["replay_of"] = replay_of
        if covered_seq is not None:
            entry["covered_by"] = covered_seq
        if summary:
            entry["summary"] = summary
        entry["prev"] = entries[-1]["hash"] if entries else doc.get("genesis", _GENESIS)
        entry["hash"] = _entry_hash(entry)
        entries.append(entry)
        _write(path, doc)
        after = read_ledger(root, analyst)
    return Receipt(
        analyst=analyst,
        replay=replay_of is not None,
        seq=entry["seq"],
        spent=after.spend(when),
        guarantee=after.guarantee(when),
        limits=after.limits,
    )


def remaining_text(ledger: Ledger, when: datetime | None = None) -> dict[str, str]:
    """What is left of each limit, as exact text (RDP: the ε reached so far)."""
    s = ledger.spend(when)
    lim = ledger.limits
    mode = lim.mode
    if mode == "pure":
        return {"epsilon": fraction_text(lim["epsilon"] - s.epsilon)}
    if mode == "approx":
        return {"epsilon": fraction_text(lim["epsilon"] - s.epsilon), "delta": fraction_text(lim["delta"] - s.delta)}
    if mode == "zcdp":
        return {"rho": fraction_text(lim["rho"] - s.rho), "delta": fraction_text(lim["delta"] - s.delta)}
    if mode == "rdp":
        eps, _ = bud.guarantee(lim, s)
        return {"epsilon_reached": f"{eps:.6g}", "epsilon_limit": fraction_text(lim["epsilon"])}
    return {
        "info_units": str(int(lim["info_budget"]) - s.units),
        "calls": str(int(lim["call_budget"]) - s.calls),
    }


__all__ = ["Ledger", "Receipt", "charge", "init_ledger", "read_ledger", "remaining_text"]
