"""The steps every kind of release shares, and the protocol its kinds implement (:class:`Continuation`).

A release is one of three continuations of the same path (:func:`dpcli.release.run`): one release paid by
itself (:class:`dpcli.release.plain.OneRelease`), a run of a ``--schedule`` paid by the schedule's
reservation (:class:`dpcli.release.scheduled.Scheduled`), or a run of a stream kept in a ``--state`` file
paid by the stream's (:class:`dpcli.release.stream_runs.StreamRuns`). Each plans its runs (a dry run) and
runs them with the steps here: :func:`prepare` seeds a task and runs it (:meth:`dpcli.tasks.Task.run`),
:func:`charge` debits it and reports, and nothing is written before :func:`charge` returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl

from dpcli.core.display import parameters_text
from dpcli.core.events import PrivacyEvent
from dpcli.io.outputs import output_compression, render
from dpcli.io.tables import InputTable, fingerprint_bytes, verify_unchanged
from dpcli.release.inputs import Opened, Sources, check_data_schema, check_list_headers, check_task_inputs
from dpcli.release.seeds import Calibration, ReleaseSeed, release_seed, task_material
from dpcli.state import ledger
from dpcli.state.paths import existing_state_dir

if TYPE_CHECKING:
    from dpcli.advice import Note
    from dpcli.core.accounting.budget import Limits
    from dpcli.tasks import Engine, P, Result, Task
    from dpcli.tasks.dry_runs import DryRun
    from dpcli.tasks.reports import Report

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

    def digest(self, table: pl.DataFrame, metadata: Report, times: tuple[str, ...] = ()) -> str | None:
        """The digest of the file the release is about to be written to (None for standard output): the bytes
        written, compressed for a ``.gz`` name (``times``: :attr:`Release.times`)."""
        if not self.to_file:
            return None
        return fingerprint_bytes(render(table, self.format, grid_step(metadata), output_compression(self.path),
                                        times))


def grid_step(report: Mapping[str, Any]) -> float | None:
    """The grid released values were snapped to (it sets how floats are rounded in text outputs)."""
    from fractions import Fraction

    return float(Fraction(report["granularity"])) if report.get("granularity") else None


@dataclass(frozen=True)
class Prepared:
    """A task's :class:`~dpcli.tasks.Result` seeded and costed, not yet charged: its seed, the events it reserves,
    and the result (its table, public metadata, what it really cost if less, its columns of moments).

    Its table must not leave the process before :func:`charge` has debited it (only a charged
    :class:`Release` is ever handed out).
    """

    seed: ReleaseSeed
    events: list[PrivacyEvent]
    result: Result

    @property
    def table(self) -> pl.DataFrame:
        return self.result.table

    @property
    def metadata(self) -> Report:
        """The task's report (:mod:`dpcli.tasks.reports`)."""
        return self.result.metadata

    @property
    def actual(self) -> list[PrivacyEvent] | None:
        """What it really cost, if less than :attr:`events` (topk's ⊥)."""
        return self.result.actual

    @property
    def times(self) -> tuple[str, ...]:
        """Columns of moments dpcli computed (:attr:`dpcli.tasks.Result.times`)."""
        return self.result.times


@dataclass(frozen=True)
class Release:
    """A charged release: the noisy table, the report of what was charged and what is left, one line
    for people, the notes that change how to read it, and the table's columns of moments dpcli computed
    (shown as ISO 8601 with ``Z``: :func:`dpcli.io.outputs.shown`)."""

    table: pl.DataFrame
    report: Report
    summary: str
    notes: tuple[Note, ...] = ()
    times: tuple[str, ...] = ()


@dataclass(frozen=True)
class Planned:
    """A dry run: the plan described (public inputs only; typed, :mod:`dpcli.tasks.dry_runs`), its cost, and
    whether the ledger would accept it."""

    description: DryRun
    events: list[PrivacyEvent]
    refusal: str | None = None



@dataclass(frozen=True)
class Admitted:
    """A task a continuation has admitted (:meth:`Continuation.admit`): the task at the ledger's defaults, the
    ledger's limits, and its plan when the continuation plans once for the whole run (None: a schedule, whose
    runs are each planned at the ε the schedule gives them)."""

    task: Task[Any]
    limits: Limits
    planned: Any = None


class Continuation(Protocol):
    """What a run of :func:`dpcli.release.run` is part of, and so what pays for it and what is kept between runs:
    one release (:class:`dpcli.release.plain.OneRelease`, the default), a run of a schedule
    (:class:`dpcli.release.scheduled.Scheduled`) or of a stream kept in a state file
    (:class:`dpcli.release.stream_runs.StreamRuns`). :func:`dpcli.release.run` calls :meth:`admit`, opens the
    inputs and calls :meth:`run`; :func:`dpcli.release.plan` calls :meth:`plan`."""

    def guarded(self) -> tuple[str, ...]:
        """Paths besides the state directory and the inputs that the output must never overwrite."""
        ...

    def admit(self, task: Task[Any], led: ledger.Ledger) -> Admitted:
        """Refuse, before any input is opened, what this run can never do (a query no schedule runs, a cost the
        ledger can never pay); ``task`` is at the ledger's defaults already."""
        ...

    def run(self, admitted: Admitted, opened: Opened, engine: Engine | None, payer: LedgerRef,
            output: Output | None, busy: Busy) -> Release:
        """The run on the opened inputs, charged (nothing written yet)."""
        ...

    def plan(self, task: Task[Any], payer: LedgerRef, sources: Sources | None, runs: int | None) -> Planned:
        """``--dry-run``: the next ``runs`` runs (the continuation's default when None) planned from public
        inputs, their cost and whether the ledger accepts them; reads no record, charges nothing."""
        ...


def check_dry_run_inputs(task: Task[P], sources: Sources) -> tuple[pl.Schema, str] | None:
    """What a dry run checks of the inputs without reading a record (public: schemas and headers), as the
    release would check it before its debit: the data's columns and their declared types, the lists' headers.
    The data's declared schema and format (None: it declares none, or is not there yet)."""
    needs = task.needs()
    data = check_data_schema(needs, sources)
    check_list_headers(needs, sources)
    return data


def with_hint(task: Task[P], refused: str, payer: LedgerRef) -> str:
    """A refusal, with what the task could do within the ledger's budget if it says (a margin target's
    best reachable margin: :meth:`dpcli.tasks.Task.budget_hint`). The ledger is read again only if the task asks
    (a task without a hint adds no wait on the ledger's lock to its refusal)."""
    read: list[ledger.Ledger] = []

    def pays(events: list[PrivacyEvent]) -> bool:
        if not read:
            read.append(ledger.read_ledger(existing_state_dir(payer.state_dir), payer.analyst, payer.lock_timeout))
        return ledger.refusal(read[0], events) is None

    hint = task.budget_hint(pays)
    return f"{refused}; {hint}" if hint else refused


#: ``before_run(seed, events)``: called once the seed is known and before the task reads its first record
#: (the debit of :func:`run`; a schedule's check of its run's cost).
BeforeRun = Callable[[ReleaseSeed, list[PrivacyEvent]], None]


def prepare(task: Task[P], planned: P, mode: str, opened: Opened, state_dir: Path, engine: Engine | None,
            busy: Busy = lambda what: nullcontext(), before_run: BeforeRun | None = None) -> Prepared:
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
    return Prepared(seed, list(planned.events), result)



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
                            completes=completes, report=_as_json(prepared.metadata) if output_digest else None)
    if reserved:
        receipt = replace(receipt, reserved=tuple(reserved))
    if before_output is not None:
        before_output()
    charged = prepared.actual if prepared.actual is not None and completes is None else prepared.events
    report = prepared.metadata.copy()  # the task's report and what the charge says of it (reports.ReportBase)
    report.update({
        "cost": [] if step else [e.to_json() for e in charged],
        "charged": not receipt.replay and (step is None or bool(receipt.reserved)),
        "seed_id": prepared.seed.id,
        "ledger": {**receipt.to_json(), "remaining": receipt.remaining},
    })
    if receipt.reserved:
        report["reserved"] = [e.to_json() for e in receipt.reserved]
    remaining = parameters_text(report["ledger"]["remaining"], "down")  # (the report keeps them exact)
    return Release(prepared.table, report,
                   f"{summary_line}; {_cost_line(receipt, step, charged)}; remaining {remaining}",
                   times=prepared.times)


def _as_json(report: Mapping[str, Any]) -> dict[str, Any]:
    """``report`` as the ``--json`` summary prints it (numbers as JSON numbers, anything else as text), for the
    ledger entry of a file written with ``-o`` (``dpcli diff`` reads a file's calibration there)."""
    doc: dict[str, Any] = json.loads(json.dumps(report, default=str))
    return doc


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
