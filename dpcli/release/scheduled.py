"""A run of a ``--schedule`` over growing snapshots: the :class:`~dpcli.release.steps.Continuation` paid by the
schedule's reservation (:mod:`dpcli.release.schedules` runs it, :mod:`dpcli.release.schedule_plan` plans it).

Each run's ε comes from the schedule, so nothing is planned before the inputs are opened: the query is
checked to be one a schedule can run, and each run is planned at its ε and run through the task
(:func:`dpcli.release.steps.prepare`), in pure mode for top-k (its accounting per run) and in the
ledger's mode for a histogram.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dpcli import advice
from dpcli.core.schedules import ScheduleLabel, ScheduleSpec
from dpcli.errors import UsageError
from dpcli.release import schedules
from dpcli.release.schedule_plan import DEFAULT_RUNS, plan_schedule
from dpcli.release.steps import Admitted, prepare
from dpcli.tasks import ExpectedSize, Result, SchedulableTask

if TYPE_CHECKING:
    from dpcli.release.inputs import Opened, Sources
    from dpcli.release.steps import BeforeRun, Busy, LedgerRef, Output, Planned, Prepared, Release
    from dpcli.state import ledger
    from dpcli.tasks import Engine, Task
    from dpcli.tasks.reports import AutoReport


@dataclass(frozen=True)
class Scheduled:
    """A run of the schedule ``spec``; ``through``: the public moment the snapshot holds data through
    (``--through``; None: now); ``size``: the sizes a dry run plans the next runs at (``--rows``, ``--units``)."""

    spec: ScheduleSpec
    through: datetime | None = None
    size: ExpectedSize | None = None

    def guarded(self) -> tuple[str, ...]:
        return ()

    def admit(self, task: Task[Any], led: ledger.Ledger) -> Admitted:
        """A query a schedule can run (histogram and topk, as their checks say); its runs are planned later."""
        if not isinstance(task, SchedulableTask):
            raise UsageError(f"{task.command} has no --schedule")
        task.check_schedulable()
        return Admitted(task, led.limits)

    def run(self, admitted: Admitted, opened: Opened, engine: Engine | None, payer: LedgerRef,
            output: Output | None, busy: Busy) -> Release:
        """One call of the schedule (:func:`dpcli.release.schedules.run_scheduled`), with the notes of the run."""
        task, limits = admitted.task, admitted.limits
        assert isinstance(task, SchedulableTask)  # (admitted)
        mode = task.schedule_mode(limits.mode)

        def run_at(epsilon: Fraction, kept: AutoReport | None, before_run: BeforeRun) -> Prepared:
            run_task = schedules.scheduled_run(task, epsilon, kept)
            return prepare(run_task, run_task.plan(mode, limits.values), mode, opened, payer.state_dir, engine,
                           busy, before_run)

        query = task.schedule_query(opened.fingerprints)
        digest = output.digest if output is not None else None
        done = schedules.run_scheduled(payer.state_dir, payer.analyst, task.command, self.spec, query, opened.data,
                                       run_at, payer.lock_timeout, digest, self.through)
        label: ScheduleLabel = done.report["schedule"]
        run_eps = Fraction(label["run_epsilon"])
        auto = done.report.get("auto")
        kept = schedules.chosen_bounds(auto) if auto and auto.get("kept") else None
        run_task = schedules.scheduled_run(task, run_eps, kept)
        notes = [*run_task.notes(run_task.plan(mode, limits.values), Result(done.table, done.report)),
                 advice.small_run_epsilon(float(run_eps), float(self.spec.total_epsilon), self.spec.scheduler),
                 advice.schedule_backfill(label), advice.schedule_repeat(label),
                 advice.improver_c_without_gain(label["scheduler"], label.get("c", 0.0)),
                 advice.improver_counts_runs(label.get("made_with_index"))]
        return replace(done, notes=tuple(n for n in notes if n is not None))

    def plan(self, task: Task[Any], payer: LedgerRef, sources: Sources | None, runs: int | None) -> Planned:
        """The next ``runs`` runs (a month of daily runs by default) at the stated sizes
        (:func:`dpcli.release.schedule_plan.plan_schedule`)."""
        if sources is None:
            raise UsageError("a schedule's dry run reads its public list of groups: give the sources")
        return plan_schedule(task, sources, payer, self.spec, self.size, runs or DEFAULT_RUNS)
