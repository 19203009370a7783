"""Privacy accounting: conversions and composition theorems as plain functions.

Sources (see docs/accounting.md for the mapping):

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

import functools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where RDP curves are computed: `dpcli budget show` of a
    import numpy as np  # pure, approx, zCDP or br ledger never needs it (fast start)


@functools.cache
def rdp_orders() -> np.ndarray:
    """Orders α used for RDP accounting: SafeTab's grid 1.01 … 10.00 (step 0.01),
    extended geometrically to 10^4 for small budgets."""
    import numpy as np

    orders = np.unique(np.concatenate([np.round(np.arange(1.01, 10.0001, 0.01), 2), np.geomspace(10.0, 1e4, 200)]))
    orders.setflags(write=False)
    return orders


def __getattr__(name: str) -> Any:  # ``RDP_ORDERS`` stays importable, built on first use
    if name == "RDP_ORDERS":
        return rdp_orders()
    raise AttributeError(name)


#: Relative slack added to every real-valued ε this module returns (so a ρ found by inverting a
#: conversion is rounded down too): far above the float rounding of the formulas (a few ulps),
#: far below any figure we print.
_PAD = 2.0**-40


def _up(x: float, scale: float = 0.0) -> float:
    """``x`` rounded up past its float error: relative :data:`_PAD` of ``max(|x|, scale)``.

    ``scale`` is the magnitude of the largest term ``x`` was computed from, so a
    result that cancelled to (nearly) zero still moves up by the terms' rounding.
    """
    if not math.isfinite(x):
        return x
    return x + max(abs(x), scale) * _PAD


def _mul_up(a: float, b: float) -> float:
    """a·b for a, b ≥ 0, rounded up to the next float when the product is inexact."""
    p = a * b
    if math.isfinite(p) and Fraction(p) < Fraction(a) * Fraction(b):
        p = math.nextafter(p, math.inf)
    return p


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError("δ must be in (0, 1)")


def zcdp_to_approx_analytic(rho: float, delta: float) -> float:
    """ε with ρ-zCDP ⇒ (ε, δ)-DP by ε = ρ + 2√(ρ ln(1/δ)) (SafeTab Lemma 5), rounded up."""
    _check_delta(delta)
    if not rho >= 0:
        raise ValueError("ρ must be ≥ 0")
    return _up(rho + 2.0 * math.sqrt(rho) * math.sqrt(-math.log(delta)))


def _zcdp_log_delta(rho: float, epsilon: float, x: float) -> float:
    """ln δ of CKS's bound at order α = 1 + x (x > 0), evaluated without overflow.

    δ = e^{(α−1)(αρ−ε)}/(α−1) · (1 − 1/α)^α, i.e. ln δ = x((1+x)ρ − ε) + x ln x − (1+x) ln(1+x).
    """
    if x >= 1.0:  # x ln x − (1+x) ln(1+x) = −x·ln(1 + 1/x) − ln(1+x), without cancellation
        return x * ((1.0 + x) * rho - epsilon) - x * math.log1p(1.0 / x) - math.log1p(x)
    return x * ((1.0 + x) * rho - epsilon) + x * math.log(x) - (1.0 + x) * math.log1p(x)


def _bisect_log(increasing: Callable[[float], float], lo: float, hi: float, steps: int = 100) -> float:
    """The root of ``increasing`` between ``lo`` and ``hi`` (> 0), bisected geometrically."""
    a, b = math.log(lo), math.log(hi)
    for _ in range(steps):
        mid = (a + b) / 2.0
        if increasing(math.exp(mid)) < 0:
            a = mid
        else:
            b = mid
    return math.exp((a + b) / 2.0)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """The smallest δ (CKS Prop. / SafeTab Lemma 4) with ρ-zCDP ⇒ (ε, δ)-DP (any order gives a valid δ)."""
    if not (rho >= 0 and epsilon >= 0):
        raise ValueError("ρ and ε must be ≥ 0")
    if rho == 0:
        return 0.0
    # The optimal order solves (2α−1)ρ − ε + ln(1 − 1/α) = 0 (increasing in α = 1 + x).
    hi = (epsilon + 1.0) / (2.0 * rho) + 1.0
    x = _bisect_log(lambda x: (2.0 * x + 1.0) * rho - epsilon - math.log1p(1.0 / x), 1e-300, min(hi, 1e300))
    return math.exp(min(0.0, _zcdp_log_delta(rho, epsilon, x)))


def zcdp_to_approx(rho: float, delta: float) -> float:
    """The optimal ε for ρ-zCDP ⇒ (ε, δ)-DP (SafeTab eq. 7 / CKS Prop. 3), rounded up.

    ε = min over α = 1 + x of (1+x)ρ + (ln(1/δ) + x ln x − (1+x) ln(1+x))/x; every x
    gives a valid ε, so the minimiser only needs to be close: its root
    ρx² = ln(1/δ) − ln(1+x) is bisected in log space (no overflow for any
    ρ ≥ 0, δ ∈ (0, 1)), the value is rounded up past the float error of its
    terms, and never exceeds the (rounded-up) analytic bound.
    """
    _check_delta(delta)
    if not rho >= 0:
        raise ValueError("ρ must be ≥ 0")
    if rho == 0:
        return 0.0
    analytic = zcdp_to_approx_analytic(rho, delta)
    if not math.isfinite(analytic):
        return analytic
    log_inv = -math.log(delta)
    top = math.sqrt(log_inv / rho)  # the root is below: there ρx² = ln(1/δ) > ln(1/δ) − ln(1+x)
    x = _bisect_log(lambda x: rho * x * x + math.log1p(x) - log_inv, min(1e-300, top), max(top, 1e-300))
    # ln x − (1+x)·ln(1+x)/x (< 0), written without cancellation on either side of x = 1.
    if x >= 1.0:
        tail = -math.log1p(1.0 / x) - math.log1p(x) / x
    else:
        tail = math.log(x) - (1.0 + x) * math.log1p(x) / x
    terms = ((1.0 + x) * rho, log_inv / x, tail)
    eps = max(0.0, _up(sum(terms), max(abs(t) for t in terms)))
    return min(eps, analytic)


def largest_epsilon(rho: Fraction, per_rho: int) -> Fraction:
    """The largest ε on a 10⁻⁹ grid with ε²/``per_rho`` ≤ ρ (at least 0): the ε a ρ-zCDP budget buys for an
    ε-bounded-range mechanism such as the exponential mechanism (``per_rho`` 8), or for any ε-DP one (2: an ε-DP
    mechanism is ε²/2-zCDP, Bun and Steinke 2016, Prop. 1.4). Exact: the search is in Fractions."""
    eps = Fraction(math.sqrt(float(per_rho * rho))).limit_denominator(10**9)
    while eps * eps / per_rho > rho:
        eps -= Fraction(1, 10**9)
    return max(eps, Fraction(0))


def rho_for_epsilon(epsilon: float, delta: float) -> float:
    """The largest ρ (found to ~10 significant digits, rounded down) whose optimal conversion gives ≤ ε at δ.

    Used to calibrate Gaussian noise to a requested (ε, δ): rounding ρ down
    means the released guarantee is never weaker than asked. Bisected in log
    space, so any ε > 0 and δ ∈ (0, 1) take the same few hundred evaluations;
    returns 0.0 when no positive float ρ fits (ε far below double precision).
    """
    _check_delta(delta)
    if not epsilon > 0:
        raise ValueError("ε must be > 0")
    if not math.isfinite(epsilon):
        raise ValueError("ε must be finite")

    def fits(rho: float) -> bool:
        return zcdp_to_approx(rho, delta) <= epsilon

    # Bracket the answer by factors of 16: ρ = ε usually fails already, but for ε far below
    # ln(1/δ) a much larger ρ can still convert to ε (even to 0); at most ~300 steps either way.
    lo, hi = _bracket_up(fits, epsilon)
    if not math.isfinite(hi):
        return lo
    if lo == 0.0:
        below = _bracket_down(fits, hi)
        if below is None:
            return 0.0
        lo, hi = below
    return _largest_fitting(fits, lo, hi)


def _bracket_up(fits: Callable[[float], bool], start: float) -> tuple[float, float]:
    """(lo, hi): ``start`` times 16 until it fails to fit; lo the last that fit (0 if none), hi infinite
    if every finite one fits."""
    lo, hi = 0.0, start
    for _ in range(300):
        if not fits(hi):
            break
        lo, hi = hi, hi * 16.0
        if not math.isfinite(hi):
            break
    return lo, hi


def _bracket_down(fits: Callable[[float], bool], hi: float) -> tuple[float, float] | None:
    """(lo, hi) with lo > 0 fitting: ``hi`` divided by 16 until one fits; None if none above 0 does."""
    lo = 0.0
    while lo == 0.0:
        hi_next = hi / 16.0
        if hi_next == 0.0:
            return None
        if fits(hi_next):
            lo = hi_next
        else:
            hi = hi_next
    return lo, hi


def _largest_fitting(fits: Callable[[float], bool], lo: float, hi: float) -> float:
    """Bisection in log space between a fitting ``lo`` and a failing ``hi``: the largest ρ seen to fit
    (a float that was tested, never a rounded log)."""
    best = lo
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        mid = (a + b) / 2.0
        rho = math.exp(mid)
        if fits(rho):
            a, best = mid, max(best, rho)
        else:
            b = mid
    return best


def rdp_to_approx(curve: np.ndarray | Sequence[float], delta: float,
                  orders: np.ndarray | None = None) -> tuple[float, float]:
    """Convert an RDP curve ε(α) to (ε, δ)-DP by SafeTab eq. 6; returns (ε rounded up, best α).

    Infinite curve values (an order whose RDP overflowed) are skipped; an all-infinite curve gives ε = ∞.
    """
    import numpy as np

    orders = rdp_orders() if orders is None else orders
    _check_delta(delta)
    a = np.asarray(orders, dtype=float)
    curve = np.asarray(curve, dtype=float)
    shift = (-math.log(delta) + (a - 1.0) * np.log1p(-1.0 / a) - np.log(a)) / (a - 1.0)
    with np.errstate(invalid="ignore"):
        eps = curve + shift
    eps = np.where(np.isnan(eps), np.inf, eps)
    i = int(np.argmin(eps))
    value = _up(float(eps[i]), max(abs(float(curve[i])), abs(float(shift[i]))))
    return float(max(value, 0.0)), float(a[i])


def geometric_rdp(epsilon: float, orders: np.ndarray | None = None) -> np.ndarray:
    """RDP curve τ(α, ε) of the geometric mechanism with parameter ε (SafeTab Cor. 1).

    Evaluated in log space so large α·ε (or ε itself) does not overflow.
    """
    import numpy as np

    orders = rdp_orders() if orders is None else orders
    if epsilon <= 0:
        return np.zeros_like(np.asarray(orders, dtype=float))
    a = np.asarray(orders, dtype=float)
    # ln((e^ε − 1)/(e^ε + 1)) = ln(−expm1(−ε)) − ln1p(e^−ε), valid for every ε > 0.
    log_pref = math.log(-math.expm1(-epsilon)) - math.log1p(math.exp(-epsilon))
    with np.errstate(over="ignore"):
        t1 = np.log(2.0 * a / (epsilon * (2.0 * a - 1.0))) + (a - 1.0) * epsilon
        t2 = np.log(2.0 * (a - 1.0) / (epsilon * (2.0 * a - 1.0))) - a * epsilon
        return (log_pref + np.logaddexp(t1, t2)) / (a - 1.0)


def pure_rdp(epsilon: float, orders: np.ndarray | None = None) -> np.ndarray:
    """An RDP curve valid for any ε-DP mechanism: min(ε, α ε²/2) (via ε²/2-zCDP)."""
    import numpy as np

    orders = rdp_orders() if orders is None else orders
    a = np.asarray(orders, dtype=float)
    with np.errstate(over="ignore"):
        return np.minimum(epsilon, a * epsilon * epsilon / 2.0)


def zcdp_rdp(rho: float, orders: np.ndarray | None = None) -> np.ndarray:
    """The RDP curve α ↦ αρ of a ρ-zCDP mechanism."""
    import numpy as np

    orders = rdp_orders() if orders is None else orders
    with np.errstate(over="ignore"):
        return np.asarray(orders, dtype=float) * rho


def _x_minus_log1p(y: float) -> float:
    """y − ln(1 + y) for y ≥ 0 without cancellation (series below 0.01)."""
    if y >= 0.01:
        return y - math.log1p(y)
    # y²/2 − y³/3 + y⁴/4 − …: alternating with decreasing terms, 12 terms reach 1e-26 relative.
    series: float = sum((-1) ** k * y**k / k for k in range(2, 14))
    return series


def _br_excess(epsilon: float) -> float:
    """r − 1 − ln r with r = ε/(1 − e^−ε) (LinkedIn Lemma 2.1), accurate for every ε > 0."""
    if epsilon < 0.01:
        # r − 1 = (ε + expm1(−ε))/(−expm1(−ε)); ε + expm1(−ε) = ε²/2 − ε³/6 + … by its series.
        num = sum((-1) ** k * epsilon**k / math.factorial(k) for k in range(2, 14))
        y = num / -math.expm1(-epsilon)
    else:
        y = epsilon / -math.expm1(-epsilon) - 1.0
    return _x_minus_log1p(y)


def br_composition(epsilon: float, count: int, delta: float) -> float:
    """ε′(δ) of ``count`` adaptive ε-bounded-range mechanisms (LinkedIn Lemma 2.1), rounded up.

    The minimum of ``count·ε`` and
    t(ε/(1-e^-ε) - 1 - ln(ε/(1-e^-ε))) + ε√(t/2 · ln(1/δ)).
    (Theorem 2 of the paper prints the denominator as 1 - e^ε; Lemma 2.1's
    1 - e^-ε is the correct one and reproduces the paper's Sec. 8.4 figure.)
    """
    if epsilon < 0 or count < 0:
        raise ValueError("ε and count must be ≥ 0")
    if count == 0 or epsilon == 0:
        return 0.0
    basic = _mul_up(float(count), epsilon)
    if delta <= 0:
        return basic
    _check_delta(delta)
    first = float(count) * _br_excess(epsilon)
    second = epsilon * math.sqrt(float(count) / 2.0 * -math.log(delta))
    return min(basic, _up(first + second))


def br_budget_guarantee(
    epsilon_per: float, info_budget: int, call_budget: int, delta_per: float, delta_prime: float
) -> tuple[float, float]:
    """(ε*, δ*) of LinkedIn's budget system (Theorem 2): δ* = 2ℓ*δ + δ′ (capped at 1)."""
    eps = br_composition(epsilon_per, info_budget, delta_prime)
    return eps, min(1.0, _up(2.0 * float(call_budget) * delta_per + delta_prime))


def k_fold(epsilon: float, count: int) -> float:
    """count·ε rounded up: basic composition of ``count`` ε-DP mechanisms."""
    return _mul_up(float(count), epsilon)


def basic_composition(parts: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Σε, Σδ."""
    return float(sum(e for e, _ in parts)), float(sum(d for _, d in parts))


def advanced_composition(epsilon: float, delta: float, count: int, delta_prime: float) -> tuple[float, float]:
    """Dwork-Rothblum-Vadhan: k-fold (ε, δ) ⇒ (√(2k ln 1/δ′)ε + kε(e^ε-1), kδ + δ′).

    ε is rounded up (and never above kε), δ capped at 1.
    """
    _check_delta(delta_prime)
    k = float(count)
    if count == 0 or epsilon == 0:
        return 0.0, min(1.0, _up(k * delta + delta_prime))
    basic = _mul_up(k, epsilon)
    growth = math.expm1(epsilon) if epsilon < 700.0 else math.inf
    eps = math.sqrt(2.0 * k * -math.log(delta_prime)) * epsilon + k * epsilon * growth
    return min(_up(eps), basic), min(1.0, _up(k * delta + delta_prime))


def discrete_laplace_rdp(epsilon: float, orders: np.ndarray | None = None) -> np.ndarray:
    """Exact RDP curve of the discrete Laplace with scale 1/ε against a shift of 1.

    D_α = 1/(α-1) · ln[(e^{(α-1)ε} + e^{-αε}) / (1 + e^{-ε})], from summing
    p^α q^{1-α} over the integers. SafeTab's Corollary 1 (:func:`geometric_rdp`)
    integrates instead of summing and comes out *smaller* than this (e.g. 0.368
    vs 0.394 at ε = 0.474, α = 7), so ledgers use this curve.

    For small (α−1)ε the ratio is written as 1 + [4 sinh²(y/2) + expm1(−ε)·expm1(−y)]/(1 + e^−ε)
    with y = (α−1)ε (all terms positive, no cancellation), so tiny ε are not rounded to 0.
    """
    import numpy as np

    orders = rdp_orders() if orders is None else orders
    if epsilon <= 0:
        return np.zeros_like(np.asarray(orders, dtype=float))
    a = np.asarray(orders, dtype=float)
    y = (a - 1.0) * epsilon
    with np.errstate(over="ignore"):
        big = (np.logaddexp(y, -a * epsilon) - math.log1p(math.exp(-epsilon))) / (a - 1.0)
        ys = np.minimum(y, 1.0)
        excess = (4.0 * np.sinh(ys / 2.0) ** 2 + math.expm1(-epsilon) * np.expm1(-ys)) / (1.0 + math.exp(-epsilon))
        small = np.log1p(excess) / (a - 1.0)
    return np.where(y < 1.0, small, big)
