"""Private top-k selection without floating-point Gumbel noise (paper 000, Sec. 5).

LinkedIn's KnownGumb and UnkGumb add Gumbel(τ/ε) noise to counts and sort. We
never draw a Gumbel variate. Adding independent Gumbel(β) noise to values x_i
and sorting in decreasing order gives the same order as an *exponential race*:
each item finishes after an Exp(w_i) time with w_i = exp(x_i/β), first
finisher first (P[next = i] = w_i / Σ remaining w). So:

* the top-k of noisy values = the first k finishers (k-fold peeling
  exponential mechanism);
* the *argmin* of noisy values = the *last* finisher of the race.

:func:`race` runs a race exactly: each step proposes a remaining item
uniformly and accepts it with probability w_i/B for a bound B ≥ max w, using
:func:`dpcli.core.samplers.bernoulli_exp` (exact, integer inputs). Weights have
the form c_i·exp(rate·u_i) with integer c_i ≥ 1 and integer utilities u_i; the
``ln(i/δ)`` terms of UnkGumb become the integer factors c_i.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import _MARGIN, _TWO_M64, _compare_exact, rate_at_most

#: B = (1 + 1/256) × the float-identified largest weight: any float error in
#: finding the largest weight (≤ 1e-7 relative here) stays far inside it.
_SLACK_NUM, _SLACK_DEN = 256, 257


def race(
    stream: KeyedStream,
    utilities: np.ndarray,
    multipliers: np.ndarray,
    rate: Fraction,
    picks: int,
    stop: int | None = None,
) -> list[int]:
    """The first ``picks`` finishers of an exponential race with weights c_i·exp(rate·u_i).

    Stops early, after including it, when item ``stop`` finishes. Exact: each
    pick is one draw of the exponential mechanism over the remaining items.
    """
    u, c, rate = _race_inputs(utilities, multipliers, rate)
    remaining = np.arange(u.size)
    order: list[int] = []
    if not u.size or picks <= 0:
        return order
    # Each round is one call of uniform_below and one of bernoulli_exp over the m remaining items, and
    # consumes the stream exactly as those calls do (same words, same order, same exact comparisons);
    # what is hoisted out of the rounds is only arithmetic that does not change between them: every
    # item's log-weight, and each candidate's acceptance bounds, computed element by element by the
    # same float expressions as bernoulli_exp (so bit for bit the same), for all items at once, again
    # only when the best remaining item (the bound B) changes.
    log_w = np.log(c.astype(np.float64)) + float(rate) * u.astype(np.float64)
    alive = np.ones(u.size, dtype=bool)
    by_weight = np.argsort(-log_w, kind="stable")  # argmax over the remaining: the first alive in this order
    head = 0
    bound: _Bound | None = None
    den_all = np.full(u.size, rate.denominator, dtype=np.int64)
    sn_all = c * _SLACK_NUM
    if rate.denominator < 1 or int(sn_all.min()) < 1:  # bernoulli_exp's checks, once for every item
        raise ValueError("need den ≥ 1 and positive scales")
    while remaining.size and len(order) < picks:
        head = _first_alive(by_weight, alive, head)
        top = int(by_weight[head])
        if bound is None or top != bound.best:  # a new B: the acceptance bounds of every item against it
            num_all = rate.numerator * (u[top] - u)
            sd = np.full(u.size, int(c[top]) * _SLACK_DEN, dtype=np.int64)
            bound = _Bound(top, num_all, sd, _acceptance_bounds(num_all, den_all, sn_all, sd))
        pick = _next_finisher(stream, remaining, bound, den_all, sn_all)
        order.append(pick)
        alive[pick] = False
        remaining = remaining[remaining != pick]
        if pick == stop:
            break
    return order


def _first_alive(by_weight: np.ndarray, alive: np.ndarray, head: int) -> int:
    """The position in ``by_weight`` of the heaviest remaining item, from ``head`` on."""
    while not alive[by_weight[head]]:
        head += 1
    return head


def _race_inputs(utilities: np.ndarray, multipliers: np.ndarray,
                 rate: Fraction) -> tuple[np.ndarray, np.ndarray, Fraction]:
    """The utilities and multipliers as int64, and the rate rounded down so that every product
    rate.numerator · (u_best − u_i) fits in int64; refuses a non-positive rate or multiplier."""
    u = np.asarray(utilities, dtype=np.int64)
    c = np.asarray(multipliers, dtype=np.int64)
    rate = Fraction(rate)
    if rate <= 0:
        raise ValueError("rate must be positive")
    if u.shape != c.shape or (c.size and c.min() < 1):
        raise ValueError("one positive integer multiplier per utility")
    # int64-safe products rate.numerator · (u_best − u_i): the rate may only be rounded down.
    rate = rate_at_most(rate, int(u.max()) - int(u.min()) if u.size else 0)
    if c.size and int(c.max()) > (1 << 62) // _SLACK_DEN:
        raise ValueError("multiplier too large")
    return u, c, rate


@dataclass(frozen=True)
class _Bound:
    """The acceptance of every item against B, the (slackened) weight of the best remaining item ``best``:
    the exact numerators and scale denominators, and the float bounds of the fast path."""

    best: int
    num: np.ndarray
    sd: np.ndarray
    bounds: tuple[np.ndarray, ...]


def _next_finisher(stream: KeyedStream, remaining: np.ndarray, bound: _Bound, den: np.ndarray,
                   sn: np.ndarray) -> int:
    """One draw of the exponential mechanism over ``remaining``: rounds of m uniform proposals, each
    accepted with probability w_i/B, until one is; the first accepted."""
    m = remaining.size
    while True:
        prop = remaining[_uniform_below_scalar(stream, m)]
        ok = _bernoulli_from_bounds(stream, prop, bound.bounds, bound.num, den, sn, bound.sd)
        hits = np.flatnonzero(ok)
        if hits.size:
            return int(prop[hits[0]])


def _uniform_below_scalar(stream: KeyedStream, m: int) -> np.ndarray:
    """``uniform_below(stream, np.full(m, m))`` for m ≥ 1: the same words, the same values (one bound for all)."""
    limit = ((1 << 64) // m) * m  # words ≥ limit are redrawn; 2^64 (m a power of two): none is
    w = stream.uint64(m)
    if limit == 1 << 64 or int(w.max()) < limit:  # the usual case: one draw, no word redrawn
        return (w % np.uint64(m)).astype(np.int64)
    out = np.empty(m, dtype=np.int64)
    pending = np.arange(m)
    while pending.size:
        ok = w < np.uint64(limit)
        out[pending[ok]] = (w[ok] % np.uint64(m)).astype(np.int64)
        pending = pending[~ok]
        w = stream.uint64(pending.size)
    return out


def _acceptance_bounds(num: np.ndarray, den: np.ndarray, sn: np.ndarray, sd: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per item, the float quantities :func:`bernoulli_exp` computes element by element for
    Bernoulli((sn/sd)·exp(−num/den)): log p, and the bounds f_lo, f_hi of its fast path."""
    log_p = -(num.astype(np.float64) / den.astype(np.float64))
    log_p = log_p + np.log(sn.astype(np.float64) / sd.astype(np.float64))
    huge = log_p < -700.0
    with np.errstate(under="ignore"):  # items above B (already picked, never proposed) are capped: no overflow
        f = np.exp(np.where(huge, 0.0, np.minimum(log_p, 1.0)))
    f_lo = np.where(huge, 0.0, f * (1.0 - _MARGIN))
    f_hi = np.where(huge, 2.0**-1000, f * (1.0 + _MARGIN))
    return log_p, f_lo, f_hi


def _bernoulli_from_bounds(stream: KeyedStream, prop: np.ndarray, bounds: tuple[np.ndarray, ...], num: np.ndarray,
                           den: np.ndarray, sn: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """``bernoulli_exp(stream, num[prop], den[prop], sn[prop], sd[prop])`` from precomputed bounds:
    the same checks, the same words and the same exact comparisons, in the same order."""
    log_p, f_lo_all, f_hi_all = bounds  # den, sn and sd are ≥ 1 by construction (checked in race)
    if log_p[prop].max() > 1e-9:
        raise ValueError("probability above 1")
    f_lo, f_hi = f_lo_all[prop], f_hi_all[prop]
    w = stream.uint64(prop.size)
    uf = w.astype(np.float64) * _TWO_M64
    accept: np.ndarray = (uf + _TWO_M64) * (1.0 + 2.0**-50) < f_lo
    unsure = ~accept & ~(uf * (1.0 - 2.0**-50) > f_hi)
    for i in np.flatnonzero(unsure):
        j = prop[i]
        accept[i] = _compare_exact(stream, int(w[i]), int(num[j]), int(den[j]), Fraction(int(sn[j]), int(sd[j])))
    return accept


def last_finisher(stream: KeyedStream, utilities: np.ndarray, multipliers: np.ndarray, rate: Fraction) -> int:
    """The argmin of c_i·… noisy values: the item a full race finishes last."""
    n = len(utilities)
    if n == 1:
        return 0
    order = race(stream, utilities, multipliers, rate, n - 1)
    left = np.ones(n, dtype=bool)
    left[order] = False  # (np.setdiff1d would import numpy.ma: ~30 ms a run)
    return int(np.flatnonzero(left)[0])


def known_top_k(stream: KeyedStream, counts: np.ndarray, k: int, epsilon_per: Fraction, tau: int) -> list[int]:
    """KnownGumb's selection (paper 000, Alg. 2): top-k of counts + Gumbel(τ/ε_per), as a race."""
    counts = np.asarray(counts, dtype=np.int64)
    if not 1 <= k <= counts.size:
        raise ValueError("need 1 ≤ k ≤ domain size")
    return race(stream.child("known-top-k"), counts, np.ones(counts.size, np.int64), Fraction(epsilon_per) / tau, k)


@dataclass(frozen=True)
class UnknownTopK:
    """What UnkGumb selected: positions in the sorted histogram, ⊥ or not, and its internals."""

    positions: list[int]  # 0-based positions in the descending sort, in release order
    bottom: bool  # True when ⊥ was reached before k items (fewer than k released)
    k_bar: int  # the threshold index k̄ (1-based, as in the paper)
    h_bottom: float  # h_⊥ (real-valued; internal only: it is h_(k̄+1) plus a public constant)


def _delta_rational(delta: Fraction, m: int) -> Fraction:
    """δ as a rational whose denominator keeps m·den·257 in int64; rounded *down* (safer: larger h_⊥)."""
    delta = Fraction(delta)
    limit = (1 << 62) // (_SLACK_DEN * max(m, 1))
    if delta.denominator <= limit:
        return delta
    return Fraction(math.floor(delta * limit), limit)


def unknown_min_delta(dbar: int) -> Fraction:
    """The smallest δ UnkGumb represents for this d̄ (:func:`_delta_rational` keeps it ≥ this, never 0)."""
    return Fraction(1, (1 << 62) // (_SLACK_DEN * max(1, dbar // 2 + 1)))


def bottom_offset(k_bar: int, dbar: int, epsilon_per: Fraction, tau: int, delta: Fraction) -> float:
    """h_⊥ − h_(k̄+1) = τ·(1 + ln(m/δ)/ε_per), m = min(k̄, d̄ − k̄) ≥ 1, at the δ the race uses (public: k̄ is
    released, the rest are parameters)."""
    m = max(1, min(k_bar, dbar - k_bar))
    d = _delta_rational(delta, m)
    return tau + tau * math.log(m / float(d)) / float(epsilon_per)


def unknown_top_k(
    stream: KeyedStream, sorted_counts: np.ndarray, k: int, dbar: int, epsilon_per: Fraction, tau: int, delta: Fraction
) -> UnknownTopK:
    """UnkGumb (paper 000, Alg. 4) on the d̄ + 1 largest counts (descending, zero-padded).

    1. k̄ = argmin over i ∈ {k, …, d̄} of h_(i+1) + τ + τ·ln(i/δ)/ε + Gumbel(τ/ε):
       the last finisher of a race with weights i·exp(ε·h_(i+1)/τ) (the common
       factor e^ε/δ cancels).
    2. h_⊥ = h_(k̄+1) + τ·(1 + ln(m/δ)/ε) with m = min(k̄, d̄ − k̄), taken ≥ 1
       (the paper's formula needs m ≥ 1; m = 1 only raises the threshold).
    3. Sort {h_(j) + Gumbel : j ≤ k̄, h_(j) > h_(k̄+1)} ∪ {h_⊥ + Gumbel} and stop
       at ⊥ or after k items: a race in which ⊥ has weight
       (m/δ)·exp(ε·(h_(k̄+1) + τ)/τ); all weights are multiplied by δ's
       denominator to make the multipliers integers.
    """
    h = np.zeros(dbar + 1, dtype=np.int64)
    got = np.asarray(sorted_counts, dtype=np.int64)[: dbar + 1]
    h[: got.size] = got
    if np.any(np.diff(h) > 0):
        raise ValueError("counts must be sorted in decreasing order")
    if not 1 <= k <= dbar:
        raise ValueError("need 1 ≤ k ≤ d̄")
    rate = Fraction(epsilon_per) / tau
    idx = np.arange(k, dbar + 1)  # i = k … d̄ (1-based); u_i = h_(i+1) = h[i]
    k_bar = int(idx[last_finisher(stream.child("k-bar"), h[idx], idx, rate)])
    m = max(1, min(k_bar, dbar - k_bar))
    d = _delta_rational(delta, m)
    cutoff = int(h[k_bar])  # h_(k̄+1)
    a = cutoff + tau
    h_bottom = cutoff + bottom_offset(k_bar, dbar, epsilon_per, tau, delta)
    cand = np.flatnonzero(h[:k_bar] > cutoff)  # 0-based j − 1 for j ≤ k̄
    utilities = np.concatenate([h[cand], [a]])
    multipliers = np.concatenate([np.full(cand.size, d.numerator, np.int64), [m * d.denominator]])
    order = race(stream.child("select"), utilities, multipliers, rate, k, stop=cand.size)
    bottom = bool(order) and order[-1] == cand.size
    positions = [int(cand[i]) for i in order if i != cand.size]
    return UnknownTopK(positions, bottom or len(positions) < k, k_bar, h_bottom)
