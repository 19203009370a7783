"""Noise mechanisms on integer arrays, their calibration and their error.

A :class:`Noise` is one calibrated integer noise distribution (discrete
Laplace with scale b, or discrete Gaussian with variance parameter σ²). It
draws from a keyed stream through the exact samplers, and knows its own tail
probabilities, which the partition-selection thresholds and the 95% margins
of error are computed from.

Thresholds (all for data where one privacy unit can create at most ``K`` new
groups, each with a true count of 1):

* :func:`selection_threshold` — minimum-unit thresholding (Wilson et al.,
  paper 002): the smallest integer τ with 1 − (1 − P[1 + Z ≥ τ])^K ≤ δ.
* :func:`unklap_threshold_offset` — LinkedIn's UnkLap (paper 000, Alg. 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Literal, TypedDict, TypeVar

import numpy as np

from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import (
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
    effective_sigma2,
    rate_at_most,
    rational_at_least,
    uniform_below,
)

NoiseKind = Literal["laplace", "gaussian"]

#: Exact tail sums of the discrete Gaussian are used up to this σ; beyond it the
#: (indistinguishable at 1e-9) continuous normal quantile is used for margins.
_EXACT_GAUSS_SIGMA = 20_000.0


class NoiseJSON(TypedDict, total=False):
    """A :class:`Noise` as JSON (:meth:`Noise.to_json`): ``discrete_laplace`` with its scale, or ``discrete_gaussian``
    with its σ (each a number as text, to 6 significant digits; a plan may say in words what it depends on)."""

    noise: str
    scale: str
    sigma: str


#: A typed part that holds a noise's keys (:meth:`Noise.described_in`).
Described = TypeVar("Described", bound=NoiseJSON)


@dataclass(frozen=True)
class Noise:
    """Integer noise: ``laplace`` with scale ``param`` = b, or ``gaussian`` with ``param`` = σ².

    ``param`` is the value the sampler really uses (scales are rounded *up*
    by :func:`laplace` / :func:`gaussian`, never down).
    """

    kind: NoiseKind
    param: Fraction

    def sample(self, stream: KeyedStream, n: int) -> np.ndarray:
        """``n`` independent draws as int64."""
        if self.kind == "laplace":
            return discrete_laplace(stream, self.param, n)
        return discrete_gaussian(stream, self.param, n)

    @property
    def std(self) -> float:
        """Standard deviation of one draw."""
        if self.kind == "laplace":
            r = math.exp(-1.0 / float(self.param))
            return math.sqrt(2.0 * r) / (1.0 - r)
        return math.sqrt(float(self.param))  # within 1e-6 relative for σ ≥ 1; ≤ σ below

    def tail(self, m: int) -> float:
        """P[Z ≥ m] (an upper bound for the Gaussian when σ is large)."""
        if m <= 0:  # symmetry: P[Z ≥ m] = 1 − P[Z ≥ 1 − m]
            return 1.0 - self.tail(1 - m)
        if self.kind == "laplace":
            b = float(self.param)
            return math.exp(-m / b) / (1.0 + math.exp(-1.0 / b))
        sigma2 = float(self.param)
        if math.sqrt(sigma2) <= _EXACT_GAUSS_SIGMA:
            return _gauss_upper_tail(sigma2, m)
        return math.exp(-(m * m) / (2.0 * sigma2))  # sub-Gaussian bound (CKS 2020)

    def margin95(self) -> int:
        """The smallest integer m with P[|Z| ≤ m] ≥ 0.95 (exact up to float rounding of the tail sum)."""
        return self.margin(0.05)

    def margin(self, alpha: float) -> int:
        """The smallest integer m with P[|Z| ≤ m] ≥ 1 − ``alpha``, i.e. 2·P[Z ≥ m + 1] ≤ ``alpha``."""
        if self.param == 0:
            return 0
        if self.kind == "gaussian" and math.sqrt(float(self.param)) > _EXACT_GAUSS_SIGMA:
            return math.ceil(NormalDist(0.0, math.sqrt(float(self.param))).inv_cdf(1.0 - alpha / 2.0))
        if self.kind == "gaussian":
            guess = max(0, int(NormalDist().inv_cdf(1.0 - alpha / 2.0) * self.std))
        else:  # solve 2·tail(m) = alpha in closed form, so the loops below take a step or two at any scale
            b = float(self.param)
            guess = max(0, math.ceil(-b * math.log(alpha / 2.0 * (1.0 + math.exp(-1.0 / b)))))
        m = guess
        while m > 0 and 2.0 * self.tail(m) <= alpha:  # P[|Z| > m-1] = 2 P[Z ≥ m]
            m -= 1
        while 2.0 * self.tail(m + 1) > alpha:
            m += 1
        return m

    def to_json(self) -> NoiseJSON:
        """The noise as a plan and a report show it: its distribution and its scale (Laplace) or σ (Gaussian)."""
        if self.kind == "laplace":
            return {"noise": "discrete_laplace", "scale": f"{float(self.param):.6g}"}
        return {"noise": "discrete_gaussian", "sigma": f"{math.sqrt(float(self.param)):.6g}"}

    def described_in(self, entry: Described) -> Described:
        """``entry`` (a plan's or a report's part that holds a noise's keys) with :meth:`to_json`'s keys set, after
        those it has."""
        shown = self.to_json()
        entry["noise"] = shown["noise"]
        if "scale" in shown:
            entry["scale"] = shown["scale"]
        if "sigma" in shown:
            entry["sigma"] = shown["sigma"]
        return entry

    def describe(self) -> dict[str, str]:
        """:meth:`to_json` as a plain mapping (for the reports whose parts are not typed)."""
        return {key: str(value) for key, value in self.to_json().items()}


def _gauss_upper_tail(sigma2: float, m: int) -> float:
    """P[Z ≥ m] for the discrete Gaussian N_Z(0, σ²) by direct summation (m ≥ 1)."""
    sigma = math.sqrt(sigma2)
    width = int(40 * sigma) + 50
    xs = np.arange(0, width + 1, dtype=np.float64)
    w = np.exp(-(xs * xs) / (2.0 * sigma2))
    total = w[0] + 2.0 * w[1:].sum()
    if m > width:
        return math.exp(-(m * m) / (2.0 * sigma2))
    return float(w[m:].sum() / total)


def laplace(l1_sensitivity: Fraction | int, epsilon: Fraction) -> Noise:
    """Discrete Laplace noise giving ε-DP for an integer query with the given ℓ1 sensitivity."""
    if epsilon <= 0:
        raise ValueError("ε must be > 0")
    return Noise("laplace", rational_at_least(Fraction(l1_sensitivity) / Fraction(epsilon)))


def gaussian(l2_sensitivity_squared: Fraction | int, rho: Fraction) -> Noise:
    """Discrete Gaussian noise giving ρ-zCDP: σ² = Δ₂² / (2ρ) (CKS Thm. 4), rounded up."""
    if rho <= 0:
        raise ValueError("ρ must be > 0")
    return Noise("gaussian", effective_sigma2(Fraction(l2_sensitivity_squared) / (2 * Fraction(rho))))


def selection_threshold(noise: Noise, max_partitions: int, delta: float) -> int:
    """Minimum-unit threshold τ for releasing discovered groups (paper 002, Sec. 4.2.3).

    A unit that is alone in up to ``max_partitions`` = K groups makes each of
    them appear with probability p = P[1 + Z ≥ τ]; all of them stay hidden
    with probability (1 − p)^K, so we need 1 − (1 − p)^K ≤ δ, i.e.
    p ≤ p* = 1 − (1 − δ)^{1/K}. Returns the smallest integer τ ≥ 1 meeting it
    (computed in floats with log1p/expm1 and then checked against the tail).
    """
    if not 0 < delta < 1:
        raise ValueError("partition selection needs 0 < δ < 1")
    p_star = -math.expm1(math.log1p(-delta) / max_partitions)
    if noise.kind == "laplace":
        b = float(noise.param)
        m = math.ceil(-b * (math.log(p_star) + math.log1p(math.exp(-1.0 / b))))
    else:
        m = math.ceil(math.sqrt(2.0 * float(noise.param) * math.log(1.0 / p_star)))
    m = max(m, 1)
    while m > 1 and noise.tail(m - 1) <= p_star:
        m -= 1
    while noise.tail(m) > p_star:
        m += 1
    return 1 + m


def _unklap_log_delta_hat(epsilon_per: float, delta: float, max_partitions: int) -> float:
    """ln δ̂ solving δ = δ̂/4 · (e^{ε_per/2} + 1) · (3 + ln(Δ/δ̂)), rounded down (bisected in log space)."""
    # ln c with c = (e^{ε/2} + 1)/4, without overflow for large ε.
    log_c = epsilon_per / 2.0 + math.log1p(math.exp(-epsilon_per / 2.0)) - math.log(4.0)
    log_delta, log_k = math.log(delta), math.log(max_partitions)

    def fits(t: float) -> bool:  # f(e^t) ≤ δ, with f(x) = x·c·(3 + ln(Δ/x)) increasing in x ≤ Δ
        return t + log_c + math.log(3.0 + log_k - t) <= log_delta

    hi = min(log_delta, log_k)
    lo = log_delta - log_c - math.log(3.0 + log_k - log_delta + log_c) - 1.0
    while not fits(lo):  # one or two steps: the bracket above is already feasible up to rounding
        lo -= 1.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def unklap_delta_hat(epsilon_per: float, delta: float, max_partitions: int) -> float:
    """Solve δ = δ̂/4 · (e^{ε_per/2} + 1) · (3 + ln(Δ/δ̂)) for δ̂ (paper 000, Alg. 3), rounding δ̂ down.

    Returns 0.0 when δ̂ is below the smallest double (huge ε_per); the offset uses ln δ̂ directly.
    """
    return math.exp(_unklap_log_delta_hat(epsilon_per, delta, max_partitions))


def unklap_threshold_offset(tau: int, max_partitions: int, epsilon_per: float, delta: float) -> int:
    """The integer offset added to h_(d̄+1) for UnkLap's ⊥ threshold.

    The paper's offset is τ·(1 + 2Δ·ln(Δ/δ̂)/ε_per) for continuous Laplace
    noise. Discrete Laplace tails are slightly heavier: P[Z ≥ m] =
    e^{−m/b}/(1 + e^{−1/b}) ≤ ½·e^{−(m−½)/b}, so we use ⌈offset⌉ + 1, whose
    discrete tail is below the continuous tail at the paper's offset.
    """
    log_dh = _unklap_log_delta_hat(epsilon_per, delta, max_partitions)
    offset = tau * (1.0 + 2.0 * max_partitions * (math.log(max_partitions) - log_dh) / epsilon_per)
    return math.ceil(offset) + 1


def quantile_utility_sensitivity(p: Fraction, rows: int) -> int:
    """How far one privacy unit's ≤ ``rows`` rows in a group move the quantile utility
    u(c) = −|den·r(c) − num·n| of every candidate c (p = num/den, r(c) the rows below c, n all rows).

    Adding k ≤ ``rows`` rows of which a lie below c gives r' = r + a and n' = n + k, so
    den·r' − num·n' = (den·r − num·n) + (den·a − num·k) with den·a − num·k ∈ [−num·k, (den − num)·k]
    (a = 0 or a = k at the ends). By the triangle inequality |u'(c) − u(c)| ≤ k·max(num, den − num) ≤
    rows·max(num, den − num): the median's is half the denominator's C·den. Both ends are reached (all
    k rows above c, or all below), and the shift is not of one sign across candidates (rows at the low end
    raise the utility of candidates below q·n and lower the others'), so the rate stays ε/(2Δu).
    A utility that does not move (p = 0 or 1 has max = den = 1) still counts one."""
    p = Fraction(p)
    if not 0 <= p <= 1 or rows < 1:
        raise ValueError("need 0 ≤ p ≤ 1 and rows ≥ 1")
    return rows * max(p.numerator, p.denominator - p.numerator, 1)


def exponential_mechanism_rows(stream: KeyedStream, utilities: np.ndarray, rate: Fraction) -> np.ndarray:
    """One index per row of ``utilities`` (G × B, int64), chosen ∝ exp(rate · u), exactly.

    Vectorised over rows: each round proposes B uniform candidates for every
    undecided row and accepts candidate j with Bernoulli(exp(−rate·(max − u_j)));
    a row takes its first accepted proposal. Per row this is the exponential
    mechanism by rejection: the same distribution as adding Gumbel(1/rate) noise and keeping
    the top item, without floating point.
    """
    utilities = np.asarray(utilities, dtype=np.int64)
    g, b = utilities.shape
    rate = Fraction(rate)
    if rate < 0:
        raise ValueError("rate must be non-negative")
    gap = utilities.max(axis=1, keepdims=True) - utilities
    rate = rate_at_most(rate, int(gap.max()) if gap.size else 0)  # int64-safe; rate 0 = uniform (0-DP)
    out = np.empty(g, dtype=np.int64)
    pending = np.arange(g)
    while pending.size:
        m = pending.size
        prop = uniform_below(stream, np.full(m * b, b, dtype=np.int64)).reshape(m, b)
        num = gap[pending[:, None], prop].ravel() * rate.numerator
        ok = bernoulli_exp(stream, num, np.full(m * b, rate.denominator, dtype=np.int64)).reshape(m, b)
        hit = ok.any(axis=1)
        first = ok.argmax(axis=1)
        out[pending[hit]] = prop[hit, first[hit]]
        pending = pending[~hit]
    return out


#: The slack of the weighted mechanism's rejection bound B = (257/256)·(the float-identified largest weight), as in
#: :mod:`dpcli.core.selection`'s races: any float error in finding the largest weight stays far inside it.
_SLACK_NUM, _SLACK_DEN = 256, 257


def exponential_mechanism_weighted_rows(stream: KeyedStream, utilities: np.ndarray, multipliers: np.ndarray,
                                        sizes: np.ndarray, rate: Fraction) -> np.ndarray:
    """One index per row, chosen among the row's first ``sizes[i]`` items ∝ c·exp(rate·u), exactly.

    ``utilities`` and ``multipliers`` are G × B int64 (items past a row's size are padding, never read), every
    multiplier of an item ≥ 1. Per row this is rejection from a uniform proposal: B_i = (257/256)·c_t·exp(rate·u_t)
    for the item t of largest float log-weight, and item j is accepted with the exact Bernoulli
    (256·c_j)/(257·c_t)·exp(−rate·(u_t − u_j)) (:func:`dpcli.core.samplers.bernoulli_exp`; u_t − u_j may be
    negative when c_j < c_t). Float error in t only loosens B (by far less than 1/256), never decides an output.
    Each round proposes as many items as the row holds, so a round accepts one with probability ≥ 1 − e^−0.99;
    a row takes its first accepted proposal: P[j] ∝ c_j·exp(rate·u_j)."""
    u = np.asarray(utilities, dtype=np.int64)
    c = np.asarray(multipliers, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    g, b = u.shape
    rate = Fraction(rate)
    if c.shape != u.shape or sizes.shape != (g,) or (g and (sizes.min() < 1 or sizes.max() > b)):
        raise ValueError("need G × B utilities and multipliers and 1 ≤ size ≤ B per row")
    valid = np.arange(b)[None, :] < sizes[:, None]
    if (c[valid] < 1).any() or (c.size and int(c[valid].max()) > (1 << 62) // _SLACK_DEN):
        raise ValueError("multipliers must be in [1, 2^62/257]")
    if rate < 0:
        raise ValueError("rate must be non-negative")
    out = np.empty(g, dtype=np.int64)
    if not g:
        return out
    top_u = np.where(valid, u, np.iinfo(np.int64).min).max(axis=1)
    low_u = np.where(valid, u, np.iinfo(np.int64).max).min(axis=1)
    rate = rate_at_most(rate, int((top_u - low_u).max()))  # int64-safe products rate.numerator·(u_t − u_j)
    log_w = np.where(valid, np.log(np.maximum(c, 1).astype(np.float64))
                     + float(rate) * (u - top_u[:, None]).astype(np.float64), -np.inf)
    top = log_w.argmax(axis=1)
    rows = np.arange(g)
    u_t, c_t = u[rows, top], c[rows, top]
    pending = rows
    while pending.size:
        owner = np.repeat(pending, sizes[pending])
        prop = uniform_below(stream, sizes[owner])
        num = (u_t[owner] - u[owner, prop]) * rate.numerator
        ok = bernoulli_exp(stream, num, np.full(owner.size, rate.denominator, dtype=np.int64),
                           c[owner, prop] * _SLACK_NUM, c_t[owner] * _SLACK_DEN)
        hit_rows, first = np.unique(owner[ok], return_index=True)  # owner is sorted: the first accepted per row
        out[hit_rows] = prop[np.flatnonzero(ok)[first]]
        pending = pending[~np.isin(pending, hit_rows)]
    return out
