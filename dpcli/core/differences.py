"""The noise of a difference of two releases (``dpcli diff``): its tail, its 95% margin and a p-value.

Two independent releases of one measurement carry independent noises A and B (:class:`Noise`: discrete Laplace
of scale b or discrete Gaussian of variance σ²), so their difference's error is A − B. Its tail
P[A − B ≥ m] = Σ_k P[A = k]·P[B ≥ m − k] is summed exactly over A's support (all but 10⁻¹⁵ of it) while that
support is small. Beyond it:

* two discrete Laplace noises: a discrete Laplace is the difference of two geometric variables, each the floor of
  an exponential one, so it lies within 1 of a continuous Laplace of the same scale (coupled), and A − B within 2 of
  the difference of two continuous Laplace variables, whose tail is closed-form
  (b₁²e^{−t/b₁} − b₂²e^{−t/b₂}) / (2(b₁² − b₂²)), or e^{−t/b}(2 + t/b)/4 when b₁ = b₂ = b: the margin is that
  distribution's, plus 2;
* two discrete Gaussian noises: each is sub-Gaussian with its σ² (Canonne, Kamath, Steinke 2020, Cor. 9), so A − B
  is sub-Gaussian with σ₁² + σ₂² and P[|A − B| ≥ t] ≤ 2e^{−t²/(2(σ₁²+σ₂²))}: a margin that covers at least 95%.

A margin here is always one that covers the difference's noise with probability at least 95% (never an
approximation that could cover less).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from dpcli.core import tree
from dpcli.core.intervals import ratio_range
from dpcli.core.mechanisms import Noise

#: The support summed exactly: at most this many points of A (beyond it, the bounds of the module docstring).
EXACT_POINTS = 400_001
#: What is left out of A's support when it is summed (far below any tail a margin or p-value reads).
TAIL_LEFT_OUT = 1e-15


def _half_width(noise: Noise) -> int:
    """The half-width of the support holding all but :data:`TAIL_LEFT_OUT` of ``noise``."""
    if noise.kind == "laplace":
        return math.ceil(float(noise.param) * math.log(2 / TAIL_LEFT_OUT)) + 1
    return math.ceil(math.sqrt(float(noise.param)) * math.sqrt(2 * math.log(2 / TAIL_LEFT_OUT))) + 1


def _pmf(noise: Noise, k: np.ndarray) -> np.ndarray:
    if noise.kind == "laplace":
        r = math.exp(-1.0 / float(noise.param))
        return np.asarray((1 - r) / (1 + r) * np.power(r, np.abs(k)), dtype=float)
    w = np.exp(-(k.astype(float) ** 2) / (2 * float(noise.param)))
    return np.asarray(w / w.sum(), dtype=float)


def _laplace_upper(noise: Noise, j: np.ndarray) -> np.ndarray:
    r = math.exp(-1.0 / float(noise.param))
    above = np.power(r, np.maximum(j, 1)) / (1 + r)
    below = 1 - np.power(r, np.maximum(1 - j, 1)) / (1 + r)
    return np.asarray(np.where(j >= 1, above, below), dtype=float)


def _exact(a: Noise, b: Noise) -> bool:
    return 2 * _half_width(a) + 1 <= EXACT_POINTS and (b.kind == "laplace" or 2 * _half_width(b) + 1 <= EXACT_POINTS)


def difference_tail(a: Noise, b: Noise, m: int) -> float:
    """P[A − B ≥ m] for independent ``a`` and ``b`` (an upper bound beyond the exact support; see the module)."""
    if m <= 0:
        return 1.0
    if _exact(a, b):
        width = _half_width(a)
        k = np.arange(-width, width + 1)
        if b.kind == "gaussian":  # B's tail at every m − k, from its own pmf over its support
            wb = _half_width(b)
            kb = np.arange(-wb, wb + 1)
            pb = _pmf(b, kb)
            survival = np.concatenate([np.cumsum(pb[::-1])[::-1], [0.0]])  # P[B ≥ kb[i]]
            idx = np.clip(m - k + wb, 0, len(pb))
            upper = np.where(m - k < -wb, 1.0, survival[idx])
        else:
            upper = _laplace_upper(b, m - k)
        return float(min(1.0, np.sum(_pmf(a, k) * upper)))
    if a.kind == b.kind == "laplace":
        return _continuous_laplace_tail(float(a.param), float(b.param), m - 2)
    if a.kind == b.kind == "gaussian":
        s2 = float(a.param) + float(b.param)
        return min(1.0, math.exp(-(m * m) / (2 * s2)))
    raise ValueError("a difference of a Laplace and a Gaussian noise this large has no bound here")


def _continuous_laplace_tail(b1: float, b2: float, t: float) -> float:
    """P[L₁ − L₂ > t] for independent continuous Laplace variables of scales b₁ and b₂ (t ≥ 0; 1/2 at t < 0)."""
    if t < 0:
        return 1.0
    if abs(b1 - b2) <= 1e-9 * max(b1, b2):
        b = (b1 + b2) / 2
        return math.exp(-t / b) * (2 + t / b) / 4
    return (b1 * b1 * math.exp(-t / b1) - b2 * b2 * math.exp(-t / b2)) / (2 * (b1 * b1 - b2 * b2))


def difference_margin(a: Noise, b: Noise, alpha: float = 0.05) -> int:
    """The smallest integer m with P[|A − B| ≤ m] ≥ 1 − ``alpha`` (by the tails above: at least that coverage)."""
    lo, hi = 0, 1
    while 2 * difference_tail(a, b, hi + 1) > alpha:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # 2·P[A − B ≥ hi + 1] ≤ alpha; not so at lo (or lo = 0)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if 2 * difference_tail(a, b, mid + 1) <= alpha else (mid, hi)
    return hi if 2 * difference_tail(a, b, lo + 1) > alpha else lo


def difference_p_value(a: Noise, b: Noise, observed: int) -> float:
    """P[|A − B| ≥ |observed|]: how surprising a difference this large is if nothing changed (two-sided)."""
    d = abs(int(observed))
    return 1.0 if d == 0 else min(1.0, 2 * difference_tail(a, b, d))


def one_sided_margin(a: Noise, b: Noise, alpha: float = 0.05) -> int:
    """The smallest integer m with P[A − B > m] ≤ ``alpha`` (an equivalence test's, TOST)."""
    m = 0
    step = 1
    while difference_tail(a, b, m + step + 1) > alpha:
        step *= 2
    lo, hi = m + step // 2, m + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if difference_tail(a, b, mid + 1) <= alpha else (mid, hi)
    return hi if difference_tail(a, b, lo + 1) > alpha else lo


def benjamini_hochberg(p_values: list[float], q: float) -> list[bool]:
    """Which tests BH rejects at false-discovery rate ``q`` (the largest i with p₍ᵢ₎ ≤ i·q/m, and all below it)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    cut = 0
    for rank, i in enumerate(order, start=1):
        if p_values[i] <= rank * q / m:
            cut = rank
    flagged = [False] * m
    for i in order[:cut]:
        flagged[i] = True
    return flagged


# -- differences whose noise is a sum of Gaussians with real weights (stream triggers) -----------------------------

#: The variance two roundings add to a difference of released values (each value rounded to its grid: the two
#: residues, nearly uniform on [−½, ½] and independent once the noise spans many grid steps, add 1/12 each).
ROUNDING_VARIANCE = 1.0 / 6.0


def _honaker_coefficient(level: int, below: int) -> float:
    """The weight of a node's own noise ``below`` levels under a node at ``level`` in that node's bottom-up Honaker
    estimate (σ² = 1: the weights do not depend on it; :func:`dpcli.core.tree.honaker_prefixes`)."""
    v = tree.node_variances(1.0, 1 << level)  # V_ℓ for ℓ = 0 … level
    lower = level - below
    weight = float(v[lower]) if lower else 1.0  # a leaf's estimate is its own noisy value
    for ell in range(lower + 1, level + 1):
        weight *= float(v[ell] / (2.0 * v[ell - 1]))
    return weight


def _prefix_coefficients(i: int, leaves: int) -> list[np.ndarray]:
    """Per level, the weight of each node's own noise in the Honaker prefix estimate after leaf ``i`` of a tree
    of ``leaves`` leaves (0 for the empty prefix): the estimates of the prefix's dyadic nodes, each a weighted sum
    of the noise of the nodes below it."""
    levels = tree.levels(leaves)
    out = [np.zeros(leaves >> ell) for ell in range(levels)]
    for ell in range(levels):
        if (i >> ell) & 1:
            j = (i >> ell) - 1  # the node of level ℓ in the prefix's decomposition (eq. 2)
            for below in range(ell + 1):
                span = 1 << below
                out[ell - below][j * span:(j + 1) * span] += _honaker_coefficient(ell, below)
    return out


@lru_cache(maxsize=4096)
def _shared_tree_unit_variance(i1: int, i2: int) -> float:
    leaves = max(i1, i2, 1)
    a, b = _prefix_coefficients(i1, leaves), _prefix_coefficients(i2, leaves)
    return float(sum(float(np.sum((y - x) ** 2)) for x, y in zip(a, b, strict=True)))


def shared_tree_variance(sigma2: float, i1: int, i2: int) -> float:
    """Var[P̂(i2) − P̂(i1)] for two Honaker prefix estimates of one tree whose nodes carry independent noise of
    variance at most ``sigma2`` (after ``i1`` and ``i2`` leaves; P̂(0) = 0).

    Both estimates are linear in the nodes' noise (:func:`dpcli.core.tree.honaker_prefixes`), so their difference
    is Σ_v (c₂(v) − c₁(v))·Z_v over the nodes v, and its variance σ²·Σ_v (c₂(v) − c₁(v))², computed exactly from
    the tree's weights: nodes both prefixes reach with the same weight cancel, which is what the two releases share.
    (Not simply the nodes of the two decompositions' symmetric difference: a dyadic node's estimate also draws on
    the nodes below it, which the shorter prefix may use directly.) ``i1 == i2`` gives 0."""
    if i1 == i2:
        return 0.0
    return sigma2 * _shared_tree_unit_variance(min(i1, i2), max(i1, i2))


def independent_trees_variance(sigma2_old: float, i_old: int, sigma2_new: float, i_new: int) -> float:
    """Var[P̂₂(i_new) − P̂₁(i_old)] for prefix estimates of two trees with independent noise: λ²₁ + λ²₂ (eq. 2)."""
    return (float(tree.prefix_variances(sigma2_old, i_old)[-1]) if i_old else 0.0) + (
        float(tree.prefix_variances(sigma2_new, i_new)[-1]) if i_new else 0.0)


def normal_margin(variance: float, alpha: float = 0.05) -> float:
    """z_{1−α/2}·√variance: the 95% margin of a normal difference (0 for no variance)."""
    return NormalDist().inv_cdf(1.0 - alpha / 2.0) * math.sqrt(variance) if variance > 0 else 0.0


def normal_p_value(variance: float, observed: float) -> float:
    """P[|N(0, variance)| ≥ |observed|] (1 for a zero difference; 0 for a difference without noise)."""
    if observed == 0:
        return 1.0
    if variance <= 0:
        return 0.0
    return math.erfc(abs(observed) / math.sqrt(2.0 * variance))


# -- differences of means: ratios of two noisy measurements, by a union bound -------------------------------------

#: The levels at which a mean difference's interval is computed for its p-value: 1 down to 10⁻¹² in eighths of
#: a decade (the p-value is the smallest of them whose interval leaves out 0: rounded up, so still valid).
P_LEVELS = tuple(10.0 ** (-k / 8) for k in range(97))


@dataclass(frozen=True)
class MeanGrid:
    """A mean's value grid as its release used it: bounds [lo, hi] and the step of the grid (the summary's
    ``bounds`` and ``granularity``); the centre is ``mid_units`` (as :class:`dpcli.bounding.ValueGrid`)."""

    lo: float
    hi: float
    step: Fraction

    @property
    def lo_units(self) -> int:
        return math.ceil(Fraction(self.lo) / self.step)

    @property
    def hi_units(self) -> int:
        return math.floor(Fraction(self.hi) / self.step)

    @property
    def mid_units(self) -> int:
        return (self.lo_units + self.hi_units) // 2


def released_mean_range(grid: MeanGrid, count: np.ndarray, mean: np.ndarray, half: float, margin_count: float,
                        margin_sum: float) -> tuple[np.ndarray, np.ndarray]:
    """Where each group's bounded mean lies when its release's count and centred-sum intervals (± ``margin_count``
    and ± ``margin_sum`` grid units) hold, from the released noisy count ``count`` (the n of the mean) and the
    released mean, shown to within ± ``half``.

    The release showed clamp((mid + s/n)·step, lo, hi) with n = max(count, 1) and s the noisy centred sum: so
    s/n is within ``half`` of the shown mean's, or beyond a bound where the mean shows that bound. The true centred
    sum and count then lie in s ± margin_sum and [max(count − margin_count, 1), count + margin_count], and the mean
    in the range of their ratio (:func:`dpcli.core.intervals.ratio_range`), within the grid's bounds; where no
    count of at least 1 is in reach, or no ratio within the bounds, an interval has failed: the whole grid."""
    g = float(grid.step)
    mid = grid.mid_units
    count = np.asarray(count, dtype=np.float64)
    n = np.maximum(count, 1.0)
    r, h = np.asarray(mean, dtype=np.float64) / g - mid, half / g
    s_lo = np.where(mean - half <= grid.lo, -np.inf, (r - h) * n)  # a mean shown at a bound may have been clamped
    s_hi = np.where(mean + half >= grid.hi, np.inf, (r + h) * n)
    n_hi = count + margin_count
    low, high = ratio_range(s_lo - margin_sum, s_hi + margin_sum, np.maximum(count - margin_count, 1.0),
                            np.maximum(n_hi, 1.0))
    lo_c, hi_c = float(grid.lo_units - mid), float(grid.hi_units - mid)
    possible = (n_hi >= 1.0) & (low <= hi_c) & (high >= lo_c)
    a, b = np.where(possible, np.clip(low, lo_c, hi_c), lo_c), np.where(possible, np.clip(high, lo_c, hi_c), hi_c)
    return (mid + a) * g, (mid + b) * g


@dataclass(frozen=True)
class MeanRelease:
    """One release's means as :func:`mean_difference` reads them: its grid, the noises of its count and centred
    sum, and per group the released count and mean (shown to within ± ``half``)."""

    grid: MeanGrid
    count_noise: Noise
    sum_noise: Noise
    count: np.ndarray
    mean: np.ndarray
    half: float

    def range(self, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """The groups' mean ranges with each of the two measurements' intervals at level 1 − ``alpha``."""
        return released_mean_range(self.grid, self.count, self.mean, self.half,
                                   float(self.count_noise.margin(alpha)), float(self.sum_noise.margin(alpha)))


def mean_difference_interval(old: MeanRelease, new: MeanRelease, alpha: float = 0.05) -> tuple[np.ndarray,
                                                                                               np.ndarray]:
    """An interval for each group's new − old bounded mean covering it with probability at least 1 − ``alpha``:
    the four measurements' (two counts, two centred sums) intervals at 1 − alpha/4 each hold together with
    probability at least 1 − alpha (union bound), and then both means lie in their ranges."""
    lo_old, hi_old = old.range(alpha / 4)
    lo_new, hi_new = new.range(alpha / 4)
    return lo_new - hi_old, hi_new - lo_old


def mean_difference_p_values(old: MeanRelease, new: MeanRelease) -> np.ndarray:
    """Per group, a p-value for "the mean did not change": the smallest level of :data:`P_LEVELS` whose interval
    (:func:`mean_difference_interval`) leaves out 0 (1 when none does). Valid: P[p ≤ a] ≤ a under no change,
    since the intervals cover a zero difference with probability at least 1 − a at every level a."""
    p = np.ones(old.count.shape)
    for alpha in P_LEVELS[1:]:
        lo, hi = mean_difference_interval(old, new, alpha)
        p = np.where((lo > 0) | (hi < 0), alpha, p)
    return p
