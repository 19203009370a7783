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

What it releases: summed over units, each unit's *share* of its rows in each of the first four parts and
the rest of its share (1 less the four), in thousandths (rounded down, :data:`SCALE`), each with one noise.
A unit's five coordinates are non-negative and add up to exactly SCALE whatever it holds, so adding or
removing a unit moves the vector by exactly SCALE in ℓ1 (at most SCALE in ℓ2): independent discrete Laplace
(or Gaussian) noise on each coordinate at that sensitivity is ε-DP (ρ-zCDP) at the report's share, and the
number of units is the sum of the five, with no coordinate of its own. (Report 1 released the four shares
and the number of units: one unit moved them by up to 2·SCALE, twice the noise for the same precision.)
Shares of units, not counts of rows: a count of rows cut is unbounded per unit (a plane with 1,000
flights under a cap of 5 loses 995), so it would need its own cap; a share is at most 1 whatever a unit
holds. (Shares of rows with each unit's rows counted up to K·C were tried and left: where units hold far
fewer rows than K·C, as generous caps make them, the rows counted weigh a few units' worth and the margin
grows by K·C over the rows a unit holds; the review measured ±19% to ±12,000% where shares of units gave ±6%.)

What it reports (post-processing of the noisy sums): the average over units of each share, clipped to
[0, 1], with a 95% margin, and the noisy number of units. The average over units weighs every unit
alike; under caps, units with many rows lose the largest shares, so the share of all *rows* cut is
usually larger than the share reported. :mod:`dpcli.advice` turns the report into a note when the cut may
exceed a released count's or sum's margin.
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
#: Each unit's shares are counted in thousandths (rounded down): the report's resolution.
SCALE = 1000
#: The report's version, bound into every seed (:func:`dpcli.release.seeds.rule_versions`: its sums and noise shape
#: the output). Change it with the report. 1: the four shares and the number of units (ℓ1 sensitivity 2·SCALE);
#: 2: the four shares and the rest of each unit's share, whose sum is the number of units (ℓ1 sensitivity SCALE).
RULE = "unit shares 2"
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
    """The noisy average shares (by :data:`SHARES` name), the noisy number of units, the shares' 95% margin."""

    shares: dict[str, float]
    units: int
    moe95: float
    noise: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {**self.shares, "units": self.units, "moe95": self.moe95, "noise": self.noise}


def report_bias(frame: pl.LazyFrame, shape: DataShape, bounds: ChosenBounds, noise: mech.Noise,
                stream: KeyedStream, salt: int, name: str = "the input", rows: bool = True) -> BiasReport:
    """The report of ``bounds`` (in force) on ``frame`` (:func:`bias_parts`, ``rows`` as there): one pass, one
    collect; ``salt`` is the release's bounding salt (the groups K keeps are the release's own)."""
    parts = bias_parts(shape, bounds, rows)
    sums = _true_sums(frame, shape, bounds, parts, salt, name)
    noisy = {p: int(sums[p]) + int(noise.sample(stream.child(p), 1)[0]) for p in [*parts, "rest"]}
    margin = noise.margin95()
    units = sum(noisy.values())  # SCALE × the noisy number of units: every coordinate's noise in it
    # The shares' margin: a numerator's noise over the smallest unit count the denominator's noise plausibly allows
    # (a sum of n independent noises spreads about √n times one: a rough floor, never below one unit).
    floor = max(units - math.sqrt(len(noisy)) * margin, SCALE)
    shares = {SHARES[p]: round(min(max(noisy[p] / max(units, SCALE), 0.0), 1.0), 4) for p in parts}
    return BiasReport(shares, max(round(units / SCALE), 0), round(margin / floor, 4), noise.describe())


def _true_sums(frame: pl.LazyFrame, shape: DataShape, bounds: ChosenBounds, parts: list[str], salt: int,
               name: str) -> dict[str, int]:
    """The exact sums over units of each share (in thousandths, rounded down) and of the rest of each unit's
    (``rest``): each unit adds exactly SCALE in all."""
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
    # Each unit's shares in thousandths, rounded down, then each capped by what the ones before it left, and the
    # rest last: the unit's five are non-negative and add up to SCALE exactly, whatever the float rounding of the
    # ratios (the sensitivity).
    # (a column expression, one value per unit: a literal alone would select one row where no share is measured)
    left = pl.when(pl.col("total") > 0).then(pl.lit(SCALE, dtype=pl.Int64)).otherwise(pl.lit(0, dtype=pl.Int64))
    shares = []
    for part in parts:
        share = (pl.col(part).cast(pl.Float64) * SCALE / pl.col("total").cast(pl.Float64)).floor().cast(pl.Int64)
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
           "check_bias", "margin_text", "percent_text", "report_bias"]
