"""The sealed high-water mark: it vouches for the ledger file as dpcli last wrote it and carries the running
totals, so a charge is O(1) in ledger length (docs/ledger.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from dpcli.core.accounting import budget as bud
from dpcli.core.exact import fraction_text, to_fraction
from dpcli.errors import StateError
from dpcli.state.atomic import atomic_write_bytes
from dpcli.state.ledger.costs import latest_accounting
from dpcli.state.ledger.format import (
    GENESIS_DOMAIN,
    HEADER_FIELDS,
    SCHEMA_VERSION,
    current_mac_key,
    hwm_path,
    mac,
    mac_keys,
    mark_mac,
    parse_time,
    same_mac,
    seed_tag,
)
from dpcli.state.ledger.model import Ledger, Tail
from dpcli.state.ledger.series import OpenSeries, open_series
from dpcli.state.ledger.series import after as series_after
from dpcli.state.paths import ledger_path


class MarkError(StateError):
    """The high-water mark does not vouch for the ledger file; ``reason`` is a short public phrase."""

    def __init__(self, message: str, reason: str, entries_missing: bool = False, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.reason = reason
        #: The sealed mark proves entries are missing: a reseal would hand back what they spent.
        self.entries_missing = entries_missing


def verify_mark(led: Ledger, ctime_ns: int, root: Path, raw: bytes) -> Ledger:
    """The high-water mark must be sealed, of this ledger, not ahead of it, and name this very file.

    The ledger may be one write ahead of its mark (a crash between the two
    writes; one write's entries share their time); the file-identity check
    then has nothing to compare with. A mark announcing a pending append
    (a charge that crashed while appending) completes it: see :func:`_with_pending`.
    Returns the ledger, completed if so.
    """
    hwm = hwm_path(led.path)
    fix = f"restore the newest copy, or accept this one with: dpcli budget verify {led.analyst} --reseal"
    body, sealed, count, ctime = _read_mark(hwm, fix)
    if not any(same_mac(mark_mac(k, body), sealed) for k in mac_keys(root)):
        raise MarkError(f"high-water mark {hwm} fails verification (edited, or from another state directory)",
                         "high-water mark unverifiable", fix=fix)
    if body["ledger_id"] != led.ledger_id:
        raise MarkError(f"high-water mark {hwm} belongs to another ledger (ledger replaced?)",
                         "high-water mark of another ledger", fix=fix)
    if body.get("pending") is not None:
        return _with_pending(led, raw, body, fix)
    _check_position(led, hwm, body["hash"], count, fix)
    if count == len(led.entries) and ctime != ctime_ns:
        raise MarkError(
            f"ledger {led.path} was replaced since dpcli wrote it (restored, copied or moved?)",
            "ledger file replaced (restored, copied or moved)",
            fix="if it is a restored backup, restore the newest copy instead (releases after the backup are missing "
                "from it); if it was only copied or moved as is, accept it with: "
                f"dpcli budget verify {led.analyst} --reseal",
        )
    return led


def _read_mark(hwm: Path, fix: str) -> tuple[dict[str, Any], Any, int, int]:
    """The mark's body (without its seal), its seal, its entry count and the ledger's ctime it recorded."""
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
        raise MarkError(f"high-water mark {hwm} is missing, so a rollback cannot be ruled out",
                         "high-water mark missing", fix=fix) from None
    except (OSError, ValueError, KeyError, TypeError):
        raise MarkError(f"high-water mark {hwm} is corrupt", "high-water mark unreadable", fix=fix) from None
    return body, sealed, count, ctime


def _check_position(led: Ledger, hwm: Path, head: Any, count: int, fix: str) -> None:
    """The mark's entry ``count`` (with its ``head`` hash) must be in the ledger, and the ledger at most one
    write ahead of it."""
    restore = "restore the newest copy"
    n = len(led.entries)
    if count > n or (led.entries[count - 1]["hash"] if count else led.genesis) != head:
        raise MarkError(
            f"ledger {led.path} is older than its high-water mark ({n} entries, {count} recorded): "
            "it was rolled back or replaced",
            f"ledger older than its high-water mark ({n} entries, {count} recorded)",
            entries_missing=True,
            fix=f"{restore} (a reseal is refused: it would hand back the budget of the missing entries)",
        )
    if len({e.get("time") for e in led.entries[count:]}) > 1:  # more than one write ahead of the mark
        raise MarkError(f"high-water mark {hwm} is older than its ledger (restored from a backup?)",
                         "high-water mark older than the ledger", fix=fix)


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
        raise MarkError(f"ledger {led.path} does not match its high-water mark (restored or edited?)",
                         "ledger does not match the pending charge of its high-water mark", fix=fix)
    # No ctime check here: a write killed before its first byte lands may already have moved the
    # ctime (the kernel stamps it before copying data). The bytes are exactly those the sealed mark
    # vouches for, so nothing the ledger recorded is missing.
    new = tuple(json.loads(line) for line in lines.split(b"\n")[:-1])
    return Ledger(led.path, led.analyst, led.ledger_id, led.limits, led.created, led.refresh_days, led.report_delta,
                  (*old, *new), led.genesis, led.header, None)


@dataclass(frozen=True)
class MarkTotals:
    """The running totals a charge needs, kept in the sealed high-water mark so a charge is O(1) in ledger length.

    ``spent`` is the composed spend of the entries of refresh period ``period``; ``seeds`` lists each of
    its charged (non-replay) entries as `` <tag>:<seq>`` (tag: 128 bits of SHA-256 of the seed id), for
    free replays: a plain ASCII blob is searched and sealed far faster than a 10,000-key mapping is
    parsed, sorted and encoded. It is trusted only while the ledger file is the one the mark was
    written for (same size and ctime); otherwise a charge re-reads and re-verifies the whole ledger
    and recomputes it. A pld ledger's mark also carries the accounting of its latest costs (another
    installed accounting takes the full path, which recosts: :mod:`dpcli.state.ledger.costs`) and its
    open series (:mod:`dpcli.state.ledger.series`).
    """

    period: int
    spent: bud.Spend
    seeds: str
    count: int
    head: str
    accounting: str = ""
    series: tuple[OpenSeries, ...] = ()

    @classmethod
    def of(cls, led: Ledger, when: datetime) -> MarkTotals:
        head = led.entries[-1]["hash"] if led.entries else led.genesis
        cache = cls(led.period(when), led.spend(when), "", len(led.entries), head)
        if led.limits.mode == "pld":
            cache = replace(cache, accounting=latest_accounting(led.entries), series=open_series(led, when))
        return replace(cache, seeds=cache.with_seeds(led.current_entries(when)))

    def after(self, added: list[dict[str, Any]], spent: bud.Spend) -> MarkTotals:
        """The totals once ``added`` (sealed) are appended and ``spent`` is the new spend."""
        return MarkTotals(self.period, spent, self.with_seeds(added), self.count + len(added), added[-1]["hash"],
                          latest_accounting(added) or self.accounting, series_after(self.series, added))

    def replay_of(self, seed_id: str) -> int | None:
        """The entry that first charged ``seed_id`` in this period, if any."""
        needle = f" {seed_tag(seed_id)}:"
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
            tag = seed_tag(e["seed_id"])
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
        out: dict[str, Any] = {"period": self.period, "spent": spent, "seeds": self.seeds}
        if self.accounting:
            out["accounting"] = self.accounting
        if self.series:
            out["series"] = [one.to_json() for one in self.series]
        return out

    @classmethod
    def from_mark(cls, mark: dict[str, Any]) -> MarkTotals:
        c, s = mark["cache"], mark["cache"]["spent"]
        spent = bud.Spend(to_fraction(s["epsilon"]), to_fraction(s["delta"]), to_fraction(s["rho"]), int(s["units"]),
                          int(s["calls"]), tuple(float(x) for x in s["rdp_curve"]))
        return cls(int(c["period"]), spent, str(c["seeds"]), int(mark["count"]), str(mark["hash"]),
                   str(c.get("accounting", "")), tuple(OpenSeries.from_json(x) for x in c.get("series", [])))


def write_mark(root: Path, led: Ledger, cache: MarkTotals, size: int, pending: bytes | None = None) -> None:
    """Seal and atomically write the high-water mark for the ledger file as it is now.

    ``pending``: the lines about to be appended (the intent mark of :func:`_record`).
    """
    body: dict[str, Any] = {"ledger_id": led.ledger_id, "count": cache.count, "hash": cache.head,
                            "ctime_ns": os.stat(led.path).st_ctime_ns, "size": size, "cache": cache.to_json()}
    if pending is not None:
        body["pending"] = {"lines": pending.decode("ascii")}
    mark = {**body, "mac": mark_mac(current_mac_key(root), body)}
    atomic_write_bytes(hwm_path(led.path), json.dumps(mark).encode(), mode=0o600)


def from_mark(root: Path, analyst: str, when: datetime) -> tuple[Ledger, MarkTotals] | None:
    """The header and cached totals without reading the entries, or None to take the full path.

    Trusted only if the mark is sealed with the current key, carries a cache, and names this very file
    (size and ctime as written; any other write, copy or restore changes the ctime) and a verified header.
    """
    path = ledger_path(root, analyst)
    key = current_mac_key(root)
    try:
        trusted = _trusted_mark(path, key, analyst)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if trusted is None:
        return None
    led, cache = trusted
    period = led.period(when)
    if period < cache.period:  # the clock went back a period: recount from the entries
        return None
    if period > cache.period:  # a new refresh period: nothing spent in it yet
        cache = MarkTotals(period, led.accountant.spend([]), "", cache.count, cache.head)
    return led, cache


def _trusted_mark(path: Path, key: bytes, analyst: str) -> tuple[Ledger, MarkTotals] | None:
    """The ledger's header and the mark's totals, if the mark is sealed with ``key``, carries totals, has no
    pending append and names this very file with a verified header; None otherwise (raises on a damaged
    file: the caller takes the full path)."""
    mark = json.loads(hwm_path(path).read_bytes())
    body = {k: v for k, v in mark.items() if k != "mac"}
    if "cache" not in body or "pending" in body or not same_mac(mark_mac(key, body), mark.get("mac")):
        return None
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        if (st.st_size, st.st_ctime_ns) != (body["size"], body["ctime_ns"]):
            return None
        head = json.loads(fh.readline())
    header = {f: head.get(f) for f in HEADER_FIELDS}
    if not _header_vouched(head, header, analyst, body["ledger_id"], key):
        return None
    led = Ledger(path, analyst, header["ledger_id"], bud.Limits.from_json(head["limits"]),
                 parse_time(head["created"]), head["refresh_days"], float(head["report_delta"]), (),
                 head["genesis"], header, Tail(SCHEMA_VERSION, st.st_size, True))
    return led, MarkTotals.from_mark(mark)


def _header_vouched(head: dict[str, Any], header: dict[str, Any], analyst: str, ledger_id: Any, key: bytes) -> bool:
    """Is the ledger's first line this analyst's ledger of this schema, the mark's, with a verified seal?"""
    return not (head.get("schema_version") != SCHEMA_VERSION or head.get("analyst") != analyst
                or header["ledger_id"] != ledger_id
                or not same_mac(mac(key, GENESIS_DOMAIN, header), head.get("genesis")))
