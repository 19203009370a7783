"""The quantile's exponential mechanism is ε-DP at the plan's rate, checked on exact selection probabilities.

For neighbouring groups D and D′ = D plus one person's C rows (all at the low end of the bounds, or all at
the high end), the probability of releasing each candidate is exp(rate·u)/Σ exp(rate·u) with
u = −max(0, den·r_< − num·n, num·n − den·r_≤) (r_<, r_≤: the rows strictly below the candidate, at most it),
the distribution gap sampling draws exactly (its runs' utilities are checked against this definition). The
candidates are every grid point of [lo, hi] (bounds 0:1024 at granularity 1: the points 0 … 1024). The
probabilities are computed in 60-digit decimal arithmetic, so the log-ratio check has no float slack beyond
1e-40; it must stay ≤ the measurement's ε (one quantile, K = 1: the whole ε). A control calibrated to one
row less of sensitivity must break the bound on the same data, so the test can fail.
"""

from __future__ import annotations

from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest

from dpcli.core import mechanisms as mech
from dpcli.tasks import histogram as hist
from dpcli.tasks import quantile_gaps

C, LO, HI, EPSILON = 3, 0, 1024, Fraction(1)
getcontext().prec = 60
BOUND = Decimal(1) + Decimal("1e-40")  # ε = 1 in decimals, with the arithmetic's slack
QUANTILES = [Fraction(1, 10), Fraction(1, 2), Fraction(9, 10)]


def _plan_rate(p: Fraction) -> Fraction:
    q = hist.HistogramQuery(by=("g",), unit="u", aggregations=(hist.quantile_label(p),), value="x",
                            bounds=(float(LO), float(HI)), granularity=Fraction(1), max_contributions=C,
                            max_partitions=1, epsilon=EPSILON, domain="keys")
    plan = hist.plan_histogram(q, "approx", {})
    rate = plan.measurements[hist.quantile_measurement(hist.quantile_label(p))].em_rate
    assert rate is not None
    return rate


def _utilities(values: np.ndarray, p: Fraction) -> list[int]:
    """u(x) = −max(0, den·r_<(x) − num·n, num·n − den·r_≤(x)) for every grid point x of [LO, HI] (docs/histogram.md),
    computed from its definition, not from the release's runs."""
    sorted_values = np.sort(values)
    points = np.arange(LO, HI + 1)
    below = np.searchsorted(sorted_values, points, side="left")
    at_most = np.searchsorted(sorted_values, points, side="right")
    n = values.size
    return [-max(0, p.denominator * int(a) - p.numerator * n, p.numerator * n - p.denominator * int(b))
            for a, b in zip(below, at_most, strict=True)]


def _run_utilities(values: np.ndarray, p: Fraction) -> list[int]:
    """The same utilities as the release computes them: its runs (quantile_gaps.gap_runs), point by point."""
    offsets, counts = np.unique(values.astype(np.int64), return_counts=True)
    u, widths, _, sizes = quantile_gaps.gap_runs(np.zeros(offsets.size, np.int64), offsets, counts, 1, HI - LO,
                                                 p)
    return [int(u[0, k]) for k in range(int(sizes[0])) for _ in range(int(widths[0, k]))]


def _log_probabilities(utilities: list[int], rate: Fraction) -> list[Decimal]:
    r = Decimal(rate.numerator) / Decimal(rate.denominator)
    top = max(utilities)
    weights = [(r * (u - top)).exp() for u in utilities]
    log_total = sum(weights, Decimal(0)).ln()
    return [r * (u - top) - log_total for u in utilities]


def _worst_log_ratio(d: np.ndarray, p: Fraction, rate: Fraction) -> Decimal:
    worst = Decimal(0)
    for extreme in (LO, HI):
        d2 = np.concatenate([d, np.full(C, extreme)])
        a = _log_probabilities(_utilities(d, p), rate)
        b = _log_probabilities(_utilities(d2, p), rate)
        worst = max(worst, max(abs(x - y) for x, y in zip(a, b, strict=True)))
    return worst


def _two_values(p: Fraction, above: bool) -> np.ndarray:
    """1,000 rows at 10 and 1,000: the wide gap between them, its utility −den, holds nearly all the mass, with
    the quantile's rank just below it (``above``: low-end rows then lower the gap's utility by (den − num)·C and
    raise the points below 10 by as much) or just above it (high-end rows: the mirror, by num·C). There the
    log-ratio approaches 2·rate·ΔU: the bound is nearly reached, which the control needs."""
    n = 1000
    low = int(p * n) + 1 if above else int(p * n) - 1
    return np.concatenate([np.full(low, 10), np.full(n - low, 1000)])


def _datasets(p: Fraction) -> list[np.ndarray]:
    rng = np.random.default_rng(38)  # test data only; never noise
    return [
        _two_values(p, True),
        _two_values(p, False),
        np.full(2000, 512),  # every row at one value
        rng.integers(LO, HI + 1, 500),
        np.clip(rng.normal(300, 80, 800).round(), LO, HI).astype(np.int64),
        np.array([], dtype=np.int64),
        np.full(5, HI),
    ]


@pytest.mark.parametrize("p", QUANTILES, ids=str)
def test_sensitivity_is_c_times_the_larger_side(p):
    assert hist.measurement_sensitivity(hist.quantile_measurement(hist.quantile_label(p)) or "", hist.HistogramQuery(
        by=("g",), unit="u", max_contributions=C)) == C * max(p.numerator, p.denominator - p.numerator)


@pytest.mark.parametrize("p", QUANTILES, ids=str)
def test_exact_selection_probabilities_stay_within_epsilon(p):
    rate = _plan_rate(p)
    assert rate == EPSILON / (2 * C * max(p.numerator, p.denominator - p.numerator))
    for d in _datasets(p):
        assert _utilities(d, p) == _run_utilities(d, p)
        assert _worst_log_ratio(d, p, rate) <= BOUND, (p, d[:5])


def test_a_rate_for_one_row_less_of_sensitivity_breaks_the_bound():
    """The control: ΔU one smaller (C·max(num, den − num) − 1) gives a rate the same neighbours push past ε,
    for every quantile (on the two-value data sets, where the log-ratio approaches 2·rate·ΔU)."""
    for p in QUANTILES:
        du = C * max(p.numerator, p.denominator - p.numerator)
        too_fast = EPSILON / (2 * (du - 1))
        worst = max(_worst_log_ratio(_two_values(p, above), p, too_fast) for above in (True, False))
        assert worst > BOUND, p
        assert max(_worst_log_ratio(_two_values(p, above), p, _plan_rate(p)) for above in (True, False)) <= BOUND


def test_sensitivity_of_the_extreme_quantiles():
    assert mech.quantile_utility_sensitivity(Fraction(0), 4) == 4
    assert mech.quantile_utility_sensitivity(Fraction(1), 4) == 4
    with pytest.raises(ValueError):
        mech.quantile_utility_sensitivity(Fraction(3, 2), 1)
