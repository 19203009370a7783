"""The public grids of candidates and the two sparse-vector walks over them that choose a bound.

:func:`first_reaching` is AboveThreshold (Dwork and Roth 2014, §3.6) to a quantile level (the choice by
quantiles); :func:`first_within` is the monotone sparse vector (Lyu, Su and Li, VLDB 2017) to an allowance
(the bias–variance rule, :mod:`dpcli.tasks.auto_bounds.rule`). Both draw every query's noise, so nothing but the
index they release depends on the data. :func:`check_choice` refuses, before any data is read, a part too small
to draw its noise.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError

#: The quantile levels of the choices: 90% of units within the partition bound, 90% of the sampled
#: (unit, group) row counts within the row bound, values clamped below the 1st and above the 99th percentile.
PARTITIONS_LEVEL = Fraction(9, 10)
CONTRIBUTIONS_LEVEL = Fraction(9, 10)
VALUE_LEVELS = (Fraction(1, 100), Fraction(99, 100))


def _count_candidates() -> tuple[int, ...]:
    """1 to 8, then four steps per doubling (⌊8·2^(j/4)⌋) up to 2^16."""
    out = list(range(1, 9))
    j = 1
    while out[-1] < 1 << 16:
        c = math.floor(8 * 2 ** (j / 4))
        if c > out[-1]:
            out.append(min(c, 1 << 16))
        j += 1
    return tuple(out)


#: The public candidates of a count bound (groups per unit, rows per unit and group).
COUNT_CANDIDATES = _count_candidates()
#: The public candidates of a value limit: 0 and ±2^(j/2) for j in [−40, 100] (about 1e-6 to 1e15).
VALUE_CANDIDATES: tuple[float, ...] = tuple(
    [-(2.0 ** (j / 2)) for j in range(100, -41, -1)] + [0.0] + [2.0 ** (j / 2) for j in range(-40, 101)]
)


#: The index of 0 in :data:`VALUE_CANDIDATES` (its centre), where the bias–variance value walks start.
ZERO = VALUE_CANDIDATES.index(0.0)


#: The positive value candidates (2^(j/2) for j in [−40, 100]): the candidates of a symmetric limit L.
LIMIT_CANDIDATES: tuple[float, ...] = tuple(c for c in VALUE_CANDIDATES if c > 0)


def first_reaching(at_most: np.ndarray, level: Fraction, epsilon: Fraction, stream: KeyedStream) -> int:
    """The first candidate whose noisy count of entries at most it reaches ``level`` of all entries: the index of
    AboveThreshold (Dwork and Roth 2014, Alg. 1 of §3.6) over the candidates in order, or the last index if
    none does.

    ``at_most[i]`` (non-decreasing, length B + 1; the last is every entry) counts the entries at most
    candidate i. The queries are ``b·at_most[i] − a·n`` for level a/b: one entry more or less moves each by at
    most b (with n), so with ε₁ = ε₂ = ε/2 the threshold's noise is discrete Laplace of scale 2b/ε and each
    query's 4b/ε: ε-DP when each unit holds one entry. A query's noise is drawn for every candidate (the
    draws past the first reaching one are never read), so nothing here depends on the data but the output.
    """
    counts = np.asarray(at_most, dtype=np.int64)
    size = counts.size - 1
    n = int(counts[-1])
    a, b = level.numerator, level.denominator
    queries = b * counts[:-1] - a * n
    threshold = int(mech.laplace(2 * b, epsilon).sample(stream.child("threshold"), 1)[0])
    noisy = queries + mech.laplace(4 * b, epsilon).sample(stream.child("queries"), size)
    reached = np.flatnonzero(noisy >= threshold)
    return int(reached[0]) if reached.size else size - 1


#: The most entries :func:`first_within` allows beyond a candidate (2^60): more than any input holds, and small
#: enough that ``allowed`` + slack + noise stays within int64 (a tiny ε with many public groups and large given
#: K·C makes G·noise·K·C exceed 2^63, which numpy refused with an OverflowError after the data was read).
MOST_ALLOWED = 1 << 60


#: The slack of a walk (:func:`first_within`), in threshold noise scales: the row bound's walk stops within two
#: scales of its allowance (a count's cut rows cost more than its noise: issue 38), K's and a value limit's within
#: three.
COUNT_SLACK = 2
VALUE_SLACK = 3


def first_within(above: np.ndarray, allowed: int, sensitivity: int, epsilon: Fraction, stream: KeyedStream,
                 slack_scales: int = VALUE_SLACK, threshold_share: Fraction = Fraction(1, 2)) -> int:
    """The first candidate with at most ``allowed`` entries above it (noisily): AboveThreshold over the queries
    ``allowed + slack − above[i]`` in candidate order, or the last index if none reaches 0.

    ``above[i]`` (non-increasing, one per candidate) counts the entries beyond candidate i; a unit holds at most
    ``sensitivity`` entries, so it moves each query by at most Δ = ``sensitivity``, and every query the same
    way (a unit added can only raise the counts): the queries are monotone. With ε₁ = ε₂ = ε/2, the
    threshold's noise and each query's are then discrete Laplace of scale 2Δ/ε (Lyu, Su and Li, "Understanding
    the sparse vector technique for differential privacy", VLDB 2017, the monotone case of their Alg. 1): ε-DP.
    ``threshold_share`` splits ε between the threshold (ε₁) and the queries (ε₂ = ε − ε₁; Lyu, Su and Li's Alg. 1
    allows any split): noise of scale Δ/ε₁ and Δ/ε₂ (2Δ/ε both at the default half).
    ``slack`` is ``slack_scales`` threshold scales (public): the walk stops when a count is within a few noise scales of
    ``allowed``, rather than overshooting past it into candidates with no entries, where every query is the
    same and only an unlucky threshold would keep it walking (to the last candidate: probability about
    e^−3/candidates). Every query's noise is drawn; only the index is released. ``allowed`` is capped at
    :data:`MOST_ALLOWED`, so the queries stay within int64 whatever the error model gives.
    """
    counts = np.asarray(above, dtype=np.int64)
    allowed = min(allowed, MOST_ALLOWED)
    first, rest = epsilon * threshold_share, epsilon * (1 - threshold_share)
    slack = math.ceil(slack_scales * sensitivity / first)
    threshold = int(mech.laplace(sensitivity, first).sample(stream.child("threshold"), 1)[0])
    noisy = (allowed + slack - counts) + mech.laplace(sensitivity, rest).sample(stream.child("queries"), counts.size)
    reached = np.flatnonzero(noisy >= threshold)
    return int(reached[0]) if reached.size else counts.size - 1


def sampleable(noise: mech.Noise) -> bool:
    """Whether the samplers can draw ``noise`` (decided by its scale alone, by a probe draw on a fixed stream)."""
    try:
        noise.sample(KeyedStream(b"\0" * 32, "probe"), 1)
    except ValueError:
        return False
    return True


#: The largest noise scale, per unit of 1/ε, of a choice by quantiles (:func:`first_reaching`: 4b/ε at the
#: levels' largest denominator b) and of a choice by the bias–variance rule (:func:`first_within`: 2/ε).
QUANTILE_SCALE = 4 * max(level.denominator for level in (PARTITIONS_LEVEL, CONTRIBUTIONS_LEVEL, *VALUE_LEVELS))
WITHIN_SCALE = 2


def check_choice(epsilon: Fraction, field: str = "auto_share", scale: int = WITHIN_SCALE) -> None:
    """Refuse (before any data is read) a choice whose parts' pure ``epsilon`` is too small to draw the noise every
    choice draws: its walk's (``scale``/ε: :data:`WITHIN_SCALE` or :data:`QUANTILE_SCALE`) and the
    sensitivity-1 counts' (1/ε)."""
    if epsilon <= 0 or not sampleable(mech.laplace(scale, epsilon)):
        raise UsageError("leaves each part of the choice of bounds too little budget to draw its noise; raise "
                         "--auto-share or the query's --epsilon or --rho, or give the bounds", field=field)
