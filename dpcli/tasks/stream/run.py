"""A whole stream replay (:func:`run_stream`) or one advance of a persisted stream (:func:`advance_stream`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl

from dpcli.core.display import utc_text
from dpcli.tasks.reports import StreamReport
from dpcli.tasks.stream.algorithm import StreamState
from dpcli.tasks.stream.events import EventsEngine, prepare_events, record_columns, with_kept
from dpcli.tasks.stream.plan import StreamPlan
from dpcli.tasks.stream.query import StreamQuery


@dataclass
class StreamRelease:
    """The released rows (long format) and the public summary."""

    table: pl.DataFrame
    metadata: StreamReport


@dataclass
class StreamFeed:
    """A run of a stream kept in a ``--state`` file, as its task runs it (:meth:`.task.StreamTask.run`): the
    stream as its state holds it (``stream``: its seed, trees, kept events; advanced in place by the run), the
    run's public moment (``through``), the name the run's metadata gives the state (``state``), whether an earlier
    run was fed this input (``fed_before``: its events were counted then, so it feeds none and only runs the
    triggers due), the metadata of the bounds the stream chose (``chosen``, kept by its state), and, once run,
    what it released before any margin (``released``: what the state keeps for a retry)."""

    stream: StreamState
    through: datetime
    state: str
    fed_before: bool = False
    chosen: StreamReport = field(default_factory=lambda: StreamReport())
    released: StreamRelease | None = None


def _metadata(table: pl.DataFrame, plan: StreamPlan, through: datetime) -> StreamReport:
    """The public summary: the released row count (post-processing of noisy output), the public
    ``through`` time and the calibration. Nothing computed from the data without noise."""
    return {"releases": table.height, "through": utc_text(through), **plan.summary}


def run_stream(frame: pl.LazyFrame, q: StreamQuery, plan: StreamPlan, seed: bytes,
               through: datetime | None = None, *, name: str = "the input",
               engine: EventsEngine | None = None) -> StreamRelease:
    """Replay the whole input: every trigger ending at or before ``through`` (default: now); long-format releases.

    Events whose trigger ends after ``through`` are dropped (before the
    per-unit cap), so the rows are exactly those a replay with a later
    ``through`` gives up to this time: same seed, same noise, a prefix.
    ``name`` names the input in error messages; ``engine`` bounds the events on another engine.
    """
    state = StreamState(q, plan, seed, track_units=False)
    g = state.trigger_through(through if through is not None else datetime.now(UTC))
    events = prepare_events(frame, q, g, name=name, engine=engine)
    rows = state.advance(events, g)
    result = state.release_table(rows, dict(frame.collect_schema()))
    return StreamRelease(result, _metadata(result, plan, state.time_of(g)))


def advance_stream(frame: pl.LazyFrame, state: StreamState, through: datetime | None = None, *, keep: bool = False,
                   name: str = "the input", engine: EventsEngine | None = None) -> StreamRelease:
    """Feed the next micro-batch(es) to a persisted stream (``--state``) and run their triggers.

    Runs every trigger after the state's watermark that ends at or before
    ``through`` (default: now), on the events of ``frame`` and those the state
    kept from earlier runs. Events in triggers already run (late) are dropped
    before the per-unit cap. Events whose trigger ends after ``through`` are
    kept in the state until it runs with ``keep`` (``frame`` then holds the
    events not fed before: ``stream-replay --state``), and dropped without it
    (``frame`` may then hold the whole stream, of which each run takes its
    triggers' events). A ``through`` before the watermark is a usage error (the
    watermark is the ``through`` of an earlier run, so this depends on public
    inputs only).
    """
    g = state.trigger_through(through if through is not None else datetime.now(UTC))
    state.check_through(g)
    new = prepare_events(frame, state.q, None if keep else g, after=state.watermark, used=state.used, name=name,
                         engine=engine)
    events = with_kept(new, state.kept, state.q, state.used)
    due = events.filter(pl.col("__g") <= g)
    later = events.filter(pl.col("__g") > g).select(record_columns(state.q))
    state.kept = later if later.height else None
    rows = state.advance(due, g)
    result = state.release_table(rows, dict(frame.collect_schema()))
    return StreamRelease(result, _metadata(result, state.plan, state.time_of(g)))
