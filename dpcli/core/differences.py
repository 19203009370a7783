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

import numpy as np

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
