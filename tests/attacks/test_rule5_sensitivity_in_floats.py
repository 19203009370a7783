"""Rule 5, sensitivity holds in floating point too: no row moves an aggregate beyond its declared sensitivity.

Attack: float arithmetic against the declared sensitivity (issue 15, findings 5, 6 and 9).

* Finding 5: the bounds' grid units were computed exactly in Python while polars snapped values with
  float division and its own rounding, so with a non-power-of-two ``--granularity`` (``--bounds
  0:1.47 --granularity 0.98``) one row moved a sum by 2 grid steps while the noise was calibrated
  for 1.
* Finding 6: sums wrapped around Int64 (three rows of 9e18 at granularity 1).
* Finding 9: extreme ``--bounds``/``--granularity`` crashed (exit 1).

The property test (50 examples in ``make test``, 150 under ``make audit``) draws random bounds and granularities (powers of two or not, negative, tiny and huge
magnitudes) and one row at any value (the bounds, just outside them, ±inf, NaN, ...): that row never
moves the exact integer aggregate that noise is added to (rows, sum, centred sum, sum of squares) by
more than the sensitivity the noise is calibrated for.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dptest import init_ledger, runner
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from dpcli import bounding
from dpcli.cli.app import app
from dpcli.core import mechanisms as mech
from dpcli.errors import UsageError
from dpcli.tasks import histogram as hist

MEASUREMENTS = ("rows", "sum", "csum", "csumsq")
SCHEMA = {"user": pl.String, "g": pl.String, "x": pl.Float64}


@pytest.fixture
def zero_noise(monkeypatch):
    """Every noise draw is 0: released values are the exact pre-noise aggregates (post-processed)."""
    monkeypatch.setattr(mech.Noise, "sample", lambda self, stream, n: np.zeros(n, dtype=np.int64))


def _history() -> list:
    return json.loads(runner.invoke(app, ["budget", "history", "default", "--json"]).stdout)


def _histogram(tmp_path: Path, xs: list[float], *opts: str) -> tuple[int, str, dict | None]:
    data = tmp_path / "d.parquet"
    pl.DataFrame([(f"u{i}", "a", x) for i, x in enumerate(xs)], schema=SCHEMA, orient="row").write_parquet(data)
    (tmp_path / "keys.csv").write_text("g\na\n")
    r = runner.invoke(app, ["histogram", str(data), "--by", "g", "--privacy-unit", "user", "--value", "x",
                            "--keys", str(tmp_path / "keys.csv"), *opts, "--json"])
    return r.exit_code, r.stderr, json.loads(r.stdout) if r.exit_code == 0 else None


# ---- finding 5: the grid of a non-power-of-two granularity -----------------------------------------


@pytest.mark.parametrize("x", [1.47, 1.4699999999999998, 1.5, 1e300, float("inf"), 0.49, 0.4900000000000001])
def test_cli_one_row_moves_a_sum_by_at_most_its_sensitivity(tmp_path, zero_noise, x):
    """``--bounds 0:1.47 --granularity 0.98`` released a single row of 1.47 as 1.96 (2 grid steps)
    while the noise scale (ε = 1, one measurement) said 1 step."""
    init_ledger("approx", "--epsilon", "1e6", "--delta", "0.5")
    code, err, doc = _histogram(tmp_path, [x], "--agg", "sum", "--bounds", "0:1.47", "--granularity", "0.98",
                                "--epsilon", "1")
    assert code == 0, err
    scale = float(doc["summary"]["measurements"]["sum"]["scale"])  # = sensitivity in grid steps (ε = 1, K = 1)
    released = doc["result"][0]["sum_x"]
    assert abs(released) <= scale * 0.98 + 1e-12
    assert 0 <= released <= 1.47  # and the snapped value stays inside the declared bounds


def _values(lo: float, hi: float) -> st.SearchStrategy[float]:
    special = [lo, hi, math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf), math.nextafter(lo, math.inf),
               math.nextafter(hi, -math.inf), (lo + hi) / 2 if math.isfinite((lo + hi) / 2) else lo / 2 + hi / 2,
               0.0, -0.0, math.inf, -math.inf, math.nan, 1e308, -1e308, 5e-324]
    inside = st.floats(min_value=lo, max_value=hi)
    return st.one_of(st.sampled_from(special), inside, st.floats(allow_nan=True, allow_infinity=True))


@st.composite
def _grids(draw: st.DrawFn) -> tuple[float, float, Fraction | None]:
    """Bounds of any magnitude and sign, and a granularity: default, a power of two, a decimal, or the
    width over a number of steps (which is where non-powers of two meet awkward floats)."""
    scale = draw(st.sampled_from([1.0, 1e-300, 1e-5, 1e3, 1e18, 1e300, 2.0 ** 62, 5e-324]))
    a = draw(st.one_of(st.integers(-5000, 5000).map(float), st.floats(-1e6, 1e6))) * scale
    b = draw(st.one_of(st.integers(-5000, 5000).map(float), st.floats(-1e6, 1e6))) * scale
    lo, hi = min(a, b), max(a, b)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        lo, hi = -1.0, 1.47
    kind = draw(st.sampled_from(["default", "power", "decimal", "steps"]))
    if kind == "default":
        return lo, hi, None
    if kind == "power":
        return lo, hi, Fraction(2) ** draw(st.integers(-1080, 1030))
    if kind == "decimal":
        return lo, hi, Fraction(draw(st.integers(1, 999)), 100) * Fraction(10) ** draw(st.integers(-330, 310))
    steps = draw(st.integers(1, 1 << 34))
    g = (Fraction(hi) - Fraction(lo)) / steps
    return lo, hi, Fraction(float(g)) if draw(st.booleans()) and float(g) > 0 else g


def _totals(rows: list[tuple], spec: bounding.BoundingSpec) -> pl.DataFrame:
    df = pl.DataFrame(rows, schema=SCHEMA, orient="row")
    partial = bounding.bound_contributions(df.lazy(), spec, salt=7).collect()
    totals = bounding.group_totals(partial, spec)
    return pl.DataFrame({"g": ["a"]}).join(totals, on="g", how="left").fill_null(0)


def _one_row_never_moves_an_aggregate_beyond_its_sensitivity(data: st.DataObject, grid: tuple) -> None:
    lo, hi, g = grid
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("sum", "variance", "median"), value="x",
                            bounds=(lo, hi), granularity=g, epsilon=Fraction(1), domain="keys")
    try:
        q.validate()
        vg = q.grid
    except UsageError as exc:  # a grid that cannot be honoured is refused from the options alone
        note(f"refused: {exc}")
        event("grid refused")
        return
    event("grid accepted")
    assert vg is not None and vg.lo_units <= vg.hi_units
    x = data.draw(_values(lo, hi), label="x")
    base = [("b1", "a", data.draw(_values(lo, hi), label="b1")), ("b2", "a", data.draw(_values(lo, hi), label="b2"))]
    spec = bounding.BoundingSpec("user", ("g",), 1, 1, value="x", grid=vg)
    before, after = _totals(base, spec), _totals([*base, ("new", "a", x)], spec)
    for name in MEASUREMENTS:
        sens = hist.measurement_sensitivity(name, q)
        t0 = int(hist.true_values(before, name, vg)[0])
        t1 = int(hist.true_values(after, name, vg)[0])
        note(f"{name}: {t0} → {t1}, sensitivity {sens}, grid {vg}")
        assert abs(t1 - t0) <= sens
        assert abs(t0) <= 2 * sens  # each base row is within the bound too
    # Quantile bins: the row lands in one of the bins (its rank moves by at most 1).
    rows = bounding.bounded_rows(pl.DataFrame([("new", "a", x)], schema=SCHEMA, orient="row").lazy(), spec, 7)
    units = rows.collect()[bounding.GRID].to_list()
    assert all(vg.lo_units - vg.mid_units <= u <= vg.hi_units - vg.mid_units for u in units)


PROPERTY = dict(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


@settings(max_examples=50, **PROPERTY)
@given(data=st.data(), grid=_grids())
def test_one_row_never_moves_an_aggregate_beyond_its_sensitivity(data, grid):
    _one_row_never_moves_an_aggregate_beyond_its_sensitivity(data, grid)


@pytest.mark.audit
@settings(max_examples=150, **PROPERTY)
@given(data=st.data(), grid=_grids())
def test_one_row_never_moves_an_aggregate_beyond_its_sensitivity_full(data, grid):
    _one_row_never_moves_an_aggregate_beyond_its_sensitivity(data, grid)


# ---- finding 6: no wrap-around ---------------------------------------------------------------------


def test_cli_grid_too_fine_for_exact_integer_sums_is_a_usage_error(tmp_path):
    """Three rows of 9e18 at granularity 1 used to release 8.55e18 (a wrapped Int64 sum)."""
    init_ledger("approx", "--epsilon", "1e6", "--delta", "0.5")
    code, err, _ = _histogram(tmp_path, [9e18] * 3, "--agg", "sum", "--bounds", "0:9.2e18", "--granularity", "1",
                              "--epsilon", "1e5")
    assert code == 2 and err.startswith("dpcli: error:") and err.count("\n") == 1 and "granularity" in err
    assert _history() == []


@pytest.mark.parametrize(
    "bounds, granularity, xs",
    [
        ("-9.2e18:9.2e18", str(2**32), [9e18, -9e18, 2.0**53, 2.0**62, 9e18, 9e18, 9e18, -9e18]),
        ("0:4611686018427387904", str(2**31), [2.0**62, 2.0**62, 2.0**62, 2.0**53, 9e18, 2.0**62]),
        ("-4611686018427387904:0", str(2**31), [-(2.0**62)] * 5 + [-1e300]),
    ],
)
def test_cli_sums_near_the_limits_do_not_wrap(tmp_path, zero_noise, bounds, granularity, xs):
    """With noise patched to zero the released sum, mean and variance are the mathematical ones of the
    clamped, snapped values (each row within one grid step of its clamped value): nothing wraps."""
    init_ledger("approx", "--epsilon", "1e6", "--delta", "0.5")
    code, err, doc = _histogram(tmp_path, xs, "--agg", "count,sum,mean,variance", "--bounds", bounds,
                                "--granularity", granularity, "--epsilon", "1e5")
    assert code == 0, err
    lo, hi = (float(b) for b in bounds.split(":"))
    g = float(granularity)
    clamped = [Fraction(min(max(x, lo), hi)) for x in xs]
    row = doc["result"][0]
    n = len(xs)
    assert row["count"] == n
    assert abs(Fraction(row["sum_x"]) - sum(clamped)) <= n * Fraction(g)
    # Exactly: g is a power of two, so x / g is exact and the snapped values are these integers.
    lo_u, hi_u = math.ceil(Fraction(lo) / Fraction(g)), math.floor(Fraction(hi) / Fraction(g))
    units = [min(max(round(Fraction(x) / Fraction(g)), lo_u), hi_u) if math.isfinite(x) else (hi_u if x > 0 else lo_u)
             for x in xs]
    assert row["sum_x"] == float(sum(units) * Fraction(g))
    mean = sum(clamped) / n
    assert abs(Fraction(row["mean_x"]) - mean) <= Fraction(g)
    var = sum((c - mean) ** 2 for c in clamped) / n
    spread = max(abs(c - mean) for c in clamped) + 2 * Fraction(g)
    assert abs(Fraction(row["variance_x"]) - var) <= 4 * Fraction(g) * spread + Fraction(g) ** 2


# ---- finding 9: extreme bounds and granularities -----------------------------------------------


ALL = "count,sum,mean,median,variance"
MAX = 1.7976931348623157e308


@pytest.mark.parametrize(
    "bounds, granularity, xs, aggs, expected",
    [
        ("-1e308:1e308", None, [1e308, -1e308, 0.0, 5e307], "count,sum,mean,median", 0),
        ("-1e308:1e308", None, [1e308, -1e308], "count,variance", 2),  # a variance beyond the float range: refused
        (f"{-MAX}:{MAX}", None, [math.inf, -math.inf, 1.0], "count,sum,mean,median", 0),
        ("-1e150:1e150", None, [1e150, -1e150], ALL, 0),
        ("0:5e-324", None, [5e-324, 0.0], ALL, 2),
        ("0:1e-310", None, [1e-311], ALL, 2),
        ("1e-300:2e-300", None, [1.5e-300], ALL, 0),
        ("0:1", "1e-300", [0.5], ALL, 2),
        ("0:1", "1e300", [0.5], ALL, 2),
        ("0:1", "5e-324", [0.5], ALL, 2),
        ("0:5e-324", "5e-324", [5e-324], ALL, 2),
        ("-1e308:1e308", "1e300", [1e308, -1e308, 3e305], "count,sum,mean,median", 0),
        ("0:1.47", "1.5", [1.0], ALL, 2),
    ],
)
def test_cli_extreme_bounds_and_granularity_answer_or_refuse_cleanly(tmp_path, zero_noise, bounds, granularity, xs,
                                                                     aggs, expected):
    """Each is either a one-line usage error (exit 2, nothing charged, as the dry run says) or a sane answer."""
    init_ledger("approx", "--epsilon", "1e6", "--delta", "0.5")
    opts = ["--agg", aggs, "--bounds", bounds, "--epsilon", "1e5"]
    if granularity:
        opts += ["--granularity", granularity]
    code, err, doc = _histogram(tmp_path, xs, *opts)
    dry = runner.invoke(app, ["histogram", "-", "--by", "g", "--privacy-unit", "user", "--value", "x", *opts,
                              "--keys", str(tmp_path / "keys.csv"), "--dry-run"])
    assert dry.exit_code == code == expected, (dry.stderr, err)  # decided from the options alone
    if code == 2:
        assert err.startswith("dpcli: error:") and err.count("\n") == 1
        assert _history() == []
        return
    assert code == 0, err
    lo, hi = (float(b) for b in bounds.split(":"))
    row = doc["result"][0]
    assert row["count"] == len(xs)
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for k, v in row.items() if k != "g"), row
    clamped = [Fraction(min(max(x, lo), hi)) for x in xs]
    step = (Fraction(hi) - Fraction(lo)) / 2048  # the default grid has ≥ 4096 steps; the given ones here too
    if "sum_x" in row:
        assert abs(Fraction(row["sum_x"]) - sum(clamped)) <= len(xs) * step
        assert lo <= row["mean_x"] <= hi and lo <= row["median_x"] <= hi
    if "variance_x" in row:
        assert 0 <= row["variance_x"] <= (hi - lo) ** 2
