"""A histogram release computed: bounding, aggregation, group selection and the noise (:func:`run_histogram`),
and each released column with its 95% margin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from dpcli import bounding
from dpcli.core import intervals
from dpcli.core import mechanisms as mech
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.frames import collect
from dpcli.tasks import (
    quantile_gaps,
    quantile_interval,
)
from dpcli.tasks.histogram.plan import HistogramPlan
from dpcli.tasks.histogram.query import QUANTILE_OFFSET, HistogramQuery, parse_quantile, quantile_label
from dpcli.tasks.reports import HistogramReport

if TYPE_CHECKING:
    pass


@dataclass
class HistogramRelease:
    """The released table and what a reader needs to interpret it."""

    table: pl.DataFrame
    groups_released: int
    metadata: HistogramReport


# An algorithm kernel, kept whole (about 70 lines): bounding, selection and the noise draws happen
# in one visible order, and the keyed stream's children are taken in that order (reordering them
# would change every release).
def run_histogram(  # noqa: C901 (an algorithm kernel: see above)
    frame: pl.LazyFrame,
    q: HistogramQuery,
    plan: HistogramPlan,
    stream: KeyedStream,
    keys: pl.DataFrame | None = None,
    *,
    name: str = "the input",
    rows: int | None = None,
    engine: bounding.TotalsEngine | None = None,
    quantile_engine: Callable[[bounding.BoundingSpec, int], pl.DataFrame] | None = None,
) -> HistogramRelease:
    """Bound, aggregate, select and noise one histogram (the plan must come from the same query).

    ``frame`` is the input's lazy frame, ``name`` names it in error messages, and ``rows`` is its row
    count when known without a pass over the data (a large Parquet input is bounded in unit buckets).
    ``engine`` bounds on another engine (Spark) instead of polars, and ``quantile_engine`` counts the
    rows at each grid value there ((spec, salt) → the group columns, ``__x`` (offset from lo in grid units), ``__n``).
    """
    grid = q.grid
    spec = q.bounding_spec()
    salt = bounding_salt(stream)
    bins: list[pl.DataFrame] = []

    def quantile_bins(part: pl.LazyFrame, partial: pl.DataFrame) -> None:
        bins.append(_quantile_counts(part, name, q, spec, salt, partial))

    if engine is not None:
        if q.quantiles:
            if quantile_engine is None:
                raise UsageError("are computed by polars only on this engine", field="agg")
            bins.append(quantile_engine(spec, salt))
        totals = engine(spec, salt)
    else:
        totals = bounding.bounded_totals(frame, spec, salt, bounding.unit_buckets(rows),
                                         quantile_bins if q.quantiles else None, name=name)
    qhist = None
    if q.quantiles:
        qhist = pl.concat(bins).group_by([*q.by, QUANTILE_OFFSET]).agg(pl.col("__n").sum())

    if q.domain == "keys":
        assert keys is not None
        totals = keys.join(totals, on=list(q.by), how="left", nulls_equal=True).with_columns(
            pl.col(c).fill_null(0) for c in totals.columns if c not in q.by
        )
        totals = totals.sort(list(q.by), nulls_last=True)
    noisy: dict[str, np.ndarray] = {}
    meta: HistogramReport = {}
    if q.domain == "threshold":
        units_noise = plan.measurements["units"].noise
        assert units_noise is not None and plan.threshold is not None
        u = totals["units"].to_numpy() + units_noise.sample(stream.child("units"), totals.height)
        keep = u >= plan.threshold
        totals = totals.filter(pl.Series(keep))
        noisy["units"] = u[keep]
        meta["threshold"] = plan.threshold  # public: from the plan (no count of the groups seen)
    elif q.domain == "unklap":
        totals, noisy, bottom = _unklap(totals, q, plan, stream)
        meta["bottom"] = bottom  # v_⊥: the noisy threshold, part of UnkLap's output (Alg. 3)
    for name, mmt in plan.measurements.items():
        if name in noisy or mmt.noise is None or name.startswith("i"):  # an interval's count: drawn with it
            continue
        noisy[name] = _noisy(true_values(totals, name, grid), mmt.noise.sample(stream.child(name), totals.height))
    out = totals.select(list(q.by))
    margins: dict[str, str] = {}
    released = _Released(q, plan, noisy, _selection(q, plan, meta))
    for agg in q.aggregations:
        col, values, margin, how = _aggregate(agg, released, totals, qhist, stream)
        out = out.with_columns(pl.Series(col, values))
        if q.with_error:
            if margin is not None:
                out = out.with_columns(pl.Series(col + "_moe95", margin))
            margins[col] = how
    if q.domain == "unklap":
        out = out.with_columns(pl.Series("__order", -noisy[next(iter(plan.measurements))])).sort(
            ["__order", *q.by], nulls_last=True
        ).drop("__order")
    meta.update(
        {
            "measurements": {
                n: {"share": m.share, **(m.noise.describe() if m.noise else {"mechanism": "exponential"})}
                for n, m in plan.measurements.items()
            },
            "granularity": fraction_text(grid.granularity) if grid else None,
        }
    )
    if margins:
        meta["margins"] = margins
    return HistogramRelease(out, out.height, meta)


def bounding_salt(stream: KeyedStream) -> int:
    """The 128-bit secret salt of a histogram's keyed order (the release's and its bounds' choice)."""
    words = stream.child("bounding-salt").uint64(2)
    return int(words[0]) | (int(words[1]) << 64)


def true_values(totals: pl.DataFrame, name: str, grid: bounding.ValueGrid | None) -> pl.Series:
    """The exact integer aggregate noise is added to: Int64 for counts, Int128 for value sums (never wraps)."""
    if name in ("rows", "units"):
        return totals[name].cast(pl.Int64)
    if name in ("csum", "csumsq"):
        return totals[name].cast(pl.Int128)
    if name == "sum":
        assert grid is not None
        mid = pl.lit(grid.mid_units, dtype=pl.Int128)
        return totals.select(pl.col("csum").cast(pl.Int128) + pl.col("rows").cast(pl.Int128) * mid).to_series()
    raise KeyError(name)


def _noisy(true: pl.Series, noise: np.ndarray) -> np.ndarray:
    """``true + noise`` exactly (integers), then as int64 for counts or float64 for value sums.

    Value sums are Int128 (up to ~2^126): the exact noisy integer is rounded to
    a float afterwards, which is post-processing (they are scaled by the
    granularity into floats anyway).
    """
    if true.dtype == pl.Int64:
        counts: np.ndarray = true.to_numpy() + noise
        return counts
    exact = true + pl.Series(noise, dtype=pl.Int64).cast(pl.Int128)
    return exact.cast(pl.Float64).to_numpy()


def _unklap(
    totals: pl.DataFrame, q: HistogramQuery, plan: HistogramPlan, stream: KeyedStream
) -> tuple[pl.DataFrame, dict[str, np.ndarray], int]:
    """UnkLap (paper 000, Alg. 3): top-d̄ groups and a noisy ⊥ threshold."""
    name = next(iter(plan.measurements))
    mmt = plan.measurements[name]
    assert mmt.noise is not None and plan.unklap_offset is not None
    ranked = totals.sort([name, *q.by], descending=[True] + [False] * len(q.by), nulls_last=True)
    h = ranked[name].to_numpy().astype(np.int64)
    dbar = q.max_groups
    h_next = int(h[dbar]) if h.size > dbar else 0
    top = ranked.head(dbar)
    v = h[: top.height] + mmt.noise.sample(stream.child(name), top.height)
    bottom = h_next + plan.unklap_offset + int(mmt.noise.sample(stream.child("bottom"), 1)[0])
    keep = v > bottom
    return top.filter(pl.Series(keep)), {name: v[keep]}, bottom


def _quantile_counts(
    frame: pl.LazyFrame, name: str, q: HistogramQuery, spec: bounding.BoundingSpec, salt: int, partial: pl.DataFrame
) -> pl.DataFrame:
    """Per group, the count of bounded rows at each grid value, as ``__x``: its offset from lo in grid units,
    in [0, hi − lo] (the gap sampler's input: :mod:`dpcli.tasks.quantile_gaps`)."""
    grid = q.grid
    assert grid is not None
    rows = bounding.bounded_rows(frame, spec, salt)
    offsets = rows.join(
        partial.lazy().select([q.unit, *q.by]), on=[q.unit, *q.by], how="semi", nulls_equal=True
    ).select(
        [
            *[pl.col(c) for c in q.by],
            (pl.col(bounding.GRID) + grid.mid_units - grid.lo_units)
            .clip(0, grid.hi_units - grid.lo_units)
            .cast(pl.Int64)
            .alias(QUANTILE_OFFSET),
        ]
    )
    return collect(offsets.group_by([*q.by, QUANTILE_OFFSET]).agg(pl.len().cast(pl.Int64).alias("__n")),
                   f"cannot read {name}")


def _quantile_values(
    q: HistogramQuery,
    p: Fraction,
    rate: Fraction,
    totals: pl.DataFrame,
    qhist: pl.DataFrame,
    stream: KeyedStream,
) -> np.ndarray:
    """The exponential-mechanism quantile of every group in ``totals`` (in its order), over every grid point
    of [lo, hi] by exact gap sampling (:mod:`dpcli.tasks.quantile_gaps`)."""
    grid = q.grid
    assert grid is not None
    idx = totals.select(list(q.by)).with_row_index("__g")
    joined = qhist.join(idx, on=list(q.by), how="inner", nulls_equal=True)
    chosen = quantile_gaps.gap_quantiles(stream, joined["__g"].to_numpy(), joined[QUANTILE_OFFSET].to_numpy(),
                                         joined["__n"].to_numpy(), totals.height, grid.hi_units - grid.lo_units,
                                         p, rate)
    units = (grid.lo_units + chosen).astype(np.float64)
    return np.clip(units * float(grid.granularity), grid.lo, grid.hi)


@dataclass(frozen=True)
class _Selection:
    """The noisy measurement that decided which groups appear, and how: a group is released when its
    noisy value is at least ``threshold`` (thresholding: the unit count against τ; UnkLap: the count
    against the noisy ⊥ + 1, which is released and drawn independently of the group's own noise)."""

    measurement: str
    threshold: int


def _selection(q: HistogramQuery, plan: HistogramPlan, meta: Mapping[str, Any]) -> _Selection | None:
    """How groups were selected (None for ``--keys``: every listed group appears)."""
    if q.domain == "threshold":
        assert plan.threshold is not None
        return _Selection("units", plan.threshold)
    if q.domain == "unklap":
        return _Selection(next(iter(plan.measurements)), int(meta["bottom"]) + 1)
    return None


@dataclass(frozen=True)
class _Released:
    """What every aggregation and its margin is computed from: the query, its calibration, the noisy
    measurements of the released groups and how the groups were selected."""

    q: HistogramQuery
    plan: HistogramPlan
    noisy: dict[str, np.ndarray]
    selection: _Selection | None

    def noise(self, name: str) -> mech.Noise:
        noise = self.plan.measurements[name].noise
        assert noise is not None  # every measurement but a quantile's is a noisy count or sum
        return noise

    def noise_margin(self, name: str, scale: float | None = None) -> Any:
        """The 95% margin of a count or sum measurement: its noise's exact interval, or, for the
        measurement that selected the groups, the interval conditional on that selection (per group)."""
        if not self.q.with_error:
            return None
        noise, values = self.noise(name), self.noisy[name]
        if self.selection is not None and self.selection.measurement == name:
            lo, hi = intervals.selected_interval(noise, values, self.selection.threshold)
            return intervals.cover_margin(values, lo, hi).astype(np.int64)
        m = noise.margin95()
        return [m if scale is None else m * scale] * values.size


_EXACT = "exact 95% interval of the noise"


_SELECTED = ("95% interval conditional on the group passing its selection (the noise truncated at the threshold), "
             "as a margin around the released value")


def _aggregate(
    agg: str, released: _Released, totals: pl.DataFrame, qhist: pl.DataFrame | None, stream: KeyedStream
) -> tuple[str, Any, Any, str]:
    """(column name, values, 95% margins (None: no margin column), how the margin is meant)."""
    q, noisy = released.q, released.noisy
    if agg in ("count", "count-units"):
        name = "rows" if agg == "count" else "units"
        selected = released.selection is not None and released.selection.measurement == name
        return agg.replace("-", "_"), noisy[name], released.noise_margin(name), _SELECTED if selected else _EXACT
    grid = q.grid
    assert grid is not None and q.value is not None
    g = float(grid.granularity)
    v = q.value
    if agg == "sum":
        return f"sum_{v}", noisy["sum"] * g, released.noise_margin("sum", g), _EXACT
    if agg in ("mean", "variance"):
        return _mean_or_variance(agg, released, grid)
    p = parse_quantile(agg)
    assert p is not None and qhist is not None
    mmt = released.plan.measurements["q" + fraction_text(p)]
    assert mmt.em_rate is not None
    values = _quantile_values(q, p, mmt.em_rate, totals, qhist, stream.child(mmt.name))
    if q.with_error:  # the interval's releases are in the plan only with --with-error
        lo, hi = _quantile_interval(released, p, mmt.name, totals, qhist, stream)
        return f"{quantile_label(p)}_{v}", values, intervals.cover_margin(values, lo, hi), quantile_interval.describe()
    return f"{quantile_label(p)}_{v}", values, None, ""


def _quantile_interval(released: _Released, p: Fraction, name: str, totals: pl.DataFrame, qhist: pl.DataFrame,
                       stream: KeyedStream) -> tuple[np.ndarray, np.ndarray]:
    """The 95% interval of every group's bounded sample quantile, in the value's units: a noisy row count, then
    two exponential mechanisms at targets from it alone (:mod:`dpcli.tasks.quantile_interval`)."""
    q, plan = released.q, released.plan
    grid = q.grid
    assert grid is not None
    count = plan.measurements[f"i{name}:n"]
    ends = (plan.measurements[f"i{name}:lo"].em_rate, plan.measurements[f"i{name}:hi"].em_rate)
    assert count.noise is not None and ends[0] is not None and ends[1] is not None
    n_hat = totals["rows"].cast(pl.Int64).to_numpy() + count.noise.sample(stream.child(count.name), totals.height)
    idx = totals.select(list(q.by)).with_row_index("__g")
    joined = qhist.join(idx, on=list(q.by), how="inner", nulls_equal=True)
    low, high = quantile_interval.interval_offsets(
        stream.child(f"i{name}"), joined["__g"].to_numpy(), joined[QUANTILE_OFFSET].to_numpy(),
        joined["__n"].to_numpy(), totals.height, grid.hi_units - grid.lo_units, p, n_hat,
        count.noise.margin(quantile_interval.COUNT_ALPHA), (ends[0], ends[1]))
    scale = float(grid.granularity)
    return (np.clip((grid.lo_units + low).astype(np.float64) * scale, grid.lo, grid.hi),
            np.clip((grid.lo_units + high).astype(np.float64) * scale, grid.lo, grid.hi))


def _mean_or_variance(agg: str, released: _Released, grid: bounding.ValueGrid) -> tuple[str, np.ndarray, Any, str]:
    """The mean or the variance of every group, post-processed from the noisy count and centred sums
    (clamped to what the bounds allow), and with ``--with-error`` its conservative 95% margin."""
    noisy, v = released.noisy, released.q.value
    g = float(grid.granularity)
    n = np.maximum(noisy["rows"], 1).astype(np.float64)
    mean_c = noisy["csum"] / n
    if agg == "mean":
        values = np.clip((grid.mid_units + mean_c) * g, grid.lo, grid.hi)
        return f"mean_{v}", values, _ratio_margin(agg, released, grid, values), _MEAN_HOW
    var_units = np.clip(noisy["csumsq"] / n - mean_c * mean_c, 0.0, float(grid.half_width_units) ** 2)
    values = var_units * g * g
    return f"variance_{v}", values, _ratio_margin(agg, released, grid, values), _VARIANCE_HOW


_MEAN_HOW = ("conservative 95%: the noisy count's and centred sum's own 97.5% intervals (union bound), "
             "through the ratio and the bounds, as a margin around the released value")


_VARIANCE_HOW = ("conservative 95%: the noisy count's, centred sum's and sum of squares' own 98.33% intervals "
                 "(union bound), through the ratios and the bounds, as a margin around the released value")


def _ratio_margin(agg: str, released: _Released, grid: bounding.ValueGrid, values: np.ndarray) -> np.ndarray | None:
    """The 95% margin of released means or variances (None without ``--with-error``): a union bound
    over the intervals of the measurements they are ratios of (:mod:`dpcli.core.intervals`)."""
    if not released.q.with_error:
        return None
    noisy, g = released.noisy, float(grid.granularity)
    lo_c, hi_c = float(grid.lo_units - grid.mid_units), float(grid.hi_units - grid.mid_units)
    if agg == "mean":
        alpha = intervals.ALPHA / 2
        a, b = intervals.mean_interval(noisy["rows"], noisy["csum"], released.noise("rows").margin(alpha),
                                       released.noise("csum").margin(alpha), lo_c, hi_c)
        lo, hi = (grid.mid_units + a) * g, (grid.mid_units + b) * g
    else:
        alpha = intervals.ALPHA / 3
        margins = tuple(float(released.noise(n).margin(alpha)) for n in ("rows", "csum", "csumsq"))
        a, b = intervals.variance_interval(noisy["rows"], noisy["csum"], noisy["csumsq"],
                                           (margins[0], margins[1], margins[2]), lo_c, hi_c)
        lo, hi = a * g * g, b * g * g
    return intervals.cover_margin(values, lo, hi)
