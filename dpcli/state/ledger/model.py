"""A ledger as data: the verified ledger, the receipt of a charge, a reservation and a step."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpcli.core.accounting import budget as bud
from dpcli.core.accounting.accountants import Accountant, accountant_for
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import to_fraction
from dpcli.errors import BudgetError
from dpcli.state.ledger.format import (
    utc_now,
)


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
    name: str = ""  # how people know it (a stream's state file name), for ``budget show``


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
class Tail:
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
    tail: Tail | None = field(default=None, repr=False, compare=False)

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
        p = self.period(when or utc_now())
        return [e for e in self.entries if e.get("period", 0) == p]

    def spend(self, when: datetime | None = None) -> bud.Spend:
        """What the current period's entries spent: their events composed in the ledger's mode (a pld ledger:
        the sum of the costs its entries recorded, one block each, docs/ledger.md)."""
        if self.limits.mode == "pld":
            return recorded_spend(self, self.current_entries(when))
        events = [PrivacyEvent.from_json(ev) for e in self.current_entries(when) for ev in e["events"]]
        return self.accountant.spend(events)

    def guarantee(self, when: datetime | None = None) -> tuple[float, float]:
        return self.accountant.guarantee(self.spend(when), self.report_delta)

    def reservation(self, rid: str) -> dict[str, Any] | None:
        """The entry that created reservation ``rid``, if any."""
        return next((e for e in self.entries if (e.get("reservation") or {}).get("id") == rid), None)

    def find_reservation(self, kind: str, key: str, when: datetime | None = None) -> int | None:
        """The entry number of a reservation of ``kind`` for ``key`` in the current period, if any."""
        p = self.period(when or utc_now())
        return next((e["seq"] for e in self.entries if e.get("period", 0) == p
                     and (e.get("reservation") or {}).get("kind") == kind and e["reservation"].get("key") == key), None)

    def open_starts(self, reservation_seq: int, start: int) -> list[dict[str, Any]]:
        """The marks of runs at step ``start`` of a reservation that began reading and have not ended: no step
        recorded at ``start`` and no entry closing them (:func:`dpcli.state.ledger.start_step`)."""
        if any(s["step"].get("from") == start for s in self.steps(reservation_seq)):
            return []
        closed = {e["closes"] for e in self.entries if "closes" in e}
        return [e for e in self.entries if e.get("covered_by") == reservation_seq and "starts" in e
                and e["starts"].get("from") == start and e["seq"] not in closed]

    def ended_marks(self) -> set[int]:
        """The entries a reader of the history need not see: the free marks of runs that began and then ended
        (with their step, or closed by a call answered from the schedule's cache) and the entries closing them.
        A mark that cost something, or whose run never ended, stays in view."""
        closed = {e["closes"]: e["seq"] for e in self.entries if "closes" in e}
        recorded = {(e["covered_by"], e["step"].get("from")) for e in self.entries
                    if "step" in e and e.get("covered_by") is not None and not e.get("replay_of")}
        quiet: set[int] = set()
        for e in self.entries:
            if "starts" in e and not e["events"]:
                if e["seq"] in closed:
                    quiet |= {e["seq"], closed[e["seq"]]}
                elif (e["covered_by"], e["starts"].get("from")) in recorded:
                    quiet.add(e["seq"])
        return quiet

    def steps(self, reservation_seq: int) -> list[dict[str, Any]]:
        """The recorded (non-repeat) steps of a reservation, in order: element i started at step i."""
        return [e for e in self.entries
                if e.get("covered_by") == reservation_seq and "step" in e and not e.get("replay_of")]


def entry_cost(entry: dict[str, Any]) -> bud.Spend | None:
    """The (ε, δ) a pld ledger recorded with an entry (its block's cost), or None if it recorded none."""
    cost = entry.get("cost")
    if cost is None:
        return None
    return bud.Spend(epsilon=to_fraction(cost["epsilon"]), delta=to_fraction(cost["delta"]))


def recorded_spend(led: Ledger, entries: list[dict[str, Any]]) -> bud.Spend:
    """A pld ledger's spend over ``entries``: the sum of their recorded costs (exact), an entry with events but no
    recorded cost composed as one block."""
    eps, delta = Fraction(0), Fraction(0)
    for e in entries:
        cost = entry_cost(e)
        if cost is None and e["events"]:
            cost = led.accountant.spend([PrivacyEvent.from_json(ev) for ev in e["events"]])
        if cost is not None:
            eps, delta = eps + cost.epsilon, delta + cost.delta
    return bud.Spend(epsilon=eps, delta=delta)


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

def refuse_unless_fits(led: Ledger, analyst: str, spent: bud.Spend, reserve: list[PrivacyEvent],
                       actual: list[PrivacyEvent]) -> None:
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


#: The summary of a debit made before a release read its data (:func:`dpcli.state.ledger.debit`; the entry is
#: marked ``"before_reading": true``), until the entry that ``completes`` it says what the release was.
DEBIT_SUMMARY = "debited before the run read any record"


def debited_before_reading(entry: dict[str, Any]) -> bool:
    """Whether ``entry`` is a release's debit made before it read its data (its completion follows it)."""
    return entry.get("before_reading") is True


def completions(led: Ledger) -> dict[int, dict[str, Any]]:
    """The entries that record a release's completion (output digest and summary, no cost), by the entry of
    the debit each completes; a debit whose own run never completed (killed, failed) is completed by the
    first free replay of it that did (replays are recorded only once computed)."""
    done = {int(e["completes"]): e for e in led.entries if "completes" in e}
    debits = {e["seq"] for e in led.entries if debited_before_reading(e)}
    for e in led.entries:
        target = e.get("replay_of")
        if isinstance(target, int) and target in debits and target not in done and "step" not in e:
            done[target] = e
    return done

