"""The recorded costs of a pld ledger: each block's (ε, δ), sealed in its entry with the accounting that computed it.

A pld ledger's spend is the sum of these costs (exact fractions), so reading it never needs a PLD, and its mark's
running totals equal, bit for bit, a sum over the entries. ``budget verify`` recomputes every block
(:func:`verify_costs`): a cost computed with the installed accounting must come out identical. When the
accounting changes (dpcli's PLD rules, or the dp_accounting, scipy or numpy versions), the next write first
appends a *recost* entry (:func:`recost_entry`): the current period's blocks recomputed, and the total raised to
at least their new costs (never lowered: every recorded cost was an upper bound under its own accounting). The
one-line summary says so; nothing changes silently. Format: docs/ledger.md.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

from dpcli.core.accounting import budget as bud
from dpcli.core.accounting import pld
from dpcli.core.accounting.accountants import ApproxAccountant, PldAccountant
from dpcli.core.display import parameter_text
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import to_fraction
from dpcli.errors import BudgetError, StateError
from dpcli.state.ledger.format import iso_time
from dpcli.state.ledger.model import Ledger, entry_cost

#: The accounting of an entry costed when an approx ledger became a pld ledger: its approx (ε, δ), which no
#: library version changes (:func:`dpcli.state.ledger.migrate.migrate`).
MIGRATED = "approx"


def installed() -> str | None:
    """The accounting this dpcli computes costs with, or None without dp_accounting."""
    return pld.accounting_version() if pld.available() else None


def pld_accountant(led: Ledger) -> PldAccountant:
    """A pld ledger's accountant (typed as such)."""
    accountant = led.accountant
    assert isinstance(accountant, PldAccountant)
    return accountant


def block_of(led: Ledger, entry: dict[str, Any]) -> bud.Spend:
    """The cost of an entry's block, computed now: its events as one release, or its series."""
    events = [PrivacyEvent.from_json(ev) for ev in entry["events"]]
    series = entry.get("series")
    try:
        if series is not None:
            return pld_accountant(led).series(events, int(series["count"]), to_fraction(series["delta"]))
        return pld_accountant(led).spend(events)
    except bud.ChargeRefused as exc:
        raise BudgetError(f"analyst {led.analyst!r} (pld ledger): {exc}") from None


def annotate(led: Ledger, added: list[dict[str, Any]]) -> None:
    """Record its block's cost in every entry of ``added`` that has events (a pld ledger only), in place."""
    if led.limits.mode != "pld":
        return
    version: str | None = None
    for e in added:
        if "cost" in e or not e["events"]:
            continue
        version = version or pld.accounting_version()
        cost = block_of(led, e)
        e["cost"] = pld.cost_json(cost.epsilon, cost.delta, version)


def latest_accounting(entries: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> str:
    """The accounting of the last entry costed by a PLD (or a recost), "" if none."""
    for e in reversed(entries):
        version = (e.get("cost") or {}).get("accounting")
        if version and version != MIGRATED:
            return str(version)
    return ""


def needs_recost(led: Ledger, accounting: str) -> bool:
    """Whether a pld ledger whose latest costs are of ``accounting`` must be recosted before its next write."""
    if led.limits.mode != "pld" or not accounting:
        return False
    now = installed()
    return now is not None and accounting != now


def recost_entry(led: Ledger, when: datetime, seq: int) -> dict[str, Any]:
    """The entry recording a change of accounting: the current period's blocks recomputed with the installed
    accounting, and a top-up so that the period's total is at least the sum of max(recorded, recomputed)."""
    version = pld.accounting_version()
    entries = led.current_entries(when)
    charged = needed = Fraction(0)
    recomputed = 0
    before: set[str] = set()
    for e in entries:
        cost = entry_cost(e)
        if cost is None:
            continue
        charged += cost.epsilon
        if "recost" in e:
            continue
        accounting = e["cost"]["accounting"]
        if e["events"] and accounting not in (MIGRATED, version):
            before.add(accounting)
            recomputed += 1
            needed += max(cost.epsilon, block_of(led, e).epsilon)
        else:
            needed += cost.epsilon
    top_up = max(Fraction(0), needed - charged)
    rise = f"the period's ε rises by {parameter_text(top_up, 'up')}" if top_up else "none costs more than recorded"
    return {"seq": seq, "time": iso_time(when), "period": led.period(when), "command": "budget recost",
            "query_id": "", "seed_id": f"recost:{secrets.token_hex(8)}", "events": [],
            "cost": pld.cost_json(top_up, Fraction(0), version),
            "recost": {"entries": recomputed, "from": sorted(before)},
            "summary": f"accounting is now {version}: {recomputed} charge(s) of this period recomputed; {rise}"}


@dataclass(frozen=True)
class CostCheck:
    """What :func:`verify_costs` recomputed: costs found equal, costs of another accounting (not comparable here)."""

    accounting: str | None
    equal: int
    other: int


def verify_costs(led: Ledger) -> CostCheck:
    """Recompute every recorded cost of a pld ledger; :class:`StateError` (exit 78) if one of the installed
    accounting differs from its recomputation, bit for bit (an edit made with the key, or a bug)."""
    version = installed()
    if led.limits.mode != "pld" or version is None:
        return CostCheck(version, 0, sum(1 for e in led.entries if "cost" in e))
    approx = ApproxAccountant(bud.Limits("approx", dict(led.limits.values)))
    equal = other = 0
    running: dict[int, tuple[Fraction, Fraction]] = {}  # period → (charged, needed) so far
    for e in led.entries:
        cost = entry_cost(e)
        if cost is None:
            if e["events"]:
                raise StateError(f"ledger {led.path} entry {e['seq']} has events but no recorded cost")
            continue
        period = e.get("period", 0)
        charged, needed = running.get(period, (Fraction(0), Fraction(0)))
        accounting = e["cost"]["accounting"]
        if "recost" in e:
            expected = bud.Spend(epsilon=max(Fraction(0), needed - charged))
            same = accounting != version or expected == cost
            now = cost
        elif accounting == MIGRATED:
            now = approx.spend(PrivacyEvent.from_json(ev) for ev in e["events"])
            same = now == cost
        else:
            now = block_of(led, e)
            same = accounting != version or now == cost
        if not same:
            raise StateError(f"ledger {led.path} entry {e['seq']}: its recorded cost differs from its recomputation "
                             f"with {version} (edited with the key, or a bug: please report)")
        equal += accounting in (version, MIGRATED)
        other += accounting not in (version, MIGRATED)
        top = cost.epsilon if "recost" in e else max(cost.epsilon, now.epsilon)
        running[period] = (charged + cost.epsilon, needed + (0 if "recost" in e else top))
    return CostCheck(version, equal, other)
