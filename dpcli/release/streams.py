"""A stream kept in a state file between runs (``stream-replay --state``): the release path's persisted form.

The state is bound to the ledger (:class:`dpcli.state.ledger.Step`): it
carries a random reservation id and its step (runs recorded); a run is
accepted at the ledger's latest step, or as an exact repeat of a recorded
step (same step, same input and ``through``: the same rows, free). A forked,
rolled back or foreign copy is refused (exit 78), so the stream's seed and
noise never meet other data. Order: compute in memory; a new stream's state
(step 0) on disk; then the caller charges the ledger (reservation and step),
saves the state (:meth:`StateRun.save`) and writes the output.
"""

from __future__ import annotations

import base64
import io
import secrets
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import polars as pl

from dpcli.core.prf import NOISE_VERSION
from dpcli.errors import StateError
from dpcli.state import documents, ledger
from dpcli.tasks.stream.algorithm import trigger_through
from dpcli.tasks.stream.events import EventsEngine
from dpcli.tasks.stream.plan import StreamPlan
from dpcli.tasks.stream.query import StreamQuery
from dpcli.tasks.stream.run import advance_stream
from dpcli.tasks.stream.state import (
    STATE_KIND,
    check_state_body,
    key_schema_of,
    load_state,
    new_state_body,
    state_body,
)
from dpcli.tasks.stream.task import StreamTask

if TYPE_CHECKING:
    from dpcli.release.inputs import Opened
    from dpcli.release.path import Busy, Continuation, LedgerRef, Output, Release
    from dpcli.tasks import Engine


class Seed(Protocol):
    """A derived release seed and its public id (:class:`dpcli.release.ReleaseSeed`)."""

    @property
    def seed(self) -> bytes: ...

    @property
    def id(self) -> str: ...


@dataclass(frozen=True)
class StateInput:
    """The input a run feeds to the stream: its frame, its content fingerprint, its name (for messages),
    the engine that bounds its events (None: polars) and how its bytes were read
    (:meth:`dpcli.io.inputs.InputTable.reading_material`; None only for states' older runs)."""

    frame: pl.LazyFrame
    fingerprint: str
    name: str
    engine: EventsEngine | None = None
    reading: dict[str, Any] | None = None


@dataclass
class StateRun:
    """One run against a state file, computed in memory: an exact repeat (free) or new rows to charge.

    For a new run the caller debits ``step`` (its ``create`` reserves the
    stream's whole (ε, δ) on the first run) under ``run_id`` and
    ``reservation``, then calls :meth:`save` before writing the output.
    """

    path: Path
    table: pl.DataFrame
    metadata: dict[str, Any]
    repeat: bool
    run_id: str = ""
    reservation: str = ""
    step: ledger.Step | None = None
    new_body: dict[str, Any] | None = None

    def save(self) -> None:
        """Write the stream's new state (after the ledger charge, before the output)."""
        assert self.new_body is not None  # a new run's (a repeat saves nothing)
        documents.write(self.path, STATE_KIND, self.new_body)


def _open_body(path: Path, q: StreamQuery, analyst: str, key_schema: dict[str, str], state_dir: Path,
               lock_timeout: float, new_seed: Callable[[dict[str, Any]], Seed]) -> tuple[dict[str, Any], bool]:
    """The checked body of the state file, or a fresh one (step 0, not yet on disk): (body, fresh)."""
    label = f"state file {path}"
    body = documents.read(path, STATE_KIND)
    if body is not None:
        if body.get("analyst") != analyst:  # a state moved to another analyst: bound to another ledger
            raise StateError(f"{label} belongs to analyst {body.get('analyst')!r}, not {analyst!r}")
        check_state_body(body, q, analyst, key_schema, str(path))
        if not isinstance(body.get("reservation"), str) or not isinstance(body.get("step"), int):
            raise StateError(f"{label} was written by an older dpcli (not bound to the ledger); start a new one")
        return body, False
    rid = secrets.token_hex(12)
    seed = new_seed({"command": "stream-replay", "v": 1, **q.canonical(), "reservation": rid})
    body = new_state_body(q, analyst, seed.seed, seed.id, key_schema,
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


def _repeats(last: dict[str, Any] | None, data: StateInput, through: int) -> TypeGuard[dict[str, Any]]:
    """Is this run the state's last recorded run again: the same bytes, read alike, through the same trigger?

    A last run recorded before readings were kept (no ``reading``) is matched by its bytes and
    ``through``: it returns those cached rows (post-processing of a charged release), whatever
    the reading.
    """
    if not last or last["input"] != data.fingerprint or last["through"] != through:
        return False
    return "reading" not in last or last["reading"] == data.reading


@contextmanager
def state_run(
    path: Path, q: StreamQuery, plan: StreamPlan, data: StateInput, *, analyst: str, state_dir: Path,
    lock_timeout: float, new_seed: Callable[[dict[str, Any]], Seed], through: datetime | None = None,
    busy: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> Iterator[StateRun]:
    """Lock the state file at ``path``, check it (or start a new stream) and run the new triggers.

    Yields the :class:`StateRun` while the lock is held (the caller charges
    and writes inside the ``with``). ``through`` (default now) is public and,
    with the input's fingerprint and reading, identifies the run;
    ``new_seed(material)`` derives a new stream's seed from the query and a
    fresh reservation id (the caller adds the calibration:
    :func:`dpcli.release.release_seed`); ``busy()`` wraps the computation (a spinner).
    """
    moment = through if through is not None else datetime.now(UTC)
    last_trigger = trigger_through(moment, q.step)
    key_schema = key_schema_of(data.frame.collect_schema(), q)
    label = f"state file {path}"
    with documents.locked(path, lock_timeout):
        body, fresh = _open_body(path, q, analyst, key_schema, state_dir, lock_timeout, new_seed)
        seed = bytes.fromhex(body["seed"])
        digest = _step_digest(seed, data.fingerprint, last_trigger, NOISE_VERSION, data.reading)
        last = body.get("last")
        if _repeats(last, data, last_trigger):
            recorded = _step_digest(seed, data.fingerprint, last_trigger, last.get("noise", 1), last.get("reading"))
            ledger.check_recorded(state_dir, analyst, body["reservation"], body["step"], recorded, label, lock_timeout)
            cached = pl.read_parquet(io.BytesIO(base64.b64decode(last["release"])))
            yield StateRun(path, cached, {**last["metadata"], "charged": False, "retry": True}, repeat=True)
            return
        stream = load_state(body, q, plan)
        with busy():
            release = advance_stream(data.frame, stream, moment, name=data.name, engine=data.engine)
        create = None
        if body["step"] == 0:
            create = ledger.Reservation(
                id=body["reservation"], kind="stream", key=body["seed_id"], ledger_id=body.get("ledger_id", ""),
                events=tuple(plan.events), command="stream-replay --state",
                summary=f"stream {path.name} reserves its whole (ε, δ)",
            )
        if fresh:  # on disk before its reservation: a crash in between is retried with the same seed
            documents.write(path, STATE_KIND, body)
        metadata = {"command": "stream-replay", "state": str(path), **release.metadata}
        last = {"input": data.fingerprint, "through": last_trigger, "noise": NOISE_VERSION, "metadata": metadata,
                "release": _parquet_text(release.table)}
        if data.reading is not None:
            last["reading"] = data.reading
        step = ledger.Step(reservation=body["reservation"], start=body["step"], digest=digest, label=label,
                           create=create)
        yield StateRun(path, release.table, metadata, repeat=False,
                       run_id=f"{body['seed_id']}/{release.metadata['through']}",
                       reservation=f"stream:{body['reservation']}", step=step,
                       new_body={**state_body(body, stream, last), "step": body["step"] + 1})


def run_stream_state(task: object, opened: Opened, engine: Engine | None, payer: LedgerRef, mode: str,
                     planned: object, continuation: Continuation, output: Output | None, busy: Busy) -> Release:
    """One cron run of ``stream-replay --state`` (the release path's persisted form): lock the state, run
    the new triggers, charge the run as a step of the stream's reservation, save the state.

    ``task`` and ``planned``: a :class:`StreamTask` and its :class:`StreamPlan` (the only task a state
    file runs). A new stream's seed binds its query, a fresh reservation id and the calibration; it has no
    inputs (it is made once, for every run): each run's input, with its reading, is bound by the
    run's digest in the ledger. An exact repeat of the last run returns its rows again, free."""
    from dpcli.release.path import Prepared, Release, charge
    from dpcli.release.seeds import Calibration, ReleaseSeed, release_seed

    # only stream-replay runs against a --state file
    assert isinstance(task, StreamTask) and isinstance(planned, StreamPlan) and continuation.stream_state is not None
    payer_ref = payer
    calibration = Calibration(mode, planned)
    table = opened.data
    data = StateInput(table.frame, table.fingerprint, table.name, engine.stream_events if engine else None,
                      reading=table.reading_material())
    label = continuation.label or str(continuation.stream_state)
    with state_run(continuation.stream_state, task.query, planned, data, analyst=payer_ref.analyst,
                   state_dir=payer_ref.state_dir, lock_timeout=payer_ref.lock_timeout,
                   new_seed=lambda material: release_seed(payer_ref.state_dir, material, {}, calibration),
                   through=continuation.through,
                   busy=lambda: busy(f"feeding {table.name} to {label}")) as run:
        rows = task.margins(run.table, planned)
        if run.repeat:
            return Release(rows, run.metadata,
                           f"stream-replay: repeated run, same rows as before (state {label}, free)")
        line = (f"stream-replay of {table.name} into {label}: {run.metadata['releases']} release row(s), "
                f"triggers run through {run.metadata['through']}")
        prepared = Prepared(ReleaseSeed(b"", run.run_id, run.reservation), list(planned.events), rows, run.metadata)
        return charge(payer_ref, "stream-replay --state", prepared, line, step=run.step, inputs=(table,),
                      before_output=run.save,
                      output_digest=output.digest(rows, run.metadata) if output is not None else None)
