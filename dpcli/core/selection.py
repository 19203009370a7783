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
from dpcli.core.samplers import bernoulli_exp, rate_at_most, uniform_below

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
    remaining = np.arange(u.size)
    order: list[int] = []
    rate_f = float(rate)
    while remaining.size and len(order) < picks:
        log_w = np.log(c[remaining].astype(np.float64)) + rate_f * u[remaining].astype(np.float64)
        best = int(remaining[int(np.argmax(log_w))])
        m = remaining.size
        while True:
            prop = remaining[uniform_below(stream, np.full(m, m, dtype=np.int64))]
            # w_i / B = (c_i·256)/(c_best·257) · exp(−rate·(u_best − u_i))
            num = rate.numerator * (u[best] - u[prop])
            ok = bernoulli_exp(
                stream,
                num,
                np.full(m, rate.denominator, dtype=np.int64),
                c[prop] * _SLACK_NUM,
                np.full(m, int(c[best]) * _SLACK_DEN, dtype=np.int64),
            )
            hits = np.flatnonzero(ok)
            if hits.size:
                pick = int(prop[hits[0]])
                break
        order.append(pick)
        remaining = remaining[remaining != pick]
        if stop is not None and pick == stop:
            break
    return order


def last_finisher(stream: KeyedStream, utilities: np.ndarray, multipliers: np.ndarray, rate: Fraction) -> int:
    """The argmin of c_i·… noisy values: the item a full race finishes last."""
    n = len(utilities)
    if n == 1:
        return 0
    order = race(stream, utilities, multipliers, rate, n - 1)
    return int(np.setdiff1d(np.arange(n), np.asarray(order))[0])


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
    h_bottom = a + tau * math.log(m / float(d)) / float(epsilon_per)
    cand = np.flatnonzero(h[:k_bar] > cutoff)  # 0-based j − 1 for j ≤ k̄
    utilities = np.concatenate([h[cand], [a]])
    multipliers = np.concatenate([np.full(cand.size, d.numerator, np.int64), [m * d.denominator]])
    order = race(stream.child("select"), utilities, multipliers, rate, k, stop=cand.size)
    bottom = bool(order) and order[-1] == cand.size
    positions = [int(cand[i]) for i in order if i != cand.size]
    return UnknownTopK(positions, bottom or len(positions) < k, k_bar, h_bottom)
