"""Gap sampling (dpcli.tasks.quantile_gaps) and the weighted exponential mechanism it draws runs with: the runs
cover every grid point once with the right utility, and the two draws give P[x] ∝ exp(rate·u(x)) per point."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.tasks import quantile_gaps as qg


def _point_utilities(values: np.ndarray, width: int, p: Fraction) -> np.ndarray:
    points = np.arange(width + 1)
    s = np.sort(values)
    below, at_most = np.searchsorted(s, points, "left"), np.searchsorted(s, points, "right")
    n = values.size
    over, under = p.denominator * below - p.numerator * n, p.numerator * n - p.denominator * at_most
    return -np.maximum(0, np.maximum(over, under))


def test_runs_cover_every_grid_point_once_with_its_utility():
    rng = np.random.default_rng(5)  # test data only; never noise
    width, groups = 40, 6
    frames = [rng.integers(0, width + 1, rng.integers(0, 30)) for _ in range(groups - 1)] + [np.array([0, width] * 3)]
    group = np.concatenate([np.full(np.unique(f).size, i) for i, f in enumerate(frames)]).astype(np.int64)
    uniq = [np.unique(f, return_counts=True) for f in frames]
    offset = np.concatenate([u[0] for u in uniq]).astype(np.int64)
    count = np.concatenate([u[1] for u in uniq]).astype(np.int64)
    for p in (Fraction(1, 2), Fraction(1, 10), Fraction(99, 100), Fraction(0), Fraction(1)):
        u, widths, starts, sizes = qg.gap_runs(group, offset, count, groups, width, p)
        for i, f in enumerate(frames):
            k = int(sizes[i])
            assert (widths[i, :k] >= 1).all() and widths[i, :k].sum() == width + 1
            assert (starts[i, 1:k] == starts[i, : k - 1] + widths[i, : k - 1]).all() and starts[i, 0] == 0
            expanded = np.repeat(u[i, :k], widths[i, :k])
            assert (expanded == _point_utilities(f, width, p)).all(), (i, p)


def test_weighted_rows_choose_in_proportion_to_their_weights():
    """20,000 draws over one row of four items with weights c·e^u; each frequency within 4.5 binomial standard
    deviations of its probability (a false alarm below 1e-4 per item, with fixed keys it is deterministic)."""
    u = np.array([[0, -2, -5, 1, 0]])
    c = np.array([[1, 10, 1000, 3, 99]])
    sizes = np.array([4])
    draws = 20_000
    utilities, multipliers = np.repeat(u, draws, axis=0), np.repeat(c, draws, axis=0)
    picks = mech.exponential_mechanism_weighted_rows(KeyedStream(b"w" * 32, "em"), utilities, multipliers,
                                                     np.repeat(sizes, draws), Fraction(1))
    w = c[0, :4] * np.exp(u[0, :4].astype(float))
    prob = w / w.sum()
    freq = np.bincount(picks, minlength=5) / draws
    assert freq[4] == 0
    assert (np.abs(freq[:4] - prob) <= 4.5 * np.sqrt(prob * (1 - prob) / draws)).all(), (freq, prob)


def test_gap_quantiles_draw_each_grid_point_with_its_exponential_mechanism_probability():
    """Per point P[x] = exp(rate·u(x))/Σ: 30,000 groups with the same rows, the frequencies of the 21 points within
    4.5 binomial standard deviations (fixed keys)."""
    values = np.array([3, 3, 7, 8, 8, 8, 15])
    width, p, rate = 20, Fraction(1, 2), Fraction(1, 3)
    groups = 30_000
    offs, counts = np.unique(values, return_counts=True)
    group = np.repeat(np.arange(groups), offs.size)
    chosen = qg.gap_quantiles(KeyedStream(b"g" * 32, "q"), group, np.tile(offs, groups), np.tile(counts, groups),
                              groups, width, p, rate)
    u = _point_utilities(values, width, p).astype(float)
    prob = np.exp(float(rate) * u) / np.exp(float(rate) * u).sum()
    freq = np.bincount(chosen, minlength=width + 1) / groups
    assert chosen.min() >= 0 and chosen.max() <= width
    assert (np.abs(freq - prob) <= 4.5 * np.sqrt(prob * (1 - prob) / groups) + 1e-12).all(), (freq, prob)


def test_refuses_padding_and_bad_multipliers():
    s = KeyedStream(b"r" * 32, "x")
    with pytest.raises(ValueError):
        mech.exponential_mechanism_weighted_rows(s, np.zeros((1, 2)), np.array([[1, 0]]), np.array([2]), Fraction(1))
    with pytest.raises(ValueError):
        mech.exponential_mechanism_weighted_rows(s, np.zeros((1, 2)), np.ones((1, 2)), np.array([0]), Fraction(1))
    assert math.isclose(qg.grid_points(-3, 3), 7)


def test_with_error_a_quantile_gets_a_value_interval_charged_within_its_share():
    """--with-error: the value's rate halves (1/2 of the share), the ends get 1/5 each at sensitivity C and the
    row count 1/10 (pure ε adds up to the quantile's share); the release carries a finite `_moe95` per group."""
    import polars as pl

    from dpcli.tasks import histogram as hist
    from dpcli.tasks import quantile_interval as qi

    base = {"by": ("g",), "unit": "u", "aggregations": ("median",), "value": "x", "bounds": (0.0, 100.0),
            "granularity": Fraction(1), "max_contributions": 2, "epsilon": Fraction(1), "domain": "keys"}
    plain = hist.plan_histogram(hist.HistogramQuery(**base), "pure", {})  # type: ignore[arg-type]
    q = hist.HistogramQuery(**base, with_error=True)  # type: ignore[arg-type]
    plan = hist.plan_histogram(q, "pure", {})
    point, lo, hi, n = (plan.measurements[k] for k in ("q0.5", "iq0.5:lo", "iq0.5:hi", "iq0.5:n"))
    assert point.em_rate == plain.measurements["q0.5"].em_rate * qi.POINT_SHARE
    assert lo.em_rate == hi.em_rate == qi.END_SHARE / (2 * 2)
    assert n.noise is not None and n.noise.param == Fraction(2) / qi.COUNT_SHARE
    assert qi.POINT_SHARE + 2 * qi.END_SHARE + qi.COUNT_SHARE == 1
    rng = np.random.default_rng(3)  # test data only; never noise
    frame = pl.DataFrame({"u": np.arange(3000), "g": rng.integers(0, 3, 3000), "x": rng.integers(20, 60, 3000) * 1.0})
    out = hist.run_histogram(frame.lazy(), q, plan, KeyedStream(b"i" * 32, "histogram"),
                             pl.DataFrame({"g": [0, 1, 2]})).table
    truth = frame.group_by("g").agg(pl.col("x").median().alias("t")).sort("g")
    got = out.sort("g").join(truth, on="g")
    assert (got["median_x_moe95"] > 0).all() and (got["median_x_moe95"] < 30).all()  # ≈ 1,000 rows: a narrow interval
    assert ((got["median_x"] - got["t"]).abs() <= got["median_x_moe95"]).all()


def test_interval_targets_fall_back_to_the_bounds_from_the_count_alone():
    from dpcli.tasks import quantile_interval as qi

    t_lo, t_hi, at_lo, at_hi = qi.targets(Fraction(1, 2), np.array([10, 1000]), 5, 20.0, 20.0)
    assert at_lo.tolist() == [True, False] and at_hi.tolist() == [True, False]
    assert t_lo[1] == int(np.floor(0.5 * 995 - 20)) - 1 and t_hi[1] == int(np.ceil(0.5 * 1005 + 20)) + 1


def test_a_query_of_quantiles_only_gets_a_finer_default_grid():
    """Its candidates are runs between the data's values, so a finer grid adds no noise and lets the released
    quantile lie nearer the data (ACS median income per state with bounds chosen: 0.37% → 0.20% median relative
    error); with a sum, mean or variance the grid stays at 4096 steps (their noise in grid units grows with it)."""
    from fractions import Fraction

    from dpcli.tasks.histogram import QUANTILE_STEPS, HistogramQuery

    alone = HistogramQuery(by=("g",), unit="u", aggregations=("count", "median"), value="x", bounds=(0.0, 500000.0),
                           epsilon=Fraction(1), domain="keys")
    with_sum = HistogramQuery(by=("g",), unit="u", aggregations=("median", "sum"), value="x", bounds=(0.0, 500000.0),
                              epsilon=Fraction(1), domain="keys")
    assert alone.grid is not None and with_sum.grid is not None
    assert QUANTILE_STEPS <= 500000 / alone.grid.granularity < 2 * QUANTILE_STEPS
    assert 4096 <= 500000 / with_sum.grid.granularity < 8192
