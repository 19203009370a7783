"""95% intervals for released statistics, from noisy values and public noise scales only.

Every function here takes what a release already holds (its noisy values, the
:class:`~dpcli.core.mechanisms.Noise` of each measurement, public bounds and
thresholds) and no exact statistic of the data, so an interval is
post-processing: it costs nothing and reveals nothing more. ``docs/histogram.md``
("Margins of error") says how each statistic's interval is built and why it
covers at least 95% of the time, conditional on the group being released.

* :func:`selected_interval` — a count released only because it passed a
  threshold (partition selection): the confidence set of the *truncated*
  noise distribution, by inverting two one-sided tests.
* :func:`mean_interval`, :func:`variance_interval` — ratios of noisy
  measurements: a union bound over the measurements' own intervals at
  adjusted levels, propagated through the ratio and the clamp bounds.
* :func:`exponential_margin` — the exponential mechanism's utility tail bound.
* :func:`cover_margin` — the ± margin around a released value that contains an interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from dpcli.core.mechanisms import _EXACT_GAUSS_SIGMA, Noise

#: 1 − the confidence level of every released margin.
ALPHA = 0.05


def log_survival(noise: Noise, d: np.ndarray) -> np.ndarray:
    """ln P[Z ≥ d] for each integer ``d`` (float64; −inf where the tail underflows)."""
    d = np.asarray(d, dtype=np.int64)
    if noise.kind == "laplace":
        return _laplace_log_survival(float(noise.param), d)
    sigma2 = float(noise.param)
    if math.sqrt(sigma2) > _EXACT_GAUSS_SIGMA:  # the continuous normal, as margin95 uses there
        return math.log(0.5) + _log_erfc((d.astype(np.float64) - 0.5) / math.sqrt(2.0 * sigma2))
    upper = _gauss_upper_tails(sigma2)  # upper[m] = P[Z ≥ m], m = 0 … len − 1 (0 beyond)
    top = upper.size - 1

    def tail(m: np.ndarray) -> np.ndarray:  # P[Z ≥ m] for m ≥ 1
        return np.where(m > top, 0.0, upper[np.minimum(m, top)])

    with np.errstate(divide="ignore"):
        gauss: np.ndarray = np.where(d >= 1, np.log(tail(np.maximum(d, 1))), np.log1p(-tail(np.maximum(1 - d, 1))))
    return gauss


#: Chebyshev coefficients of erfc (Numerical Recipes' erfcc: relative error below 1.2e-7 everywhere).
_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
         -0.82215223, 0.17087277)


def _log_erfc(x: np.ndarray) -> np.ndarray:
    """ln erfc(x), vectorised, without underflow for large x (relative error of erfc below 1.2e-7)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.zeros_like(z)
    for c in reversed(_ERFC):
        poly = c + t * poly
    log_upper = np.log(t) - z * z + poly  # ln erfc(|x|)
    out: np.ndarray = np.where(x >= 0, log_upper, np.log(2.0 - np.exp(log_upper)))
    return out


def _laplace_log_survival(b: float, d: np.ndarray) -> np.ndarray:
    """ln P[Z ≥ d] for the discrete Laplace with scale b: P[Z ≥ m] = e^{−m/b}/(1 + e^{−1/b}) for m ≥ 1,
    and P[Z ≥ d] = 1 − P[Z ≥ 1 − d] for d ≤ 0 (symmetry)."""
    log_norm = math.log1p(math.exp(-1.0 / b))
    df = d.astype(np.float64)
    above = -np.maximum(df, 1.0) / b - log_norm
    below = np.log1p(-np.exp(-np.maximum(1.0 - df, 1.0) / b - log_norm))
    out: np.ndarray = np.where(d >= 1, above, below)
    return out


@lru_cache(maxsize=8)
def _gauss_upper_tails(sigma2: float) -> np.ndarray:
    """P[Z ≥ m] for m = 0 … ⌊40σ⌋ + 50 of the discrete Gaussian N_Z(0, σ²), summed from the far tail
    (the same weights as :meth:`Noise.tail`)."""
    width = int(40 * math.sqrt(sigma2)) + 50
    xs = np.arange(0, width + 1, dtype=np.float64)
    w = np.exp(-(xs * xs) / (2.0 * sigma2))
    total = w[0] + 2.0 * w[1:].sum()
    upper: np.ndarray = np.cumsum(w[::-1])[::-1] / total
    return upper


def _smallest(pred: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per element, the smallest integer c in [lo, hi] with ``pred(c)`` (``pred`` false then true as c
    grows; ``hi`` when no c below it holds), by vectorised bisection."""
    lo, hi = lo.astype(np.int64).copy(), np.maximum(hi, lo).astype(np.int64).copy()
    while (open_ := lo < hi).any():
        mid = lo + (hi - lo) // 2
        ok = pred(mid)
        hi = np.where(open_ & ok, mid, hi)
        lo = np.where(open_ & ~ok, mid + 1, lo)
    return lo


def selected_interval(noise: Noise, released: np.ndarray, threshold: int, alpha: float = ALPHA,
                      floor: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A (1 − ``alpha``) interval for each true count c ≥ ``floor`` whose noisy value u = c + Z was
    released *because* u ≥ ``threshold``, conditional on that selection.

    Given the selection, u follows c + Z truncated to [threshold, ∞). The interval is every integer c
    that neither one-sided test rejects at level alpha/2: P_c[U ≥ u | U ≥ τ] > alpha/2 and
    P_c[U ≤ u | U ≥ τ] > alpha/2. Discrete Laplace and Gaussian noise are log-concave, so the
    truncated family is stochastically increasing in c: the accepted set is an interval, and the
    true c is rejected with probability at most alpha/2 by each test. Far above the threshold it is
    the plain noise interval u ± m; near it the lower end falls (to ``floor`` when the data cannot
    tell how far below the threshold c may lie: the discrete Laplace is memoryless). An empty
    set (a value improbably close to the threshold under every c) is returned as [lo, lo].
    """
    u = np.asarray(released, dtype=np.int64)
    m = noise.margin(alpha)
    floors = np.full(u.shape, floor, dtype=np.int64)

    def log_sel(c: np.ndarray) -> np.ndarray:  # ln P_c[U ≥ τ]
        return log_survival(noise, threshold - c)

    def given_selection(d: np.ndarray, c: np.ndarray, undefined: float) -> np.ndarray:
        """P_c[U ≥ u + d | U ≥ τ]; ``undefined`` where both tails underflow (accepting c: conservative)."""
        with np.errstate(invalid="ignore"):
            ratio = np.exp(log_survival(noise, u + d - c) - log_sel(c))
        out: np.ndarray = np.nan_to_num(ratio, nan=undefined)
        return out

    def upper_ok(c: np.ndarray) -> np.ndarray:  # P_c[U ≥ u | U ≥ τ] > alpha/2, nondecreasing in c
        ok: np.ndarray = given_selection(np.zeros_like(c), c, 1.0) > alpha / 2.0
        return ok

    def lower_fails(c: np.ndarray) -> np.ndarray:  # P_c[U ≤ u | U ≥ τ] ≤ alpha/2, from some c on
        fails: np.ndarray = 1.0 - given_selection(np.ones_like(c), c, 0.0) <= alpha / 2.0
        return fails

    lo = _smallest(upper_ok, floors, np.maximum(u - m, floors))
    hi = _smallest(lower_fails, floors, np.maximum(u + m + 1, floors)) - 1
    return lo, np.maximum(hi, lo)


def ratio_range(s_lo: np.ndarray, s_hi: np.ndarray, n_lo: np.ndarray,
                n_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The range of S/n over S ∈ [s_lo, s_hi] and n ∈ [n_lo, n_hi] (n_lo ≥ 1): a negative S is
    smallest over the smallest n, a positive one over the largest, and the other way round."""
    low = np.where(s_lo >= 0, s_lo / n_hi, s_lo / n_lo)
    high = np.where(s_hi >= 0, s_hi / n_lo, s_hi / n_hi)
    return low, high


def _mean_range(n: np.ndarray, s: np.ndarray, margin_n: float, margin_s: float, lo: float,
                hi: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """S/n over the box of the two intervals (n at least 1), and where that box is possible at all:
    some n ≥ 1 in the count's interval and a ratio within [lo, hi]."""
    n_lo, n_hi = np.maximum(n - margin_n, 1.0), n + margin_n
    low, high = ratio_range(s - margin_s, s + margin_s, n_lo, np.maximum(n_hi, 1.0))
    return low, high, (n_hi >= 1.0) & (low <= hi) & (high >= lo)


def mean_interval(n: np.ndarray, s: np.ndarray, margin_n: float, margin_s: float, lo: float,
                  hi: float) -> tuple[np.ndarray, np.ndarray]:
    """An interval for the mean S/n of values in [lo, hi], from the noisy count ``n`` ± ``margin_n``
    and the noisy sum ``s`` ± ``margin_s`` (each the measurement's own interval).

    When both intervals hold, n ∈ [max(n − margin_n, 1), n + margin_n] and S ∈ [s − margin_s,
    s + margin_s], so S/n lies in :func:`ratio_range` of that box, clamped to [lo, hi]. Where the
    box holds no possible mean (the count's interval below 1, or every ratio beyond a bound), one of
    the intervals has failed, or there are no rows: the whole of [lo, hi]. Coverage at least
    1 − (the two measurements' alphas), by the union bound.
    """
    low, high, possible = _mean_range(np.asarray(n, dtype=np.float64), s, margin_n, margin_s, lo, hi)
    return np.where(possible, np.clip(low, lo, hi), lo), np.where(possible, np.clip(high, lo, hi), hi)


def variance_interval(n: np.ndarray, s: np.ndarray, q: np.ndarray, margins: tuple[float, float, float],
                      lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """An interval for the variance Q/n − (S/n)² of values in [lo, hi] (S their sum, Q the sum of
    their squares), from noisy n, s, q and their margins (in that order).

    With the three intervals holding, the variance is A·x − B·x² for some x = 1/n in
    [1/n_hi, 1/n_lo], A = Q in [q − m_q, q + m_q] (and ≥ 0), B = S² in the squares of
    [s − m_s, s + m_s]. Its least value takes the smallest A and largest B, and as a concave
    quadratic in x it is least at an end of x's range; its greatest takes the largest A and smallest
    B (0 when S's interval holds 0), at the vertex A/(2B) when that lies in the range, else at an end.
    The result is clamped to [0, the Bhatia–Davis bound (hi − μ)(μ − lo) at its largest over the
    mean's interval]. Coverage at least 1 − (the three alphas), by the union bound; it is the exact
    range over the three intervals, before the clamps. Where the intervals cannot all hold (no
    possible mean, Q's interval below 0, an empty range) or there are no rows: [0, ((hi − lo)/2)²].
    """
    margin_n, margin_s, margin_q = margins
    n = np.asarray(n, dtype=np.float64)
    x_lo, x_hi = 1.0 / np.maximum(n + margin_n, 1.0), 1.0 / np.maximum(n - margin_n, 1.0)
    s_lo, s_hi = s - margin_s, s + margin_s
    b_max = np.maximum(s_lo * s_lo, s_hi * s_hi)
    b_min = np.where((s_lo <= 0) & (s_hi >= 0), 0.0, np.minimum(s_lo * s_lo, s_hi * s_hi))
    a_lo, a_hi = np.maximum(q - margin_q, 0.0), q + margin_q
    low = np.minimum(a_lo * x_lo - b_max * x_lo * x_lo, a_lo * x_hi - b_max * x_hi * x_hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.clip(np.where(b_min > 0, a_hi / (2.0 * b_min), x_hi), x_lo, x_hi)
    high = a_hi * vertex - b_min * vertex * vertex
    mean_lo, mean_hi, possible = _mean_range(n, s, margin_n, margin_s, lo, hi)
    centre = np.clip((lo + hi) / 2.0, np.clip(mean_lo, lo, hi), np.clip(mean_hi, lo, hi))
    bhatia_davis = (hi - centre) * (centre - lo)
    low, high = np.maximum(low, 0.0), np.minimum(high, bhatia_davis)
    possible &= (a_hi >= 0) & (low <= high)
    return np.where(possible, low, 0.0), np.where(possible, high, ((hi - lo) / 2.0) ** 2)


def exponential_margin(rate: float, candidates: int, alpha: float = ALPHA) -> float:
    """The s with P[u(chosen) < max u − s] ≤ ``alpha`` for an exponential mechanism choosing among
    ``candidates`` ∝ exp(rate·u): each of the other candidates with u < max − s is chosen with
    probability at most e^{−rate·s}, so s = ln((candidates − 1)/alpha)/rate (McSherry–Talwar)."""
    return math.log((candidates - 1) / alpha) / rate


def cover_margin(value: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The smallest m ≥ 0 with [value − m, value + m] ⊇ [lo, hi]: the ± margin shown for an interval
    that need not be centred on the released value."""
    margin: np.ndarray = np.maximum(np.maximum(np.asarray(value) - lo, hi - np.asarray(value)), 0.0)
    return margin
