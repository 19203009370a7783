"""Exact, vectorised samplers driven by a :class:`~dpcli.core.prf.KeyedStream`.

The discrete Laplace and Gaussian noise of releases comes from
:mod:`dpcli.core.noise_stream` (noise stream v2: each sample from its own
ChaCha20 stream, compiled); the uniform integers and Bernoulli trials of the
selection mechanisms below read the stream's SHAKE-256 words.

All randomness is integer: uniform integers by rejection from 64-bit words,
Bernoulli(n/d) by comparing a uniform integer with ``n``, Bernoulli(exp(-γ))
for rational γ by comparing a lazily drawn uniform real with exp(−γ) (floats
only decide comparisons that are certain by a wide margin; the rest is done
in exact arithmetic), and the discrete Laplace and discrete Gaussian samplers
of Canonne, Kamath & Steinke (2020, Algorithms 2-3). No floating point value
ever becomes a sample, so the output distribution is exactly the one the
privacy proof assumes (no Mironov-style float artefacts).

Every function works on whole numpy arrays; loops run over rejection *rounds*
(a handful, geometrically fewer elements each round), never over elements.
Parameters are Python ``Fraction``s; ``rational_at_least`` turns a requested
scale into one with bounded numerator and denominator, rounding *up* (more
noise, never less).
"""

from __future__ import annotations

import decimal
from fractions import Fraction
from math import ceil, isqrt

import numpy as np

from dpcli.core import noise_stream
from dpcli.core.prf import KeyedStream

_U64 = np.uint64
_MAX_DEN = 1 << 32  # denominators of scales are kept ≤ 2^32 (int64-safe products)
_MAX_NUM = 1 << 44  # numerators of scales (≈ 1.7e13) likewise


def rational_at_least(x: Fraction | int, max_den: int = _MAX_DEN, max_num: int = _MAX_NUM) -> Fraction:
    """The smallest fraction with a bounded denominator that is ≥ ``x`` (or ``x`` if already small).

    The denominator is at most ``max_den`` and, when possible, small enough that
    the numerator stays ≤ ``max_num`` (the samplers' int64 arithmetic). The
    relative rounding is below max(1/(x·max_den), (x + 1)/max_num): noise only
    ever gets (negligibly) larger.
    """
    x = Fraction(x)
    if x < 0:
        raise ValueError("scale must be non-negative")
    if x.denominator <= max_den and x.numerator <= max_num:
        return x
    den = min(max_den, max(1, max_num // (ceil(x) + 1)))
    return Fraction(ceil(x * den), den)


#: Integers the samplers multiply stay below this (int64 with a factor 2 to spare).
_INT_SAFE = 1 << 62


def rate_at_most(rate: Fraction, max_gap: int) -> Fraction:
    """An exponential-mechanism rate rounded *down* to int64-safe integers (never less private).

    :func:`bernoulli_exp` receives ``rate.numerator · gap`` and ``rate.denominator``
    as int64; numpy would silently wrap a product past 2^63 and turn a tiny
    acceptance probability into a large one. The result r ≤ ``rate`` has
    ``r.numerator · max_gap ≤ 2^62`` and ``r.denominator ≤ 2^62``; a smaller rate
    is the same mechanism with less weight on the utilities (ε only shrinks).
    Rates below 2^-62 become 0: a uniform choice (0-DP).
    """
    rate = Fraction(rate)
    if rate < 0:
        raise ValueError("rate must be non-negative")
    gap = max(int(max_gap), 1)
    limit = _INT_SAFE // gap
    if rate.denominator <= _INT_SAFE and rate.numerator <= limit:
        return rate
    if rate >= limit:
        return Fraction(limit)
    den = _INT_SAFE if rate * _INT_SAFE <= limit else max(1, int(limit / rate))
    return Fraction(int(rate * den), den)  # int() floors a positive Fraction


def uniform_below(stream: KeyedStream, bound: np.ndarray) -> np.ndarray:
    """Uniform integers in ``[0, bound[i])`` for each element (``1 ≤ bound < 2^63``), exactly.

    Rejection sampling: a 64-bit word ``u`` is accepted when it lies below the
    largest multiple of ``bound`` that fits in 2^64, then reduced mod ``bound``.
    """
    bound = np.asarray(bound, dtype=np.int64)
    if bound.size and (bound.min() < 1):
        raise ValueError("bound must be ≥ 1")
    m = bound.astype(_U64)
    # floor(2^64 / m) * m computed in wrapping uint64 arithmetic; 0 means 2^64 (m | 2^64).
    with np.errstate(over="ignore"):
        limit = ((_U64(0) - m) // m + _U64(1)) * m
    out = np.empty(bound.shape, dtype=np.int64)
    pending = np.arange(bound.size)
    while pending.size:
        u = stream.uint64(pending.size)
        lim = limit[pending]
        ok = (lim == 0) | (u < lim)
        out[pending[ok]] = (u[ok] % m[pending[ok]]).astype(np.int64)
        pending = pending[~ok]
    return out


#: Relative safety margin of the float fast path of :func:`bernoulli_exp`. The
#: float estimate of exp(−γ) is within γ·2^-52 (division) plus a few ulps (exp)
#: of the truth for γ ≤ 700, far inside 2^-36; anything closer is decided exactly.
_MARGIN = 2.0**-36
_TWO_M64 = 2.0**-64


def bernoulli_exp(
    stream: KeyedStream,
    num: np.ndarray,
    den: np.ndarray,
    scale_num: np.ndarray | None = None,
    scale_den: np.ndarray | None = None,
) -> np.ndarray:
    """Bernoulli(s · exp(−num/den)) per element, exactly; s = scale_num/scale_den (default 1).

    ``num`` may be negative when a scale s < 1 keeps the probability ≤ 1 (the
    exponential races of :mod:`dpcli.core.selection` need that); the
    probability must never exceed 1.

    Each element draws a 64-bit word ``u``: the first 64 bits of a uniform real
    V ∈ [0, 1), so V ∈ [u/2^64, (u+1)/2^64). The result is V < p, which has
    probability exactly p. In floating point we only decide when the whole
    interval of V lies clearly (relative margin 2^-36, far beyond any rounding
    error) on one side of p; the rare remaining elements (probability ~2^-35)
    are decided by :func:`_compare_exact`, which draws further bits of V and
    brackets p with correctly rounded decimal arithmetic until the comparison is
    certain. The float value never becomes part of a sample, so the
    distribution is exact (no Mironov-style artefacts).
    """
    num = np.asarray(num, dtype=np.int64)
    den = np.broadcast_to(np.asarray(den, dtype=np.int64), num.shape)
    if den.size and den.min() < 1:
        raise ValueError("need den ≥ 1")
    log_p = -(num.astype(np.float64) / den.astype(np.float64))
    scales = _scales(num, scale_num, scale_den)
    if scales is not None:
        sn, sd = scales
        log_p = log_p + np.log(sn.astype(np.float64) / sd.astype(np.float64))
    if log_p.size and log_p.max() > 1e-9:
        raise ValueError("probability above 1")
    huge = log_p < -700.0  # p < 2^-1000: only u = 0 can be below it
    with np.errstate(under="ignore"):
        f = np.exp(np.where(huge, 0.0, log_p))
    f_lo = np.where(huge, 0.0, f * (1.0 - _MARGIN))
    f_hi = np.where(huge, 2.0**-1000, f * (1.0 + _MARGIN))
    u = stream.uint64(num.size).reshape(num.shape)
    uf = u.astype(np.float64) * _TWO_M64
    v_lo = uf * (1.0 - 2.0**-50)
    v_hi = (uf + _TWO_M64) * (1.0 + 2.0**-50)
    accept = v_hi < f_lo
    unsure = ~accept & ~(v_lo > f_hi)
    for i in zip(*np.nonzero(unsure), strict=True):
        scale = Fraction(1) if scales is None else Fraction(int(scales[0][i]), int(scales[1][i]))
        accept[i] = _compare_exact(stream, int(u[i]), int(num[i]), int(den[i]), scale)
    return accept


def _scales(num: np.ndarray, scale_num: np.ndarray | None,
            scale_den: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The scales s = scale_num/scale_den broadcast to ``num`` (positive), or None without a scale
    (then every ``num`` must be ≥ 0: the probability is at most 1)."""
    if scale_num is None:
        if num.size and num.min() < 0:
            raise ValueError("need num ≥ 0 without a scale")
        return None
    sn = np.broadcast_to(np.asarray(scale_num, dtype=np.int64), num.shape)
    sd = np.broadcast_to(np.asarray(scale_den, dtype=np.int64), num.shape)
    if sn.size and (sn.min() < 1 or sd.min() < 1):
        raise ValueError("scales must be positive")
    return sn, sd


def _compare_exact(stream: KeyedStream, u: int, num: int, den: int, scale: Fraction = Fraction(1)) -> bool:
    """Is V < scale · exp(−num/den), where V's leading 64 bits are ``u`` and later bits come from ``stream``?

    Works with arbitrary-size integers. exp(−γ) is bracketed with Python's
    ``decimal`` (whose exp is correctly rounded, so within one unit in the last
    place) at growing precision; V's interval [lo, hi) shrinks by 2^-64 per
    extra word. Terminates with probability 1 (a rational p is decided once it
    falls on or outside the interval; exp(−γ) for γ ≠ 0 is irrational).
    """
    bits, prec = 64, 40
    while True:
        if num == 0:
            p_lo = p_hi = scale
        else:
            ctx = decimal.Context(prec=prec, Emin=-(10**9), Emax=10**9)
            g = ctx.divide(decimal.Decimal(num), decimal.Decimal(den))
            slack = decimal.Decimal(10) ** (-prec + 3)  # exact
            # all in ctx (Python's operators round to the ambient context, 28 digits by default)
            width = ctx.multiply(ctx.abs(g), slack)
            p_lo = Fraction(ctx.exp(ctx.minus(ctx.add(g, width)))) * (1 - Fraction(slack)) * scale
            p_hi = Fraction(ctx.exp(ctx.minus(ctx.subtract(g, width)))) * (1 + Fraction(slack)) * scale
        v_lo = Fraction(u, 1 << bits)
        v_hi = Fraction(u + 1, 1 << bits)
        if v_hi <= p_lo:
            return True
        if v_lo >= p_hi:
            return False
        u = (u << 64) | int(stream.uint64(1)[0])
        bits += 64
        prec += 20


def discrete_laplace(stream: KeyedStream, scale: Fraction | int, n: int) -> np.ndarray:
    """``n`` draws of the discrete Laplace (two-sided geometric) distribution.

    P[X = x] ∝ exp(-|x| / scale) over the integers (``BaseGeometric`` with
    ε = 1/scale for sensitivity 1). CKS Algorithm 2 with scale = t/s, drawn by
    :mod:`dpcli.core.noise_stream` (samples 0 … n−1 of the stream's next noise
    key). A scale of 0 returns zeros.
    """
    scale = rational_at_least(Fraction(scale))
    if scale == 0:
        return np.zeros(n, dtype=np.int64)
    if scale.numerator > _MAX_NUM:
        raise ValueError(f"discrete Laplace scale {float(scale):.3g} is too large")
    return noise_stream.laplace(stream.noise_key(), scale.numerator, scale.denominator, range(n))


def _discrete_gaussian_parameters(sigma2: Fraction) -> tuple[int, int, int]:
    """Integers (t, p, q) with t·p/q ≥ σ² used by :func:`discrete_gaussian`.

    CKS Algorithm 3 is exact for any positive proposal scale t; we take
    t = ⌊σ⌋ + 1 and round σ² *up* to t·μ with μ = p/q so that the acceptance
    exponent (|Y| - μ)² / (2tμ) = (q|Y| - p)² / (2tpq) has int64-sized parts.
    """
    t = isqrt(sigma2.numerator // sigma2.denominator) + 1
    sigma_bound = t  # σ < t
    q = max(1, min(1 << 16, (1 << 24) // sigma_bound))
    p = ceil(sigma2 * q / t)
    return t, p, q


def discrete_gaussian(stream: KeyedStream, sigma2: Fraction | int, n: int) -> np.ndarray:
    """``n`` draws of the discrete Gaussian N_Z(0, σ²): P[X = x] ∝ exp(-x²/(2σ²)).

    CKS Algorithm 3: propose Y from the discrete Laplace with scale t, accept
    with probability exp(-(|Y| - σ²/t)² / (2σ²)), drawn by
    :mod:`dpcli.core.noise_stream` (samples 0 … n−1 of the stream's next noise
    key). The variance parameter may be rounded up by a relative 2^-24/σ at
    most (never down); the effective σ² is :func:`effective_sigma2`. A σ² of 0
    returns zeros.
    """
    sigma2 = Fraction(sigma2)
    if sigma2 < 0:
        raise ValueError("σ² must be non-negative")
    if sigma2 == 0:
        return np.zeros(n, dtype=np.int64)
    t, p, q = _discrete_gaussian_parameters(sigma2)
    if t > _MAX_NUM or 2 * t * p * q >= _INT_SAFE:
        raise ValueError(f"discrete Gaussian σ² {float(sigma2):.3g} is too large")
    return noise_stream.gaussian(stream.noise_key(), t, p, q, range(n))


def effective_sigma2(sigma2: Fraction | int) -> Fraction:
    """The variance parameter :func:`discrete_gaussian` actually uses (≥ the requested one)."""
    sigma2 = Fraction(sigma2)
    if sigma2 == 0:
        return sigma2
    t, p, q = _discrete_gaussian_parameters(sigma2)
    return Fraction(t * p, q)
