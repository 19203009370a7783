"""Rule 4 in stream-replay's engine: no error depends on the data (an exit code is public).

Found by the adversarial review of the vectorised DP-SQLP engine (issue 20: ``dpcli/tasks/stream/
batches.py``, ``algorithm.py``):

* a run whose every (unit, key) pair of a window was already in its key's round crashed (KeyError): the
  simplest cron stream (a user back on the same page) gave an internal error, exit 70;
* a unit or key type the state's JSON cannot store (Decimal, Time, Duration, Binary) was refused only
  when a value had to be stored, i.e. iff some record counted (exit 2 vs 0: one bit of data);
* time-zone-aware units crashed the first run after a restore (polars SchemaError); tz-aware keys came
  back in UTC spelling, which sorts predicted releases differently across DST;
* a restored window typed its keys from its first 100 keys only: a key column null in those crashed
  the next run (ComputeError, whose message even quoted a key value);
* a unit or key date beyond Python's years 1 … 9999 failed the run once it became a Python value
  (a release, a restarted round, a state), quoting the year (also in the per-key engine before).

The same review's findings on the caps are rule 5's (``test_rule5_stream_engine.py``).
"""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dptest import init_ledger, runner
from stream_engine_checks import _incremental_equals_replay, _plan, _query, _replay_equals_reference, _roundtrip, _seed

from dpcli.cli.app import app
from dpcli.errors import UsageError
from dpcli.tasks import stream as sr
from dpcli.tasks.stream.algorithm import key_label

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
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-6")
    args = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "1h",
            "--max-contributions", "3", "--epsilon", "4", "--delta", "1e-9"]
    state = tmp_path / "s.state"
    for hour in (0, 1):
        f = tmp_path / f"h{hour}.csv"
        pl.DataFrame({"ts": [f"2026-11-01T{hour:02d}:30:00"], "user": ["u1"], "page": ["p"]}).write_csv(f)
        r = runner.invoke(app, ["stream-replay", str(f), *args, "--state", str(state),
                                "--through", f"2026-11-01T{hour + 1:02d}:00:00"])
        assert r.exit_code == 0, r.stderr


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
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-6")
    args = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "1h",
            "--max-contributions", "3", "--epsilon", "4", "--delta", "1e-9", "--through", "2026-11-01T01:00:00"]
    results = []
    for n in (9, 1):  # records after --through (none counts), then records that count
        f = _parquet(tmp_path / f"d{n}.parquet", users, n)
        r = runner.invoke(app, ["stream-replay", str(f), "--input-format", "parquet", *args,
                                "--state", str(tmp_path / f"s{n}.state")])
        results.append((r.exit_code, r.stdout, r.stderr.replace(f"d{n}", "D").replace(f"s{n}", "S")))
        assert not (tmp_path / f"s{n}.state").exists()
    # decimal, time and binary units cannot be sampled by the keyed order at all: the schema check of unit and key
    # columns refuses them first (65); the others the state's check of what it can store (2). Both from the schema.
    expected = 65 if dtype in ("decimal", "time", "binary") else 2
    assert results[0] == results[1] and results[0][0] == expected, results
    q = _query(keys=("user",), unit="key")
    with pytest.raises(UsageError, match="cannot store column 'user'"):  # as a key column too
        sr.key_schema_of(pl.Schema({"ts": pl.Int64, "key": pl.String, "user": users.dtype}), q)


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
