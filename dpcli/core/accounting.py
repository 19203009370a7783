"""Privacy accounting: conversions and composition theorems as plain functions.

Sources (see the README for the mapping):

* zCDP → (ε, δ): analytic ρ + 2√(ρ log 1/δ) (Bun & Steinke), and the optimal
  conversion of Canonne, Kamath & Steinke (SafeTab App. A, Lemma 4 / eq. 7),
  computed by bisection so that any numerical slack only *loosens* ε.
* RDP → (ε, δ): SafeTab eq. 6, minimised over a grid of orders α.
* RDP curve of the geometric (discrete Laplace) mechanism: SafeTab Corollary 1.
* Bounded-range composition: LinkedIn Lemma 2.1 (Dong, Durfee & Rogers), and
  the budget-system guarantee of LinkedIn Theorem 2 (δ* = 2ℓ*δ + δ′).
* Basic and advanced composition for (ε, δ).

Budget arithmetic elsewhere is exact (``Fraction``); these conversions are
real-valued by nature and are only used to *report* guarantees or to compare
RDP totals against a limit with a documented safety margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

#: Orders α used for RDP accounting: SafeTab's grid 1.01 … 10.00 (step 0.01),
#: extended geometrically to 10^4 for small budgets.
RDP_ORDERS: np.ndarray = np.unique(
    np.concatenate([np.round(np.arange(1.01, 10.0001, 0.01), 2), np.geomspace(10.0, 1e4, 200)])
)


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError("δ must be in (0, 1)")


def zcdp_to_approx_analytic(rho: float, delta: float) -> float:
    """ε with ρ-zCDP ⇒ (ε, δ)-DP by ε = ρ + 2√(ρ ln(1/δ)) (SafeTab Lemma 5)."""
    _check_delta(delta)
    if rho < 0:
        raise ValueError("ρ must be ≥ 0")
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def zcdp_delta(rho: float, epsilon: float) -> float:
    """The smallest δ (CKS Prop. / SafeTab Lemma 4) with ρ-zCDP ⇒ (ε, δ)-DP."""
    if rho < 0 or epsilon < 0:
        raise ValueError("ρ and ε must be ≥ 0")
    if rho == 0:
        return 0.0
    # The optimal order solves (2α-1)ρ - ε + ln(1 - 1/α) = 0; bisect for it.
    amin, amax = 1.01, (epsilon + 1.0) / (2.0 * rho) + 2.0
    for _ in range(200):
        alpha = (amin + amax) / 2.0
        if (2.0 * alpha - 1.0) * rho - epsilon + math.log1p(-1.0 / alpha) < 0:
            amin = alpha
        else:
            amax = alpha
    alpha = (amin + amax) / 2.0
    log_delta = (alpha - 1.0) * (alpha * rho - epsilon) + alpha * math.log1p(-1.0 / alpha)
    return min(1.0, math.exp(log_delta) / (alpha - 1.0))


def zcdp_to_approx(rho: float, delta: float) -> float:
    """The optimal ε for ρ-zCDP ⇒ (ε, δ)-DP (SafeTab eq. 7), by bisection on ε.

    Returns an ε with ``zcdp_delta(rho, ε) ≤ δ``: a valid (never optimistic) bound.
    """
    _check_delta(delta)
    if rho < 0:
        raise ValueError("ρ must be ≥ 0")
    if rho == 0:
        return 0.0
    _, hi = _bisect(lambda eps: zcdp_delta(rho, eps) > delta, 0.0, zcdp_to_approx_analytic(rho, delta), steps=100)
    return hi


def rho_for_epsilon(epsilon: float, delta: float) -> float:
    """The largest ρ (to 12 bisection digits, rounded down) whose optimal conversion gives ≤ ε at δ.

    Used to calibrate Gaussian noise to a requested (ε, δ): rounding ρ down
    means the released guarantee is never weaker than asked.
    """
    _check_delta(delta)
    if epsilon <= 0:
        raise ValueError("ε must be > 0")
    # Brackets: the analytic conversion is never better than the optimal one, so the ρ solving
    # ρ + 2√(ρ ln(1/δ)) = ε is feasible; ρ = ε is not (the conversion gives ε' ≥ ρ).
    root = math.sqrt(math.log(1.0 / delta) + epsilon) - math.sqrt(math.log(1.0 / delta))
    lo, _ = _bisect(lambda rho: zcdp_to_approx(rho, delta) <= epsilon, min(root * root, epsilon), epsilon, steps=64)
    return lo


def _bisect(below: Callable[[float], bool], lo: float, hi: float, steps: int = 200) -> tuple[float, float]:
    """Shrink [lo, hi] around the point where ``below`` turns from True to False (``below(lo)`` True)."""
    for _ in range(steps):
        mid = (lo + hi) / 2.0
        if below(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def rdp_to_approx(curve: np.ndarray, delta: float, orders: np.ndarray = RDP_ORDERS) -> tuple[float, float]:
    """Convert an RDP curve ε(α) to (ε, δ)-DP by SafeTab eq. 6; returns (ε, best α)."""
    _check_delta(delta)
    a = np.asarray(orders, dtype=float)
    eps = curve + (math.log(1.0 / delta) + (a - 1.0) * np.log1p(-1.0 / a) - np.log(a)) / (a - 1.0)
    i = int(np.argmin(eps))
    return float(max(eps[i], 0.0)), float(a[i])


def geometric_rdp(epsilon: float, orders: np.ndarray = RDP_ORDERS) -> np.ndarray:
    """RDP curve τ(α, ε) of the geometric mechanism with parameter ε (SafeTab Cor. 1).

    Evaluated in log space so large α·ε does not overflow.
    """
    if epsilon <= 0:
        return np.zeros_like(np.asarray(orders, dtype=float))
    a = np.asarray(orders, dtype=float)
    log_pref = math.log(math.expm1(epsilon)) - math.log1p(math.exp(epsilon))
    t1 = np.log(2.0 * a / (epsilon * (2.0 * a - 1.0))) + (a - 1.0) * epsilon
    t2 = np.log(2.0 * (a - 1.0) / (epsilon * (2.0 * a - 1.0))) - a * epsilon
    return (log_pref + np.logaddexp(t1, t2)) / (a - 1.0)


def pure_rdp(epsilon: float, orders: np.ndarray = RDP_ORDERS) -> np.ndarray:
    """An RDP curve valid for any ε-DP mechanism: min(ε, α ε²/2) (via ε²/2-zCDP)."""
    a = np.asarray(orders, dtype=float)
    return np.minimum(epsilon, a * epsilon * epsilon / 2.0)


def zcdp_rdp(rho: float, orders: np.ndarray = RDP_ORDERS) -> np.ndarray:
    """The RDP curve α ↦ αρ of a ρ-zCDP mechanism."""
    return np.asarray(orders, dtype=float) * rho


def br_composition(epsilon: float, count: int, delta: float) -> float:
    """ε′(δ) of ``count`` adaptive ε-bounded-range mechanisms (LinkedIn Lemma 2.1).

    The minimum of ``count·ε`` and
    t(ε/(1-e^-ε) - 1 - ln(ε/(1-e^-ε))) + ε√(t/2 · ln(1/δ)).
    (Theorem 2 of the paper prints the denominator as 1 - e^ε; Lemma 2.1's
    1 - e^-ε is the correct one and reproduces the paper's Sec. 8.4 figure.)
    """
    if epsilon < 0 or count < 0:
        raise ValueError("ε and count must be ≥ 0")
    if count == 0 or epsilon == 0:
        return 0.0
    basic = count * epsilon
    if delta <= 0:
        return basic
    _check_delta(delta)
    r = epsilon / -math.expm1(-epsilon)
    bound = count * (r - 1.0 - math.log(r)) + epsilon * math.sqrt(count / 2.0 * math.log(1.0 / delta))
    return min(basic, bound)


def br_budget_guarantee(
    epsilon_per: float, info_budget: int, call_budget: int, delta_per: float, delta_prime: float
) -> tuple[float, float]:
    """(ε*, δ*) of LinkedIn's budget system (Theorem 2): δ* = 2ℓ*δ + δ′."""
    eps = br_composition(epsilon_per, info_budget, delta_prime)
    return eps, 2.0 * call_budget * delta_per + delta_prime


def basic_composition(parts: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Σε, Σδ."""
    return float(sum(e for e, _ in parts)), float(sum(d for _, d in parts))


def advanced_composition(epsilon: float, delta: float, count: int, delta_prime: float) -> tuple[float, float]:
    """Dwork-Rothblum-Vadhan: k-fold (ε, δ) ⇒ (√(2k ln 1/δ′)ε + kε(e^ε-1), kδ + δ′)."""
    _check_delta(delta_prime)
    eps = math.sqrt(2.0 * count * math.log(1.0 / delta_prime)) * epsilon + count * epsilon * math.expm1(epsilon)
    return min(eps, count * epsilon), count * delta + delta_prime


def group_privacy(epsilon: float, delta: float, size: int) -> tuple[float, float]:
    """(ε, δ)-DP for one record ⇒ (kε, (e^{kε}-1)/(e^ε-1)·δ) for ``size`` = k records."""
    if size < 1:
        raise ValueError("group size must be ≥ 1")
    if epsilon == 0:
        return 0.0, size * delta
    return size * epsilon, math.expm1(size * epsilon) / math.expm1(epsilon) * delta


def discrete_laplace_rdp(epsilon: float, orders: np.ndarray = RDP_ORDERS) -> np.ndarray:
    """Exact RDP curve of the discrete Laplace with scale 1/ε against a shift of 1.

    D_α = 1/(α-1) · ln[(e^{(α-1)ε} + e^{-αε}) / (1 + e^{-ε})], from summing
    p^α q^{1-α} over the integers. SafeTab's Corollary 1 (:func:`geometric_rdp`)
    integrates instead of summing and comes out *smaller* than this (e.g. 0.368
    vs 0.394 at ε = 0.474, α = 7), so ledgers use this curve.
    """
    if epsilon <= 0:
        return np.zeros_like(np.asarray(orders, dtype=float))
    a = np.asarray(orders, dtype=float)
    return (np.logaddexp((a - 1.0) * epsilon, -a * epsilon) - math.log1p(math.exp(-epsilon))) / (a - 1.0)
