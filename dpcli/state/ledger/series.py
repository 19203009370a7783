"""Series in a pld ledger: N releases of one cost reserved in advance, paid once as one block.

``dpcli budget plan --runs N --reserve -- COMMAND`` reserves a series (:func:`dpcli.state.ledger.reserve_series`):
its entry records the release's events, ``series: {count, delta, key}`` and the cost of the N-fold PLD
composition at ``delta`` (:meth:`dpcli.core.accounting.accountants.PldAccountant.series`). Every later new
release of the same period whose largest cost is exactly those events takes the series' next run
(``covered_by`` the series, ``series_run`` i, nothing more to pay) until its N runs are taken; after that, a
release is charged as any other. What a run may adapt is *which* query it asks, never its cost: that is what
makes the series a composition fixed in advance (docs/accounting.md, "The pld mode").
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from fractions import Fraction
from typing import Any

from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.state.ledger.model import Ledger, entry_cost


@dataclass(frozen=True)
class OpenSeries:
    """A series of the current period with runs left: its entry, the key of its release's cost, its runs."""

    seq: int
    key: str
    count: int
    used: int

    def to_json(self) -> list[Any]:
        return [self.seq, self.key, self.count, self.used]

    @classmethod
    def from_json(cls, data: list[Any]) -> OpenSeries:
        seq, key, count, used = data
        return cls(int(seq), str(key), int(count), int(used))


def events_key(events: Iterable[PrivacyEvent | dict[str, Any]]) -> str:
    """What identifies a release's cost: 128 bits of SHA-256 of its events' canonical JSON (details included)."""
    data = [ev.to_json() if isinstance(ev, PrivacyEvent) else ev for ev in events]
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def open_series(led: Ledger, when: datetime) -> tuple[OpenSeries, ...]:
    """The series of ``when``'s period that have runs left, oldest first (from the entries)."""
    period = led.period(when)
    used: dict[int, int] = {}
    for e in led.entries:
        if "series_run" in e:
            used[e["covered_by"]] = used.get(e["covered_by"], 0) + 1
    found = [OpenSeries(e["seq"], str(e["series"]["key"]), int(e["series"]["count"]), used.get(e["seq"], 0))
             for e in led.entries if "series" in e and e.get("period", 0) == period]
    return tuple(s for s in found if s.used < s.count)


def slot_for(series: tuple[OpenSeries, ...], events: list[PrivacyEvent]) -> OpenSeries | None:
    """The open series whose next run a release costing ``events`` takes, if any (the oldest)."""
    if not events:
        return None
    key = events_key(events)
    return next((s for s in series if s.key == key), None)


def runs_left(series: tuple[OpenSeries, ...], events: list[PrivacyEvent]) -> int:
    """How many more releases costing ``events`` the open series cover."""
    if not events:
        return 0
    key = events_key(events)
    return sum(s.count - s.used for s in series if s.key == key)


def covered(entry: dict[str, Any], slot: OpenSeries) -> dict[str, Any]:
    """``entry`` (a new release, no events yet) as the next run of series ``slot``: nothing more to pay."""
    return {**entry, "events": [], "covered_by": slot.seq, "series_run": slot.used + 1}


def after(series: tuple[OpenSeries, ...], added: list[dict[str, Any]]) -> tuple[OpenSeries, ...]:
    """The open series once ``added`` are recorded: runs taken, new series opened, full ones closed."""
    out = list(series)
    for e in added:
        if "series" in e:
            out.append(OpenSeries(e["seq"], str(e["series"]["key"]), int(e["series"]["count"]), 0))
        elif "series_run" in e:
            out = [replace(s, used=s.used + 1) if s.seq == e["covered_by"] else s for s in out]
    return tuple(s for s in out if s.used < s.count)


def series_entry(led: Ledger, seq: int, when: str, period: int, events: list[PrivacyEvent], count: int,
                 delta: Fraction, command: str, summary: str) -> dict[str, Any]:
    """The entry reserving a series of ``count`` releases costing ``events``, stated at ``delta``."""
    key = events_key(events)
    return {"seq": seq, "time": when, "period": period, "command": command, "query_id": f"series:{key}",
            "seed_id": f"series:{secrets.token_hex(16)}", "events": [ev.to_json() for ev in events],
            "series": {"count": count, "delta": fraction_text(delta), "key": key}, "summary": summary}


def summaries(led: Ledger, when: datetime | None = None) -> list[dict[str, Any]]:
    """The series of the current period as ``budget show`` lists them: entry, runs reserved and taken, cost."""
    runs: dict[int, int] = {}
    for e in led.entries:
        if "series_run" in e:
            runs[e["covered_by"]] = runs.get(e["covered_by"], 0) + 1
    out = []
    for e in led.current_entries(when):
        if "series" not in e:
            continue
        cost = entry_cost(e)
        out.append({"entry": e["seq"], "time": e["time"], "command": e["command"], "runs": int(e["series"]["count"]),
                    "taken": runs.get(e["seq"], 0), "each": e["events"],
                    "cost": {"epsilon": fraction_text(cost.epsilon), "delta": fraction_text(cost.delta)}
                    if cost is not None else None})
    return out
