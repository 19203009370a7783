"""A 95% interval in the value's units for a released quantile: two more exponential-mechanism releases.

With ``--with-error`` a quantile's share ε_q of the budget (ρ_q under Gaussian noise) is split: 1/2 for the
released value, 1/5 for each end of its interval and 1/10 for a noisy count n̂ of the group's bounded rows
(sensitivity C). The ends are exponential mechanisms over every grid point, by gap sampling, with the utility
u_t(x) = −max(0, r_<(x) − t, t − r_≤(x)) of a target rank t computed from n̂ alone (public once n̂ is
released): one unit's k ≤ C rows move both ranks by at most k, so ΔU = C and the rate is ε_end/(2KC).

Coverage of the bounded sample quantile x* (the grid value with r_<(x*) ≤ q·n ≤ r_≤(x*)), by a union bound
over three events of probabilities 1%, 2% and 2%:

* the count: |n̂ − n| ≤ m (m: its noise's 99% margin);
* the low end L, target t_L = ⌊q·(n̂ − m) − s_L⌋ − 1 with s_L = ln((N − 1)/0.02)/rate (N grid points): given
  the count event, 0 ≤ t_L ≤ q·n − s_L − 1 (when t_L < 0 the end is lo, which is ≤ x* anyway). Some point
  has utility 0 (t_L ∈ [0, n]); L > x* would give r_<(L) ≥ r_≤(x*) ≥ q·n, so u(L) ≤ −(q·n − t_L) < −s_L,
  which McSherry–Talwar bounds by (N − 1)·e^(−rate·s_L) = 2%;
* the high end U, target t_U = ⌈q·(n̂ + m) + s_U⌉ + 1, the mirror: U < x* gives r_≤(U) ≤ r_<(x*) ≤ q·n and
  u(U) < −s_U; it needs t_U ≤ n, which holds when t_U < n̂ − m (otherwise the end is hi, ≥ x* anyway).

So [L, U] ∋ x* with probability ≥ 95%, and both ends are DP releases charged in the plan; nothing reads an
exact rank. The bound is for the plan's rates (the exact sampler lowers one only where a utility gap would
overflow 64-bit integers, as for the rank margin).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dpcli.core import intervals
from dpcli.core.prf import KeyedStream
from dpcli.tasks import quantile_gaps

#: The split of a quantile's share when its interval is released: the value, each end, the row count.
POINT_SHARE, END_SHARE, COUNT_SHARE = Fraction(1, 2), Fraction(1, 5), Fraction(1, 10)
#: The union bound: the count's two-sided miss, each end's one-sided miss.
COUNT_ALPHA, END_ALPHA = 0.01, 0.02


def end_slack(rate: Fraction, candidates: int) -> float:
    """s with P[u(chosen) < −s] ≤ END_ALPHA when some candidate has utility 0 (McSherry–Talwar)."""
    return intervals.exponential_margin(float(rate), candidates, END_ALPHA)


def targets(p: Fraction, n_hat: np.ndarray, margin: int, slack_lo: float, slack_hi: float
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(t_L, t_U, the low end is lo, the high end is hi) per group, from the released count alone."""
    n_hat = np.asarray(n_hat, dtype=np.int64)
    q = float(p)
    t_lo = np.floor(q * (n_hat - margin) - slack_lo).astype(np.int64) - 1
    t_hi = np.ceil(q * (n_hat + margin) + slack_hi).astype(np.int64) + 1
    at_lo = t_lo < 0
    at_hi = t_hi >= n_hat - margin
    return np.maximum(t_lo, 0), np.maximum(t_hi, 0), at_lo, at_hi


def interval_offsets(stream: KeyedStream, group: np.ndarray, offset: np.ndarray, count: np.ndarray, groups: int,
                     width: int, p: Fraction, n_hat: np.ndarray, margin: int, rates: tuple[Fraction, Fraction]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The interval's ends as grid offsets in [0, ``width``] (``stream.child("low")``, ``…("high")``)."""
    candidates = quantile_gaps.grid_points(0, width)
    t_lo, t_hi, at_lo, at_hi = targets(p, n_hat, margin, end_slack(rates[0], candidates),
                                       end_slack(rates[1], candidates))
    low = quantile_gaps.target_quantiles(stream.child("low"), group, offset, count, groups, width, t_lo, rates[0])
    high = quantile_gaps.target_quantiles(stream.child("high"), group, offset, count, groups, width, t_hi, rates[1])
    return np.where(at_lo, 0, low), np.where(at_hi, width, high)


def describe() -> str:
    """How the interval is meant (the ``margins`` text)."""
    return ("95% interval of the bounded sample quantile from two exponential-mechanism releases at target ranks "
            f"shifted from q·n̂ by their own and the noisy row count's margins ({float(END_SHARE):g} of the "
            f"quantile's budget each, {float(COUNT_SHARE):g} for the count, {float(POINT_SHARE):g} for the value), "
            "as a margin around the released value")
