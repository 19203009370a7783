"""Rule 5 in stream-replay's engine: each unit counts once per key and round, at most C records in all.

Attacks on the vectorised DP-SQLP engine (issue 20: ``dpcli/tasks/stream/batches.py``,
``algorithm.py``). The engine must release exactly what the per-key reference
(``tests/stream_reference.py``) releases, for replays and for incremental ``--state`` runs, so that
the noise calibrated for one unit's records covers them. Found by the review:

* NaN units: Python's sets and dicts never match NaN to itself, so the state's per-unit record counts
  grew one NaN entry per run and joined the events once per entry: a NaN unit's records were counted
  again and again (25 records for C = 5), and each run let it past the cap anew;
* sub-µs datetimes were stored truncated, so a unit escaped its cap across runs; Time and nanosecond
  units merged into one unit in restarted rounds (Python values stop at µs).

Resisted: odd inputs of many shapes, units already in a loaded round, every flat key type and NaN keys
equal the reference; and (review of noise stream v2) Alg. 4 decided by suffix maxima releases what a
linear scan per key releases.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
import stream_reference
from stream_engine_checks import _incremental_equals_replay, _plan, _query, _replay_equals_reference, _roundtrip, _seed

from dpcli.tasks import stream as sr


def test_nan_units_are_no_units_and_cannot_escape_the_cap():
    """One NaN unit with a record in every trigger, C = 5, ten cron runs: it used to be counted 25 times in
    memory and 10 times through JSON (a fresh NaN entry in the per-unit counts each run). NaN is now
    dropped like a null unit; other float units keep their cap."""
    nan = float("nan")
    q = _query(max_records=5)
    s = _seed("nan")
    df = pl.DataFrame({"ts": [t * 100 + 5 for t in range(10)] * 2, "user": [nan] * 10 + [-0.0] * 5 + [0.0] * 5,
                       "key": ["a"] * 20})
    for roundtrip in (True, False):
        inc, counted = sr.StreamState(q, _plan(q), s), 0
        for g in range(1, 11):
            if roundtrip:
                inc = _roundtrip(inc, q, s)
            ev = sr.prepare_events(df.lazy(), q, g, after=inc.watermark, used=inc.used)
            assert not ev["__unit"].is_nan().any()
            counted += ev.height
            inc.advance(ev, g)
        assert counted == 5 and list(inc.used.values()) == [5]  # -0.0 and 0.0: one unit, as polars compares
    _replay_equals_reference(df, q, s, 10)


@pytest.mark.parametrize("dtype", [pl.Datetime("ns"), pl.Duration("ns"), pl.Time])
def test_sub_microsecond_units_stay_distinct_in_restarted_rounds(dtype):
    """Units 0 … 149 ns apart are 150 units: the engine's restarted rounds (Python sets) and the reference
    merged them into one, the first appearances (polars) did not. Such units are compared by their
    integer value now."""
    rng = np.random.default_rng(7)
    n = 400
    q = _query(max_records=2)
    df = pl.DataFrame({"ts": rng.integers(0, 1000, n), "user": pl.Series(rng.integers(0, 150, n)).cast(dtype),
                       "key": rng.integers(0, 3, n)})
    assert len(_replay_equals_reference(df, q, _seed("ns"), 10)) >= 10


# -- resisted -------------------------------------------------------------------------------------------


def _variant(df: pl.DataFrame, v: int) -> pl.DataFrame:
    if v == 0:  # keys that look like numbers, some zero-padded: "1" and "01" are two keys
        return df.with_columns(pl.when(pl.col("user").str.len_chars() > 1).then(pl.col("key").cast(pl.String).str.zfill(2))
                               .otherwise(pl.col("key").cast(pl.String)).alias("key"))
    if v == 1:
        return df.with_columns((pl.col("key") % 2 == 0).alias("key"))
    if v == 2:
        return df.with_columns((pl.lit(dt.date(1, 1, 1)) + pl.duration(days=pl.col("key"))).alias("key"))
    if v == 3:
        return df.with_columns(pl.col("user").cast(pl.Categorical), pl.col("key").cast(pl.Int8))
    if v == 4:
        return df.with_columns((pl.col("user").cast(pl.UInt64) + (2**64 - 1000)).alias("user"))
    if v == 5:
        return df.with_columns(pl.col("key").cast(pl.Float32) / 2, pl.col("user").cast(pl.Float64) - 3.5)
    return df


@pytest.mark.parametrize("case", [*range(6), *(pytest.param(c, marks=pytest.mark.audit) for c in (6, 7))])
def test_replays_and_incremental_runs_equal_the_reference_on_odd_inputs(case):  # cases 6, 7: variants 0, 1 again
    """Small streams of many shapes: number-like text keys, booleans, dates from year 1, categorical and
    64-bit unsigned units, float keys and units; null keys, two-column keys, μ > 0, a value column,
    one-trigger windows, cuts mid-window. Releases equal the reference; states equal at every cut."""
    rng = np.random.default_rng(case)
    n = 300
    df = pl.DataFrame({"ts": rng.integers(0, 2000, n), "user": rng.integers(0, 60, n).astype(str),
                       "key": rng.integers(0, 4, n), "grp": rng.choice(["a", "b"], n),
                       "v": rng.integers(-9, 10, n) * 1.0})
    df = _variant(df, case % 6)
    if case % 3 == 0:
        df = df.with_columns(pl.when(pl.int_range(pl.len()) % 4 == 0).then(None).otherwise(pl.col("key")).alias("key"))
    q = _query(keys=("key", "grp") if case % 2 else ("key",), max_records=1 + case % 4, mu=case % 3,
               triggers=[1, 5, 10, 20][case % 4], **({"value": "v", "clamp": 10.0} if case % 4 == 0 else {}))
    last = 2000 // q.step
    cuts = sorted({1, last // 3, last // 2 + 1, last})
    s = _seed(("odd", case))
    _replay_equals_reference(df, q, s, last)
    _incremental_equals_replay(df, q, s, cuts)


def test_a_unit_already_in_a_loaded_round_counts_once_and_a_release_restarts_it():
    """μ = 50: no selection tree, the round only counts. Five units in run 1, the same five plus three new
    ones in run 2: eight, through JSON or in memory. Then a key released in run 1 counts the units that
    come back after the release (run 1 and run 2) once each in its new round."""
    q = _query(max_records=10, mu=50)
    s = _seed("once")
    df = pl.DataFrame({"ts": [5] * 5 + [105] * 8, "user": [f"u{i}" for i in range(5)] + [f"u{i}" for i in range(8)],
                       "key": ["a"] * 13})
    for roundtrip in (True, False):
        inc = sr.StreamState(q, _plan(q), s)
        for g in (1, 2):
            if roundtrip:
                inc = _roundtrip(inc, q, s)
            sr.advance_stream(df.lazy(), inc, inc.time_of(g))
        assert inc.windows[0].units.tolist() == [8]
    q = _query(max_records=10)
    big = pl.DataFrame({"ts": [5] * 300, "user": [f"b{i}" for i in range(300)], "key": ["a"] * 300})
    back = pl.DataFrame({"ts": [150, 160, 250, 250, 260], "user": ["b1", "b2", "b1", "b2", "b3"], "key": ["a"] * 5})
    df = pl.concat([big, back])
    rows = _replay_equals_reference(df, q, s, 10)
    assert [r[1] for r in rows][:1] == [1]  # released at its first trigger: rounds restart from trigger 2 on
    for roundtrip in (True, False):
        inc = sr.StreamState(q, _plan(q), s)
        for g in (1, 2, 3):
            if roundtrip:
                inc = _roundtrip(inc, q, s)
            sr.advance_stream(df.lazy(), inc, inc.time_of(g))
        st = inc.windows[0].key_states()[("a",)]
        if st.rounds == 1:  # not released again: the new round holds b1, b2, b3 once each
            assert sorted(st.round_users) == ["b1", "b2", "b3"] and inc.windows[0].units.tolist() == [3]
    _incremental_equals_replay(df, q, s, [1, 2, 3, 10])


@pytest.mark.parametrize("dtype", ["decimal", "time", "duration", "binary", "int128", "enum", "null"])
def test_replay_takes_any_flat_key_type_as_the_reference_does(dtype):
    """Without --state nothing is stored: every flat key type replays, equal to the reference."""
    rng = np.random.default_rng(11)
    n = 400
    k = rng.integers(0, 3, n).tolist()
    keys = {"decimal": pl.Series([decimal.Decimal(x) for x in k]), "time": pl.Series([dt.time(x) for x in k]),
            "duration": pl.Series([dt.timedelta(days=x) for x in k]), "binary": pl.Series([str(x).encode() for x in k]),
            "int128": pl.Series([x - 2**90 for x in k], dtype=pl.Int128),
            "enum": pl.Series([str(x) for x in k]).cast(pl.Enum(["2", "1", "0"])),
            "null": pl.Series([None] * n, dtype=pl.Null)}[dtype]
    df = pl.DataFrame({"ts": rng.integers(0, 1000, n), "user": rng.integers(0, 150, n), "key": keys})
    q = _query(max_records=2)
    rows = _replay_equals_reference(df, q, _seed(("flat", dtype)), 10)
    table = sr.run_stream(df.lazy(), q, _plan(q), _seed(("flat", dtype)), sr.naive_utc(1000)).table
    assert rows and table.height == len(rows) and table.schema["key"] == df.schema["key"]


def test_nan_keys_are_one_key_through_replays_and_states():
    """A NaN key is one key, as polars groups it, in replays and across states (the per-key reference keys
    a dict by Python tuples, where NaN never equals itself: it is compared on the same stream with NaN
    spelt +inf, which sorts and labels alike here)."""
    nan = float("nan")
    for case in range(2):
        rng = np.random.default_rng(case)
        n = 300
        df = pl.DataFrame({"ts": rng.integers(0, 2000, n), "user": rng.integers(0, 80, n).astype(str),
                           "key": pl.Series(rng.integers(-1, 3, n)).cast(pl.Float64)})
        df = df.with_columns(pl.when(pl.col("key") == 0).then(nan).otherwise(pl.col("key")).alias("key"))
        q = _query(max_records=3, mu=case)
        s = _seed(("nan-key", case))
        ev = sr.prepare_events(df.lazy(), q, 20)
        st = sr.StreamState(q, _plan(q), s, track_units=False)
        got = [r[:3] + (math.inf if math.isnan(r[3]) else r[3],) + r[4:] for r in st.advance(ev, 20)]
        ev_inf = sr.prepare_events(df.with_columns(pl.col("key").fill_nan(math.inf)).lazy(), q, 20)
        assert got == stream_reference.replay(ev_inf, q, _plan(q), st.stream)
        assert any(math.isinf(r[3]) for r in got)
        inc, rows = sr.StreamState(q, _plan(q), s), []
        for g in (3, 9, 14, 20):
            inc = _roundtrip(inc, q, s)
            rows += sr.advance_stream(df.lazy(), inc, inc.time_of(g)).table.rows()
        assert repr(rows) == repr(sr.run_stream(df.lazy(), q, _plan(q), s, sr.naive_utc(20 * q.step)).table.rows())


# ---- stream-replay: the suffix maxima change no release (resisted) -----------------------------------


def test_suffix_maxima_release_what_the_scan_released():
    """Alg. 4 decided by suffix maxima (e77a5b6, vectorised since) against a linear scan per key
    (tests/stream_reference.py), on a stream whose keys are released, restart rounds and get new
    selection trees in the same window (a stale suffix maximum from the previous tree would show here),
    and keys that are never released."""
    import hashlib

    import stream_reference

    from dpcli.tasks import stream as sr

    rows = [(t * 100 + j, f"u{t}-{j}-{k}", f"k{k}", 1.0) for t in range(10) for k in range(12)
            for j in range(3 * k)]  # key k: 3k new units per trigger
    rows += [(t * 100 + 50, f"w{t}", "rare", 1.0) for t in range(0, 20, 3)]
    q = sr.StreamQuery(time="ts", keys=("key",), unit="user", window=1000, triggers=10, max_records=3,
                       epsilon=Fraction(3), delta=Fraction(1, 10**9))
    plan = sr.plan_stream(q)
    frame = pl.DataFrame(rows, schema=["ts", "user", "key", "v"], orient="row").lazy()
    for s in range(3):
        state = sr.StreamState(q, plan, hashlib.sha256(b"suffix%d" % s).digest(), track_units=False)
        events = sr.prepare_events(frame, q, 20)
        fast = state.advance(events, 20)
        assert fast == stream_reference.replay(events, q, plan, state.stream)
        released = pl.DataFrame([(r[0], r[3]) for r in fast], schema=["w", "key"], orient="row")
        assert released.height and released.group_by("w", "key").len()["len"].max() > 1  # keys re-selected
