"""Checks of stream-replay's vectorised DP-SQLP engine against the per-key reference (issue 20).

Replays must release exactly what ``tests/stream_reference.py`` releases, and incremental ``--state``
runs (the state through JSON, or kept in memory) what one replay releases, with the same state after
every run. Used by rule 4's and rule 5's engine attacks.
"""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction

import polars as pl
import stream_reference

from dpcli.tasks import stream as sr

_PLANS: dict = {}


def _seed(i) -> bytes:
    return hashlib.sha256(repr(("engine", i)).encode()).digest()


def _query(**kw) -> sr.StreamQuery:
    base = dict(time="ts", keys=("key",), unit="user", window=1000, triggers=10, max_records=3,
                epsilon=Fraction(100), delta=Fraction(1, 10**9))
    base.update(kw)
    return sr.StreamQuery(**base)


def _plan(q):
    if q not in _PLANS:
        _PLANS[q] = sr.plan_stream(q)
    return _PLANS[q]


def _roundtrip(state, q, s):
    """The state as the next cron run sees it: JSON text and back."""
    return sr.decode_state(json.loads(json.dumps(sr.encode_state(state))), q, _plan(q), s)


def _snapshot(state) -> list:
    """The open windows as a state file stores them, independent of slot order and set order."""
    out = []
    for w in sr.encode_state(state)["windows"]:
        keys = sorted([json.dumps(k), {**st, "round_users": sorted(json.dumps(u) for u in st["round_users"])}]
                      for k, st in w["keys"])
        out.append((w["start"], w["fired"], json.dumps(keys, sort_keys=True)))
    return out


def _replay_equals_reference(df: pl.DataFrame, q, s, through: int) -> list:
    ev = sr.prepare_events(df.lazy(), q, through)
    st = sr.StreamState(q, _plan(q), s, track_units=False)
    got = st.advance(ev, through)
    assert got == stream_reference.replay(ev, q, _plan(q), st.stream)
    return got


def _incremental_equals_replay(df: pl.DataFrame, q, s, cuts: list[int]) -> None:
    """Runs up to each cut (state through JSON, or kept in memory) give the replay's rows, and after every
    cut the same state as a replay up to it (keys, round units, buffers, trees, per-unit record counts)."""
    full_rows = sr.run_stream(df.lazy(), q, _plan(q), s, sr.naive_utc(cuts[-1] * q.step)).table.rows()
    for roundtrip in (True, False):
        inc, rows = sr.StreamState(q, _plan(q), s), []
        for g in cuts:
            if roundtrip:
                inc = _roundtrip(inc, q, s)
            rows += sr.advance_stream(df.lazy(), inc, inc.time_of(g)).table.rows()
            full = sr.StreamState(q, _plan(q), s)
            sr.advance_stream(df.lazy(), full, full.time_of(g))
            assert _snapshot(inc) == _snapshot(full) and inc.used == full.used, (roundtrip, g)
        assert rows == full_rows, roundtrip
