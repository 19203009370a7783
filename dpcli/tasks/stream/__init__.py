"""Continual DP histograms over a timestamped stream (DP-SQLP, paper 001), split by concern.

* :mod:`.query`: the public parameters of a release and their limits;
* :mod:`.plan`: the privacy split and the calibration of every tree (no data);
* :mod:`.events`: records → bounded events in time order (drops, per-unit cap);
* :mod:`.algorithm`: the windows, their keys' trees and triggers (Alg. 2-4);
* :mod:`.run`: a whole replay, or one incremental advance of a persisted stream;
* :mod:`.state`: the JSON codec of a stream's state and the ``--state`` document body;
* :mod:`.task`: a whole replay, or one run of a stream its ``--state`` file holds, as a :class:`dpcli.tasks.Task`
  (the state file itself: :mod:`dpcli.release.streams`).

This file re-exports the public names (its modules never import it). The CLI and :mod:`dpcli.release.streams` call
the functions through it (tests replace :func:`plan_stream` here).
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
from dpcli.tasks.stream.run import StreamFeed, StreamRelease, advance_stream, run_stream
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
    "MAX_WINDOW_DAYS", "MIN_DELTA", "MIN_SECONDS", "STATE_KIND", "KeyState", "StreamFeed", "StreamPlan", "StreamQuery",
    "StreamRelease", "StreamState", "WindowRun", "advance_stream", "bounded_events", "check_state_body",
    "decode_state", "encode_state", "event_seconds", "key_schema_of", "load_state", "margins95",
    "margins95_by_trigger", "naive_utc",
    "new_state_body", "plan_stream", "prepare_events", "run_stream", "state_body", "tree", "trigger_through",
]
