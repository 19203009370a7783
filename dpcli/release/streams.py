"""A stream kept in a state file between runs (``stream-replay --state``): the release path's persisted form.

Each run's input holds the events not fed before. They and the events the state kept run in
every trigger up to the run's ``--through`` (default now); events of later triggers are kept in
the state until their trigger runs, whatever ``--through`` or the cron minute; only late events
(their trigger already ran) are dropped. The last run's input again is a retry: the rows that
run released, free (never other rows over the published ones); another input must end after the
last run, or it would rewrite a released run (refused: a late correction is a new release).

The state is bound to the ledger (:class:`dpcli.state.ledger.Step`): it
carries a random reservation id and its step (runs recorded); a run is
accepted at the ledger's latest step, or as an exact repeat of a recorded
step (same step, same input and ``through``: the same rows and the same state,
kept events included, free). A forked, rolled back or foreign copy is refused
(exit 78), so the stream's seed and noise never meet other data, and kept
events are never fed twice. Order: a new stream's state (step 0) on disk and
its whole (ε, δ) reserved in the ledger, before any record is read; compute in
memory; then the caller records the run as a step of the reservation, saves the
state (:meth:`StateRun.save`) and writes the output: :mod:`dpcli.release.stream_runs`, which plans
the runs too (``--dry-run``).
"""
from __future__ import annotations

import base64
import io
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard, cast

import polars as pl

from dpcli.advice import Note
from dpcli.core.display import utc_text
from dpcli.core.events import PrivacyEvent
from dpcli.core.prf import NOISE_VERSION
from dpcli.errors import StateError, UsageError
from dpcli.release.seeds import Calibration, stream_seed
from dpcli.state import documents, ledger
from dpcli.tasks import Result
from dpcli.tasks.reports import StreamReport
from dpcli.tasks.stream import notes as notes_of
from dpcli.tasks.stream.algorithm import StreamState, naive_utc, trigger_through
from dpcli.tasks.stream.auto import StreamChoice, choose, resolve
from dpcli.tasks.stream.events import EventsEngine
from dpcli.tasks.stream.plan import PendingPlan, StreamPlan
from dpcli.tasks.stream.query import StreamQuery
from dpcli.tasks.stream.run import StreamFeed, StreamRelease
from dpcli.tasks.stream.state import (
    STATE_KIND,
    check_state_body,
    key_schema_of,
    load_state,
    new_state_body,
    state_body,
)
from dpcli.tasks.stream.task import StreamTask


@dataclass(frozen=True)
class StateInput:
    """The input a run feeds to the stream: its frame, its content fingerprint, its name (for messages),
    the engine that bounds its events (None: polars) and how its bytes were read
    (:meth:`dpcli.io.tables.InputTable.reading_material`; None only for states' older runs)."""

    frame: pl.LazyFrame
    fingerprint: str
    name: str
    engine: EventsEngine | None = None
    reading: dict[str, Any] | None = None


@dataclass
class StateRun:
    """One run against a state file, computed in memory: a retry (free) or new rows to charge.

    The caller debits ``step`` under ``run_id`` and ``reservation``: for a new run, its ``create``
    reserves the stream's whole (ε, δ) on the first run and :meth:`save` writes the new state
    before the output; a retry's step repeats the recorded one (free, in the history as a replay).
    ``notes``: why nothing was released, a retry (public inputs only).
    """

    path: Path
    table: pl.DataFrame
    metadata: StreamReport
    repeat: bool
    run_id: str = ""
    reservation: str = ""
    step: ledger.Step | None = None
    new_body: dict[str, Any] | None = None
    notes: tuple[Note, ...] = ()
    query: StreamQuery | None = None  # at the stream's chosen bounds (``auto``; None: the task's)
    plan: StreamPlan | None = None  # its calibration (None: the task's)
    reserved: tuple[PrivacyEvent, ...] = ()  # the reservation this run debited before it read (a first run)

    def save(self) -> None:
        """Write the stream's new state (after the ledger charge, before the output)."""
        assert self.new_body is not None  # a new run's (a repeat saves nothing)
        documents.write(self.path, STATE_KIND, self.new_body)


def open_body(path: Path, q: StreamQuery, analyst: str, key_schema: dict[str, str] | None, state_dir: Path,
              lock_timeout: float, calibration: Calibration | None) -> tuple[dict[str, Any], bool]:
    """The checked body of the state file, or a fresh one (step 0, not yet on disk): (body, fresh).

    A fresh stream's seed is made here, once for every run (:func:`dpcli.release.seeds.stream_seed`: its query, a
    fresh reservation id and ``calibration``). ``key_schema`` None (a dry run: no data read) skips the check of
    the column types; ``calibration`` None (a dry run) makes a fresh body without a seed."""
    label = f"state file {path}"
    body = documents.read(path, STATE_KIND)
    if body is not None:
        if body.get("analyst") != analyst:  # a state moved to another analyst: bound to another ledger
            raise StateError(f"{label} belongs to analyst {body.get('analyst')!r}, not {analyst!r}")
        check_state_body(body, q, analyst, key_schema if key_schema is not None else body.get("key_schema", {}),
                         str(path))
        if not isinstance(body.get("reservation"), str) or not isinstance(body.get("step"), int):
            raise StateError(f"{label} was written by an older dpcli (not bound to the ledger); start a new one")
        return body, False
    if calibration is None:
        return {"step": 0, "last": None, "stream": None}, True
    rid = secrets.token_hex(12)
    seed = stream_seed(state_dir, q, rid, calibration)
    body = new_state_body(q, analyst, seed.seed, seed.id, key_schema or {},
                          datetime.now(UTC).isoformat(timespec="seconds"))
    body.update(reservation=rid, step=0, ledger_id=ledger.read_ledger(state_dir, analyst, lock_timeout).ledger_id)
    return body, True


def _parquet_text(table: pl.DataFrame) -> str:
    buf = io.BytesIO()
    table.write_parquet(buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _step_digest(seed: bytes, fingerprint: str, through: int, noise: int, reading: dict[str, Any] | None) -> str:
    """The ledger's digest of a run: its input and ``through``, (from noise v2 on) the noise
    definition, and (from issue 29 on) how the input was read.

    A run recomputed from an older copy of the state is free only as an exact repeat of a
    recorded run; the noise version in the digest makes a repeat under another noise definition
    (which would draw the run's new trees differently) a different run, refused as a fork, and the
    reading makes one over the same bytes read another way (other events) a different run too.
    Runs recorded before either existed keep their digest (``noise`` 1, ``reading`` None).
    """
    material: dict[str, Any] = {"input": fingerprint, "through": through}
    if noise != 1:
        material["noise"] = noise
    if reading is not None:
        material["reading"] = reading
    return ledger.step_digest(seed, material)


def _is_retry(last: dict[str, Any] | None, data: StateInput, label: str) -> TypeGuard[dict[str, Any]]:
    """Is this run a retry of the state's last run: the same input bytes (whatever ``--through``)?

    Its events were fed then, so feeding them again would count the kept ones twice. The same
    bytes read another way (format, delimiter) are refused: they are other events, and not new
    ones. A last run recorded before readings were kept (no ``reading``) is matched by its bytes.
    """
    if not last or last["input"] != data.fingerprint:
        return False
    if "reading" in last and last["reading"] != data.reading:
        raise UsageError(f"{label}: its last run read these same bytes another way (format or delimiter); a retry "
                         "must read them alike, and new events come in a new input")
    return True


def last_end(last: dict[str, Any], q: StreamQuery) -> datetime:
    """Where the last run ended: its ``--through`` (or now), or for a run of dpcli before issue 31 the end
    of its last trigger."""
    if "until" in last:
        return datetime.fromisoformat(last["until"])
    return naive_utc(int(last["through"]) * q.step).replace(tzinfo=UTC)


def _refuse_rewrite(last: dict[str, Any] | None, moment: datetime, q: StreamQuery, label: str) -> None:
    """A new input must end after the last run: one ending at or before it, with other bytes, would
    rewrite a run already released (public: the two ``--through`` moments)."""
    if not last:
        return
    end = last_end(last, q)
    if moment <= end:
        raise UsageError(f"{label} already ran up to {utc_text(end)} with another input: a late correction is a "
                         "new release, not a rewrite (feed only events not fed before, with a later --through; or "
                         "start a new --state file)")


def _fed_before(body: dict[str, Any], data: StateInput) -> dict[str, Any] | None:
    """The earlier run (not the last: that is a retry) that was fed this input, if any: its events were
    counted then, and feeding them again would count the kept ones twice (a day with no events gives
    the same header-only file as an earlier quiet day, so this is no error)."""
    fed: dict[str, Any] | None = (body.get("fed") or {}).get(data.fingerprint)
    return fed


def _retry(path: Path, body: dict[str, Any], last: dict[str, Any], q: StreamQuery, through: int) -> StateRun:
    """The last run again: its rows as released then, recorded in the ledger as a replay of its step."""
    label = f"state file {path}"
    seed = bytes.fromhex(body["seed"])
    recorded = _step_digest(seed, last["input"], last["through"], last.get("noise", 1), last.get("reading"))
    cached = pl.read_parquet(io.BytesIO(base64.b64decode(last["release"])))
    notes = [notes_of.retry(int(last["through"]), through, q.step)]
    if not cached.height:
        notes.append(notes_of.empty_run(int(last["through"]), last.get("from"), q.step, kept=True))
    step = ledger.Step(reservation=body["reservation"], start=body["step"] - 1, digest=recorded, label=label)
    report = cast(StreamReport, {**last["metadata"], "retry": True})  # the report the state kept (JSON)
    return StateRun(path, cached, report, repeat=True,
                    run_id=_run_id(body, int(last["through"]), q),
                    reservation=f"stream:{body['reservation']}", step=step, notes=tuple(notes))


def _run_id(body: dict[str, Any], through: int, q: StreamQuery) -> str:
    """The seed id a run is recorded under: the stream's, and the end of the last trigger it ran as naive ISO
    text (an identifier, kept as it always was: not a time shown to people, which :func:`utc_text` writes)."""
    return f"{body['seed_id']}/{naive_utc(through * q.step).isoformat()}"


def as_utc(moment: datetime | None) -> datetime:
    """``--through`` (naive: UTC), or now."""
    if moment is None:
        return datetime.now(UTC)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@dataclass
class NewRun:
    """A new run of the stream, begun but not computed: its first run reserved and its start marked in the ledger,
    its bounds chosen (by the run that has none yet), the stream loaded from its state. :attr:`task` is the run's
    task (the stream's query at its kept bounds, fed the stream: :class:`dpcli.tasks.stream.run.StreamFeed`),
    :attr:`plan` its calibration and :attr:`seed` the stream's; the caller runs it
    (:meth:`dpcli.tasks.Task.run`), and :meth:`finish` makes what it released the run to charge."""

    path: Path
    body: dict[str, Any]
    data: StateInput
    task: StreamTask
    plan: StreamPlan
    previous: int | None  # the stream's watermark before this run
    reserved: tuple[PrivacyEvent, ...]
    choosing: bool  # this run chooses the stream's bounds
    fed: dict[str, Any] | None  # the earlier run fed this input, if one was

    @property
    def seed(self) -> bytes:
        return bytes.fromhex(self.body["seed"])

    def finish(self, result: Result) -> StateRun:
        """The run to charge: ``result`` (the task's, on this run's input), the ledger step that records it and the
        state to save once it is charged."""
        feed = self.task.feed
        assert feed is not None and feed.released is not None  # (the task ran)
        run = replace(_new_run(self.path, self.body, feed.stream, feed.released, result, self.data, feed.through,
                               self.previous), query=self.task.query, plan=self.plan, reserved=self.reserved)
        if self.choosing:
            run = replace(run, notes=(*run.notes, notes_of.chosen_for_stream(feed.released.metadata)))
        fed = self.fed
        return replace(run, notes=(notes_of.fed_before(fed["run"], fed["until"]), *run.notes)) if fed else run


@contextmanager
def state_run(
    path: Path, task: StreamTask, plan: StreamPlan | PendingPlan, data: StateInput, *, analyst: str,
    state_dir: Path, lock_timeout: float, calibration: Calibration, through: datetime | None = None,
    unchanged: Callable[[], None] = lambda: None,
) -> Iterator[StateRun | NewRun]:
    """Lock the state file at ``path``, check it (or start a new stream) and begin the run.

    Yields, while the lock is held (the caller runs, charges and writes inside the ``with``), a retry's
    :class:`StateRun` or a :class:`NewRun` to compute. The input holds the events not fed before: they and the
    events the state kept run in every trigger up to ``through`` (default now, public), and those of later
    triggers are kept. The last run's input again is a retry (its rows, free); another input must end after it
    (:func:`_refuse_rewrite`). A new stream's seed binds its query, a fresh reservation id and ``calibration``
    (:func:`open_body`); ``unchanged()`` refuses an input changed since it was hashed (called before a new
    stream's reservation is debited). With ``auto`` bounds (or ``--report-bias``) the first run chooses them on
    its input and the state keeps the choice (``auto``) for every later run (:func:`_chosen`).
    """
    q = task.query
    moment = as_utc(through)
    last_trigger = trigger_through(moment, q.step)
    key_schema = key_schema_of(data.frame.collect_schema(), q)
    label = f"state file {path}"
    with documents.locked(path, lock_timeout):
        body, fresh = open_body(path, q, analyst, key_schema, state_dir, lock_timeout, calibration)
        last = body.get("last")
        if _is_retry(last, data, label):
            run_q, run_plan = _chosen(body, q, plan, data)
            yield replace(_retry(path, body, last, q, last_trigger), query=run_q, plan=run_plan)
            return
        _refuse_rewrite(last, moment, q, label)
        unchanged()
        reserved = _reserve_first(path, body, fresh, plan.events, analyst, state_dir, lock_timeout)
        _begin(body, data, last_trigger, plan.events, analyst, state_dir, lock_timeout, label)
        choosing = q.auto is not None and "auto" not in body  # this run chooses the stream's bounds
        run_q, run_plan = _chosen(body, q, plan, data)
        stream = load_state(body, run_q, run_plan)
        fed = _fed_before(body, data)  # an input fed before adds no event: its run only runs the triggers due
        chosen = StreamChoice.from_json(body["auto"]).metadata(q) if "auto" in body else {}
        feed = StreamFeed(stream, moment, str(path), fed_before=fed is not None, chosen=chosen)
        yield NewRun(path, body, data, replace(task, query=run_q, feed=feed), run_plan, stream.watermark, reserved,
                     choosing, fed)


def _reservation(path: Path, body: dict[str, Any], events: tuple[PrivacyEvent, ...]) -> ledger.Reservation:
    """The stream's whole (ε, δ), reserved once, before its first run reads anything."""
    return ledger.Reservation(
        id=body["reservation"], kind="stream", key=body["seed_id"], ledger_id=body.get("ledger_id", ""),
        events=events, command="stream-replay --state",
        summary=f"stream {path.name} reserves its whole (ε, δ)", name=path.name,
    )


def _reserve_first(path: Path, body: dict[str, Any], fresh: bool, events: tuple[PrivacyEvent, ...], analyst: str,
                   state_dir: Path, lock_timeout: float) -> tuple[PrivacyEvent, ...]:
    """Before a stream's first run reads a record (its ``auto`` choice or its triggers): its state on disk (a
    crash after is retried with the same seed and reservation), then its whole budget debited; the events
    debited now, if any."""
    if body["step"] != 0:
        return ()
    if fresh:
        documents.write(path, STATE_KIND, body)
    debited = ledger.reserve(state_dir, analyst, _reservation(path, body, tuple(events)), lock_timeout)
    return tuple(events) if debited else ()


def _begin(body: dict[str, Any], data: StateInput, through: int, events: tuple[PrivacyEvent, ...], analyst: str,
           state_dir: Path, lock_timeout: float, label: str) -> None:
    """Mark the run as begun in the ledger before it reads a record (:func:`ledger.start_step`): another input
    at a step whose run never ended pays the stream's whole (ε, δ) again, so no timing probe is free."""
    digest = ledger.step_digest(bytes.fromhex(body["seed"]),
                                {"begins": data.fingerprint, "through": through, "reading": data.reading})
    ledger.start_step(state_dir, analyst, body["reservation"], body["step"], digest, label, list(events),
                      lock_timeout)


def _chosen(body: dict[str, Any], q: StreamQuery, plan: StreamPlan | PendingPlan,
            data: StateInput) -> tuple[StreamQuery, StreamPlan]:
    """The query and plan a run of the stream uses: ``q`` itself, or with ``auto`` bounds (or the bias report)
    at the choice kept in the state's ``auto``, made (and kept in ``body``) by the run that has none yet (the
    first: its input, the stream's seed; paid by the reservation that run makes)."""
    if q.auto is None and q.report_bias is None:
        assert isinstance(plan, StreamPlan)
        return q, plan
    if "auto" not in body:
        if data.engine is not None:
            raise UsageError("auto bounds and --report-bias are chosen by the polars engine only")
        body["auto"] = choose(data.frame, q, bytes.fromhex(body["seed"]), None, data.name).to_json()
    return resolve(q, plan.events, StreamChoice.from_json(body["auto"]))


def _new_run(path: Path, body: dict[str, Any], stream: StreamState, release: StreamRelease, result: Result,
             data: StateInput, moment: datetime, previous: int | None) -> StateRun:
    """A run's new rows (``result``: the task's, margins included; the state keeps ``release``, the rows before
    them, for a retry), the ledger step that records it (reserving the stream's budget on its first run) and the
    state to save once it is charged."""
    label = f"state file {path}"
    q = stream.q
    through = stream.trigger_through(moment)
    create = _reservation(path, body, tuple(stream.plan.events)) if body["step"] == 0 else None
    metadata = result.metadata
    assert metadata["command"] == "stream-replay"
    last = {"input": data.fingerprint, "through": through, "noise": NOISE_VERSION, "metadata": metadata,
            "release": _parquet_text(release.table), "until": moment.isoformat(), "from": previous}
    if data.reading is not None:
        last["reading"] = data.reading
    digest = _step_digest(bytes.fromhex(body["seed"]), data.fingerprint, through, NOISE_VERSION, data.reading)
    step = ledger.Step(reservation=body["reservation"], start=body["step"], digest=digest, label=label, create=create)
    notes = () if release.table.height else (notes_of.empty_run(through, previous, q.step, kept=True),)
    first = body.get("first_through", through if body["step"] == 0 else None)
    if first is not None and q.max_records > 0:
        notes = (*notes, *notes_of.records_used_up(through - first + 1, q.max_records))
    return StateRun(path, result.table, metadata, repeat=False,
                    run_id=_run_id(body, through, q),
                    reservation=f"stream:{body['reservation']}", step=step,
                    new_body={**state_body(body, stream, last), "step": body["step"] + 1,
                              **({"first_through": first} if first is not None else {}),
                              "fed": {**(body.get("fed") or {}),
                                      data.fingerprint: {"run": body["step"] + 1, "until": moment.isoformat()}}},
                    notes=notes)
