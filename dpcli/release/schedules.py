"""Runs of a ``--schedule``: one release path over growing snapshots with one total budget (paper 004).

The whole schedule's total is debited from the analyst's ledger at its first
run; each later run is recorded in the ledger as covered by that
reservation, and calls that fall inside an epoch already run return the
cached release (post-processing: free). A call on an input the schedule has
answered before, or for a ``--through`` moment it has answered, gets that
answer again (a retry never unpublishes; another input for a released moment
is refused): see :func:`dpcli.release.schedule_state.earlier`. The state is bound to the ledger
(see :func:`run_scheduled`; its state: :mod:`dpcli.release.schedule_state`). :mod:`dpcli.core.schedules` holds
the arithmetic; the CLI options are in :mod:`dpcli.cli._options`.

No exact size of a snapshot decides anything or leaves a run: bbscheduler
decides its epochs from noisy counts of distinct privacy units, paid from its
reservation; bbimprover counts runs; fixed needs no size (each scheduler's next run:
:mod:`dpcli.release.schedule_runs`, whose exact count, ``count_units``, is only ever used under noise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from dpcli.core.display import parameter_text
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.schedules import ScheduleSpec
from dpcli.errors import BudgetError, UsageError
from dpcli.io.tables import InputTable
from dpcli.release.schedule_runs import Plan, Sizes, next_run, run_label, run_name, step_fields
from dpcli.release.schedule_state import (
    Again,
    answered,
    earlier,
    load_or_start,
    moment_text,
    reservation_event,
    schedule_reservation,
)
from dpcli.release.seeds import ReleaseSeed
from dpcli.release.steps import BeforeRun, LedgerRef, Prepared, Release, charge
from dpcli.state import ledger
from dpcli.state import schedules as store
from dpcli.tasks import Result
from dpcli.tasks.auto_bounds import chosen_text
from dpcli.tasks.reports import AutoReport, Report

if TYPE_CHECKING:
    from dpcli.tasks import P, SchedulableTask

#: A run's black box: (ε for this run, the ``auto`` bounds the schedule's first run chose and its state keeps, or
#: None before they are chosen, a check of the run's seed and cost before it reads a record) → the release
#: computed at that ε, at those bounds (not yet recorded).
RunRelease = Callable[[Fraction, AutoReport | None, BeforeRun], Prepared]
#: (released table, report) → the digest of the file it is about to be written to (None: stdout).
OutputDigest = Callable[[pl.DataFrame, Report], str | None]


@dataclass(frozen=True)
class _Call:
    """One call of a scheduled query: whose schedule, where its state lies, and its state as loaded."""

    state_dir: Path
    directory: Path
    analyst: str
    command: str
    spec: ScheduleSpec
    state: dict[str, Any]
    lock_timeout: float

    @property
    def label(self) -> str:
        return f"schedule {self.spec.name!r}"


def run_scheduled(
    state_dir: Path,
    analyst: str,
    command: str,
    spec: ScheduleSpec,
    query: dict[str, Any],
    table: InputTable,
    run: RunRelease,
    lock_timeout: float = 30.0,
    output_digest: OutputDigest | None = None,
    through: datetime | None = None,
) -> Release:
    """One call of a scheduled query: reserve (first call), run a new epoch, or answer with an earlier release.

    The schedule's state is bound to the ledger (:class:`ledger.Step`): its
    reservation id is random per creation and every run is recorded with a
    keyed digest of its snapshot, so an older copy of the state, a deleted and
    re-created one or one from another analyst is refused (exit 78), never
    given fresh releases for free. Order: a new schedule's state on disk and its
    whole budget debited (before anything is read), compute in memory, record the
    run in the ledger, write the state and cached release, then the output.
    ``query["unit"]`` names the privacy unit, whose distinct values are the size bbscheduler estimates.
    ``output_digest(table, report)``: the digest of the file a new run's release is written to, for its
    ledger entry (see :func:`dpcli.release.charge`). ``through``: the public moment the snapshot holds data
    through (``--through``), which makes retries, corrections and backfills recognisable (:func:`earlier`).
    """
    key = store.schedule_key(spec.name, query)
    with store.locked(state_dir, analyst, key, lock_timeout) as directory:
        state, fresh = load_or_start(state_dir, directory, analyst, command, spec, query, key, lock_timeout)
        call = _Call(state_dir, directory, analyst, command, spec.as_in(state["spec"]), state, lock_timeout)
        spec = call.spec
        again = earlier(spec, state, table.fingerprint, through)
        if again is not None:
            return _again(call, again, table.fingerprint, through)
        table.verify_unchanged()  # a file changed since it was hashed: refused before anything is debited
        reserved = _reserve_first(call, fresh)  # before the size test or the run reads a record
        began = _Begun(call, table.fingerprint, through)
        read = (query["unit"], *query.get("by", ()), *([query["value"]] if query.get("value") else []))
        sizes = Sizes(state_dir, state, table, query["unit"], read, began.mark)
        plan = next_run(spec, state, sizes)
        if plan is None:
            began.close()
            return _again(call, Again(len(state["runs"]), "cached"), table.fingerprint, through, current=sizes.asked)
        if plan.epsilon <= 0:
            raise BudgetError(f"schedule {spec.name!r}: the ε for {plan.step} is below 10^-15; the schedule is spent")
        epsilon = plan.epsilon

        def before_run(seed: ReleaseSeed, events: list[PrivacyEvent]) -> None:
            _check_run_cost(events, epsilon)
            began.mark()

        prepared = run(plan.epsilon, state.get("auto"), before_run)
        if "auto" not in state and "auto" in prepared.metadata:
            plan.state["auto"] = chosen_bounds(prepared.metadata["auto"])
        if through is not None:
            plan.fields["through"] = moment_text(through)
        return _record(call, table, prepared, plan, output_digest, reserved)


def _reserve_first(call: _Call, fresh: bool) -> tuple[PrivacyEvent, ...]:
    """Before a schedule's first run reads anything: its state on disk (a crash after is retried with the same
    reservation id), then its whole budget debited (:func:`ledger.reserve`); the events debited now, if any."""
    if call.state["runs"]:
        return ()
    if fresh:
        store.save(call.directory, call.state["key"], call.state)
    reservation = schedule_reservation(call.state, call.spec, call.command)
    debited = ledger.reserve(call.state_dir, call.analyst, reservation, call.lock_timeout)
    return reservation.events if debited else ()


class _Begun:
    """A call's run marked as begun in the ledger (:func:`ledger.start_step`), once, just before its size test
    or its release reads a record: a second input at a step whose run never ended pays the whole schedule's
    cost again, so no timing probe is free. A call answered from the cache closes its mark."""

    def __init__(self, call: _Call, fingerprint: str, through: datetime | None) -> None:
        self._call, self._made = call, False
        self._step = len(call.state["runs"])
        self._digest = ledger.step_digest(bytes.fromhex(call.state["secret"]),
                                          {"begins": fingerprint, "through": moment_text(through) if through else None})

    def mark(self) -> None:
        if self._made:
            return
        c = self._call
        ledger.start_step(c.state_dir, c.analyst, c.state["reservation"], self._step, self._digest, c.label,
                          [reservation_event(c.spec)], c.lock_timeout)
        self._made = True

    def close(self) -> None:
        if self._made:
            c = self._call
            ledger.close_start(c.state_dir, c.analyst, c.state["reservation"], self._step, self._digest,
                               c.lock_timeout)


def _check_run_cost(events: list[PrivacyEvent], epsilon: Fraction) -> None:
    """A schedule's run must be a pure release of at most its ε (checked from its plan, before it reads)."""
    if any(e.kind != "pure" for e in events) or sum(e.epsilon for e in events) > epsilon:
        raise UsageError("a schedule's runs must be pure ε-DP releases (histogram --keys, topk --domain)")


def chosen_bounds(auto: AutoReport) -> AutoReport:
    """What a schedule keeps of the ``auto`` bounds its first run chose (its metadata's ``"auto"``): the chosen
    values, released like the rest of that run, without the budget of the choice. Every later run gives them
    as its bounds (issue 33: a schedule chooses once, from its first run's ε, and keeps its choice)."""
    kept = {k: v for k, v in auto.items() if k in ("max_partitions", "max_contributions", "bounds")}
    return cast(AutoReport, kept)  # (a part of ``auto``, in its order)


def _record(call: _Call, table: InputTable, prepared: Prepared, plan: Plan,
            output_digest: OutputDigest | None = None, reserved: tuple[PrivacyEvent, ...] = ()) -> Release:
    """Record a new run in the ledger as a step of the reservation (``reserved``: debited by this call, before
    it read), then save the state and output."""
    spec, state = call.spec, call.state
    runs: list[dict[str, Any]] = state["runs"]
    seed = prepared.seed
    record = ledger.Step(
        reservation=state["reservation"],
        start=len(runs),
        # the run's seed too: an older copy of the state recomputing this run is free only if it
        # draws the same noise (same dpcli noise, polars and bounding versions), else it is refused
        digest=ledger.step_digest(bytes.fromhex(state["secret"]), {"input": table.fingerprint, "seed": seed.id}),
        label=call.label,
        create=schedule_reservation(state, spec, call.command) if not runs else None,
    )
    entry = {
        **step_fields(spec, plan.step),
        **plan.fields,
        "fingerprint": table.fingerprint,
        "epsilon": fraction_text(plan.epsilon),
        "seed_id": seed.id,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "metadata": prepared.metadata,
    }
    table.verify_unchanged()  # the run read the bytes it hashed (else exit 66: no run recorded or saved)
    runs.append(entry)  # in memory; saved once the ledger has recorded the run
    state.update(plan.state)
    label = run_label(spec, state, entry, cached=False)
    report = prepared.metadata.copy()
    report["schedule"] = label
    labelled = Prepared(seed, prepared.events, Result(prepared.table, report))
    through = f" through {entry['through']}" if "through" in entry else ""
    line = (f"{call.command}: {run_name(spec, state, entry)} of schedule {spec.name!r}{through} "
            f"(ε = {parameter_text(plan.epsilon, 'up')}){_auto_text(prepared.metadata.get('auto'))}")
    digest = output_digest(labelled.table, labelled.metadata) if output_digest is not None else None
    return charge(LedgerRef(call.state_dir, call.analyst, call.lock_timeout), call.command, labelled, line,
                  step=record, before_output=lambda: store.save(call.directory, state["key"], state, prepared.table),
                  output_digest=digest, reserved=reserved)


def _auto_text(auto: AutoReport | None) -> str:
    """A run's line names its ``auto`` bounds: chosen now (the first run), or kept from the first run."""
    text = chosen_text(auto)
    return f"{text} (kept from its first run)" if text and auto and auto.get("kept") else text


def _again(call: _Call, again: Again, fingerprint: str, through: datetime | None, current: bool = False) -> Release:
    """Run ``again.run``'s release once more, free, after checking the ledger recorded that run (with its input);
    with ``current`` (a crossing test said "not yet") the state must also be the newest the ledger knows: an
    older copy would answer from a test that has since passed. A call not answered before (a new input, or a
    new ``--through``) is added to the state's answers first, so that its retry gets the same release."""
    spec, state = call.spec, call.state
    run = state["runs"][again.run - 1]
    digest = ledger.step_digest(bytes.fromhex(state["secret"]), {"input": run["fingerprint"], "seed": run["seed_id"]})
    ledger.check_recorded(call.state_dir, call.analyst, state["reservation"], again.run, digest, call.label,
                          call.lock_timeout, current=current)
    cached = store.cached_release(call.directory, state["key"], again.run)
    moment = moment_text(through) if through is not None else None
    if not any(s["fingerprint"] == fingerprint and s.get("through") == moment for s in answered(state)):
        answer = {"fingerprint": fingerprint, "run": again.run, **({"through": moment} if moment else {})}
        state.setdefault("answers", []).append(answer)
        store.save(call.directory, state["key"], state)
    label = run_label(spec, state, run, cached=True)
    if again.kind == "replay":
        label["replay_of_run"] = again.run
    elif again.kind == "in force":
        label.update({"in_force_through": moment, "made_through": run.get("through")})
    # the report the state kept, as the run's task wrote it (JSON: typed by the command it names)
    report = cast(Report, {**run["metadata"], "schedule": label, "charged": False, "seed_id": run["seed_id"]})
    where = run_name(spec, state, run)
    summary = {"replay": f"the release of {where} again, for the same input (free)",
               "cached": f"cached release of {where} (free)",
               "in force": f"the release in force through {moment}: {where} (free)"}[again.kind]
    return Release(cached, report, f"{call.command}: {summary}")


def scheduled_run(task: SchedulableTask[P], epsilon: Fraction, kept: AutoReport | None) -> SchedulableTask[P]:
    """The task of one run of a schedule: at the run's ε and, once the schedule's first run has chosen its
    ``auto`` bounds (``kept``, from the schedule's state), at those bounds
    (:meth:`dpcli.tasks.SchedulableTask.keeping`)."""
    run_task = task.at_epsilon(epsilon)
    return run_task if kept is None else run_task.keeping(kept)
