"""One release paid by itself: the default :class:`~dpcli.release.steps.Continuation`.

Its plan is made once, before anything is opened, and refused then if the ledger can never pay it; its
debit is written once the seed is known and before the first record is read (a run killed or timed out,
or one whose records fail, has paid: its rerun is a free replay); the release is then computed in
memory and its completion recorded with its output's digest, and only then may anything be written.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dpcli.errors import BudgetError, DpcliError, InputMissingError
from dpcli.io.tables import verify_unchanged
from dpcli.release.inputs import check_task_inputs, declared_frames, list_groups
from dpcli.release.steps import Admitted, Planned, charge, check_dry_run_inputs, prepare, with_hint
from dpcli.state import ledger
from dpcli.state.paths import existing_state_dir

if TYPE_CHECKING:
    from dpcli.core.events import PrivacyEvent
    from dpcli.release.inputs import Opened, Sources
    from dpcli.release.seeds import ReleaseSeed
    from dpcli.release.steps import Busy, LedgerRef, Output, Release
    from dpcli.tasks import Engine, Task


@dataclass(frozen=True)
class OneRelease:
    """One release, debited in full (or a free replay of an identical one)."""

    def guarded(self) -> tuple[str, ...]:
        return ()

    def admit(self, task: Task[Any], led: ledger.Ledger) -> Admitted:
        """The plan, made once; a cost this ledger can never pay is refused before any input is opened."""
        planned = task.plan(led.limits.mode, led.limits.values)
        ledger.check_payable(led, list(planned.events))
        return Admitted(task, led.limits, planned)

    def run(self, admitted: Admitted, opened: Opened, engine: Engine | None, payer: LedgerRef,
            output: Output | None, busy: Busy) -> Release:
        """Debit before the first record is read, compute, record the completion (see the module docstring)."""
        task, planned = admitted.task, admitted.planned
        paid: list[ledger.Receipt] = []

        def debit(seed: ReleaseSeed, events: list[PrivacyEvent]) -> None:
            verify_unchanged(*opened.tables)  # a file changed since it was hashed: refused before the debit
            try:
                paid.append(ledger.debit(payer.state_dir, payer.analyst, command=task.command,
                                         query_id=seed.query_id, seed_id=seed.id, events=events,
                                         lock_timeout=payer.lock_timeout,
                                         summary=f"{task.command}: {ledger.DEBIT_SUMMARY}"))
            except BudgetError as exc:
                raise BudgetError(with_hint(task, exc.detail, payer), field=exc.field, fix=exc.fix) from None

        try:
            prepared = prepare(task, planned, admitted.limits.mode, opened, payer.state_dir, engine, busy,
                               before_run=debit)
            result_line = task.summary(opened.data.name, prepared.result)
            done = charge(payer, task.command, prepared, result_line, inputs=opened.tables,
                          output_digest=(output.digest(prepared.table, prepared.metadata, prepared.times) if output
                                         else None),
                          completes=None if paid[0].replay else paid[0].seq)
        except DpcliError as exc:
            if paid:  # it failed once reading had begun: say what it cost (a public fact: it reached the debit)
                same_bytes = engine is None and not isinstance(exc, InputMissingError)  # Spark, a changed file: new
                exc.detail += "; the run is charged (it had begun reading)" + (
                    ", and a rerun on the same input is a free replay" if same_bytes else "")
            raise
        return replace(done, notes=tuple(task.notes(planned, prepared.result)))

    def plan(self, task: Task[Any], payer: LedgerRef, sources: Sources | None, runs: int | None) -> Planned:
        """The task's plan against the ledger's mode and limits, its cost and whether the ledger would accept it
        now. Reads no record (with ``sources``, the data's schema and the public lists' headers: a missing
        column, a Parquet column of a type the query cannot use, or a list that lacks a needed column is
        refused as the release would refuse it). ``runs`` is a schedule's or a stream's: one release is one."""
        data = check_dry_run_inputs(task, sources) if sources is not None else None
        led = ledger.read_ledger(existing_state_dir(payer.state_dir), payer.analyst, payer.lock_timeout)
        task = task.for_ledger(led.limits.mode)
        if sources is not None:
            listed = sources
            task = task.with_list_groups(lambda: list_groups(task.needs(), listed))
        planned = task.plan(led.limits.mode, led.limits.values)
        frames = declared_frames(task.needs(), sources, data) if sources is not None else None
        if frames is not None:  # the task's own check, on the declared schemas (sql's types)
            check_task_inputs(task, frames, planned)
        events = list(planned.events)
        refused = ledger.refusal(led, events)
        if refused is not None:
            refused = with_hint(task, refused, payer)
        return Planned(task.describe(planned), events, refused)
