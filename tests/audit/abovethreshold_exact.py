"""The exact output distribution of :func:`dpcli.tasks.auto_bounds.first_reaching` (AboveThreshold), by brute
force over the threshold's values, and the privacy losses it implies on a pair of neighbouring inputs.

first_reaching draws T ~ DLap(s₁) and Zᵢ ~ DLap(s₂) (discrete Laplace, P[Z = z] ∝ e^(−|z|/s)) and returns the
first i with qᵢ + Zᵢ ≥ T (the last index if none), qᵢ = b·at_most[i] − a·n. Given T, the Zᵢ are independent:

    P[k] = Σ_T P[T] · Π_{i<k} P[Z < T − qᵢ] · P[Z ≥ T − q_k]      (+ P[none] at the last index)

The sum runs over every T within :data:`REACH` threshold scales of 0 (and over the queries' range): the
threshold mass left out is below 2·e^(−60) ≈ 2·10⁻²⁶, so every probability above :data:`FLOOR` is exact to a
relative 10⁻¹⁰; the losses are read on those outputs only.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy.special import logsumexp

from dpcli.core import mechanisms as mech

REACH = 60
FLOOR = 1e-15


def tail(m: np.ndarray, scale: float) -> np.ndarray:
    """P[Z ≥ m] for Z ~ DLap(scale), elementwise (each branch in its accurate form: no 1 − tiny)."""
    r = math.exp(-1.0 / scale)
    m = np.asarray(m, dtype=float)
    upper = np.exp(-np.maximum(m, 1.0) / scale) / (1.0 + r)  # m ≥ 1: r^m/(1 + r)
    lower = 1.0 - np.exp(-np.maximum(1.0 - m, 1.0) / scale) / (1.0 + r)  # m ≤ 0: 1 − P[Z ≥ 1 − m]
    return np.where(m >= 1, upper, lower)


def pmf(z: np.ndarray, scale: float) -> np.ndarray:
    r = math.exp(-1.0 / scale)
    return (1.0 - r) / (1.0 + r) * np.exp(-np.abs(z) / scale)


def scales(level: Fraction, epsilon: Fraction) -> tuple[float, float]:
    """The scales first_reaching really uses (the samplers round them up): threshold, queries."""
    b = level.denominator
    return float(mech.laplace(2 * b, epsilon).param), float(mech.laplace(4 * b, epsilon).param)


def first_reaching_pmf(at_most: np.ndarray, level: Fraction, epsilon: Fraction) -> np.ndarray:
    """P[first_reaching(at_most, level, epsilon, ·) = k] for every index k (a vector summing to 1)."""
    counts = np.asarray(at_most, dtype=np.int64)
    size, n = counts.size - 1, int(counts[-1])
    q = level.denominator * counts[:-1] - level.numerator * n
    s1, s2 = scales(level, epsilon)
    reach = math.ceil(REACH * s1)
    out = np.zeros(size)
    t_all = np.arange(min(int(q.min()), 0) - reach, max(int(q.max()), 0) + reach + 1)
    for start in range(0, t_all.size, 4096):  # chunks of T keep the matrices small
        t = t_all[start:start + 4096]
        reached = tail(t[:, None] - q[None, :], s2)  # P[qᵢ + Zᵢ ≥ T]
        below = tail(q[None, :] - t[:, None] + 1, s2)  # P[qᵢ + Zᵢ < T] = P[Z ≥ qᵢ − T + 1] (symmetry)
        prefix = np.cumprod(np.hstack([np.ones((t.size, 1)), below]), axis=1)  # prefix[:, k] = Π_{i<k}
        weights = pmf(t, s1)
        out += (weights[:, None] * prefix[:, :size] * reached).sum(axis=0)
        out[size - 1] += float((weights * prefix[:, size]).sum())
    return out


def neighbour(at_most: np.ndarray, bin_: int) -> np.ndarray:
    """The counts with one entry more in ``bin_`` (0 … B): at_most[i] + 1 for i ≥ bin_, n + 1."""
    counts = np.asarray(at_most, dtype=np.int64)
    return counts + (np.arange(counts.size) >= bin_)


def losses(p: np.ndarray, q: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    """ln(p/q) over the outputs both give probability above ``floor`` (float underflow below it)."""
    keep = (p > floor) & (q > floor)
    return np.asarray(np.log(p[keep]) - np.log(q[keep]))


def zcdp(p: np.ndarray, q: np.ndarray, alphas: np.ndarray, floor: float = FLOOR) -> float:
    """max over the orders α (both directions) of D_α(p‖q)/α: the ρ this pair needs for ρ-zCDP."""
    keep = (p > floor) & (q > floor)
    lp, lq = np.log(p[keep]), np.log(q[keep])
    best = 0.0
    for a in alphas:
        for x, y in ((lp, lq), (lq, lp)):
            best = max(best, float(logsumexp(a * x + (1 - a) * y)) / (a - 1) / a)
    return best


def first_within_pmf(above: np.ndarray, allowed: int, sensitivity: int, epsilon: Fraction,
                     slack_scales: int = 3, threshold_share: Fraction = Fraction(1, 2)) -> np.ndarray:
    """P[first_within(above, allowed, sensitivity, epsilon, ·) = k] for every index k: the same AboveThreshold
    with queries qᵢ = allowed + slack − above[i] and both scales 2Δ/ε (the monotone case)."""
    counts = np.asarray(above, dtype=np.int64)
    size = counts.size
    first, rest = epsilon * threshold_share, epsilon * (1 - threshold_share)
    scale = float(mech.laplace(sensitivity, first).param)  # the threshold's
    query = float(mech.laplace(sensitivity, rest).param)  # each query's
    slack = math.ceil(slack_scales * sensitivity / first)
    q = allowed + slack - counts
    reach = math.ceil(REACH * scale)
    out = np.zeros(size)
    t_all = np.arange(min(int(q.min()), 0) - reach, max(int(q.max()), 0) + reach + 1)
    for start in range(0, t_all.size, 4096):
        t = t_all[start:start + 4096]
        reached = tail(t[:, None] - q[None, :], query)
        below = tail(q[None, :] - t[:, None] + 1, query)
        prefix = np.cumprod(np.hstack([np.ones((t.size, 1)), below]), axis=1)
        weights = pmf(t, scale)
        out += (weights[:, None] * prefix[:, :size] * reached).sum(axis=0)
        out[size - 1] += float((weights * prefix[:, size]).sum())
    return out
