"""``--with-error`` (issue 31): a margin for every released number, or a note saying why not.

The coverage of every margin is audited by simulation in ``tests/audit/test_audit_margins.py``
(``make audit``); here, fast: the columns exist and are finite and positive, the interval functions
behave at their edges, and the notes (quantiles without a value margin, means near a bound) appear
when they should and only then. Statistical checks use fixed seeds.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from dptest import PAGES, PV, PV_SMALL, cli, init_ledger, stream
from tabulate_specs import write_spec
from test_advice import notes

from dpcli.core import intervals
from dpcli.core import mechanisms as mech

HIST = ("histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--value", "duration_s", "--bounds",
        "0:600", "--max-contributions", "5", "--epsilon", "1", "--delta", "1e-7")


def _released(r) -> pl.DataFrame:
    assert r.exit_code == 0, r.stderr
    return pl.DataFrame(json.loads(r.stdout)["result"])


def _finite_positive(df: pl.DataFrame, column: str) -> None:
    margin = df[f"{column}_moe95"].cast(pl.Float64).to_numpy()
    assert margin.size and np.isfinite(margin).all() and (margin > 0).all(), (column, margin)


@pytest.mark.parametrize("noise", [(), ("--noise", "gaussian")])
def test_every_histogram_statistic_has_a_finite_positive_margin_or_a_note(noise):
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    r = cli(*HIST, *noise, "--agg", "count,count-units,sum,mean,variance,median", "--with-error", "--json")
    df = _released(r)
    for column in ("count", "count_units", "sum_duration_s", "mean_duration_s", "variance_duration_s",
                   "median_duration_s"):
        _finite_positive(df, column)
    assert not any("quantiles have no margin column" in n for n in notes(r.stderr)), r.stderr
    how = json.loads(r.stdout)["summary"]["margins"]
    assert "conditional on the group passing its selection" in how["count_units"]
    assert how["mean_duration_s"].startswith("conservative")
    assert how["median_duration_s"].startswith("95% interval of the bounded sample quantile")
    # the same release without --with-error: no margin columns and no quantile note (charged: with --with-error
    # a quantile's share also paid for its interval, so the two are different releases)
    plain = cli(*HIST, *noise, "--agg", "count,count-units,sum,mean,variance,median", "--json")
    assert not any(c.endswith("_moe95") for c in _released(plain).columns)
    summary, with_error = json.loads(plain.stdout)["summary"], json.loads(r.stdout)["summary"]
    assert summary["charged"] is True and summary["seed_id"] != with_error["seed_id"]  # never the same noise
    assert not any("quantiles" in n for n in notes(plain.stderr))
    assert notes(cli("-q", *HIST, *noise, "--agg", "median", "--with-error").stderr) == []


def test_unklap_and_known_groups_counts_have_margins():
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    unklap = _released(cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--selection", "unklap",
                           "--max-groups", "20", "--epsilon", "0.5", "--delta", "1e-8", "--with-error", "--json"))
    _finite_positive(unklap, "count")
    keys = _released(cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--agg",
                         "count-units,mean", "--value", "duration_s", "--bounds", "0:600", "--epsilon", "1",
                         "--with-error", "--json"))
    _finite_positive(keys, "count_units")
    _finite_positive(keys, "mean_duration_s")
    assert keys["count_units_moe95"].n_unique() == 1  # no selection: the noise's own interval for every group


def test_topk_counts_have_margins():
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    for extra in ((), ("--keys", PAGES)):
        df = _released(cli("topk", PV_SMALL, "--by", "page", "-k", "5", "--privacy-unit", "user_id", "--epsilon-per",
                           "0.2", "--delta", "1e-8", *extra, "--with-error", "--json"))
        _finite_positive(df, "count")


def test_every_tabulate_cell_has_a_margin(tmp_path):
    spec = write_spec(tmp_path, '[[levels]]\ngeography = "state"\niterations = "reg"\nepsilon = 0.5\nstability = 4\n')
    data = tmp_path / "p.csv"
    pl.DataFrame({"block": ["01001", "02001"] * 50, "race": ["1000;2000", "1500"] * 50, "eth": [1, 2] * 50,
                  "sex": ["1", "2"] * 50, "age": [30, 80] * 50}).write_csv(data)
    init_ledger("pure", "--epsilon", "1")
    r = cli("tabulate", data, "--spec", spec, "--with-error")
    assert r.exit_code == 0, r.stderr
    df = pl.read_csv(r.stdout.encode())
    assert df.height and np.isfinite(df["moe95"].to_numpy()).all() and (df["moe95"] > 0).all()


def test_mean_near_a_bound_is_noted_from_released_means_only():
    """Sample durations average about 33 s: within 2.5% of the width of 0 for --bounds 0:10000
    (250 s), not for 0:600 (15 s). The note comes with or without --with-error, and -q silences it."""
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    args = ("histogram", PV, "--by", "country", "--privacy-unit", "user_id", "--agg", "mean", "--value",
            "duration_s", "--max-contributions", "5", "--epsilon", "1", "--delta", "1e-7")
    wide = notes(cli(*args, "--bounds", "0:10000").stderr)
    assert any("mean_duration_s: 8 released mean(s) lie within 2.5% of the bounds' width of 0" in n
               and "widen --bounds" in n for n in wide), wide
    assert not any("released mean" in n for n in notes(cli(*args, "--bounds", "0:600", "--with-error").stderr))
    assert any("width of 30;" in n for n in notes(cli(*args, "--bounds", "-9000:30").stderr))  # the upper bound
    assert notes(cli("-q", *args, "--bounds", "0:10000").stderr) == []


# --- the interval functions --------------------------------------------------------------------


NOISES = [mech.laplace(1, Fraction(1, 2)), mech.laplace(3, Fraction(1, 7)), mech.gaussian(1, Fraction(1, 8)),
          mech.gaussian(25, Fraction(1, 100))]


@pytest.mark.parametrize("noise", NOISES, ids=lambda n: str(n.describe()))
def test_margin_generalises_margin95_and_log_survival_matches_tail(noise):
    assert noise.margin(0.05) == noise.margin95()
    assert noise.margin(0.05 / 3) >= noise.margin(0.025) >= noise.margin(0.05) >= noise.margin(0.2)
    for alpha in (0.05, 0.025, 0.01):
        m = noise.margin(alpha)
        assert 2 * noise.tail(m + 1) <= alpha < 2 * noise.tail(m)  # the smallest such m
    d = np.arange(-40, 41)
    expected = np.array([math.log(noise.tail(int(x))) for x in d])
    assert np.allclose(intervals.log_survival(noise, d), expected, rtol=1e-9, atol=1e-12)


def test_normal_tail_path_for_a_large_sigma():
    noise = mech.gaussian(1, Fraction(1, 10**12))  # σ ≈ 7·10⁵: beyond the exact tail sums
    sigma = math.sqrt(float(noise.param))
    got = intervals.log_survival(noise, np.array([1, round(2 * sigma)]))
    assert got[0] == pytest.approx(math.log(0.5), abs=1e-5) and got[1] == pytest.approx(math.log(0.02275), rel=1e-3)


@pytest.mark.parametrize("noise", NOISES, ids=lambda n: str(n.describe()))
def test_selected_interval_edges(noise):
    m = noise.margin95()
    tau = mech.selection_threshold(noise, 1, 1e-7)
    far = np.array([tau + 100 * m + 1000])
    lo, hi = intervals.selected_interval(noise, far, tau)
    assert (lo[0], hi[0]) == (far[0] - m, far[0] + m)  # far above τ: the plain noise interval
    at = np.array([tau, tau + 1])
    lo, hi = intervals.selected_interval(noise, at, tau)
    assert (lo == 0).all() and (hi <= at + m).all() and (hi >= lo).all()  # at τ: anything down to 0
    lo, hi = intervals.selected_interval(noise, far, -10**9)  # a threshold nobody is near: no conditioning
    assert (lo[0], hi[0]) == (far[0] - m, far[0] + m)


def test_selected_interval_covers_at_the_threshold_small_sample():
    """Fixed seed, true count exactly τ, 4,000 draws (about half pass): coverage must be at least
    93%, three standard deviations (√(0.95·0.05/2000) ≈ 0.5%) below 95%. The full audit is in
    tests/audit/test_audit_margins.py."""
    noise = mech.laplace(1, Fraction(1, 2))
    tau = mech.selection_threshold(noise, 1, 1e-7)
    u = tau + noise.sample(stream("selected"), 4000)
    u = u[u >= tau]
    lo, hi = intervals.selected_interval(noise, u, tau)
    assert ((lo <= tau) & (tau <= hi)).mean() >= 0.93


def test_ratio_intervals_hold_the_released_value_and_fall_back_to_the_bounds():
    n = np.array([100.0, 5.0, -3.0, 100.0])
    s = np.array([250.0, -40.0, 10.0, 1e6])  # the last: a sum no 100 values in [−10, 10] can reach
    lo, hi = intervals.mean_interval(n, s, 10.0, 30.0, -10.0, 10.0)
    ratio = s / np.maximum(n, 1)
    assert (lo[:2] <= ratio[:2]).all() and (ratio[:2] <= hi[:2]).all()
    assert (lo[2], hi[2]) == (-10.0, 10.0) and (lo[3], hi[3]) == (-10.0, 10.0)  # no rows / impossible box
    q = np.array([5000.0, 400.0, 0.0, 1e7])
    vlo, vhi = intervals.variance_interval(n, s, q, (10.0, 30.0, 500.0), -10.0, 10.0)
    released = q[:2] / n[:2] - ratio[:2] ** 2
    assert (vlo[:2] <= released).all() and (released <= vhi[:2]).all()
    assert ((vlo >= 0) & (vlo <= vhi) & (vhi <= 100.0)).all()
    assert (vlo[3], vhi[3]) == (0.0, 100.0)
    assert intervals.cover_margin(np.array([3.0]), np.array([1.0]), np.array([4.0]))[0] == 2.0
