"""Attacks on ``dpcli stream-replay``'s public report (issue 15, findings 3, 4 and 9).

Everything dpcli prints, writes to the ledger or returns as an exit code must be
covered by the charged (ε, δ). With the noise seed forced to one constant (so
that D and D′ draw the same noise), a neighbouring dataset D′ = D plus one unit
must give the same exit code, stderr, --json summary and ledger summary: only
noisy released values may differ, and here the extra unit's key (held by one
unit, δ ≈ 1e-9) is never released, so even the rows agree.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from dpcli.cli.app import app
from dpcli.core.accounting import composition as accounting

runner = CliRunner()

BASE = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "6h",
        "--max-contributions", "3", "--epsilon", "4", "--delta", "1e-9"]
THROUGH = "2026-11-10T00:00:00"


_RHO = functools.lru_cache(maxsize=None)(accounting.rho_for_epsilon)


@pytest.fixture(autouse=True)
def fast_calibration(monkeypatch):
    """The ρ calibration (~1 s a run) gives the same value for the same (ε, δ): compute it once."""
    monkeypatch.setattr(accounting, "rho_for_epsilon", _RHO)


@pytest.fixture
def forced_seed(monkeypatch):
    """Every release seed is one constant: it no longer depends on the key, the data or the state token."""
    monkeypatch.setattr("dpcli.release.seeds.derive_seed", lambda key, material: hashlib.sha256(b"fixed").digest())


def _rows(extra: list[dict] | None = None, first: list[dict] | None = None, value: bool = False) -> pl.DataFrame:
    """D: three pages of 100 units a day over two days (released); ``extra`` rows appended, ``first`` prepended."""
    rows = [{"ts": f"2026-11-0{1 + i % 2}T{(i * 5) % 24:02d}:{i % 60:02d}:00", "user": f"u{i}", "page": f"p{i % 3}",
             "v": float(i % 7)} for i in range(600)]
    rows = (first or []) + rows + (extra or [])
    df = pl.DataFrame(rows, schema={"ts": pl.String, "user": pl.String, "page": pl.String, "v": pl.Float64})
    return df if value else df.drop("v")


def _write(tmp: Path, name: str, df: pl.DataFrame) -> Path:
    path = tmp / name
    df.write_csv(path)
    return path


def _run(monkeypatch, tmp: Path, tag: str, argv: list[str], state_file: Path | None = None,
         setup: list[list[str]] = (), data: pl.DataFrame | None = None) -> dict:
    """Run argv (after ``setup`` runs) in a fresh state dir, with ``data`` written to tmp/data.csv first
    (the same path for D and D′: it appears in messages); return everything public."""
    if data is not None:
        _write(tmp, "data.csv", data)
    monkeypatch.setenv("DPCLI_STATE_DIR", str(tmp / f"state-{tag}"))
    if state_file is not None and state_file.exists():
        state_file.unlink()
    assert runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "50",
                               "--delta", "1e-3"]).exit_code == 0
    for cmd in setup:
        r = runner.invoke(app, cmd)
        assert r.exit_code == 0, r.stderr
    r = runner.invoke(app, argv)
    history = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
    out = {"exit": r.exit_code, "stderr": r.stderr, "ledger": [e.get("summary") for e in history]}
    if r.exit_code == 0 and "--json" in argv:
        doc = json.loads(r.stdout)
        out["summary"] = doc["summary"]
    return out


def _differs(a: dict, b: dict) -> list[tuple[str, object, object]]:
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


NEWCOMER = {"user": "newcomer", "page": "solo", "v": 1.0}


@pytest.mark.parametrize("when", ["2026-11-01T03:00:00", "2026-11-06T21:00:00"], ids=["inside", "latest"])
@pytest.mark.parametrize("mode", ["full", "state"])
def test_one_more_unit_changes_nothing_public(monkeypatch, tmp_path, forced_seed, when, mode):
    """(a) D vs D′ = D + one unit with one event in a key of its own (inside the data's time span, or the
    latest event of all): exit code, stderr, every --json summary field, the ledger's summaries and the
    rows of the other keys are identical."""
    data = tmp_path / "data.csv"
    state = tmp_path / "s.state"
    extra = ["--state", str(state), "--through", THROUGH] if mode == "state" else []
    pair = (("d", _rows()), ("d2", _rows([{**NEWCOMER, "ts": when}])))
    runs = [_run(monkeypatch, tmp_path, tag, ["stream-replay", str(data), *BASE, *extra, "--json"],
                 state if mode == "state" else None, data=df) for tag, df in pair]
    assert runs[0]["exit"] == 0, runs[0]["stderr"]
    assert runs[0]["summary"]["releases"] >= 6
    assert _differs(*runs) == []
    if mode == "full":  # and without --json (no --through: now): the stderr summary line (-v prints it)
        plain = [_run(monkeypatch, tmp_path, f"plain-{tag}", ["-v", "stream-replay", str(data), *BASE, "-o",
                                                              str(tmp_path / "o.csv")], data=df) for tag, df in pair]
        assert plain[0]["exit"] == 0 and plain[0]["stderr"]
        assert _differs(*plain) == []


BAD_RECORDS = {
    "unparsable time": {"ts": "not-a-time", "user": "x1", "page": "p0", "v": 1.0},
    "missing time": {"ts": None, "user": "x1", "page": "p0", "v": 1.0},
    "null unit": {"ts": "2026-11-01T10:00:00", "user": None, "page": "p0", "v": 1.0},
    "NaN value": {"ts": "2026-11-01T10:00:00", "user": "x1", "page": "p0", "v": float("nan")},
    "infinite value": {"ts": "2026-11-01T10:00:00", "user": "x1", "page": "p0", "v": float("inf")},
    "time past year 9999": {"ts": "9999-12-31T23:00:00", "user": "x1", "page": "p0", "v": 1.0},
}


def test_a_bad_record_changes_nothing_public(monkeypatch, tmp_path, forced_seed):
    """(b) D with no bad record and D′ with one (each case of BAD_RECORDS): same exit code, stderr and
    ledger summary."""
    argv = ["-v", "stream-replay", str(tmp_path / "data.csv"), *BASE, "--value", "v", "--bounds", "-10:10",
            "--through", THROUGH, "-o", str(tmp_path / "o.csv")]
    clean = _run(monkeypatch, tmp_path, "d", argv, data=_rows(value=True))
    assert clean["exit"] == 0 and clean["stderr"], clean["stderr"]
    for i, (case, bad) in enumerate(BAD_RECORDS.items()):
        assert _differs(clean, _run(monkeypatch, tmp_path, f"d2-{i}", argv, data=_rows([bad], value=True))) == [], case


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


OPTIONS = {  # option overrides → the exit codes allowed (never 1)
    "through 1e11": (["--through", "100000000000"], {0}),
    "through -1e11": (["--through", "-100000000000"], {2}),
    "through 1e20": (["--through", "100000000000000000000"], {2}),
    "through 9999": (["--through", "9999-12-31T23:59:59"], {0}),
    "through 0001": (["--through", "0001-01-01T00:00:00"], {0}),
    "through 0001 +05:00": (["--through", "0001-01-01T00:00:00+05:00"], {2}),
    "through 9999 -05:00": (["--through", "9999-12-31T23:59:59-05:00"], {2}),
    "window huge": (["--window", "99999999999999d", "--triggers", "4"], {2}),
    "trigger every second": (["--window", "7d", "--trigger-every", "1s"], {2}),
    "clamp huge": (["--value", "v", "--bounds", "-1e300:1e300"], {0, 2}),
    "clamp tiny": (["--value", "v", "--bounds", "-5e-324:5e-324"], {0, 2}),
    "max-records huge": (["--max-contributions", "1000000000000000000"], {0, 2}),
    "epsilon huge": (["--epsilon", "1e6"], {0, 2}),
    "mu huge": (["--mu", "1000000000000000000"], {0, 2}),
}


def test_extreme_options_are_usage_errors_or_work(tmp_path):
    """(c) public options at extremes (each case of OPTIONS, full replay and --state): exit 0 or 2 with
    one line, never 1 (a crash)."""
    f = _write(tmp_path, "d.csv", _rows(value=True))
    assert runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "1000",
                               "--delta", "0.5"]).exit_code == 0
    for n, (case, (extra, allowed)) in enumerate(OPTIONS.items()):
        base = list(BASE)
        if "--window" in extra:  # replace --window/--trigger-every
            i = base.index("--window")
            del base[i: i + 4]
        for mode in ([], ["--state", str(tmp_path / f"{n}.state")])[: 2 if "--through" in extra else 1]:
            r = runner.invoke(app, ["stream-replay", str(f), *base, *extra, *mode])
            assert r.exit_code in allowed, (case, mode, r.exit_code, r.stderr)
            # one line, or typer's own usage block for a bound it checks (max=), whose last line names it
            assert r.stderr.count("\n") <= 1 or r.stderr.rstrip().splitlines()[-1].startswith("Error:"), (case, r.stderr)
