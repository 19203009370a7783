"""The one path of a release: limits → plan once → payable? → check the output → open → seed → debit → run →
record.

A release is debited durably once its seed is known and before its first private record is read
(a run killed or timed out, or one whose records fail, has paid: its rerun is a free replay), then
computed in memory, then its completion is recorded (with its output's digest), and only then may
anything be written (:class:`Release` is handed back charged; the caller writes it). Every command
and every library entry point goes through :func:`run`: histogram, topk, tabulate, sql and
stream-replay, and their scheduled (``--schedule``) and persisted (``--state``) runs, which differ
only in what pays (a reservation, debited before their first run reads anything; each run is then
recorded as a step of it) and what is kept between runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from dpcli.core.display import parameters_text
from dpcli.core.events import PrivacyEvent
from dpcli.errors import BudgetError, DpcliError, InputMissingError
from dpcli.io.inputs import InputTable, csv_delimiter, fingerprint_bytes, verify_unchanged
from dpcli.io.opening import EarlyInput
from dpcli.io.outputs import check_output_path, output_compression, render
from dpcli.release.inputs import (
    Opened,
    Sources,
    check_data_schema,
    check_list_headers,
    check_task_inputs,
    declared_frames,
    list_groups,
    open_sources,
)
from dpcli.release.seeds import Calibration, ReleaseSeed, release_seed, task_material
from dpcli.state import ledger
from dpcli.state.paths import existing_state_dir

if TYPE_CHECKING:
    from fractions import Fraction

    from dpcli.advice import Note
    from dpcli.core.accounting.budget import Limits
    from dpcli.release.schedules import ScheduleSpec
    from dpcli.spark.engine import EngineRequest
    from dpcli.tasks import Engine, P, Result, SchedulableTask, Task

#: ``busy(what)``: a context to run long work in (the CLI's spinner on a terminal; nothing in the library).
Busy = Callable[[str], AbstractContextManager[Any]]


@dataclass(frozen=True)
class LedgerRef:
    """Whose ledger pays for a release, and where the state lies."""

    state_dir: Path
    analyst: str
    lock_timeout: float = 30.0


@dataclass(frozen=True)
class Output:
    """Where a release will be written: ``path`` (None or ``-``: standard output) in ``format``. Checked
    before any data is read; a file's digest is recorded with the charge (``dpcli plot`` checks it)."""

    path: str | None
    format: str

    @property
    def to_file(self) -> bool:
        return bool(self.path) and self.path != "-" and self.format != "table"

    def digest(self, table: pl.DataFrame, metadata: dict[str, Any], times: tuple[str, ...] = ()) -> str | None:
        """The digest of the file the release is about to be written to (None for standard output): the bytes
        written, compressed for a ``.gz`` name (``times``: :attr:`Release.times`)."""
        if not self.to_file:
            return None
        return fingerprint_bytes(render(table, self.format, grid_step(metadata), output_compression(self.path),
                                        times))


def grid_step(report: dict[str, Any]) -> float | None:
    """The grid released values were snapped to (it sets how floats are rounded in text outputs)."""
    from fractions import Fraction

    return float(Fraction(report["granularity"])) if report.get("granularity") else None


@dataclass(frozen=True)
class Prepared:
    """A release computed in memory, not yet charged: its seed, cost, table and public metadata.

    Its table must not leave the process before :func:`charge` has debited it (only a charged
    :class:`Release` is ever handed out).
    """

    seed: ReleaseSeed
    events: list[PrivacyEvent]
    table: pl.DataFrame
    metadata: dict[str, Any]
    actual: list[PrivacyEvent] | None = None  # what it really cost, if less than ``events`` (topk's ⊥)
    times: tuple[str, ...] = ()  # columns of moments dpcli computed (:attr:`dpcli.tasks.Result.times`)


@dataclass(frozen=True)
class Release:
    """A charged release: the noisy table, the report of what was charged and what is left, one line
    for people, the notes that change how to read it, and the table's columns of moments dpcli computed
    (shown as ISO 8601 with ``Z``: :func:`dpcli.io.outputs.shown`)."""

    table: pl.DataFrame
    report: dict[str, Any]
    summary: str
    notes: tuple[Note, ...] = ()
    times: tuple[str, ...] = ()


@dataclass(frozen=True)
class Planned:
    """A dry run: the plan described (public inputs only), its cost, and whether the ledger would accept it."""

    description: dict[str, Any]
    events: list[PrivacyEvent]
    refusal: str | None = None


@dataclass(frozen=True)
class Continuation:
    """What makes a run part of something bigger: a schedule over growing snapshots, or a stream kept in a
    state file (``through``: the stream's public run-until time; None: now; ``label``: how lines name it)."""

    schedule: ScheduleSpec | None = None
    stream_state: Path | None = None
    label: str = ""
    through: datetime | None = None


def plan(task: Task[P], payer: LedgerRef, sources: Sources | None = None) -> Planned:
    """``--dry-run``: the task's plan against the ledger's mode and limits, its cost and whether the
    ledger would accept it now. Reads no record (with ``sources``, the data's schema and the public lists'
    headers: a missing column, a Parquet column of a type the query cannot use, or a list that lacks a
    needed column is refused as the release would refuse it), charges nothing."""
    task.check()
    data = check_dry_run_inputs(task, sources) if sources is not None else None
    led = ledger.read_ledger(existing_state_dir(payer.state_dir), payer.analyst, payer.lock_timeout)
    task = task.for_ledger(led.limits.mode)
    counted = getattr(task, "with_list_groups", None)  # a margin a public list's length bounds (histogram's auto K)
    if counted is not None and sources is not None:
        listed = sources
        task = counted(lambda: list_groups(task.needs(), listed))
    planned = task.plan(led.limits.mode, led.limits.values)
    frames = declared_frames(task.needs(), sources, data) if sources and hasattr(task, "check_inputs") else None
    if frames is not None:  # the task's own check, on the declared schemas (sql's types)
        check_task_inputs(task, frames, planned)
    events = list(planned.events)
    refused = ledger.refusal(led, events)
    if refused is not None:
        refused = _with_hint(task, refused, payer)
    return Planned(task.describe(planned), events, refused)


def check_dry_run_inputs(task: Task[P], sources: Sources) -> tuple[pl.Schema, str] | None:
    """What a dry run checks of the inputs without reading a record (public: schemas and headers), as the
    release would check it before its debit: the data's columns and their declared types, the lists' headers.
    The data's declared schema and format (None: it declares none, or is not there yet)."""
    needs = task.needs()
    data = check_data_schema(needs, sources)
    check_list_headers(needs, sources)
    return data


def _with_hint(task: Task[P], refused: str, payer: LedgerRef) -> str:
    """A refusal, with what the task could do within the ledger's budget if it says (a margin target's
    best reachable margin: :meth:`dpcli.tasks.histogram.HistogramTask.budget_hint`)."""
    hint_of = getattr(task, "budget_hint", None)
    if hint_of is None:
        return refused
    led = ledger.read_ledger(existing_state_dir(payer.state_dir), payer.analyst, payer.lock_timeout)
    hint = hint_of(lambda events: ledger.refusal(led, events) is None)
    return f"{refused}; {hint}" if hint else refused


def run(
    task: Task[P],
    sources: Sources,
    payer: LedgerRef,
    *,
    output: Output | None = None,
    engine: EngineRequest | None = None,
    early: EarlyInput | None = None,
    busy: Busy = lambda what: nullcontext(),
    continuation: Continuation | None = None,
) -> Release:
    """The one path of a release (see the module docstring); the charged release, not yet written."""
    task.check()
    led = ledger.read_ledger(existing_state_dir(payer.state_dir), payer.analyst, payer.lock_timeout)
    task = task.for_ledger(led.limits.mode)
    if continuation is not None and continuation.schedule is not None:
        # each run's ε comes from the schedule: validated now, planned per run
        scheduled = _schedulable(task)
        scheduled.check_schedulable()
        opened, bounder = _open_checked(task, sources, payer, output, continuation, engine, early)
        return _scheduled(scheduled, opened, bounder, payer, led.limits, continuation, output, busy)
    # refuse a bad query, or one this ledger can never pay, before reading data
    planned = task.plan(led.limits.mode, led.limits.values)
    ledger.check_payable(led, list(planned.events))
    opened, bounder = _open_checked(task, sources, payer, output, continuation, engine, early)
    if continuation is not None and continuation.stream_state is not None:
        from dpcli.release.streams import run_stream_state

        return run_stream_state(task, opened, bounder, payer, led.limits.mode, planned, continuation, output, busy)
    paid: list[ledger.Receipt] = []

    def debit(seed: ReleaseSeed, events: list[PrivacyEvent]) -> None:
        verify_unchanged(*opened.tables)  # a file changed since it was hashed: refused before the debit
        try:
            paid.append(ledger.debit(payer.state_dir, payer.analyst, command=task.command, query_id=seed.query_id,
                                     seed_id=seed.id, events=events, lock_timeout=payer.lock_timeout,
                                     summary=f"{task.command}: {ledger.DEBIT_SUMMARY}"))
        except BudgetError as exc:
            raise BudgetError(_with_hint(task, exc.detail, payer), field=exc.field, fix=exc.fix) from None

    try:
        prepared = prepare(task, planned, led.limits.mode, opened, payer.state_dir, bounder, busy, before_run=debit)
        result_line = task.summary(opened.data.name, prepared.result)
        made = prepared.prepared
        done = charge(payer, task.command, made, result_line, inputs=opened.tables,
                      output_digest=output.digest(made.table, made.metadata, made.times) if output else None,
                      completes=None if paid[0].replay else paid[0].seq)
    except DpcliError as exc:
        if paid:  # it failed once reading had begun: say what it cost (a public fact: it reached the debit)
            same_bytes = bounder is None and not isinstance(exc, InputMissingError)  # Spark, a changed file: new
            exc.detail += "; the run is charged (it had begun reading)" + (
                ", and a rerun on the same input is a free replay" if same_bytes else "")
        raise
    return replace(done, notes=tuple(task.notes(planned, prepared.result)))


def _schedulable(task: Task[P]) -> SchedulableTask[P]:
    from dpcli.tasks import SchedulableTask

    assert isinstance(task, SchedulableTask), task.command  # the CLI offers --schedule to histogram and topk
    return task


def _open_checked(task: Task[P], sources: Sources, payer: LedgerRef, output: Output | None,
                  continuation: Continuation | None, request: EngineRequest | None,
                  early: EarlyInput | None) -> tuple[Opened, Engine | None]:
    """The output path checked (never over the state, an input or the stream's state file), then the
    inputs opened (:func:`_open`)."""
    extra = (str(continuation.stream_state),) if continuation and continuation.stream_state else ()
    if output is not None:
        check_output_path(output.path, payer.state_dir, (*sources.locations, *extra))
    return _open(task, sources, payer, request, early)


def _open(task: Task[P], sources: Sources, payer: LedgerRef, request: EngineRequest | None,
          early: EarlyInput | None) -> tuple[Opened, Engine | None]:
    """The engine checked (before anything is read), the inputs opened, and the engine that bounds them."""
    if request is None:
        return open_sources(task.needs(), sources, early=early), None
    from dpcli.spark.engine import bounding_engine, check_engine, open_spark_input

    choice = check_engine(request, sources.data)
    listed = open_spark_input(payer.state_dir, choice, sources.data)
    opened = open_sources(task.needs(), sources, early=early, data=listed)
    others = {role: table for role, (table, _) in opened.lists.items()}
    engine = bounding_engine(payer.state_dir, choice, opened.data,
                             csv_delimiter(sources.data.delimiter, sources.data.location), others)
    if engine is not None and engine.precheck is not None:
        engine.precheck(task)
    return opened, engine


@dataclass(frozen=True)
class Computed:
    """A task's result and the uncharged release made of it."""

    result: Result
    prepared: Prepared


#: ``before_run(seed, events)``: called once the seed is known and before the task reads its first record
#: (the debit of :func:`run`; a schedule's check of its run's cost).
BeforeRun = Callable[[ReleaseSeed, list[PrivacyEvent]], None]


def prepare(task: Task[P], planned: P, mode: str, opened: Opened, state_dir: Path, engine: Engine | None,
            busy: Busy = lambda what: nullcontext(), before_run: BeforeRun | None = None) -> Computed:
    """Seed and run ``task`` on the opened inputs: the release in memory, not yet recorded as done.

    Nothing before ``before_run`` reads a record: the inputs are opened (their bytes hashed, their
    schema and any public list read) but not parsed."""
    task.check_lists({role: frame for role, (_, frame) in opened.lists.items()})  # public: refused before any debit
    check_task_inputs(task, opened.frames(counted=False), planned)  # the schemas (sql types): refused before a debit
    seed = release_seed(state_dir, task_material(task), opened.seed_inputs, Calibration(mode, planned), engine,
                        opened.reads)
    if before_run is not None:
        before_run(seed, list(planned.events))
    with busy(f"computing the {task.command} release of {opened.data.name}"):
        result = task.run(opened.frames(), planned, seed.seed, engine)
    return Computed(result, Prepared(seed, list(planned.events), result.table, result.metadata, result.actual,
                                     result.times))


def _scheduled(task: SchedulableTask[P], opened: Opened, engine: Engine | None, payer: LedgerRef, limits: Limits,
               continuation: Continuation, output: Output | None, busy: Busy) -> Release:
    """One run of a ``--schedule`` (:func:`dpcli.release.schedules.run_scheduled`): each run's ε from the
    schedule, in pure mode for top-k (its accounting per run) and the ledger's mode for a histogram."""
    from fractions import Fraction

    from dpcli import advice
    from dpcli.release import schedules
    from dpcli.tasks import Result

    spec = continuation.schedule
    assert spec is not None
    mode = getattr(task, "scheduled_mode", None) or limits.mode

    def run_at(epsilon: Fraction, kept: dict[str, Any] | None, before_run: BeforeRun) -> Prepared:
        run_task = scheduled_run(task, epsilon, kept)
        return prepare(run_task, run_task.plan(mode, limits.values), mode, opened, payer.state_dir, engine,
                       busy, before_run).prepared

    query = task.schedule_query(opened.fingerprints)
    digest = output.digest if output is not None else None
    done = schedules.run_scheduled(payer.state_dir, payer.analyst, task.command, spec, query, opened.data, run_at,
                                   payer.lock_timeout, digest, continuation.through)
    run_eps = Fraction(done.report["schedule"]["run_epsilon"])
    label = done.report["schedule"]
    auto = done.report.get("auto")
    run_task = scheduled_run(task, run_eps, schedules.chosen_bounds(auto) if auto and auto.get("kept") else None)
    notes = [*run_task.notes(run_task.plan(mode, limits.values), Result(done.table, done.report)),
             advice.small_run_epsilon(float(run_eps), float(spec.total_epsilon), spec.scheduler),
             advice.schedule_backfill(label), advice.schedule_repeat(label),
             advice.improver_c_without_gain(label["scheduler"], float(label.get("c", 0))),
             advice.improver_counts_runs(label.get("made_with_index"))]
    return replace(done, notes=tuple(n for n in notes if n is not None))


def scheduled_run(task: SchedulableTask[P], epsilon: Fraction, kept: dict[str, Any] | None) -> SchedulableTask[P]:
    """The task of one run of a schedule: at the run's ε and, once the schedule's first run has chosen its
    ``auto`` bounds (``kept``, from the schedule's state), at those bounds (the task's ``keeping``)."""
    run_task = task.at_epsilon(epsilon)
    if kept is None:
        return run_task
    keeping = getattr(run_task, "keeping", None)
    assert keeping is not None, task.command  # a state keeps bounds only of a task whose runs chose them
    return cast("SchedulableTask[P]", keeping(kept))


def charge(
    payer: LedgerRef,
    command: str,
    prepared: Prepared,
    summary_line: str,
    *,
    step: ledger.Step | None = None,
    before_output: Callable[[], None] | None = None,
    inputs: Sequence[InputTable | None] = (),
    output_digest: str | None = None,
    completes: int | None = None,
    reserved: Sequence[PrivacyEvent] = (),
) -> Release:
    """Debit ``prepared`` (free if this seed was already released) and report; nothing is written here.

    ``inputs`` (the tables the release read) are first checked to be unchanged since they were
    hashed: a file rewritten while it was read is refused (exit 66) with no debit.

    With ``step`` the release is a run against a stream's or schedule's state file, paid by its
    reservation (which ``step.create`` debits on the first run: the report then says
    ``"charged": true`` and lists it as ``reserved``). ``before_output`` runs after the debit (the
    state file's own write: ledger first, so a crash in between is retried as a free exact repeat).
    ``output_digest``: the digest of the file the release is about to be written to, recorded in the
    ledger entry (``dpcli plot`` in service mode draws only files whose digest a ledger holds).

    ``completes``: the entry that debited this release before it read any data (:func:`ledger.debit`):
    the entry written now records its completion at no cost, and the release stays charged its
    reserve (a run that began reading pays whatever it would have found). ``reserved``: the
    reservation a stream's or schedule's first run made before reading (:func:`ledger.reserve`).
    A file rewritten while read is then refused (exit 66) after the debit: the run read data, so it
    stays charged, and nothing is written.
    """
    verify_unchanged(*inputs)
    receipt = ledger.charge(payer.state_dir, payer.analyst, command=command, query_id=prepared.seed.query_id,
                            seed_id=prepared.seed.id, reserve=prepared.events, actual=prepared.actual,
                            summary=summary_line, lock_timeout=payer.lock_timeout, step=step, output=output_digest,
                            completes=completes)
    if reserved:
        receipt = replace(receipt, reserved=tuple(reserved))
    if before_output is not None:
        before_output()
    charged = prepared.actual if prepared.actual is not None and completes is None else prepared.events
    report = {
        **prepared.metadata,
        "cost": [] if step else [e.to_json() for e in charged],
        "charged": not receipt.replay and (step is None or bool(receipt.reserved)),
        "seed_id": prepared.seed.id,
        "ledger": {**receipt.to_json(), "remaining": receipt.remaining},
    }
    if receipt.reserved:
        report["reserved"] = [e.to_json() for e in receipt.reserved]
    remaining = parameters_text(report["ledger"]["remaining"], "down")  # (the report keeps them exact)
    return Release(prepared.table, report,
                   f"{summary_line}; {_cost_line(receipt, step, charged)}; remaining {remaining}",
                   times=prepared.times)


def _cost_line(receipt: ledger.Receipt, step: ledger.Step | None, charged: list[PrivacyEvent]) -> str:
    """What the charge was, in words: a free replay, a reservation made now, a step it covers, or a debit."""
    if receipt.replay:
        return "free replay of an earlier identical release"
    if receipt.reserved:
        return "reserved " + cost_text(list(receipt.reserved)) + ", which covers this run"
    if step:
        return "covered by the reservation"
    return "charged " + cost_text(charged)


def cost_text(events: list[PrivacyEvent]) -> str:
    """``mechanism (epsilon=…, delta=…) + …``: a release's cost in one line, its ε, δ and ρ rounded up to 4
    significant digits (:func:`dpcli.core.display.parameters_text`)."""
    parts = []
    for e in events:
        figures = {k: v for k, v in e.to_json().items() if k in ("epsilon", "delta", "rho", "units", "calls")}
        parts.append(f"{e.mechanism} ({parameters_text(figures, 'up')})")
    return " + ".join(parts)
