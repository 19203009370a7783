"""Goodness of fit of the exact samplers against their exact pmfs (fixed seeds).

Tolerance: a chi-square test over cells with expected count ≥ 5 (tails pooled);
we require p > 1e-4 (false-alarm 1e-4 per test at fixed seeds, so a pass is
deterministic) and check power: the same test must reject the pmf of a scale
30% off.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpcli.core import samplers
from dpcli.core.mechanisms import exponential_mechanism_rows
from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import (
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
    effective_sigma2,
    uniform_below,
)

N = 200_000


def _stream(label: str) -> KeyedStream:
    return KeyedStream(b"\x42" * 32, label)


def _laplace_pmf(x: np.ndarray, scale: float) -> np.ndarray:
    q = math.exp(-1.0 / scale)
    return (1 - q) / (1 + q) * q ** np.abs(x)


def _gauss_pmf(x: np.ndarray, sigma2: float) -> np.ndarray:
    support = np.arange(-int(40 * math.sqrt(sigma2)) - 40, int(40 * math.sqrt(sigma2)) + 41)
    w = np.exp(-(support.astype(float) ** 2) / (2 * sigma2))
    return np.exp(-(x.astype(float) ** 2) / (2 * sigma2)) / w.sum()


def _chi2_p(samples: np.ndarray, pmf) -> float:
    lo, hi = samples.min(), samples.max()
    support = np.arange(lo, hi + 1)
    counts = np.bincount(samples - lo, minlength=support.size).astype(float)
    expected = pmf(support) * samples.size
    # Pool cells into bins with expected ≥ 5, plus both tails.
    tail_lo = samples.size * (pmf(np.arange(lo - 10_000, lo)).sum())
    tail_hi = samples.size * (pmf(np.arange(hi + 1, hi + 10_001)).sum())
    obs_bins, exp_bins = [0.0], [tail_lo]
    for c, e in zip(counts, expected):
        if exp_bins[-1] < 5:
            obs_bins[-1] += c
            exp_bins[-1] += e
        else:
            obs_bins.append(c)
            exp_bins.append(e)
    obs_bins[-1] += 0
    exp_bins[-1] += tail_hi
    obs, exp = np.array(obs_bins), np.array(exp_bins)
    exp *= obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(1), Fraction(3), Fraction(1000)])
def test_discrete_laplace_fits_and_has_power(scale):
    x = discrete_laplace(_stream(f"lap{scale}"), scale, N)
    assert _chi2_p(x, lambda s: _laplace_pmf(s, float(scale))) > 1e-4
    for wrong in (0.7, 1.3):
        assert _chi2_p(x, lambda s: _laplace_pmf(s, float(scale) * wrong)) < 1e-6


@pytest.mark.parametrize("sigma", [0.5, 1, 3, 10])
def test_discrete_gaussian_fits_and_has_power(sigma):
    s2 = Fraction(sigma) ** 2
    x = discrete_gaussian(_stream(f"g{sigma}"), s2, N)
    eff = float(effective_sigma2(s2))
    assert abs(eff - float(s2)) / float(s2) < 1e-6
    assert _chi2_p(x, lambda s: _gauss_pmf(s, eff)) > 1e-4
    for wrong in (0.7, 1.3):
        assert _chi2_p(x, lambda s: _gauss_pmf(s, eff * wrong**2)) < 1e-6


@pytest.mark.audit
@pytest.mark.parametrize("kind,scale", [("laplace", 0.5), ("laplace", 1), ("laplace", 3), ("laplace", 1000),
                                        ("gauss", 0.5), ("gauss", 1), ("gauss", 3), ("gauss", 10), ("gauss", 1000)])
def test_samplers_full_audit(kind, scale):
    """`make audit`: 10^6 samples, false-alarm rate 10^-6 (p > 1e-6), and the ±30% scales rejected
    (p < 1e-6); also no repeated stream across distinct derived seeds."""
    n = 1_000_000
    if kind == "laplace":
        x = discrete_laplace(_stream(f"full-lap{scale}"), Fraction(scale), n)
        pmf = lambda s, f=1.0: _laplace_pmf(s, float(scale) * f)  # noqa: E731
    else:
        eff = float(effective_sigma2(Fraction(scale) ** 2))
        x = discrete_gaussian(_stream(f"full-g{scale}"), Fraction(scale) ** 2, n)
        pmf = lambda s, f=1.0: _gauss_pmf(s, eff * f * f)  # noqa: E731
    assert _chi2_p(x, pmf) > 1e-6
    for wrong in (0.7, 1.3):
        assert _chi2_p(x, lambda s: pmf(s, wrong)) < 1e-6
    firsts = {discrete_laplace(_stream(f"seed-{i}"), 1000, 8).tobytes() for i in range(2000)}
    assert len(firsts) == 2000


def test_large_scales_have_the_right_spread():
    # Var of discrete Laplace ≈ 2b² for large b; sample variance has relative sd ≈ sqrt(5/N) (kurtosis 6): 6 sd.
    b = 10**6
    x = discrete_laplace(_stream("bigl"), b, N).astype(float)
    assert abs(x.var() / (2.0 * b * b) - 1) < 6 * math.sqrt(5 / N)
    g = discrete_gaussian(_stream("bigg"), Fraction(10**12), N).astype(float)
    assert abs(g.var() / 1e12 - 1) < 6 * math.sqrt(2 / N)


def test_zero_scale_and_symmetry_and_determinism():
    assert not discrete_laplace(_stream("z"), 0, 10).any()
    assert not discrete_gaussian(_stream("z"), 0, 10).any()
    x = discrete_laplace(_stream("sym"), 2, N)
    # P(X>0) = P(X<0); difference of counts has sd ≤ sqrt(N): 5 sd.
    assert abs((x > 0).sum() - (x < 0).sum()) < 5 * math.sqrt(N)
    assert np.array_equal(discrete_laplace(_stream("d"), 5, 1000), discrete_laplace(_stream("d"), 5, 1000))
    assert not np.array_equal(discrete_laplace(_stream("d1"), 5, 1000), discrete_laplace(_stream("d2"), 5, 1000))


def test_uniform_below_is_uniform_and_in_range():
    bound = np.full(N, 7, dtype=np.int64)
    u = uniform_below(_stream("u"), bound)
    assert u.min() == 0 and u.max() == 6
    assert stats.chisquare(np.bincount(u)).pvalue > 1e-4


def test_bernoulli_exp_matches_exp():
    num = np.full(N, 3, dtype=np.int64)
    den = np.full(N, 2, dtype=np.int64)
    p = bernoulli_exp(_stream("b"), num, den).mean()
    # Binomial sd sqrt(p(1-p)/N); 6 sd.
    assert abs(p - math.exp(-1.5)) < 6 * math.sqrt(math.exp(-1.5) / N)


@pytest.mark.parametrize("num, den", [(3, 2), (1, 1000), (7, 1)])
def test_bernoulli_exp_exact_path_matches_exp(monkeypatch, num, den):
    """With the float margin forced to 1/2 most decisions take the exact decimal path;
    the frequency must still be exp(-γ) (binomial, 6 sd)."""
    monkeypatch.setattr(samplers, "_MARGIN", 0.5)
    n = 20_000
    x = bernoulli_exp(_stream(f"x{num}/{den}"), np.full(n, num), np.full(n, den))
    p = math.exp(-num / den)
    assert abs(x.mean() - p) < 6 * math.sqrt(p * (1 - p) / n) + 1e-12


@pytest.mark.parametrize("margin", [2.0**-36, 0.5])
def test_scaled_bernoulli_exp(monkeypatch, margin):
    """Bernoulli((3/7)·exp(+1/2)) = 0.7066 with a negative exponent and a scale, on the fast and
    the forced exact path (binomial, 6 sd); a probability above 1 is refused."""
    monkeypatch.setattr(samplers, "_MARGIN", margin)
    n = 20_000
    x = bernoulli_exp(_stream(f"sc{margin}"), np.full(n, -1), np.full(n, 2), np.full(n, 3), np.full(n, 7))
    p = 3 / 7 * math.exp(0.5)
    assert abs(x.mean() - p) < 6 * math.sqrt(p * (1 - p) / n)
    with pytest.raises(ValueError):
        bernoulli_exp(_stream("z"), np.array([-1]), np.array([1]), np.array([1]), np.array([2]))


def test_compare_exact_boundaries():
    s = _stream("cmp")
    assert samplers._compare_exact(s, 0, 1, 1) is True  # V < 2^-64 < e^-1
    assert samplers._compare_exact(s, (1 << 64) - 1, 1, 1) is False
    # exp(-1/2) = 0.60653..., u just below/above its 64-bit expansion
    e = int(math.exp(-0.5) * 2**64)
    assert samplers._compare_exact(s, e - 5000, 1, 2) is True
    assert samplers._compare_exact(s, e + 5000, 1, 2) is False
    # huge γ: only V with all-zero leading bits can be below exp(-10^6)
    assert samplers._compare_exact(s, 1, 10**6, 1) is False


def test_exponential_mechanism_probabilities():
    util = np.array([10, 9, 7, 0])
    rate = Fraction(1, 2)
    picks = exponential_mechanism_rows(_stream("em"), np.tile(util, (4000, 1)), rate)
    w = np.exp(float(rate) * util)
    expected = w / w.sum() * picks.size
    # chi-square goodness of fit, 3 degrees of freedom; a correct sampler fails at p < 1e-4 once in 10^4 seeds
    assert stats.chisquare(np.bincount(picks, minlength=4), expected).pvalue > 1e-4


def test_awkward_large_scales_are_rounded_up_not_refused():
    """A scale like 10^15/44800000001 (from an ε rounded to 15 decimals) has a huge numerator;
    it is rounded up by < 1e-12 relative so the integer samplers can use it."""
    x = Fraction(10**15, 44_800_000_001)
    y = samplers.rational_at_least(x)
    assert y >= x and float(y / x - 1) < 1e-12 and y.numerator <= 1 << 44
    z = discrete_laplace(_stream("awkward"), x, 20_000)
    # sd of discrete Laplace with scale b ≈ b·√2 = 31,567; sample sd within 5%
    assert abs(z.std() / (float(x) * math.sqrt(2)) - 1) < 0.05
