"""``dpcli stream-replay``'s library (DP-SQLP, paper 001): the public names of :mod:`dpcli.tasks.stream`.

A facade: the query (:mod:`~dpcli.tasks.stream.query`), the calibration
(:mod:`~dpcli.tasks.stream.plan`), the bounded events
(:mod:`~dpcli.tasks.stream.events`), the algorithm
(:mod:`~dpcli.tasks.stream.algorithm`), a replay or an advance
(:mod:`~dpcli.tasks.stream.run`), the state codec
(:mod:`~dpcli.tasks.stream.state`) and a run against a state file
(:mod:`dpcli.release.streams`). The CLI calls the functions through
this module (tests replace :func:`plan_stream` here).
"""

from __future__ import annotations

from dpcli.core import tree
from dpcli.tasks.stream.algorithm import (
    KeyState,
    StreamState,
    WindowRun,
    naive_utc,
    trigger_through,
)
from dpcli.tasks.stream.events import (
    ISO_LAYOUTS,
    bounded_events,
    event_seconds,
    prepare_events,
)
from dpcli.tasks.stream.plan import StreamPlan, margins95, margins95_by_trigger, plan_stream
from dpcli.tasks.stream.query import (
    CLAMP_RANGE,
    MAX_EPSILON,
    MAX_MU,
    MAX_RECORDS,
    MAX_SECONDS,
    MAX_TRIGGERS,
    MAX_WINDOW_DAYS,
    MIN_DELTA,
    MIN_SECONDS,
    StreamQuery,
)
from dpcli.tasks.stream.run import StreamRelease, advance_stream, run_stream
from dpcli.tasks.stream.state import (
    STATE_KIND,
    check_state_body,
    decode_state,
    encode_state,
    key_schema_of,
    load_state,
    new_state_body,
    state_body,
)

__all__ = [
    "CLAMP_RANGE", "ISO_LAYOUTS", "MAX_EPSILON", "MAX_MU", "MAX_RECORDS", "MAX_SECONDS", "MAX_TRIGGERS",
    "MAX_WINDOW_DAYS", "MIN_DELTA", "MIN_SECONDS", "STATE_KIND", "KeyState", "StreamPlan", "StreamQuery",
    "StreamRelease", "StreamState", "WindowRun", "advance_stream", "bounded_events", "check_state_body",
    "decode_state", "encode_state", "event_seconds", "key_schema_of", "load_state", "margins95",
    "margins95_by_trigger", "naive_utc",
    "new_state_body", "plan_stream", "prepare_events", "run_stream", "state_body", "tree", "trigger_through",
]
