"""The one path of a release: check → the ledger's defaults → admit → check the output → open → run, and its dry
run, for every command and every continuation (:class:`~dpcli.release.steps.Continuation`).

What pays and what is kept between runs is the continuation's: one release
(:class:`~dpcli.release.plain.OneRelease`, the default) is debited once its seed is known and before its first
private record is read, then computed in memory, then its completion is recorded with its output's digest,
and only then may anything be written (:class:`~dpcli.release.steps.Release` is handed back charged; the caller
writes it). A run of a ``--schedule`` (:class:`~dpcli.release.scheduled.Scheduled`) or of a stream kept in a
``--state`` file (:class:`~dpcli.release.stream_runs.StreamRuns`) differs only in what pays (a reservation,
debited before its first run reads anything; each run is then recorded as a step of it) and what is kept.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

from dpcli.io.inputs import csv_delimiter
from dpcli.io.outputs import check_output_path
from dpcli.release.inputs import open_sources
from dpcli.release.plain import OneRelease
from dpcli.state import ledger
from dpcli.state.paths import existing_state_dir

if TYPE_CHECKING:
    from dpcli.io.opening import EarlyInput, EarlyInputs
    from dpcli.release.inputs import Opened, Sources
    from dpcli.release.steps import Busy, Continuation, LedgerRef, Output, Planned, Release
    from dpcli.spark.engine import EngineRequest
    from dpcli.tasks import Engine, P, Task


def plan(task: Task[P], payer: LedgerRef, sources: Sources | None = None, *,
         continuation: Continuation | None = None, runs: int | None = None) -> Planned:
    """``--dry-run``: the continuation's next ``runs`` runs planned (one release by default: the task's plan
    against the ledger's mode and limits), their cost and whether the ledger would accept them now. Reads no
    record (with ``sources``, the data's schema and the public lists' headers, refused as the release would
    refuse them), charges nothing."""
    task.check()
    return (continuation or OneRelease()).plan(task, payer, sources, runs)


def run(
    task: Task[P],
    sources: Sources,
    payer: LedgerRef,
    *,
    output: Output | None = None,
    engine: EngineRequest | None = None,
    early: EarlyInput | EarlyInputs | None = None,
    busy: Busy = lambda what: nullcontext(),
    continuation: Continuation | None = None,
) -> Release:
    """The one path of a release (see the module docstring); the charged release, not yet written."""
    how = continuation or OneRelease()
    task.check()
    led = ledger.read_ledger(existing_state_dir(payer.state_dir), payer.analyst, payer.lock_timeout)
    admitted = how.admit(task.for_ledger(led.limits.mode), led)  # a bad query, or one never payable: before any read
    if output is not None:  # never over the state, an input or a stream's state file
        check_output_path(output.path, payer.state_dir, (*sources.locations, *how.guarded()))
    opened, bounder = _open(admitted.task, sources, payer, engine, early)
    return how.run(admitted, opened, bounder, payer, output, busy)


def _open(task: Task[P], sources: Sources, payer: LedgerRef, request: EngineRequest | None,
          early: EarlyInput | EarlyInputs | None) -> tuple[Opened, Engine | None]:
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
