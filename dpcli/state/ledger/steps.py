"""Runs against a stream's or schedule's state file: a reservation debited once, each run recorded as a step."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

from dpcli.core.accounting import budget as bud
from dpcli.core.events import PrivacyEvent
from dpcli.errors import BudgetError, StateError
from dpcli.state.ledger.document import read_ledger
from dpcli.state.ledger.format import (
    same_mac,
)
from dpcli.state.ledger.model import Ledger, Reservation, Step, refuse_unless_fits


def step_entries(
    led: Ledger, analyst: str, step: Step, base: dict[str, Any], now: datetime, spent: bud.Spend
) -> tuple[list[dict[str, Any]], tuple[PrivacyEvent, ...], int | None, int]:
    """The entries recording ``step`` (a new reservation first, if needed): (entries, reserved, replay_of,
    covered_by)."""
    n = len(led.entries)
    period = led.period(now)
    new: list[dict[str, Any]] = []
    reserved: tuple[PrivacyEvent, ...] = ()
    created = led.reservation(step.reservation)
    if created is None:
        if step.create is None or step.start != 0:
            raise StateError(
                f"{step.label}: its reservation is not in analyst {analyst!r}'s ledger (state copied from another "
                "analyst or state directory, or the ledger restored from an older backup)"
            )
        new.append(reservation_entry(led, analyst, step.create, step.label, base["time"], now, spent))
        reserved = step.create.events
        res_seq, res_period, steps = n + 1, period, []
    else:
        res_seq, res_period, steps = created["seq"], created.get("period", 0), led.steps(created["seq"])
    if any(s["step"].get("from") != i for i, s in enumerate(steps)):
        raise StateError(f"ledger {led.path}: the steps of reservation #{res_seq} are out of order")
    record = {"from": step.start, "input": step.digest}
    entry = {**base, "seq": n + len(new) + 1, "covered_by": res_seq, "step": record}
    replay_of = _replayed_step(analyst, step, steps, res_period == period)
    if replay_of is not None:
        entry["replay_of"] = replay_of
    return [*new, entry], reserved, replay_of, res_seq


def reservation_entry(led: Ledger, analyst: str, c: Reservation, label: str, time: Any, now: datetime,
                      spent: bud.Spend) -> dict[str, Any]:
    """The entry of a new reservation ``c`` (``label`` names its state in messages), if it is this ledger's,
    new, and fits the budget."""
    if c.ledger_id != led.ledger_id:
        raise StateError(f"{label} was created for another ledger (copied from another analyst or state "
                         "directory)")
    clash = led.find_reservation(c.kind, c.key, now) if c.kind == "schedule" else None
    if clash is not None:
        raise StateError(
            f"{label} already has reservation #{clash} in this ledger but not this state "
            "(state deleted or replaced?): restore its state file, or use a new --schedule name"
        )
    refuse_unless_fits(led, analyst, spent, list(c.events), list(c.events))
    return {"seq": len(led.entries) + 1, "time": time, "period": led.period(now), "command": c.command,
            "query_id": f"{c.kind}:{c.key}", "seed_id": f"{c.kind}:{c.id}",
            "events": [ev.to_json() for ev in c.events],
            "reservation": {"id": c.id, "kind": c.kind, "key": c.key, **({"name": c.name} if c.name else {})},
            **({"summary": c.summary} if c.summary else {})}


def _replayed_step(analyst: str, step: Step, steps: list[dict[str, Any]], same_period: bool) -> int | None:
    """None for the next run (its reservation must be of this period); the entry of the recorded run
    it repeats (the same input); refused when it is ahead of the ledger or differs from the record."""
    if step.start == len(steps):
        if not same_period:
            raise BudgetError(f"analyst {analyst!r}: the reservation of {step.label} is not in this ledger period")
        return None
    if step.start < len(steps):
        earlier = steps[step.start]
        if not same_mac(earlier["step"].get("input"), step.digest):
            raise StateError(
                f"{step.label} is behind the ledger (at run {step.start} of {len(steps)}) and its input differs from "
                f"the one recorded for run {step.start + 1}: it is an older or copied state; use the newest copy"
            )
        seq: int = earlier["seq"]
        return seq
    raise StateError(
        f"{step.label} is ahead of the ledger (run {step.start}, ledger has {len(steps)}): "
        "the ledger was restored from an older backup, or the state belongs to another ledger"
    )


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
    if digest is not None and not same_mac(steps[runs - 1]["step"].get("input"), digest):
        raise StateError(f"{label} differs from the run the ledger recorded (an older or copied state)")
    if current and len(steps) != runs:
        raise StateError(f"{label} is an older copy of its state (the ledger recorded later runs): restore the newest "
                         "state file, or use a new --schedule name")


class StreamSummary(TypedDict):
    """A stream's reservation as ``budget show`` lists it."""

    name: str | None  # its state file's name (None in ledgers written before issue 31)
    entry: int  # the entry that reserved it
    time: str
    reserved: list[dict[str, Any]]  # the (ε, δ) reserved, as the entry's events
    runs: int  # runs recorded as its steps
    retries: int  # runs repeated (free replays of a recorded run)


def stream_summaries(led: Ledger, when: datetime | None = None) -> list[StreamSummary]:
    """The streams reserved in the current period (their reservation is part of what it spent), each
    with its runs and retries."""
    runs: dict[int, int] = {}
    retries: dict[int, int] = {}
    for e in led.entries:
        if "step" in e and e.get("covered_by") is not None:
            tally = retries if e.get("replay_of") else runs
            tally[e["covered_by"]] = tally.get(e["covered_by"], 0) + 1
    return [StreamSummary(name=e["reservation"].get("name"), entry=e["seq"], time=e["time"], reserved=e["events"],
                          runs=runs.get(e["seq"], 0), retries=retries.get(e["seq"], 0))
            for e in led.current_entries(when) if (e.get("reservation") or {}).get("kind") == "stream"]
