"""Rule 4 for stream-replay: a bad or late record, or an extreme private time, changes nothing public.

Attacks on stream-replay's public report (issue 15, findings 4 and 9). With the noise seed forced to one
constant, D with no bad record and D′ with one (an unparsable, missing or far time, a null unit, a NaN
or infinite value, a first record in another time layout, an event late for ``--state``) give the same
exit code, stderr and ledger summary; epoch times of ±1e11 and ±1e18 s in the data are dropped, not
fatal.
"""

from __future__ import annotations

import polars as pl
from stream_reports import BASE, NEWCOMER, THROUGH, _differs, _rows, _run, _write


def test_a_bad_record_changes_nothing_public(monkeypatch, tmp_path, forced_seed):
    """(b) D with no bad record and D′ with one (each case of BAD_RECORDS): same exit code, stderr and
    ledger summary."""
    argv = ["-v", "stream-replay", str(tmp_path / "data.csv"), *BASE, "--value", "v", "--bounds", "-10:10",
            "--through", THROUGH, "-o", str(tmp_path / "o.csv")]
    clean = _run(monkeypatch, tmp_path, "d", argv, data=_rows(value=True))
    assert clean["exit"] == 0 and clean["stderr"], clean["stderr"]
    for i, (case, bad) in enumerate(BAD_RECORDS.items()):
        assert _differs(clean, _run(monkeypatch, tmp_path, f"d2-{i}", argv, data=_rows([bad], value=True))) == [], case


BAD_RECORDS = {
    "unparsable time": {"ts": "not-a-time", "user": "x1", "page": "p0", "v": 1.0},
    "missing time": {"ts": None, "user": "x1", "page": "p0", "v": 1.0},
    "null unit": {"ts": "2026-11-01T10:00:00", "user": None, "page": "p0", "v": 1.0},
    "NaN value": {"ts": "2026-11-01T10:00:00", "user": "x1", "page": "p0", "v": float("nan")},
    "infinite value": {"ts": "2026-11-01T10:00:00", "user": "x1", "page": "p0", "v": float("inf")},
    "time past year 9999": {"ts": "9999-12-31T23:00:00", "user": "x1", "page": "p0", "v": 1.0},
}


def test_the_first_record_does_not_choose_how_times_are_read(monkeypatch, tmp_path, forced_seed):
    """(b) polars infers a datetime format from the first value: one record with an offset (or another
    layout) placed first made every other timestamp unparsable. Times are read with fixed formats."""
    data = tmp_path / "data.csv"
    for i, ts in enumerate(["2026-11-01T04:00:00+02:00", "01/11/2026 04:00"]):
        pair = (("d", _rows()), ("d2", _rows(first=[{**NEWCOMER, "ts": ts}])))
        runs = [_run(monkeypatch, tmp_path, f"{tag}{i}", ["stream-replay", str(data), *BASE, "--through", THROUGH,
                                                          "--json"], data=df) for tag, df in pair]
        assert runs[0]["exit"] == 0, runs[0]["stderr"]
        assert _differs(*runs) == []


def test_a_late_event_in_state_mode_changes_nothing_public(monkeypatch, tmp_path, forced_seed):
    """(b) --state: after a run through Nov 2, a second run whose file also holds an event of Nov 1
    (a trigger already released) gives the same exit code, stderr and summary as without it."""
    state = tmp_path / "s.state"
    day1 = _write(tmp_path, "day1.csv", _rows().filter(pl.col("ts") < "2026-11-02"))
    day2 = _rows().filter(pl.col("ts") >= "2026-11-02")
    late = pl.DataFrame({"ts": ["2026-11-01T10:00:00"], "user": ["late"], "page": ["p0"]})
    data = tmp_path / "data.csv"
    first = ["stream-replay", str(day1), *BASE, "--state", str(state), "--through", "2026-11-02T00:00:00"]
    runs = [_run(monkeypatch, tmp_path, tag, ["stream-replay", str(data), *BASE, "--state", str(state),
                                              "--through", "2026-11-03T00:00:00", "--json"], state, [first], df)
            for tag, df in (("d", day2), ("d2", pl.concat([day2, late])))]
    assert runs[0]["exit"] == 0, runs[0]["stderr"]
    assert _differs(*runs) == []


EXTREME_TIMES = [100_000_000_000, -100_000_000_000, 10**18, -(10**18)]


def test_extreme_private_times_are_dropped_not_fatal(monkeypatch, tmp_path):
    """(c) epoch seconds of ±1e11 and ±1e18 (and ±inf, NaN) in the data: exit 0, like without them."""
    base = pl.DataFrame({"ts": [1_700_000_000 + 60 * i for i in range(50)], "user": [f"u{i}" for i in range(50)],
                         "page": ["p"] * 50})
    for i, df in enumerate([
        pl.concat([base, pl.DataFrame({"ts": EXTREME_TIMES, "user": ["x"] * 4, "page": ["p"] * 4})]),
        pl.concat([base.with_columns(pl.col("ts").cast(pl.Float64)),
                   pl.DataFrame({"ts": [1e300, -1e300, float("inf"), float("nan")], "user": ["x"] * 4, "page": ["p"] * 4})]),
    ]):
        f = tmp_path / f"e{i}.parquet"
        df.write_parquet(f)
        r = _run(monkeypatch, tmp_path, f"e{i}", ["stream-replay", str(f), *BASE])
        assert r["exit"] == 0, r["stderr"]
