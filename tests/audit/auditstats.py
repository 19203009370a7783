"""Statistics shared by the audits: Clopper–Pearson bounds, event ε lower bounds, a two-sample (ε, δ) test.

Every audit runs at fixed seeds, so a pass is deterministic; the confidence
levels below say how unlikely a false alarm would be for a *random* seed.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def clopper_pearson(successes: int, n: int, side: str, conf: float) -> float:
    """One-sided Clopper–Pearson bound (``side`` = "lower" or "upper") of a binomial proportion."""
    if side == "lower":
        return 0.0 if successes == 0 else float(stats.beta.ppf(1 - conf, successes, n - successes + 1))
    return 1.0 if successes == n else float(stats.beta.ppf(conf, successes + 1, n - successes))


def event_epsilon_bound(hits1: int, n1: int, hits0: int, n0: int, delta: float = 0.0, conf: float = 0.995) -> float:
    """A lower bound on ε from one event E fixed in advance: P1(E) ≤ e^ε·P0(E) + δ must hold, so
    ε ≥ ln((lower(P1) − δ)/upper(P0)). With ``conf`` per side the bound holds with ≥ 2·conf − 1."""
    lo1 = clopper_pearson(hits1, n1, "lower", conf)
    hi0 = clopper_pearson(hits0, n0, "upper", conf)
    if lo1 <= delta:
        return -math.inf
    return math.log((lo1 - delta) / hi0)


def threshold_epsilon_bound(x0: np.ndarray, x1: np.ndarray, delta: float = 0.0) -> float:
    """DP-Sniper-style ε lower bound from integer-valued outputs under D (x0) and D' (x1).

    Events are tails {X ≥ t}. The threshold t is chosen on the first half of each sample
    (the best bound there) and the bound is computed on the second, fresh half, so choosing
    the event does not bias it. Clopper–Pearson at 99.5% per side (99% joint). Candidate
    thresholds are the distinct values seen, so outputs should be integers (or few distinct values).
    """
    half0, half1 = x0.size // 2, x1.size // 2
    s0, e0, s1, e1 = x0[:half0], x0[half0:], x1[:half1], x1[half1:]

    def bound(a1: np.ndarray, a0: np.ndarray, t: float) -> float:
        return event_epsilon_bound(int((a1 >= t).sum()), a1.size, int((a0 >= t).sum()), a0.size, delta)

    candidates = np.unique(np.clip(s1, np.percentile(s1, 1), np.percentile(s0, 99.99)).round())
    best_t = max(candidates, key=lambda t: bound(s1, s0, t))
    return bound(e1, e0, best_t)


def two_sample_violations(a: np.ndarray, b: np.ndarray, epsilon: float, delta: float = 0.0,
                          alpha: float = 1e-6) -> list[tuple[int, str]]:
    """A two-sample (ε, δ) test over a discrete output (integer codes, e.g. clipped values).

    For every output value v both P_a(v) ≤ e^ε·P_b(v) + δ and P_b(v) ≤ e^ε·P_a(v) + δ must
    hold. A value is a violation when a one-sided Clopper–Pearson lower bound of one side
    exceeds e^ε × the upper bound of the other + δ; bounds are Bonferroni-corrected over all
    values and both directions, so a correct mechanism is flagged with probability ≤ alpha.
    Returns the violating (value, direction) pairs.
    """
    values = np.union1d(np.unique(a), np.unique(b))
    conf = 1 - alpha / (4 * values.size)  # two bounds per check, two directions per value
    out = []
    for v in values:
        ka, kb = int((a == v).sum()), int((b == v).sum())
        for (k1, n1, name1), (k0, n0) in (((ka, a.size, "a>b"), (kb, b.size)), ((kb, b.size, "b>a"), (ka, a.size))):
            lo1 = clopper_pearson(k1, n1, "lower", conf)
            hi0 = clopper_pearson(k0, n0, "upper", conf)
            if lo1 > math.exp(epsilon) * hi0 + delta:
                out.append((int(v), name1))
    return out


def coverage_rejected(covered: int, trials: int, level: float = 0.95, alpha: float = 0.01) -> bool:
    """The one-sided exact binomial test of H0 "coverage ≥ ``level``": True when P[X ≤ covered] < ``alpha``
    for X ~ Binomial(trials, level), i.e. the observed coverage is significantly below ``level``."""
    return bool(stats.binom.cdf(covered, trials, level) < alpha)
