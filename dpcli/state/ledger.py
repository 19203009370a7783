"""Per-analyst privacy-budget ledgers: lock → read and verify once → check → debit (durable) → unlock.

A ledger is JSON Lines (a header, then one appended line per charge) under a keyed HMAC chain,
with a sealed high-water mark that also carries the running totals, so a charge costs the same
at entry 10 and entry 10,000. Identical releases are free replays; streams and schedules debit a
reservation once and record each run as a step. Format, seal, crash safety and what is (not)
detected: ``docs/ledger.md``.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from dpcli.core import budget as bud
from dpcli.core.accountants import Accountant, accountant_for
from dpcli.core.exact import fraction_text, to_fraction
from dpcli.core.events import PrivacyEvent
from dpcli.errors import BudgetError, StateError, UsageError
from dpcli.state.atomic import atomic_write_bytes
from dpcli.state.ledger_format import (
    _append_at,
    _current_mac_key,
    dump_document,
    _ENTRY_DOMAIN,
    _GENESIS_DOMAIN,
    _HEADER_FIELDS,
    _hwm_path,
    _iso,
    load_document,
    _mac,
    _mac_keys,
    _mark_mac,
    _now,
    _parse_time,
    _READABLE_VERSIONS,
    _same,
    SCHEMA_VERSION,
    _seal,
    _sealed_lines,
    _seed_tag,
    step_digest,
    _v1_entry_hash,
    _V1_GENESIS,
)
from dpcli.state.lock import exclusive_lock
from dpcli.state.paths import ensure_state_dir, ledger_path, lock_path


@dataclass(frozen=True)
class Reservation:
    """A stream's or schedule's whole budget, debited once when its first run is recorded.

    ``id`` is random per creation (so a re-created schedule never matches an
    old reservation), ``key`` says what is reserved (a schedule's key, a
    stream's query id), and ``ledger_id`` is the id of the ledger the state
    file was created for (a state copied elsewhere is refused).
    """

    id: str
    kind: str
    key: str
    ledger_id: str
    events: tuple[PrivacyEvent, ...]
    command: str
    summary: str = ""


@dataclass(frozen=True)
class Step:
    """One run against a state file: the state was at ``start`` recorded runs; its input digest.

    ``create`` (only with ``start == 0``) is the reservation to debit first if
    the ledger does not hold it yet. ``label`` names the state in messages.
    """

    reservation: str
    start: int
    digest: str
    label: str
    create: Reservation | None = None


@dataclass(frozen=True)
class _Tail:
    """Where a verified ledger file ends, for appending to it: its schema, complete length, and key."""

    version: int
    size: int  # bytes up to the last complete line (a torn append after it is cut off by the next write)
    current_key: bool  # sealed with the current key (else the next write reseals the whole file)


@dataclass(frozen=True)
class Ledger:
    """A parsed, verified ledger."""

    path: Path
    analyst: str
    ledger_id: str
    limits: bud.Limits
    created: datetime
    refresh_days: int | None
    report_delta: float
    entries: tuple[dict[str, Any], ...]
    genesis: str = field(default="", repr=False, compare=False)
    header: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    tail: _Tail | None = field(default=None, repr=False, compare=False)

    @property
    def accountant(self) -> Accountant:
        """The accountant of this ledger's mode and limits."""
        return accountant_for(self.limits)

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
        return self.accountant.spend(events)

    def guarantee(self, when: datetime | None = None) -> tuple[float, float]:
        return self.accountant.guarantee(self.spend(when), self.report_delta)

    def reservation(self, rid: str) -> dict[str, Any] | None:
        """The entry that created reservation ``rid``, if any."""
        return next((e for e in self.entries if (e.get("reservation") or {}).get("id") == rid), None)

    def find_reservation(self, kind: str, key: str, when: datetime | None = None) -> int | None:
        """The entry number of a reservation of ``kind`` for ``key`` in the current period, if any."""
        p = self.period(when or _now())
        return next((e["seq"] for e in self.entries if e.get("period", 0) == p
                     and (e.get("reservation") or {}).get("kind") == kind and e["reservation"].get("key") == key), None)

    def steps(self, reservation_seq: int) -> list[dict[str, Any]]:
        """The recorded (non-repeat) steps of a reservation, in order: element i started at step i."""
        return [e for e in self.entries
                if e.get("covered_by") == reservation_seq and "step" in e and not e.get("replay_of")]


@dataclass(frozen=True)
class Receipt:
    """What :func:`charge` did."""

    analyst: str
    replay: bool
    seq: int
    spent: bud.Spend
    guarantee: tuple[float, float]
    limits: bud.Limits
    remaining: dict[str, str] = field(default_factory=dict)
    reserved: tuple[PrivacyEvent, ...] = ()  # a reservation debited by this call (a stream's or schedule's first run)
    covered_by: int | None = None  # the reservation entry that paid for this release

    def to_json(self) -> dict[str, Any]:
        return {
            "analyst": self.analyst,
            "replay": self.replay,
            "entry": self.seq,
            "mode": self.limits.mode,
            "limits": self.limits.to_json(),
            "spent": accountant_for(self.limits).spent_json(self.spent),
            "guarantee": {"epsilon": self.guarantee[0], "delta": self.guarantee[1]},
        }


class _MarkError(StateError):
    """The high-water mark does not vouch for the ledger file; ``reason`` is a short public phrase."""

    def __init__(self, message: str, reason: str, entries_missing: bool = False, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.reason = reason
        #: The sealed mark proves entries are missing: a reseal would hand back what they spent.
        self.entries_missing = entries_missing


def _read(path: Path, analyst: str) -> tuple[bytes, int]:
    """The ledger's bytes and the ctime of the very file read."""
    try:
        with open(path, "rb") as fh:
            return fh.read(), os.fstat(fh.fileno()).st_ctime_ns
    except FileNotFoundError:
        raise BudgetError(f"analyst {analyst!r} has no budget ledger",
                          fix=f"create one with: dpcli budget init {analyst} --mode ...") from None
    except OSError:
        raise StateError(f"cannot read ledger {path}") from None


def _fields(path: Path, data: dict[str, Any]) -> tuple[bud.Limits, datetime, int | None, float, str, list[Any]]:
    try:
        limits = bud.Limits.from_json(data["limits"])
        created = _parse_time(data["created"])
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


def _check_events(path: Path, entries: list[Any]) -> None:
    for i, entry in enumerate(entries, start=1):
        try:
            for ev in entry["events"]:
                PrivacyEvent.from_json(ev)
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"ledger {path} entry {i} has an invalid event ({type(exc).__name__})") from None


def _verify_chain(path: Path, entries: list[Any], genesis: str, digest: Any) -> None:
    prev = genesis
    for i, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or entry.get("seq") != i or entry.get("prev") != prev:
            raise StateError(f"ledger {path} fails verification at entry {i} (edited, deleted or reordered entries)")
        if not _same(digest(entry), entry.get("hash")):
            raise StateError(f"ledger {path} fails verification at entry {i} (entry was modified)")
        prev = entry["hash"]


def _parse(path: Path, raw: bytes, ctime_ns: int, analyst: str, root: Path, check_mark: bool = True) -> Ledger:
    """Parse and verify a schema-2 ledger: header seal, entry chain, then (optionally) its high-water mark."""
    data, complete = load_document(path, raw)
    version = data["schema_version"]
    if version == 1:
        raise StateError(f"ledger {path} has schema_version 1 (no keyed seal)",
                         fix=f"check it, then upgrade it once with: dpcli budget verify {analyst} --reseal")
    if version not in _READABLE_VERSIONS:
        raise StateError(f"ledger {path} has schema_version {version!r}; this dpcli reads {SCHEMA_VERSION}: upgrade dpcli")
    limits, created, refresh, report_delta, owner, entries = _fields(path, data)
    if owner != analyst:
        raise StateError(f"ledger {path} belongs to analyst {owner!r}, not {analyst!r} (renamed or copied?)")
    header = {f: data.get(f) for f in _HEADER_FIELDS}
    if not isinstance(header["ledger_id"], str):
        raise StateError(f"ledger {path} is corrupt (no ledger_id)")
    key = next((k for k in _mac_keys(root) if _same(_mac(k, _GENESIS_DOMAIN, header), data.get("genesis"))), None)
    if key is None:
        raise StateError(
            f"ledger {path} fails verification of its header (edited, or sealed with another secret key: "
            "copied from another state directory?)"
        )
    _verify_chain(path, entries, data["genesis"], lambda e: _mac(key, _ENTRY_DOMAIN, {k: v for k, v in e.items() if k != "hash"}))
    _check_events(path, entries)
    led = Ledger(path, owner, header["ledger_id"], limits, created, refresh, report_delta, tuple(entries),
                 data["genesis"], header, _Tail(version, complete, key == _current_mac_key(root)))
    if check_mark:
        led = _check_mark(led, ctime_ns, root, raw)
    return led


def _check_mark(led: Ledger, ctime_ns: int, root: Path, raw: bytes) -> Ledger:
    """The high-water mark must be sealed, of this ledger, not ahead of it, and name this very file.

    The ledger may be one write ahead of its mark (a crash between the two
    writes; one write's entries share their time); the file-identity check
    then has nothing to compare with. A mark announcing a pending append
    (a charge that crashed while appending) completes it: see :func:`_with_pending`.
    Returns the ledger, completed if so.
    """
    hwm = _hwm_path(led.path)
    fix = f"restore the newest copy, or accept this one with: dpcli budget verify {led.analyst} --reseal"
    restore = "restore the newest copy"
    try:
        mark = json.loads(hwm.read_bytes())
        body = {k: v for k, v in mark.items() if k != "mac"}
        count, ctime = int(body["count"]), int(body["ctime_ns"])
        if not {"ledger_id", "hash"} <= body.keys():
            raise KeyError("ledger_id")
        sealed = mark["mac"]
        if count < 0:
            raise ValueError("count")
    except FileNotFoundError:
        raise _MarkError(f"high-water mark {hwm} is missing, so a rollback cannot be ruled out",
                         "high-water mark missing", fix=fix) from None
    except (OSError, ValueError, KeyError, TypeError):
        raise _MarkError(f"high-water mark {hwm} is corrupt", "high-water mark unreadable", fix=fix) from None
    if not any(_same(_mark_mac(k, body), sealed) for k in _mac_keys(root)):
        raise _MarkError(f"high-water mark {hwm} fails verification (edited, or from another state directory)",
                         "high-water mark unverifiable", fix=fix)
    if body["ledger_id"] != led.ledger_id:
        raise _MarkError(f"high-water mark {hwm} belongs to another ledger (ledger replaced?)",
                         "high-water mark of another ledger", fix=fix)
    if body.get("pending") is not None:
        return _with_pending(led, raw, body, fix)
    n = len(led.entries)
    if count > n or (led.entries[count - 1]["hash"] if count else led.genesis) != body["hash"]:
        raise _MarkError(
            f"ledger {led.path} is older than its high-water mark ({n} entries, {count} recorded): "
            "it was rolled back or replaced",
            f"ledger older than its high-water mark ({n} entries, {count} recorded)",
            entries_missing=True,
            fix=f"{restore} (a reseal is refused: it would hand back the budget of the missing entries)",
        )
    if len({e.get("time") for e in led.entries[count:]}) > 1:  # more than one write ahead of the mark
        raise _MarkError(f"high-water mark {hwm} is older than its ledger (restored from a backup?)",
                         "high-water mark older than the ledger", fix=fix)
    if count == n and ctime != ctime_ns:
        raise _MarkError(
            f"ledger {led.path} was replaced since dpcli wrote it (restored, copied or moved?)",
            "ledger file replaced (restored, copied or moved)",
            fix="if it is a restored backup, restore the newest copy instead (releases after the backup are missing "
                "from it); if it was only copied or moved as is, accept it with: "
                f"dpcli budget verify {led.analyst} --reseal",
        )
    return led


def _with_pending(led: Ledger, raw: bytes, body: dict[str, Any], fix: str) -> Ledger:
    """Complete a charge that crashed while appending, from the lines its sealed mark announced.

    A charge first seals the lines it will append into the mark (with the ledger's size and ctime
    before them), then appends, then writes the final mark. After a crash in between, the file is its
    old self plus a prefix (possibly empty or torn) of those lines: it is read as if the append had
    finished (counting a charge whose release was never output is safe; dropping one is not), and the
    next charge rewrites it whole. Anything else is refused like any other mismatch.
    """
    size, count = int(body["size"]), int(body["count"])
    lines = str(body["pending"]["lines"]).encode("ascii")
    old = led.entries[:count]
    intact = len(old) == count and (old[-1]["hash"] if count else led.genesis) == body["hash"]
    if not intact or len(raw) < size or not lines.startswith(raw[size:]):
        raise _MarkError(f"ledger {led.path} does not match its high-water mark (restored or edited?)",
                         "ledger does not match the pending charge of its high-water mark", fix=fix)
    # No ctime check here: a write killed before its first byte lands may already have moved the
    # ctime (the kernel stamps it before copying data). The bytes are exactly those the sealed mark
    # vouches for, so nothing the ledger recorded is missing.
    new = tuple(json.loads(line) for line in lines.split(b"\n")[:-1])
    return Ledger(led.path, led.analyst, led.ledger_id, led.limits, led.created, led.refresh_days, led.report_delta,
                  (*old, *new), led.genesis, led.header, None)


def _write(root: Path, path: Path, doc: dict[str, Any], when: datetime | None = None) -> None:
    """Seal ``doc`` with the current key, replace the whole ledger file, then its high-water mark (both atomic).

    For a new ledger, a reseal, a schema upgrade or a key rotation; a charge appends (:func:`_append`).
    """
    key = _current_mac_key(root)
    doc["schema_version"] = SCHEMA_VERSION  # a schema-2 document is upgraded by this write
    _seal(doc, key)
    data = dump_document(doc)
    atomic_write_bytes(path, data, mode=0o600)
    led = _ledger_of(path, doc)
    _write_mark(root, led, _Cache.of(led, when or _now()), len(data))


def _ledger_of(path: Path, doc: dict[str, Any]) -> Ledger:
    """The Ledger of a sealed document (already verified, or just written by us)."""
    header = {f: doc.get(f) for f in _HEADER_FIELDS}
    return Ledger(path, doc["analyst"], doc["ledger_id"], bud.Limits.from_json(doc["limits"]), _parse_time(doc["created"]),
                  doc["refresh_days"], doc["report_delta"], tuple(doc["entries"]), doc["genesis"], header)


@dataclass(frozen=True)
class _Cache:
    """The running totals a charge needs, kept in the sealed high-water mark so a charge is O(1) in ledger length.

    ``spent`` is the composed spend of the entries of refresh period ``period``; ``seeds`` lists each of
    its charged (non-replay) entries as `` <tag>:<seq>`` (tag: 128 bits of SHA-256 of the seed id), for
    free replays: a plain ASCII blob is searched and sealed far faster than a 10,000-key mapping is
    parsed, sorted and encoded. It is trusted only while the ledger file is the one the mark was
    written for (same size and ctime); otherwise a charge re-reads and re-verifies the whole ledger
    and recomputes it.
    """

    period: int
    spent: bud.Spend
    seeds: str
    count: int
    head: str

    @classmethod
    def of(cls, led: Ledger, when: datetime) -> _Cache:
        head = led.entries[-1]["hash"] if led.entries else led.genesis
        cache = cls(led.period(when), led.spend(when), "", len(led.entries), head)
        return replace(cache, seeds=cache.with_seeds(led.current_entries(when)))

    def replay_of(self, seed_id: str) -> int | None:
        """The entry that first charged ``seed_id`` in this period, if any."""
        needle = f" {_seed_tag(seed_id)}:"
        at = self.seeds.find(needle)
        if at < 0:
            return None
        start = at + len(needle)
        end = self.seeds.find(" ", start)
        return int(self.seeds[start : end if end >= 0 else len(self.seeds)])

    def with_seeds(self, entries: Iterable[dict[str, Any]]) -> str:
        """The seeds blob with those of ``entries`` (charged, not yet listed) added."""
        blob, entries = self.seeds, list(entries)
        known = {part.split(":")[0] for part in blob.split()} if len(entries) > 4 else None
        for e in entries:
            tag = _seed_tag(e["seed_id"])
            if e.get("replay_of") or (tag in known if known is not None else f" {tag}:" in blob):
                continue
            blob += f" {tag}:{e['seq']}"
            if known is not None:
                known.add(tag)
        return blob

    def to_json(self) -> dict[str, Any]:
        s = self.spent
        spent = {"epsilon": fraction_text(s.epsilon), "delta": fraction_text(s.delta), "rho": fraction_text(s.rho),
                 "units": s.units, "calls": s.calls, "rdp_curve": list(s.rdp_curve)}
        return {"period": self.period, "spent": spent, "seeds": self.seeds}

    @classmethod
    def from_mark(cls, mark: dict[str, Any]) -> _Cache:
        c, s = mark["cache"], mark["cache"]["spent"]
        spent = bud.Spend(to_fraction(s["epsilon"]), to_fraction(s["delta"]), to_fraction(s["rho"]), int(s["units"]),
                          int(s["calls"]), tuple(float(x) for x in s["rdp_curve"]))
        return cls(int(c["period"]), spent, str(c["seeds"]), int(mark["count"]), str(mark["hash"]))


def _write_mark(root: Path, led: Ledger, cache: _Cache, size: int, pending: bytes | None = None) -> None:
    """Seal and atomically write the high-water mark for the ledger file as it is now.

    ``pending``: the lines about to be appended (the intent mark of :func:`_record`).
    """
    body: dict[str, Any] = {"ledger_id": led.ledger_id, "count": cache.count, "hash": cache.head,
                            "ctime_ns": os.stat(led.path).st_ctime_ns, "size": size, "cache": cache.to_json()}
    if pending is not None:
        body["pending"] = {"lines": pending.decode("ascii")}
    mark = {**body, "mac": _mark_mac(_current_mac_key(root), body)}
    atomic_write_bytes(_hwm_path(led.path), json.dumps(mark).encode(), mode=0o600)


def _doc(led: Ledger, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {**led.header, "genesis": None, "entries": [dict(e) for e in entries]}


def _load(root: Path, analyst: str) -> Ledger:
    path = ledger_path(root, analyst)
    raw, ctime = _read(path, analyst)
    return _parse(path, raw, ctime, analyst, root)


def read_ledger(root: Path, analyst: str, lock_timeout: float = 30.0) -> Ledger:
    """Load and verify an analyst's ledger (briefly under its lock, so ledger and mark are read as a pair)."""
    path = ledger_path(root, analyst)
    if not path.exists():
        _read(path, analyst)  # the "no budget ledger" error
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        return _load(root, analyst)


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
        if path.exists() or _hwm_path(path).exists():
            raise UsageError(
                f"analyst {analyst!r} already has a ledger ({path}); budgets cannot be reset: use another analyst name"
            )
        doc = {
            "schema_version": SCHEMA_VERSION,
            "analyst": analyst,
            "ledger_id": secrets.token_hex(16),
            "created": _iso(_now()),
            "limits": limits.to_json(),
            "refresh_days": refresh_days,
            "report_delta": report_delta,
            "genesis": None,
            "entries": [],
        }
        _write(root, path, doc)
        return _load(root, analyst)


def _fits(led: Ledger, analyst: str, spent: bud.Spend, reserve: list[PrivacyEvent], actual: list[PrivacyEvent]) -> None:
    """Refuse (BudgetError) unless the reserve fits what is left; the actual cost must not exceed it."""
    mode = led.limits.mode
    try:
        need = led.accountant.spend(reserve)
        actual_spend = led.accountant.spend(actual)
    except bud.ChargeRefused as exc:
        raise BudgetError(f"analyst {analyst!r} ({mode} ledger): {exc}") from None
    short = led.accountant.fits(spent, need)
    if short is not None:
        raise BudgetError(f"budget refused for analyst {analyst!r}: {short} (see: dpcli budget show {analyst})")
    if led.accountant.fits(spent, actual_spend) is not None:
        raise BudgetError("internal: actual cost exceeds the reserved cost")


def check_payable(led: Ledger, events: list[PrivacyEvent]) -> None:
    """Refuse (BudgetError, exit 77) events this ledger's mode can never pay (δ in a pure ledger).

    Called before any data is read. Running out of budget is checked only when charging: the
    same release may be a free replay, which only the data's fingerprint can tell.
    """
    try:
        led.accountant.spend(events)
    except bud.ChargeRefused as exc:
        raise BudgetError(f"analyst {led.analyst!r} ({led.limits.mode} ledger): {exc}") from None


def refusal(led: Ledger, events: list[PrivacyEvent], when: datetime | None = None) -> str | None:
    """Why ``led`` would refuse a new release costing ``events`` now, or None if it would accept it.

    Reads only (``--dry-run``): a replay of an earlier identical release would be free anyway.
    """
    try:
        _fits(led, led.analyst, led.spend(when), events, events)
    except BudgetError as exc:
        return str(exc)
    return None


def _step_entries(
    led: Ledger, analyst: str, step: Step, base: dict[str, Any], now: datetime, spent: bud.Spend
) -> tuple[list[dict[str, Any]], tuple[PrivacyEvent, ...], int | None, int]:
    """The entries recording ``step`` (a new reservation first, if needed): (entries, reserved, replay_of, covered_by)."""
    n = len(led.entries)
    period = led.period(now)
    new: list[dict[str, Any]] = []
    reserved: tuple[PrivacyEvent, ...] = ()
    created = led.reservation(step.reservation)
    if created is None:
        c = step.create
        if c is None or step.start != 0:
            raise StateError(
                f"{step.label}: its reservation is not in analyst {analyst!r}'s ledger (state copied from another "
                "analyst or state directory, or the ledger restored from an older backup)"
            )
        if c.ledger_id != led.ledger_id:
            raise StateError(f"{step.label} was created for another ledger (copied from another analyst or state directory)")
        clash = led.find_reservation(c.kind, c.key, now) if c.kind == "schedule" else None
        if clash is not None:
            raise StateError(
                f"{step.label} already has reservation #{clash} in this ledger but not this state "
                "(state deleted or replaced?): restore its state file, or use a new --schedule name"
            )
        _fits(led, analyst, spent, list(c.events), list(c.events))
        reserved = c.events
        new.append({"seq": n + 1, "time": base["time"], "period": period, "command": c.command,
                    "query_id": f"{c.kind}:{c.key}", "seed_id": f"{c.kind}:{c.id}",
                    "events": [ev.to_json() for ev in c.events],
                    "reservation": {"id": c.id, "kind": c.kind, "key": c.key},
                    **({"summary": c.summary} if c.summary else {})})
        res_seq, res_period, steps = n + 1, period, []
    else:
        res_seq, res_period, steps = created["seq"], created.get("period", 0), led.steps(created["seq"])
    if any(s["step"].get("from") != i for i, s in enumerate(steps)):
        raise StateError(f"ledger {led.path}: the steps of reservation #{res_seq} are out of order")
    record = {"from": step.start, "input": step.digest}
    entry = {**base, "seq": n + len(new) + 1, "covered_by": res_seq, "step": record}
    replay_of = None
    if step.start == len(steps):
        if res_period != period:
            raise BudgetError(f"analyst {analyst!r}: the reservation of {step.label} is not in this ledger period")
    elif step.start < len(steps):
        earlier = steps[step.start]
        if not _same(earlier["step"].get("input"), step.digest):
            raise StateError(
                f"{step.label} is behind the ledger (at run {step.start} of {len(steps)}) and its input differs from "
                f"the one recorded for run {step.start + 1}: it is an older or copied state; use the newest copy"
            )
        replay_of = entry["replay_of"] = earlier["seq"]
    else:
        raise StateError(
            f"{step.label} is ahead of the ledger (run {step.start}, ledger has {len(steps)}): "
            "the ledger was restored from an older backup, or the state belongs to another ledger"
        )
    return [*new, entry], reserved, replay_of, res_seq


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
    step: Step | None = None,
    output: str | None = None,
) -> Receipt:
    """Debit a release durably, before its output is written (the ledger is read and verified once).

    ``reserve`` is the largest cost the query can have, decided without looking
    at the data (so a refusal reveals nothing); ``actual`` (≤ reserve, default
    the same) is what the release really cost, e.g. UnkGumb's 2|o| + 1 - 1{⊥}.
    Under the lock: a seed already charged this period is a free replay;
    otherwise the reserve must fit the remaining budget and the actual cost is
    appended and fsynced. Raises :class:`BudgetError` when it does not fit.

    ``step`` records a run against a stream's or schedule's state file instead
    (its cost is covered by the reservation; see docs/ledger.md): a new
    step, an exact repeat (free, ``replay``), or :class:`StateError` for a
    state that is older, forked, re-created or foreign. ``step.create``
    debits the reservation itself in the same write.

    ``output`` is the digest of the release file about to be written (``-o``): recorded in the entry,
    so ``dpcli plot`` can tell a release dpcli wrote from any other file.
    """
    actual = reserve if actual is None else actual
    ensure_state_dir(root)
    when = now or _now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        led, cache = _open_for_charge(root, analyst, when, entries_needed=step is not None)
        base: dict[str, Any] = {"seq": 0, "time": _iso(when), "period": cache.period, "command": command,
                                "query_id": query_id, "seed_id": seed_id, "events": []}
        if summary:
            base["summary"] = summary
        if output:
            base["output"] = output
        reserved: tuple[PrivacyEvent, ...] = ()
        covered: int | None = None
        if step is not None:
            added, reserved, replay_of, covered = _step_entries(led, analyst, step, base, when, cache.spent)
        else:
            replay_of = cache.replay_of(seed_id)
            entry = {**base, "seq": cache.count + 1}
            if replay_of is None:
                _fits(led, analyst, cache.spent, reserve, actual)
                entry["events"] = [ev.to_json() for ev in actual]
            else:
                entry["replay_of"] = replay_of
            added = [entry]
        after = _record(root, led, cache, added)
    return Receipt(
        analyst=analyst,
        replay=replay_of is not None,
        seq=added[-1]["seq"],
        spent=after.spent,
        guarantee=led.accountant.guarantee(after.spent, led.report_delta),
        limits=led.limits,
        remaining=remaining_text(led, when, after.spent),
        reserved=reserved,
        covered_by=covered,
    )


def _open_for_charge(root: Path, analyst: str, when: datetime, entries_needed: bool) -> tuple[Ledger, _Cache]:
    """The ledger and its running totals for period ``when``: from the sealed mark if it vouches for the file
    as it is (O(1) in the number of entries), else by reading and verifying everything (O(n))."""
    if not entries_needed:
        fast = _from_mark(root, analyst, when)
        if fast is not None:
            return fast
    led = _load(root, analyst)
    return led, _Cache.of(led, when)


def _from_mark(root: Path, analyst: str, when: datetime) -> tuple[Ledger, _Cache] | None:
    """The header and cached totals without reading the entries, or None to take the full path.

    Trusted only if the mark is sealed with the current key, carries a cache, and names this very file
    (size and ctime as written; any other write, copy or restore changes the ctime) and a verified header.
    """
    path = ledger_path(root, analyst)
    key = _current_mac_key(root)
    try:
        mark = json.loads(_hwm_path(path).read_bytes())
        body = {k: v for k, v in mark.items() if k != "mac"}
        if "cache" not in body or "pending" in body or not _same(_mark_mac(key, body), mark.get("mac")):
            return None
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if (st.st_size, st.st_ctime_ns) != (body["size"], body["ctime_ns"]):
                return None
            head = json.loads(fh.readline())
        header = {f: head.get(f) for f in _HEADER_FIELDS}
        if (head.get("schema_version") != SCHEMA_VERSION or head.get("analyst") != analyst
                or header["ledger_id"] != body["ledger_id"]
                or not _same(_mac(key, _GENESIS_DOMAIN, header), head.get("genesis"))):
            return None
        led = Ledger(path, analyst, header["ledger_id"], bud.Limits.from_json(head["limits"]),
                     _parse_time(head["created"]), head["refresh_days"], float(head["report_delta"]), (),
                     head["genesis"], header, _Tail(SCHEMA_VERSION, st.st_size, True))
        cache = _Cache.from_mark(mark)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    period = led.period(when)
    if period < cache.period:  # the clock went back a period: recount from the entries
        return None
    if period > cache.period:  # a new refresh period: nothing spent in it yet
        cache = _Cache(period, led.accountant.spend([]), "", cache.count, cache.head)
    return led, cache


def _record(root: Path, led: Ledger, cache: _Cache, added: list[dict[str, Any]]) -> _Cache:
    """Write ``added`` durably (append, or rewrite a schema-2 or old-key file whole), then the mark; new totals."""
    new_events = [PrivacyEvent.from_json(ev) for e in added for ev in e["events"]]
    spent = led.accountant.spend(new_events, base=cache.spent)
    tail = led.tail
    if tail is None or tail.version != SCHEMA_VERSION or not tail.current_key:
        doc = _doc(led, [*led.entries, *added])
        _write(root, led.path, doc, _parse_time(added[-1]["time"]))
        return _Cache.of(_ledger_of(led.path, doc), _parse_time(added[-1]["time"]))
    lines = _sealed_lines(root, cache.head, added)
    _write_mark(root, led, cache, tail.size, pending=lines)  # intent first: a crash mid-append is completed
    size = _append_at(led.path, tail.size, lines)
    after = _Cache(cache.period, spent, cache.with_seeds(added), cache.count + len(added), added[-1]["hash"])
    _write_mark(root, led, after, size)
    return after


def check_recorded(root: Path, analyst: str, reservation: str, runs: int, digest: str | None, label: str,
                   lock_timeout: float = 30.0, current: bool = False) -> None:
    """Before handing back a state file's cached release of its run ``runs``: the ledger must record that run.

    ``digest``, if given, must be the input digest recorded for it. A state the
    ledger does not know (foreign, or ahead of a restored ledger) is refused.
    With ``current`` the run must also be the last one recorded: a state that answers
    from noise it holds (a schedule's open crossing test) must not be an older copy.
    """
    led = read_ledger(root, analyst, lock_timeout)
    created = led.reservation(reservation)
    steps = led.steps(created["seq"]) if created is not None else []
    if created is None or runs < 1 or len(steps) < runs:
        raise StateError(f"{label} is not recorded in analyst {analyst!r}'s ledger (state from another ledger, or "
                         "the ledger restored from an older backup)")
    if digest is not None and not _same(steps[runs - 1]["step"].get("input"), digest):
        raise StateError(f"{label} differs from the run the ledger recorded (an older or copied state)")
    if current and len(steps) != runs:
        raise StateError(f"{label} is an older copy of its state (the ledger recorded later runs): restore the newest "
                         "state file, or use a new --schedule name")


def _upgrade_v1(path: Path, data: dict[str, Any], analyst: str) -> tuple[dict[str, Any], str]:
    """A schema-1 ledger (unkeyed chain) as a schema-2 document, after checking what v1 could check."""
    _limits, _created, _refresh, _delta, owner, entries = _fields(path, data)
    if owner != analyst:
        raise StateError(f"ledger {path} belongs to analyst {owner!r}, not {analyst!r} (renamed or copied?)")
    _verify_chain(path, entries, data.get("genesis", _V1_GENESIS), _v1_entry_hash)
    _check_events(path, entries)
    reason = "upgraded from schema_version 1 (unkeyed)"
    try:
        mark = json.loads(_hwm_path(path).read_text())
        if int(mark["count"]) > len(entries):
            reason += f"; its high-water mark recorded {int(mark['count'])} entries, the ledger has {len(entries)}"
    except (OSError, ValueError, KeyError, TypeError):
        reason += "; no readable high-water mark"
    header = {**{f: data.get(f) for f in _HEADER_FIELDS}, "schema_version": SCHEMA_VERSION,
              "ledger_id": secrets.token_hex(16), "report_delta": float(data.get("report_delta", 1e-9))}
    entries = [{k: v for k, v in e.items() if k not in ("prev", "hash")} for e in entries]
    return {**header, "genesis": None, "entries": entries}, reason


def reseal(root: Path, analyst: str, lock_timeout: float = 30.0, now: datetime | None = None) -> tuple[Ledger, str | None]:
    """Accept the ledger file as it is now (after a deliberate move or restore, or to upgrade schema 1).

    The operator's decision, for what the seal cannot decide: the entries must
    still verify (edits are never accepted), only the high-water mark's
    objections are overridden, and an entry saying so is appended. Returns the
    ledger and the reason, or None when the ledger already verified fully.
    """
    path = ledger_path(root, analyst)
    when = now or _now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        raw, ctime = _read(path, analyst)
        data, _complete = load_document(path, raw)
        if data["schema_version"] == 1:
            doc, reason = _upgrade_v1(path, data, analyst)
        else:
            led = _parse(path, raw, ctime, analyst, root, check_mark=False)
            try:
                return _check_mark(led, ctime, root, raw), None
            except _MarkError as exc:
                if exc.entries_missing:
                    raise
                reason = exc.reason
            doc = _doc(led, list(led.entries))
        period = Ledger(path, analyst, doc["ledger_id"], bud.Limits.from_json(doc["limits"]),
                        _parse_time(doc["created"]), doc["refresh_days"], doc["report_delta"], ()).period(when)
        doc["entries"].append({"seq": len(doc["entries"]) + 1, "time": _iso(when), "period": period,
                               "command": "budget reseal", "query_id": "", "seed_id": f"reseal:{secrets.token_hex(8)}",
                               "events": [], "summary": f"the operator accepted the ledger file as it was: {reason}"})
        _write(root, path, doc)
        return _load(root, analyst), reason


def wrote(led: Ledger, digest: str) -> bool:
    """Did a release recorded in this ledger write a file with this digest (``-o``)?"""
    return any(e.get("output") == digest for e in led.entries)


def remaining_text(ledger: Ledger, when: datetime | None = None, spent: bud.Spend | None = None) -> dict[str, str]:
    """What is left of each limit, as exact text (RDP: the ε reached so far); ``spent``: if already computed."""
    return ledger.accountant.remaining(ledger.spend(when) if spent is None else spent)


__all__ = [
    "Ledger", "Receipt", "Reservation", "Step", "charge", "check_recorded", "init_ledger",
    "read_ledger", "remaining_text", "reseal", "step_digest", "wrote",
]
