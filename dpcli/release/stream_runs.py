"""A run of a stream kept in a ``--state`` file, or of one without: the :class:`~dpcli.release.steps.Continuation`
of ``stream-replay``. With a state file the stream's first run reserves its whole (ε, δ) and every later run is
a step of that reservation (:mod:`dpcli.release.streams` keeps the state); without one each run over new data
is one release (:class:`dpcli.release.plain.OneRelease`). Both are planned here (``--dry-run``): the margin at
each trigger, the triggers the next run executes and what the next runs cost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpcli.core.accounting.budget import ChargeRefused
from dpcli.core.display import utc_text
from dpcli.errors import UsageError
from dpcli.release.inputs import check_task_inputs, declared_frames
from dpcli.release.plain import OneRelease
from dpcli.release.seeds import Calibration, ReleaseSeed
from dpcli.release.steps import Admitted, Planned, Prepared, charge, check_dry_run_inputs
from dpcli.release.streams import NewRun, StateInput, as_utc, last_end, open_body, state_run
from dpcli.state import ledger
from dpcli.state.paths import existing_state_dir
from dpcli.tasks import Result
from dpcli.tasks.stream.algorithm import TIME_COLUMNS, naive_utc, trigger_through
from dpcli.tasks.stream.auto import StreamChoice, chosen_line, resolve
from dpcli.tasks.stream.query import StreamQuery
from dpcli.tasks.stream.task import StreamTask

if TYPE_CHECKING:
    from dpcli.core.events import PrivacyEvent
    from dpcli.release.inputs import Opened, Sources
    from dpcli.release.steps import Busy, LedgerRef, Output, Release
    from dpcli.tasks import Engine, Task
    from dpcli.tasks.dry_runs import StreamStanding


@dataclass(frozen=True)
class StreamRuns:
    """Runs of a stream: kept in the state file ``state`` (None: each run is one release), ``label`` the name its
    lines give the state (``--state NAME`` in service mode; default its path), ``through`` the run's public
    run-until moment (None: now)."""

    state: Path | None = None
    label: str = ""
    through: datetime | None = None

    def guarded(self) -> tuple[str, ...]:
        """The state file: never an output."""
        return (str(self.state),) if self.state is not None else ()

    def admit(self, task: Task[Any], led: ledger.Ledger) -> Admitted:
        """The plan, made once (a stream's whole (ε, δ)); refused before any input is opened if the ledger can
        never pay it. Only a stream runs against a state file."""
        if self.state is not None and not isinstance(task, StreamTask):
            raise UsageError(f"{task.command} does not run against a --state file")
        return OneRelease().admit(task, led)

    def run(self, admitted: Admitted, opened: Opened, engine: Engine | None, payer: LedgerRef,
            output: Output | None, busy: Busy) -> Release:
        """Without a state file, one release; with one, a run of the stream (:meth:`_state_run`)."""
        if self.state is None:
            return OneRelease().run(admitted, opened, engine, payer, output, busy)
        return self._state_run(admitted, self.state, opened, engine, payer, output, busy)

    def _state_run(self, admitted: Admitted, state: Path, opened: Opened, engine: Engine | None, payer: LedgerRef,
                   output: Output | None, busy: Busy) -> Release:
        """One cron run of ``stream-replay --state`` (the release path's persisted form): lock the state, run
        the new triggers through the task (:meth:`dpcli.tasks.Task.run`, fed the stream its state holds), charge
        the run as a step of the stream's reservation, save the state.

        A new stream's seed binds its query, a fresh reservation id and the calibration
        (:func:`dpcli.release.seeds.stream_seed`); it has no inputs (it is made once, for every run): each run's
        input, with its reading, is bound by the run's digest in the ledger. The last run's input again (a retry)
        returns its rows again, free, and is recorded in the ledger as a replay of that run's step."""
        task, planned = admitted.task, admitted.planned
        assert isinstance(task, StreamTask)  # (admitted)
        frames = opened.frames()
        check_task_inputs(task, frames, planned)  # the value column's type, before the reservation
        table = opened.data
        data = StateInput(table.frame, table.fingerprint, table.name, engine.stream_events if engine else None,
                          reading=table.reading_material())
        label = self.label or str(state)
        with state_run(state, task, planned, data, analyst=payer.analyst, state_dir=payer.state_dir,
                       lock_timeout=payer.lock_timeout, calibration=Calibration(admitted.limits.mode, planned),
                       through=self.through, unchanged=table.verify_unchanged) as begun:
            if isinstance(begun, NewRun):
                with busy(f"feeding {table.name} to {label}"):
                    run = begun.finish(begun.task.run(frames, begun.plan, begun.seed, engine))
                rows = run.table
                line = (f"stream-replay of {table.name} into {label}: {run.metadata['releases']} release row(s), "
                        f"triggers run through {run.metadata['through']}{chosen_line(run.metadata)}")
            else:
                run = begun
                assert run.plan is not None
                rows = task.margins(run.table, run.plan, run.query)
                line = f"stream-replay of {table.name} into {label}: a retry of the last run, its rows again"
            prepared = Prepared(ReleaseSeed(b"", run.run_id, run.reservation), list(planned.events),
                                Result(rows, run.metadata, times=TIME_COLUMNS))
            done = charge(payer, "stream-replay --state", prepared, line, step=run.step, inputs=(table,),
                          before_output=None if run.repeat else run.save,
                          output_digest=output.digest(rows, run.metadata, TIME_COLUMNS) if output is not None else None,
                          reserved=run.reserved)
            return replace(done, notes=run.notes)

    def plan(self, task: Task[Any], payer: LedgerRef, sources: Sources | None, runs: int | None) -> Planned:
        """``--dry-run`` of ``stream-replay``, with or without ``--state``: the calibration and the 95% margin
        at each trigger (:func:`dpcli.tasks.stream.plan.margins95_by_trigger`), the triggers the next run
        executes, the cost of each of the next ``runs`` runs and their total, and whether the ledger accepts
        it. Reads no record and writes nothing (a state file is only read: its public part decides; with
        ``sources``, the data's schema is checked as a run checks it: :func:`dpcli.release.steps.check_dry_run_inputs`).

        Without a state file each run over new data is a new release, charged in full; with it the first
        run reserves the stream's whole (ε, δ) and every later run (and trigger) is covered by it.
        """
        if not isinstance(task, StreamTask):
            if self.state is not None:  # as a run refuses it (:meth:`admit`)
                raise UsageError(f"{task.command} does not run against a --state file")
            return OneRelease().plan(task, payer, sources, None)
        state, runs = self.state, runs or 1
        data = check_dry_run_inputs(task, sources) if sources is not None else None
        led = ledger.read_ledger(existing_state_dir(payer.state_dir), payer.analyst, payer.lock_timeout)
        planned = task.plan(led.limits.mode, led.limits.values)
        frames = declared_frames(task.needs(), sources, data) if sources is not None else None
        if frames is not None:
            check_task_inputs(task, frames, planned)  # the value column's declared type
        events = list(planned.events)
        q = task.query
        moment = as_utc(task.through)
        through = trigger_through(moment, q.step)
        body: dict[str, Any] = {}
        if state is None:
            costs, refusal = [events] * runs, ledger.refusal(led, events * runs)
            standing: StreamStanding = {"state": None, "triggers": {"through": utc_text(naive_utc(through * q.step))}}
        else:
            body, _ = open_body(state, q, payer.analyst, None, payer.state_dir, payer.lock_timeout, None)
            covered, refusal = _covered(led, body, events, f"state file {state}")
            costs = [[] if covered is not None else events] + [[] for _ in range(runs - 1)]
            standing = {"state": str(state), "runs_recorded": body["step"], "covered_by": covered,
                        "triggers": _next_triggers(body, moment, q)}
        standing["runs"] = [{"run": i + 1, "cost": [e.to_json() for e in c]} for i, c in enumerate(costs)]
        standing["spend"] = _total(led, costs)
        described = task.describe(planned)
        if "auto" in body:  # the stream's bounds were chosen: its margins are known
            run_q, run_plan = resolve(q, planned.events, StreamChoice.from_json(body["auto"]))
            described = replace(task, query=run_q).describe(run_plan)
            described["auto"] = body["auto"]
        described["stream"] = standing
        return Planned(described, costs[0], refusal)


def _covered(led: ledger.Ledger, body: dict[str, Any], events: list[PrivacyEvent],
             label: str) -> tuple[int | None, str | None]:
    """A dry run's view of a state file against the ledger: (the entry of the reservation that covers
    its next run, or None if that run reserves; why the ledger would refuse the run, or None)."""
    entry = led.reservation(body["reservation"]) if body.get("reservation") else None
    if entry is None:
        if body["step"]:
            return None, (f"{label} is not recorded in analyst {led.analyst!r}'s ledger (state from another "
                          "ledger, or the ledger restored from an older backup)")
        return None, ledger.refusal(led, events)
    recorded = len(led.steps(entry["seq"]))
    if recorded != body["step"]:
        return None, (f"{label} is at run {body['step']} but the ledger recorded {recorded}: an older copy, or "
                      "a ledger restored from an older backup; use the newest copies")
    if entry.get("period", 0) != led.period(datetime.now(UTC)):
        return None, f"analyst {led.analyst!r}: the reservation of {label} is not in this ledger period"
    seq: int = entry["seq"]
    return seq, None


def _next_triggers(body: dict[str, Any], moment: datetime, q: StreamQuery) -> dict[str, Any]:
    """The triggers the next run would execute (public: its ``--through`` and the last run's)."""
    through = trigger_through(moment, q.step)
    out: dict[str, Any] = {"through": utc_text(naive_utc(through * q.step)),
                           "next": utc_text(naive_utc((through + 1) * q.step))}
    watermark = (body.get("stream") or {}).get("watermark")
    if watermark is not None:
        out.update(after=utc_text(naive_utc(watermark * q.step)), count=max(0, through - watermark))
    last = body.get("last")
    if last:
        end = last_end(last, q)
        out.update(last_run_end=utc_text(end), new_input_accepted=moment > end)
    return out


def _total(led: ledger.Ledger, costs: list[list[PrivacyEvent]]) -> dict[str, Any] | None:
    """What the runs would spend together in the ledger's terms (None when its mode cannot pay them: the
    ledger's refusal says why)."""
    try:
        total = None
        for c in costs:  # charge by charge, as the ledger composes them (a pld ledger: one block each)
            total = led.accountant.spend(c, total)
        return led.accountant.spent_json(total or led.accountant.spend([]))
    except ChargeRefused:
        return None
