"""Quantiles by exact gap sampling: the exponential mechanism over every grid point of [lo, hi].

A quantile's candidates are all W + 1 grid points x = 0 … W of the bounds (in grid units from lo). Its
utility is u(x) = −max(0, den·r_<(x) − num·n, num·n − den·r_≤(x)) (p = num/den; r_<(x) and r_≤(x): the
group's bounded rows strictly below x and at most x, n: all of them): 0 at a point that is a p-quantile
of the rows (q·n between its two ranks: a value repeated across the quantile's rank is one), and
−|den·r − num·n| between values, where both ranks are r. It is constant on each gap between consecutive
distinct values of the group, so the points fall into runs: with distinct values v₁ < … < v_m (grid
units), the gap [0, v₁ − 1], the point v₁, the gap [v₁ + 1, v₂ − 1], …, the point v_m, the gap
[v_m + 1, W] (empty gaps dropped). The exponential mechanism over the points is then two exact draws:

1. a run, with probability ∝ width · exp(rate · u(run)): the exact weighted race of
   :func:`dpcli.core.mechanisms.exponential_mechanism_weighted_rows`, the widths its integer multipliers;
2. a point uniform in the chosen run (:func:`dpcli.core.samplers.uniform_below`).

So P[x] = exp(rate·u(x)) / Σ_y exp(rate·u(y)) for every grid point, the same distribution as an exponential
mechanism over all W + 1 points (whose privacy proof is docs/histogram.md's), at a cost linear in the
group's distinct values rather than in W. Nothing about the data decides anything but the draws' weights:
the candidate set (every grid point) is public; the runs only group it. Vectorised over groups: the runs of
a chunk of groups sit in one padded array (:data:`CHUNK`).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import uniform_below

#: How quantiles are released (bound into the seed through the plans that carry it): a new value gives every
#: quantile release fresh draws once.
QUANTILE_SAMPLER = "quantiles: exponential mechanism over every grid point, by gap sampling (v1)"


def _runs(group: np.ndarray, offset: np.ndarray, count: np.ndarray, groups: int, width: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(r_<, r_≤, widths, starts, sizes, n) of every group's runs, padded to G × R (see :func:`gap_runs`)."""
    group = np.asarray(group, dtype=np.int64)
    offset = np.asarray(offset, dtype=np.int64)
    count = np.asarray(count, dtype=np.int64)
    order = np.lexsort((offset, group))
    group, offset, count = group[order], offset[order], count[order]
    per_group = np.bincount(group, minlength=groups).astype(np.int64)
    first = np.concatenate([[0], np.cumsum(per_group)[:-1]]).astype(np.int64)
    pos = np.arange(group.size, dtype=np.int64) - first[group]  # the value's index within its group
    cum = np.cumsum(count)
    rank_le = cum - np.concatenate([[0], cum])[first][group]  # the group's rows at or below the value
    rank_lt = rank_le - count  # … strictly below it
    slots = 2 * (int(per_group.max()) if groups else 0) + 1
    # Slot 2i + 1 is the i-th value's point; slot 2i the gap before it; slot 2m the gap after the last value.
    starts = np.zeros((groups, slots), dtype=np.int64)
    ends = np.full((groups, slots), -1, dtype=np.int64)
    lt = np.zeros((groups, slots), dtype=np.int64)
    le = np.zeros((groups, slots), dtype=np.int64)
    rows = np.arange(groups)
    ends[rows, 2 * per_group] = width  # the last gap ends at W (a group's only run when it has no rows)
    starts[group, 2 * pos + 1] = offset
    ends[group, 2 * pos + 1] = offset
    lt[group, 2 * pos + 1], le[group, 2 * pos + 1] = rank_lt, rank_le
    ends[group, 2 * pos] = offset - 1  # the gap before a value ends just below it …
    starts[group, 2 * pos + 2] = offset + 1  # … and the gap after it starts just above
    lt[group, 2 * pos + 2], le[group, 2 * pos + 2] = rank_le, rank_le
    n = le[rows, 2 * per_group]
    widths = ends - starts + 1
    valid = (np.arange(slots)[None, :] <= 2 * per_group[:, None]) & (widths >= 1)
    packed = np.argsort(~valid, axis=1, kind="stable")  # the runs of a row first, in order
    sizes = valid.sum(axis=1).astype(np.int64)
    keep = np.take_along_axis(valid, packed, axis=1)
    lt, le, widths, starts = (np.take_along_axis(a, packed, axis=1) for a in (lt, le, widths, starts))
    return np.where(keep, lt, 0), np.where(keep, le, 0), np.where(keep, widths, 1), starts, sizes, n


def gap_runs(group: np.ndarray, offset: np.ndarray, count: np.ndarray, groups: int, width: int,
             p: Fraction) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(utilities, widths, starts, sizes) of every group's runs, padded to G × R.

    ``group``, ``offset`` and ``count`` list each (group index, grid offset in [0, ``width``], rows) once; the
    groups are 0 … ``groups`` − 1 (a group without rows has the one run [0, W]). Row i holds sizes[i] runs,
    in order: starts[i, k] their first point, widths[i, k] ≥ 1 their points, utilities[i, k] their utility.
    Each distinct value is a run of its own (one point), each gap between values another (empty gaps dropped)."""
    lt, le, widths, starts, sizes, n = _runs(group, offset, count, groups, width)
    # u = −max(0, den·r_< − num·n, num·n − den·r_≤): 0 where q·n lies in [r_<, r_≤] (docs/histogram.md)
    over = p.denominator * lt - p.numerator * n[:, None]
    under = p.numerator * n[:, None] - p.denominator * le
    return -np.maximum(0, np.maximum(over, under)), widths, starts, sizes


def target_runs(group: np.ndarray, offset: np.ndarray, count: np.ndarray, groups: int, width: int,
                target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """As :func:`gap_runs`, with the utility −max(0, r_< − t, t − r_≤) of a public target rank t per group
    (an interval end's: one unit's k ≤ C rows move both ranks by at most k, so ΔU = C)."""
    lt, le, widths, starts, sizes, _ = _runs(group, offset, count, groups, width)
    t = np.asarray(target, dtype=np.int64)[:, None]
    return -np.maximum(0, np.maximum(lt - t, t - le)), widths, starts, sizes


def draw(stream: KeyedStream, runs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
         rate: Fraction) -> np.ndarray:
    """A grid offset per group from its runs: a run by the weighted exponential mechanism
    (``stream.child("run")``), then a uniform point in it (``stream.child("point")``)."""
    utilities, widths, starts, sizes = runs
    groups = sizes.size
    if groups == 0:
        return np.zeros(0, dtype=np.int64)
    run = mech.exponential_mechanism_weighted_rows(stream.child("run"), utilities, widths, sizes, rate)
    rows = np.arange(groups)
    inside = uniform_below(stream.child("point"), widths[rows, run])
    chosen: np.ndarray = starts[rows, run] + inside
    return chosen


#: Groups drawn together: the runs of a chunk sit in one padded array of (its groups) × (twice its most
#: distinct values + 1) cells, so memory stays bounded by this many groups' worth whatever the number of groups.
#: The chunks are fixed by the groups' public order and count alone (each draws from its own child stream).
CHUNK = 64


def _chunks(groups: int, group: np.ndarray) -> list[tuple[int, int, slice]]:
    """(first group, groups, the entries' slice) of every chunk; ``group`` sorted ascending."""
    out = []
    for first in range(0, groups, CHUNK):
        size = min(CHUNK, groups - first)
        lo, hi = np.searchsorted(group, [first, first + size], side="left")
        out.append((first, size, slice(int(lo), int(hi))))
    return out


def _sorted(group: np.ndarray, offset: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, ...]:
    group = np.asarray(group, dtype=np.int64)
    order = np.argsort(group, kind="stable")
    return group[order], np.asarray(offset, dtype=np.int64)[order], np.asarray(count, dtype=np.int64)[order]


def gap_quantiles(stream: KeyedStream, group: np.ndarray, offset: np.ndarray, count: np.ndarray, groups: int,
                  width: int, p: Fraction, rate: Fraction) -> np.ndarray:
    """The released grid offset (in [0, ``width``]) of every group's p-quantile (:func:`draw`, by chunks of
    :data:`CHUNK` groups, chunk i from ``stream.child(f"groups{i}")``)."""
    group, offset, count = _sorted(group, offset, count)
    out = np.zeros(groups, dtype=np.int64)
    for i, (first, size, part) in enumerate(_chunks(groups, group)):
        runs = gap_runs(group[part] - first, offset[part], count[part], size, width, p)
        out[first:first + size] = draw(stream.child(f"groups{i}"), runs, rate)
    return out


def target_quantiles(stream: KeyedStream, group: np.ndarray, offset: np.ndarray, count: np.ndarray, groups: int,
                     width: int, target: np.ndarray, rate: Fraction) -> np.ndarray:
    """As :func:`gap_quantiles`, aimed at a public target rank per group (:func:`target_runs`)."""
    group, offset, count = _sorted(group, offset, count)
    target = np.asarray(target, dtype=np.int64)
    out = np.zeros(groups, dtype=np.int64)
    for i, (first, size, part) in enumerate(_chunks(groups, group)):
        runs = target_runs(group[part] - first, offset[part], count[part], size, width, target[first:first + size])
        out[first:first + size] = draw(stream.child(f"groups{i}"), runs, rate)
    return out


def grid_points(lo_units: int, hi_units: int) -> int:
    """How many candidates a quantile has: every grid point of [lo, hi]."""
    return hi_units - lo_units + 1
