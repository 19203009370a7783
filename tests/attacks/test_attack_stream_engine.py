"""Attacks on stream-replay's vectorised DP-SQLP engine (issue 20: dpcli/tasks/stream/batches.py, algorithm.py).

The engine must release exactly what the per-key reference (tests/stream_reference.py) releases, for
replays and for incremental ``--state`` runs (state through JSON or kept in memory); each unit counts at
most once per key and selection round and at most C records over the stream; and no error may depend on
the data (an exit code is public). Found by the adversarial review of the rewrite:

* a run whose every (unit, key) pair of a window was already in its key's round crashed (KeyError): the
  simplest cron stream (a user back on the same page) gave an internal error, exit 70;
* NaN units: Python's sets and dicts never match NaN to itself, so the state's per-unit record counts
  grew one NaN entry per run and joined the events once per entry: a NaN unit's records were counted
  again and again (25 records for C = 5), and each run let it past the cap anew;
* a unit or key type the state's JSON cannot store (Decimal, Time, Duration, Binary) was refused only
  when a value had to be stored, i.e. iff some record counted (exit 2 vs 0: one bit of data); sub-µs
  datetimes were stored truncated, so a unit escaped its cap across runs;
* time-zone-aware units crashed the first run after a restore (polars SchemaError); tz-aware keys came
  back in UTC spelling, which sorts predicted releases differently across DST;
* a restored window typed its keys from its first 100 keys only: a key column null in those crashed
  the next run (ComputeError, whose message even quoted a key value);
* Time and nanosecond units merged into one unit in restarted rounds (Python values stop at µs);
* a unit or key date beyond Python's years 1 … 9999 failed the run once it became a Python value
  (a release, a restarted round, a state), quoting the year (also in the per-key engine before).
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import hashlib
import json
import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from dpcli.cli.app import app
from dpcli.core.accounting import composition as accounting
from dpcli.errors import UsageError
from dpcli.tasks import stream_replay as sr
from dpcli.tasks.stream.algorithm import key_label

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import stream_reference  # noqa: E402

runner = CliRunner()
_RHO = functools.lru_cache(maxsize=None)(accounting.rho_for_epsilon)
_PLANS: dict = {}


@pytest.fixture(autouse=True)
def fast_calibration(monkeypatch):
    """The ρ calibration gives the same value for the same (ε, δ): compute it once."""
    monkeypatch.setattr(accounting, "rho_for_epsilon", _RHO)


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


# -- confirmed, fixed ---------------------------------------------------------------------------------

def test_a_run_whose_units_are_all_in_their_rounds_already_runs():
    """Run 2's only event is a unit already in its key's round (batches.py: the window had no new
    (unit, key) pair, pairs_by_window[w] raised KeyError)."""
    q = _query(max_records=5)
    s = _seed("known")
    df = pl.DataFrame({"ts": [5, 105, 205, 310], "user": ["u", "u", "u", "v"], "key": ["a", "a", "a", "a"]})
    for roundtrip in (True, False):
        inc = sr.StreamState(q, _plan(q), s)
        for g in (1, 2, 3, 4):
            if roundtrip:
                inc = _roundtrip(inc, q, s)
            sr.advance_stream(df.lazy(), inc, inc.time_of(g))
            assert inc.windows[0].units.tolist() == [1 if g < 4 else 2]  # u counted once in its round
    _incremental_equals_replay(df, q, s, [1, 2, 3, 10])


def test_cli_cron_runs_with_a_returning_user_exit_0(tmp_path):
    """The same, end to end: two hourly runs, the same user on the same page, exit 0 both times."""
    assert runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "10",
                               "--delta", "1e-6"]).exit_code == 0
    args = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "1h",
            "--max-contributions", "3", "--epsilon", "4", "--delta", "1e-9"]
    state = tmp_path / "s.state"
    for hour in (0, 1):
        f = tmp_path / f"h{hour}.csv"
        pl.DataFrame({"ts": [f"2026-11-01T{hour:02d}:30:00"], "user": ["u1"], "page": ["p"]}).write_csv(f)
        r = runner.invoke(app, ["stream-replay", str(f), *args, "--state", str(state),
                                "--through", f"2026-11-01T{hour + 1:02d}:00:00"])
        assert r.exit_code == 0, r.stderr


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


def _parquet(path: Path, users: pl.Series, day: int) -> Path:
    pl.DataFrame({"ts": [f"2026-11-{day:02d}T00:{i:02d}:00" for i in range(users.len())], "user": users,
                  "page": ["p"] * users.len()}).write_parquet(path)
    return path


@pytest.mark.parametrize("dtype", ["decimal", "time", "duration", "binary", "datetime_ns", "int128"])
def test_state_refuses_unstorable_types_from_the_schema_alone(tmp_path, dtype):
    """The refusal used to come at the state write, i.e. only if some record counted (or earlier runs
    counted one): exit 2 with data, exit 0 without. Now the schema decides, before any data is read."""
    users = {"decimal": pl.Series([decimal.Decimal("1.5")] * 3), "time": pl.Series([dt.time(1, 2)] * 3),
             "duration": pl.Series([dt.timedelta(1)] * 3), "binary": pl.Series([b"x"] * 3),
             "datetime_ns": pl.Series([1577836800000000001] * 3).cast(pl.Datetime("ns")),
             "int128": pl.Series([2**100] * 3, dtype=pl.Int128)}[dtype]
    assert runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "10",
                               "--delta", "1e-6"]).exit_code == 0
    args = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "1h",
            "--max-contributions", "3", "--epsilon", "4", "--delta", "1e-9", "--through", "2026-11-01T01:00:00"]
    results = []
    for n in (9, 1):  # records after --through (none counts), then records that count
        f = _parquet(tmp_path / f"d{n}.parquet", users, n)
        r = runner.invoke(app, ["stream-replay", str(f), "--input-format", "parquet", *args,
                                "--state", str(tmp_path / f"s{n}.state")])
        results.append((r.exit_code, r.stdout, r.stderr.replace(f"d{n}", "D").replace(f"s{n}", "S")))
        assert not (tmp_path / f"s{n}.state").exists()
    assert results[0] == results[1] and results[0][0] == 2, results
    q = _query(keys=("user",), unit="key")
    with pytest.raises(UsageError, match="cannot store column 'user'"):  # as a key column too
        sr.key_schema_of(pl.Schema({"ts": pl.Int64, "key": pl.String, "user": users.dtype}), q)


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


def test_time_zone_aware_units_and_keys_survive_the_state():
    """tz-aware units crashed the first run after a restore (SchemaError in _settle_rounds); tz-aware
    keys came back spelt in UTC, whose text order (predicted releases are sorted by it) differs from
    the local one across a DST change."""
    rng = np.random.default_rng(3)
    n = 400
    keys = pl.Series([dt.datetime(2026, 11, 1, 5, 10), dt.datetime(2026, 11, 1, 5, 50),
                      dt.datetime(2026, 11, 1, 6, 30)]).dt.replace_time_zone("UTC").dt.convert_time_zone(
        "America/New_York")  # 01:10 EDT, 01:50 EDT, 01:30 EST: local text order is not time order
    df = pl.DataFrame({"ts": rng.integers(0, 2000, n),
                       "user": pl.from_epoch(pl.Series(rng.integers(0, 200, n)), "ms").dt.replace_time_zone("Europe/Paris"),
                       "key": keys.gather(rng.integers(0, 3, n))})
    q = _query(max_records=3)
    s = _seed("tz")
    _replay_equals_reference(df, q, s, 20)
    _incremental_equals_replay(df, q, s, [3, 7, 8, 15, 20])
    state = sr.StreamState(q, _plan(q), s)
    sr.advance_stream(df.lazy(), state, state.time_of(3))
    run, back = state.windows[0], _roundtrip(state, q, s).windows[0]
    assert [key_label(run.key(i)) for i in range(run.size)] == [key_label(back.key(i)) for i in range(back.size)]


def test_a_restored_window_types_its_keys_from_every_row():
    """120 keys whose second column is null, then one that is not: the restore inferred the column's
    type from the first 100 keys (Null) and the next run crashed, quoting the key value."""
    q = _query(keys=("key", "grp"), max_records=2)
    s = _seed("null100")
    df = pl.DataFrame({"ts": [5] * 121 + [105] * 2, "user": [f"u{i}" for i in range(121)] + ["u0", "z"],
                       "key": list(range(120)) + [999, 0, 999], "grp": [None] * 120 + ["a", None, "a"]})
    _incremental_equals_replay(df, q, s, [1, 2, 10])


def test_dates_python_cannot_hold_are_dropped_not_an_error():
    """Polars dates reach years ±262,000; Python's stop at 1 … 9999. One record whose unit is such a date,
    after its key's release (a restarted round turns units into Python values), or whose key is one
    (a state stores its keys) made the run fail ("ValueError: year 15659 is out of range", exit 70, the
    year quoted): an error for some data and not for other. Such records are dropped now, also a
    tz-aware time whose local year is 9999 and UTC year 10000, and durations beyond 10^9 days."""
    q = _query(max_records=3)
    s = _seed("far")
    units = pl.Series(list(range(300)) + [5_000_000]).cast(pl.Date)
    df = pl.DataFrame({"ts": [5] * 300 + [150], "user": units, "key": ["a"] * 301})
    rows = _replay_equals_reference(df, q, s, 10)
    assert rows == _replay_equals_reference(df.head(300), q, s, 10) and rows
    edge = pl.DataFrame({"s": pl.Series([dt.datetime(2020, 1, 1), dt.datetime(9999, 12, 31, 23, 30), None],
                                        dtype=pl.Datetime("ms", "UTC"))}).select(
        pl.col("s") + pl.duration(hours=pl.int_range(3) % 2))["s"].dt.convert_time_zone("America/New_York")
    for key in (pl.Series([0, 5_000_000, -1_000_000]).cast(pl.Date), edge):
        df = pl.DataFrame({"ts": [5, 6, 7], "user": ["u", "v", "w"], "key": key})
        inc = sr.StreamState(q, _plan(q), s)
        sr.advance_stream(df.lazy(), inc, inc.time_of(1))
        inc = _roundtrip(inc, q, s)
        assert inc.windows[0].size == 1 + key.null_count()
    far = pl.Series([2**62] * 300 + [1] * 300).cast(pl.Duration("ms"))  # 10^11 days: beyond timedelta
    df = pl.DataFrame({"ts": [5] * 600, "user": [f"u{i}" for i in range(600)], "key": far})
    assert _replay_equals_reference(df, q, s, 10) == _replay_equals_reference(df.tail(300), q, s, 10)


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


@pytest.mark.parametrize("case", range(8))
def test_replays_and_incremental_runs_equal_the_reference_on_odd_inputs(case):
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


def test_the_sign_of_a_zero_key_never_shows():
    """-0.0 and 0.0 are one key (as polars compares); which of them a record holds must not show in the
    release: the same rows whether one record, all or none hold -0.0."""
    q = _query(max_records=1)
    tables = []
    for keys in ([0.0] * 300, [-0.0] + [0.0] * 299, [0.0] * 299 + [-0.0], [-0.0] * 300):
        df = pl.DataFrame({"ts": list(range(300)), "user": [f"u{i}" for i in range(300)], "key": keys})
        t = sr.run_stream(df.lazy(), q, _plan(q), _seed("zero"), sr.naive_utc(1000)).table
        tables.append([(r[:3], math.copysign(1.0, r[3]), r[4:]) for r in t.rows()])
    assert tables[0] and all(t == tables[0] for t in tables)


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


def test_a_malformed_state_names_no_stored_value():
    """A state whose stored key cannot be read back: the error names the problem, never the value
    (a state file holds units and keys of the data; stderr is public)."""
    import json
    from fractions import Fraction

    import pytest

    from dpcli.errors import StateError
    from dpcli.tasks import stream_replay as sr

    q = sr.StreamQuery(time="ts", keys=("key",), unit="user", window=1000, triggers=10, max_records=3,
                       epsilon=Fraction(6), delta=Fraction(1, 10**9))
    plan = sr.plan_stream(q)
    body = {"seed": "00" * 32, "stream": {"watermark": 1, "used": {"units": ["secret-unit-4711"], "records": [1]},
                                          "windows": [{"start": 0, "fired": 1, "keys": [[[{"$d": "secret-key-4711"}], {}]]}]}}
    with pytest.raises(StateError) as err:
        sr.load_state(json.loads(json.dumps(body)), q, plan)
    assert "4711" not in str(err.value) and "malformed" in str(err.value)
