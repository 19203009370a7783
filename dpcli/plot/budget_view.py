"""A ledger's spending over time: the running total of each limited quantity, entry by entry.

The quantities are the ledger mode's own (ε and δ; ρ; BR units and calls; the RDP ledger's ε at
its δ), composed exactly as the ledger composes them; the total starts again at each refresh
period. Schedules' reservations are entries too (a schedule reserves its whole budget at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dpcli.core.accounting.budget import Spend
from dpcli.core.events import PrivacyEvent
from dpcli.state import ledger

#: A limit's name in the ledger header → the spent quantity it limits, where the two differ (BR ledgers).
LIMIT_OF = {"info_budget": "info_units", "call_budget": "calls"}


@dataclass(frozen=True)
class BudgetTimeline:
    """Per quantity: the entry times and the running spend after each; the limits; period starts."""

    analyst: str
    mode: str
    times: list[datetime]
    spent: dict[str, list[float]]
    limits: dict[str, float]
    periods: list[datetime]
    reserved: float  # ε reserved by schedules in the current period (0 if none)


def timeline(led: ledger.Ledger, schedules: list[dict[str, Any]] | None = None) -> BudgetTimeline:
    """The running spend of every entry of ``led`` (a new total at each refresh period)."""
    times: list[datetime] = []
    spent: dict[str, list[float]] = {}
    periods: list[datetime] = []
    total = None
    period = None
    for entry in led.entries:
        if entry.get("period", 0) != period:
            period = entry.get("period", 0)
            total = None
            periods.append(datetime.fromisoformat(entry["time"]))
        total = _composed(led, entry, total)
        times.append(datetime.fromisoformat(entry["time"]))
        for key, value in _spent_values(led, total).items():
            spent.setdefault(key, []).append(value)
    named = {LIMIT_OF.get(k, k): _number(v) for k, v in led.limits.to_json().items() if k != "mode"}
    limits = {k: v for k, v in named.items() if k in spent}
    return BudgetTimeline(led.analyst, led.limits.mode, times, spent, limits, periods[1:], _reserved(schedules))


def _composed(led: ledger.Ledger, entry: dict[str, Any], total: Spend | None) -> Spend:
    """The running total after ``entry``: its events composed onto it, or a pld ledger's recorded cost added."""
    if led.limits.mode == "pld":
        cost = ledger.recorded_spend(led, [entry])
        base = total or Spend()
        return Spend(epsilon=base.epsilon + cost.epsilon, delta=base.delta + cost.delta)
    return led.accountant.spend([PrivacyEvent.from_json(ev) for ev in entry["events"]], total)


def _spent_values(led: ledger.Ledger, total: Spend) -> dict[str, float]:
    """The running spend as the ledger states it: each quantity, or the RDP ledger's ε at its δ."""
    if led.limits.mode == "rdp":
        return {"epsilon": led.accountant.guarantee(total, led.report_delta)[0]}
    return {k: _number(v) for k, v in led.accountant.spent_json(total).items()}


def _reserved(schedules: list[dict[str, Any]] | None) -> float:
    """ε the schedules reserve in the current period."""
    return sum(_number(s["epsilon_reserved"]) for s in schedules or [] if s.get("epsilon_reserved") is not None)


def _number(text: Any) -> float:
    """An exact ledger figure (``"37/30"``, ``"0.5"``, a number) as a float."""
    if isinstance(text, (int, float)):
        return float(text)
    num, slash, den = str(text).partition("/")
    return float(num) / float(den) if slash else float(num)
