"""How much a release's bounds cut: noisy shares of the privacy units' rows, released beside the release.

A release is only as right as its bounds: the caps drop rows and the value limits clamp values, and
neither shows in the noise's margin. The bias report says how much they did, at a small share of the
query's budget (:data:`BIAS_SHARE`): on by default wherever the release can pay for it, ``--report-bias`` /
``--no-report-bias`` otherwise.

What it measures. Each unit's usable rows (the rows the release reads: a unit, and a readable value
when there is a value column) fall into five disjoint parts: rows in groups beyond the partition cap K,
rows beyond the row cap C in the groups kept, kept rows with a value below the low limit, kept rows with
a value above the high limit, and the rest. "Kept" is the expectation under the release's uniform row
sample: a group of r rows of which C are kept holds min(r, C)/r of each of its kinds of rows.

Shares of rows, weighted up to W. A reader compares the cut with a released count or sum, which adds up
*rows*: the share of all rows cut is what matters, and under caps the units with many rows lose the largest
shares, so an average over units understates it. A count of rows cut, though, is unbounded per unit (a
plane with 1,000 flights under a cap of 5 loses 995). So each unit gets a weight, min(r, W)/W of a full one
for its r rows, where W (:func:`weight_cap`) is the most rows the release can take from one unit (K·C; C
without groups; 1, every unit alike, when the release counts units rather than rows), and the report
releases, summed over units, each part's share of the unit's weight and the rest of the weight, in
millionths (rounded down, :data:`SCALE`), each with one noise. A unit's five coordinates are non-negative
and add up to its weight, at most SCALE: adding or removing a unit moves the vector by at most SCALE in ℓ1
and in ℓ2, and independent discrete Laplace (or Gaussian) noise on each coordinate at that sensitivity is
ε-DP (ρ-zCDP) at the report's share. The shares it reports are then the shares of the rows with every unit's
rows counted up to W: the share of all rows (up to the rounding) where no unit holds more than W, and nearer it than an
average over units where some do (a unit beyond W is counted as W rows, of which it loses at least r − W).

What it reports (post-processing of the noisy sums): each part over the noisy total weight (the sum of all
the coordinates), clipped to [0, 1], with a 95% margin, W (``rows_counted_up_to``) and the noisy total weight
in units of W rows (``weight``). :mod:`dpcli.advice` turns the report into a note when the cut may exceed a
released count's or sum's margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import polars as pl

from dpcli import bounding
from dpcli.bounding.keyed_order import keep_first
from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.frames import collect
from dpcli.tasks.auto_bounds import ChosenBounds, DataShape, sampleable

#: The default share of the query's ε (or ρ) spent on the bias report (a fortieth: the noise of each coordinate is
#: that of report 1 at a twentieth, whose vector had twice the sensitivity).
BIAS_SHARE = Fraction(1, 40)
#: A unit's full weight, and the resolution of its parts: millionths, rounded down (a unit of r rows weighs r/W of
#: a full one: with W up to 10⁵, ten steps per row).
SCALE = 1_000_000
#: The report's version, bound into every seed (:func:`dpcli.release.seeds.rule_versions`: its sums and noise shape
#: the output). Change it with the report. 1: average shares over units, and the number of units (issue 38's first
#: report); 2: shares of rows, each unit's rows weighted up to W, with the rest of each weight as a coordinate.
RULE = "row shares 2"
#: The largest W (:func:`weight_cap`): 10⁶ · 10⁶, the options' largest K·C, so it shapes no release and enters
#: no seed (:func:`dpcli.release.seeds.rule_versions` reads public names); min(r, W)·SCALE stays within Int64.
_MOST_ROWS = 10**12
#: The shares, in the order they are counted, by the bound that made them: rows in groups beyond K, rows
#: beyond C, kept values below the low limit, kept values above the high limit.
SHARES = {"max_partitions": "share_cut_by_max_partitions", "max_contributions": "share_cut_by_max_contributions",
          "below": "share_clamped_below", "above": "share_clamped_above"}


def bias_noise(epsilon: Fraction | None, rho: Fraction | None, share: Fraction) -> mech.Noise:
    """The noise of each coordinate of the report (ℓ1 sensitivity SCALE, squared ℓ2 at most SCALE²) at ``share`` of
    the query's ε or ρ."""
    if rho is not None:
        return mech.gaussian(SCALE * SCALE, rho * share)
    assert epsilon is not None
    return mech.laplace(SCALE, epsilon * share)


def can_report(epsilon: Fraction | None, rho: Fraction | None, share: Fraction) -> bool:
    """Whether a report at ``share`` of this budget can draw its noise (decided from public inputs)."""
    budget = rho if rho is not None else epsilon
    return budget is not None and budget * share > 0 and sampleable(bias_noise(epsilon, rho, share))


def check_bias(epsilon: Fraction | None, rho: Fraction | None, share: Fraction) -> None:
    """Refuse (before any data is read) a bias report whose noise cannot be drawn."""
    if not can_report(epsilon, rho, share):
        raise UsageError("leaves the bias report too little budget to draw its noise; raise --bias-share or the "
                         "query's --epsilon or --rho", field="bias_share")


def bias_parts(shape: DataShape, bounds: ChosenBounds, rows: bool = True) -> list[str]:
    """The shares a report measures (keys of :data:`SHARES`): K's with groups, C's when the release counts rows
    (``rows``; a count of units is not cut by C), the value limits' two."""
    out = ["max_partitions"] if bounds.max_partitions is not None and shape.by else []
    if rows:
        out.append("max_contributions")
    if bounds.bounds is not None and shape.value is not None:
        out += ["below", "above"]
    return out


@dataclass(frozen=True)
class BiasReport:
    """The noisy shares (by :data:`SHARES` name), W (:func:`weight_cap`), the noisy weight they are shares of (in
    units of W rows), the shares' 95% margin."""

    shares: dict[str, float]
    rows_counted_up_to: int
    weight: int
    moe95: float
    noise: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {**self.shares, "rows_counted_up_to": self.rows_counted_up_to, "weight": self.weight,
                "moe95": self.moe95, "noise": self.noise}


def report_bias(frame: pl.LazyFrame, shape: DataShape, bounds: ChosenBounds, noise: mech.Noise,
                stream: KeyedStream, salt: int, name: str = "the input", rows: bool = True) -> BiasReport:
    """The report of ``bounds`` (in force) on ``frame`` (:func:`bias_parts`, ``rows`` as there): one pass, one
    collect; ``salt`` is the release's bounding salt (the groups K keeps are the release's own)."""
    parts = bias_parts(shape, bounds, rows)
    cap = weight_cap(bounds, shape, rows)
    sums = _true_sums(frame, shape, bounds, parts, salt, name, cap)
    noisy = {p: int(sums[p]) + int(noise.sample(stream.child(p), 1)[0]) for p in [*parts, "rest"]}
    margin = noise.margin95()
    weight = sum(noisy.values())  # the noisy total weight: every coordinate's noise in it
    # The shares' margin: a numerator's noise over the smallest weight the denominator's noise plausibly allows
    # (a sum of n independent noises spreads about √n times one: the floor is a rough one, never below one unit).
    floor = max(weight - math.sqrt(len(noisy)) * margin, SCALE)
    shares = {SHARES[p]: round(min(max(noisy[p] / max(weight, SCALE), 0.0), 1.0), 4) for p in parts}
    return BiasReport(shares, cap, max(round(weight / SCALE), 0), round(margin / floor, 4), noise.describe())


def weight_cap(bounds: ChosenBounds, shape: DataShape, rows: bool = True) -> int:
    """W, the rows of a unit that count in full towards the report's weights: the most rows the release can take
    from one unit (K·C, or C without groups) when it counts rows, at most :data:`_MOST_ROWS` (the options' largest
    K·C); 1 (every unit alike) when it counts units. The W released (``rows_counted_up_to``) is the W weighed at."""
    if not rows:
        return 1
    k = bounds.max_partitions if bounds.max_partitions is not None and shape.by else 1
    return min(max(1, k * bounds.max_contributions), _MOST_ROWS)


def _true_sums(frame: pl.LazyFrame, shape: DataShape, bounds: ChosenBounds, parts: list[str], salt: int,
               name: str, cap: int) -> dict[str, int]:
    """The exact sums over units of each unit's weighted parts (in millionths of a full weight, rounded down) and
    of the rest of its weight (``rest``): each unit adds exactly its weight, floor(SCALE·min(r, W)/W), in all."""
    # The input's columns copied under the report's own names first: a unit, group or value column may be called
    # anything (``total``, ``__r``, ``below``…), and the same column may be both a group and the value.
    unit, value = "__bias_unit", "__bias_value"
    keys = [unit, *(f"__bias_by{i}" for i in range(len(shape.by)))]
    copies = [pl.col(c).alias(n) for c, n in zip([shape.unit, *shape.by], keys, strict=True)]
    if shape.value is not None:
        copies.append(pl.col(shape.value).alias(value))
    lf = frame.select(copies).filter(pl.col(unit).is_not_null())
    aggs = [pl.len().cast(pl.Int64).alias("__r")]
    if shape.value is not None:
        x = bounding.numeric_value(pl.col(value), lf.collect_schema()[value])
        lf = lf.with_columns(x.alias("__x")).filter(pl.col("__x").is_not_null() & ~pl.col("__x").is_nan())
        if bounds.bounds is not None:
            lo, hi = bounds.bounds
            aggs += [(pl.col("__x") < lo).sum().cast(pl.Int64).alias("__lo"),
                     (pl.col("__x") > hi).sum().cast(pl.Int64).alias("__hi")]
    pairs = lf.group_by(keys).agg(aggs)
    if "max_partitions" in parts:
        assert bounds.max_partitions is not None
        schema = pairs.collect_schema()
        kept = keep_first(pairs, [unit], [(c, schema[c]) for c in keys], salt, "groups", bounds.max_partitions)
        pairs = pairs.join(kept.select(keys).with_columns(pl.lit(True).alias("__kept")), on=keys, how="left",
                           nulls_equal=True).with_columns(pl.col("__kept").fill_null(False))
    else:
        pairs = pairs.with_columns(pl.lit(True).alias("__kept"))
    c = bounds.max_contributions
    kept_rows = pl.when(pl.col("__kept")).then(pl.min_horizontal(pl.col("__r"), pl.lit(c))).otherwise(0)
    per_pair = [pl.col("__r").alias("total"),
                pl.when(pl.col("__kept")).then(0).otherwise(pl.col("__r")).alias("max_partitions"),
                pl.when(pl.col("__kept")).then(pl.col("__r") - kept_rows).otherwise(0).alias("max_contributions")]
    if "below" in parts:  # the expected kept rows of each kind under the uniform sample: min(r, C)/r of them
        per_pair += [(kept_rows * pl.col(col) / pl.col("__r")).alias(part) for part, col in (("below", "__lo"),
                                                                                                ("above", "__hi"))]
    per_unit = pairs.select(unit, *per_pair).group_by(unit).agg(pl.exclude(unit).sum())
    # Each unit's weight min(r, W)/W in millionths, rounded down (integer arithmetic: exact), then each part's share
    # of it, rounded down and capped by what the parts before it left; the rest of the weight is the last
    # coordinate. A unit's coordinates are non-negative and add up to its weight, at most SCALE, exactly: the
    # sensitivity, whatever the float rounding of the ratios.
    total = pl.col("total").cast(pl.Float64)
    cap = min(cap, _MOST_ROWS)  # min(r, W)·SCALE stays within Int64 (weight_cap never gives more)
    weight = (pl.min_horizontal(pl.col("total"), pl.lit(cap, dtype=pl.Int64)) * SCALE) // cap
    left = weight
    shares = []
    for part in parts:
        share = (pl.col(part).cast(pl.Float64) * weight.cast(pl.Float64) / total).floor().cast(pl.Int64)
        share = pl.min_horizontal(pl.max_horizontal(share, pl.lit(0)), left)
        shares.append(share.alias(part))
        left = left - share
    shares.append(left.alias("rest"))
    columns = [*parts, "rest"]
    out = collect(per_unit.select(shares).select([pl.col(p).sum() for p in columns]),
                  f"cannot read {name}").row(0, named=True)
    return {p: int(out[p] or 0) for p in columns}


def margin_text(moe95: float) -> str:
    """A share's margin in percent: ``±1.2%``."""
    return f"±{percent_text(moe95)}"


def percent_text(share: float) -> str:
    """A share in percent, two significant digits (at least one decimal below 10%)."""
    pct = 100 * share
    if pct == 0:
        return "0%"
    digits = max(0, 1 - math.floor(math.log10(abs(pct))))
    return f"{pct:.{digits}f}%"


__all__ = ["BIAS_SHARE", "RULE", "SCALE", "SHARES", "BiasReport", "bias_noise", "bias_parts", "can_report",
           "check_bias", "margin_text", "percent_text", "report_bias", "weight_cap"]
