"""Running a resolved query: the per-user stage, the contribution bound, the DP aggregation.

1. The relation (:mod:`dpcli.tasks.sql.compile`) with its group keys and aggregated values.
2. Per-user partial aggregation per partition (paper 002, "Per-user aggregation"): one row per
   (unit, partition) with each measurement's partial, clamped (:mod:`dpcli.tasks.sql.plan`).
3. At most K partitions per user, chosen by the keyed order of selection v3
   (:func:`dpcli.bounding.keyed_order.keep_first`, the same as ``histogram``'s).
4. Per partition, the sums of the partials and the count of users; then ``histogram``'s steps:
   a public list of groups or minimum-unit thresholding, exact noise, post-processing.

The noise streams are children of the release seed named by each measurement's key, so the
noise of one measurement does not depend on which others the query has or their order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from dpcli.bounding.keyed_order import keep_first
from dpcli.core.prf import KeyedStream
from dpcli.frames import collect
from dpcli.tasks import quantile_gaps, quantile_interval
from dpcli.tasks.sql import fixed
from dpcli.tasks.sql.compile import compile_relation, group_key_check, needed_columns
from dpcli.tasks.sql.ir import Expr, ResolvedQuery, expr_canonical
from dpcli.tasks.sql.plan import Measure, SqlPlan
from dpcli.tasks.sql.typed import Compiler, numeric_value_column, schema_of

#: The root label of a sql release's keyed streams (its children: ``bounding-salt`` and each measurement's key).
STREAM_LABEL = "sql"
UNITS = "units"


@dataclass(frozen=True)
class Layout:
    """The per-user frame's columns: the unit, the group keys, and each measurement's value and partial."""

    unit: str
    groups: tuple[str, ...]
    values: dict[str, str]  # measurement key → its value column
    partials: dict[str, str]  # measurement key → its partial column


def per_user_frame(query: ResolvedQuery, plan: SqlPlan, tables: Mapping[str, pl.LazyFrame],
                   group_names: tuple[str, ...]) -> tuple[pl.LazyFrame, Layout]:
    """Step 1: the relation as (unit, group keys, values), every column typed from the schema."""
    measures = [c.measure for c in plan.calibrated]
    extra = [*query.groups, *(m.value for m in measures if m.value is not None)]
    relation = compile_relation(query.relation, tables, needed_columns(query.relation, extra))
    compiler = Compiler(schema_of(relation))
    groups = tuple(f"__dp_g{i}" for i in range(len(query.groups)))
    selected = [pl.col(query.unit).alias("__dp_unit")]
    selected += [compiler.typed(g).expr.alias(n) for g, n in zip(query.groups, groups, strict=True)]
    values: dict[str, str] = {}
    columns: dict[str, pl.Expr] = {}
    for m in measures:
        if m.value is None:
            continue
        numeric = m.kind != "count"
        name = f"__dp_v{_value_id(m.value, numeric)}"
        typed = compiler.typed(m.value)
        columns[name] = numeric_value_column(typed) if numeric else typed.expr
        values[m.key] = name
    frame = relation.select([*selected, *(e.alias(n) for n, e in columns.items())])
    schema = schema_of(frame)
    group_key_check(schema, "__dp_unit", "the privacy unit")
    for g, name in zip(groups, group_names, strict=True):
        group_key_check(schema, g, f"GROUP BY key {name!r}")
    partials = {m.key: f"__dp_m{i}" for i, m in enumerate(measures) if m.kind != "units"}
    return frame, Layout("__dp_unit", groups, values, partials)


def _value_id(value: Expr, numeric: bool) -> str:
    """A short, stable column suffix for one value expression read one way."""
    text = json.dumps([expr_canonical(value), numeric], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# ---- step 2: per-user partials ----------------------------------------------------------------


#: A measurement's partial is computed in two steps: plain aggregates of the user's rows in the group-by
#: (count, exact integer sums of the values' fixed-point integers and of VAR's squares, nearest quantile: each
#: once, whatever shares it), then the clamps on those columns, one row per (user, partition), vectorised.
#: Nothing is added in floating point, so a partial does not depend on the order of the rows (:mod:`.fixed`).
Basics = dict[str, pl.Expr]


def row_columns(plan: SqlPlan, layout: Layout) -> dict[str, pl.Expr]:
    """Per-row columns the partials need besides the values: each SUM's, AVG's and VAR's fixed-point integer,
    and each VAR's squared distance to the centre from it, in 2^−2F grid units² (:mod:`.fixed`)."""
    out = {}
    for c in plan.calibrated:
        m = c.measure
        if m.kind in ("sum", "csum", "csq"):
            v = layout.values[m.key]
            r = fixed.row_units(pl.col(v), m.grid)
            out[fixed.fixed_column(v, m.grid)] = r
            if m.kind == "csq":
                out[fixed.square_column(v, m.grid)] = fixed.row_square(r, m.grid)
    return out


def basics(m: Measure, v: str | None) -> Basics:
    """The plain aggregates of one user's rows in one partition that measurement ``m``'s partial reads."""
    if m.kind == "rows":
        return {"__dp_len": pl.len().cast(pl.Int64)}
    assert v is not None
    found: Basics = {}
    if m.kind in ("count", "n", "csum", "csq") or (m.kind == "sum" and not _zero_inside(m)):
        found[f"__dp_cnt{v}"] = pl.col(v).count().cast(pl.Int64)
    if m.kind in ("sum", "csum"):
        r = fixed.fixed_column(v, m.grid)
        found[f"__dp_sum{r}"] = pl.col(r).cast(pl.Int128).sum()
    if m.kind == "csq":
        d = fixed.square_column(v, m.grid)
        found[f"__dp_sum{d}"] = pl.col(d).sum()
    if m.kind == "ntile":
        assert m.p is not None
        found[f"__dp_q{v}_{m.p}"] = pl.col(v).quantile(float(m.p), "nearest")
    return found


def partial_expr(m: Measure, v: str | None) -> pl.Expr:
    """The partial of one user in one partition for measurement ``m`` (see :mod:`.plan`), from its
    :func:`basics`: one row per (user, partition)."""
    if m.kind in ("rows", "count"):
        n = pl.col("__dp_len") if m.kind == "rows" else pl.col(f"__dp_cnt{v}")
        return n.clip(upper_bound=m.cap)
    if m.kind == "ntile":
        return _ntile(m, pl.col(f"__dp_q{v}_{m.p}"))
    assert v is not None
    count = pl.col(f"__dp_cnt{v}")
    if m.kind == "n":
        return (count > 0).cast(pl.Int64)
    g = m.grid
    if m.kind == "sum":
        # The user's exact sum clamped to [L, U] on the grid; no contribution (0) from a user without values: still
        # within the sensitivity max(|L|, |U|).
        total = pl.col(f"__dp_sum{fixed.fixed_column(v, m.grid)}").fill_null(0)
        units = fixed.round_div(total, fixed.int128(1 << fixed.FRACTION_BITS)).clip(g.lo_units, g.hi_units)
        if _zero_inside(m):  # a user without values sums to 0, which the clamp keeps: no count needed to say so
            return units.cast(pl.Int64)
        return pl.when(count > 0).then(units).otherwise(0).cast(pl.Int64)
    if m.kind == "csum":
        total = pl.col(f"__dp_sum{fixed.fixed_column(v, m.grid)}").fill_null(0)
        mean = fixed.round_div(total, fixed.scaled_count(count, fixed.FRACTION_BITS))
        units = mean.clip(g.lo_units, g.hi_units) - g.mid_units
    else:
        top = max(g.half_width_units, 1) ** 2
        total = pl.col(f"__dp_sum{fixed.square_column(v, m.grid)}").fill_null(0)
        units = fixed.round_div(total, fixed.scaled_count(count, 2 * fixed.FRACTION_BITS)).clip(0, top)
    return pl.when(count > 0).then(units).otherwise(0).cast(pl.Int64)


def _zero_inside(m: Measure) -> bool:
    """Whether a sum's clamp keeps 0 (L ≤ 0 ≤ U on the grid): then a user without values, whose sum is 0, gets the
    partial 0 from the clamp alone, and the sum needs no count of the user's values."""
    return m.grid.lo_units <= 0 <= m.grid.hi_units


def _valid(x: pl.Expr) -> pl.Expr:
    return x.is_not_null() & x.is_not_nan()


def _ntile(m: Measure, q: pl.Expr) -> pl.Expr:
    """The user's nearest p-quantile, clamped to [L, U], on the measurement's grid as its offset from L in grid
    units, in [0, hi − lo] (null: no value; the gap sampler's input, :mod:`dpcli.tasks.quantile_gaps`)."""
    assert m.bounds is not None
    g = m.grid
    lo, hi = float(m.bounds[0]), float(m.bounds[1])
    units = (q.clip(lo, hi) / float(g.granularity)).round(0) - g.lo_units
    offset = units.clip(0, g.hi_units - g.lo_units)
    return pl.when(_valid(q)).then(offset).otherwise(None).cast(pl.Int64, strict=False)


def bounded_partials(frame: pl.LazyFrame, layout: Layout, plan: SqlPlan, salt: int) -> pl.LazyFrame:
    """Steps 2 and 3: one row per (unit, partition) with every partial, at most K partitions per unit."""
    keys = [layout.unit, *layout.groups]
    measures = [c.measure for c in plan.calibrated if c.measure.key in layout.partials]
    aggs: Basics = {}
    for m in measures:
        aggs.update(basics(m, layout.values.get(m.key)))
    rows = row_columns(plan, layout)
    source = frame.with_columns(**rows) if rows else frame
    grouped = source.group_by(keys).agg(**aggs) if aggs else source.group_by(keys).agg(pl.len().alias("__dp_len"))
    partial = grouped.select(*keys, *[partial_expr(m, layout.values.get(m.key)).alias(layout.partials[m.key])
                                      for m in measures])
    if not layout.groups:
        return partial
    schema = schema_of(partial)
    return keep_first(partial, [layout.unit], [(c, schema[c]) for c in keys], salt, "groups", plan.max_partitions)


# ---- step 4: totals, selection, noise ---------------------------------------------------------


_WIDE = ("sum", "csum", "csq")


def totals_of(partial: pl.LazyFrame | pl.DataFrame, layout: Layout, plan: SqlPlan) -> Any:
    """Per partition: ``units`` and each measurement's total (Int128 for value sums: nothing wraps)."""
    aggs = [pl.len().cast(pl.Int64).alias(UNITS)]
    for c in plan.calibrated:
        m = c.measure
        if m.key in layout.partials and m.kind != "ntile":
            dtype = pl.Int128 if m.kind in _WIDE else pl.Int64
            aggs.append(pl.col(layout.partials[m.key]).cast(dtype).sum().alias(layout.partials[m.key]))
    if not layout.groups:
        return partial.select(aggs)
    return partial.group_by(list(layout.groups)).agg(aggs).sort(list(layout.groups), nulls_last=True)


def ntile_bins(partial: pl.DataFrame, layout: Layout, key: str) -> pl.DataFrame:
    """Per partition, how many users' partials fall in each bin of one NTILE."""
    column = layout.partials[key]
    kept = partial.filter(pl.col(column).is_not_null())
    return kept.group_by([*layout.groups, column]).agg(pl.len().alias("__dp_n"))


def compute_totals(frame: pl.LazyFrame, layout: Layout, plan: SqlPlan, salt: int, name: str
                   ) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
    """The bounded totals (and each NTILE's bins), collected once."""
    partial = bounded_partials(frame, layout, plan, salt)
    ntiles = [c.measure.key for c in plan.calibrated if c.measure.kind == "ntile"]
    if not ntiles:
        return collect(totals_of(partial, layout, plan), f"cannot read {name}"), {}
    collected = collect(partial, f"cannot read {name}")
    return totals_of(collected, layout, plan), {k: ntile_bins(collected, layout, k) for k in ntiles}


def select_partitions(totals: pl.DataFrame, layout: Layout, plan: SqlPlan, stream: KeyedStream,
                      keys: pl.DataFrame | None) -> tuple[pl.DataFrame, dict[str, np.ndarray]]:
    """The released partitions: the public list's (empty ones with zeros), or those whose noisy
    distinct-user count reaches the threshold; the noisy user counts drawn for the latter."""
    groups = list(layout.groups)
    if plan.domain == "keys":
        assert keys is not None
        joined = keys.join(totals, on=groups, how="left", nulls_equal=True)
        filled = joined.with_columns(pl.col(c).fill_null(0) for c in totals.columns if c not in groups)
        return filled.sort(groups, nulls_last=True), {}
    if plan.domain != "threshold":
        return totals, {}
    noise = plan.get(UNITS).noise
    assert noise is not None and plan.threshold is not None
    noisy = totals[UNITS].to_numpy() + noise.sample(stream.child(UNITS), totals.height)
    keep = noisy >= plan.threshold
    return totals.filter(pl.Series(keep)), {UNITS: noisy[keep]}


def add_noise(totals: pl.DataFrame, layout: Layout, plan: SqlPlan, stream: KeyedStream,
              noisy: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every measurement's noisy totals (exact integer arithmetic; value sums as floats afterwards)."""
    for c in plan.calibrated:
        key = c.measure.key
        if key in noisy or c.noise is None:
            continue
        column = UNITS if key == UNITS else layout.partials[key]
        draws = c.noise.sample(stream.child(key), totals.height)
        true = totals[column]
        if true.dtype == pl.Int128:
            exact = true + pl.Series(draws, dtype=pl.Int64).cast(pl.Int128)
            noisy[key] = exact.cast(pl.Float64).to_numpy()
        else:
            noisy[key] = true.cast(pl.Int64).to_numpy() + draws
    return noisy


def ntile_interval(m: Measure, c: Any, totals: pl.DataFrame, bins: pl.DataFrame, layout: Layout,
                   stream: KeyedStream) -> tuple[np.ndarray, np.ndarray]:
    """The 95% interval of every released partition's NTILE (``histogram``'s: a noisy count of the partials, then
    two exponential mechanisms at ranks from it alone; :mod:`dpcli.tasks.quantile_interval`)."""
    assert m.bounds is not None and m.p is not None and c.count is not None and c.end_rate is not None
    grid = m.grid
    group, offset, count = _ntile_counts(m, totals, bins, layout)
    exact = np.bincount(group, weights=count, minlength=totals.height).astype(np.int64)
    n_hat = exact + c.count.sample(stream.child("n"), totals.height)
    low, high = quantile_interval.interval_offsets(stream, group, offset, count, totals.height,
                                                   grid.hi_units - grid.lo_units, m.p, n_hat,
                                                   c.count.margin(quantile_interval.COUNT_ALPHA),
                                                   (c.end_rate, c.end_rate))
    lo, hi, g = float(m.bounds[0]), float(m.bounds[1]), float(grid.granularity)
    return (np.clip((grid.lo_units + low).astype(np.float64) * g, lo, hi),
            np.clip((grid.lo_units + high).astype(np.float64) * g, lo, hi))


def _ntile_counts(m: Measure, totals: pl.DataFrame, bins: pl.DataFrame, layout: Layout
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(partition index, grid offset, partials) of every (released partition, offset) with partials."""
    if layout.groups:
        index = totals.select(list(layout.groups)).with_row_index("__dp_i")
        joined = bins.join(index, on=list(layout.groups), how="inner", nulls_equal=True)
    else:
        joined = bins.with_columns(pl.lit(0, dtype=pl.UInt32).alias("__dp_i"))
    return (joined["__dp_i"].to_numpy().astype(np.int64), joined[layout.partials[m.key]].to_numpy().astype(np.int64),
            joined["__dp_n"].to_numpy().astype(np.int64))


def ntile_values(m: Measure, rate: Any, totals: pl.DataFrame, bins: pl.DataFrame, layout: Layout,
                 stream: KeyedStream) -> np.ndarray:
    """The exponential-mechanism quantile of every released partition over every point of the measurement's grid,
    by exact gap sampling (``histogram``'s quantile, one partial per user: :mod:`dpcli.tasks.quantile_gaps`)."""
    assert m.bounds is not None and m.p is not None
    grid = m.grid
    if layout.groups:
        index = totals.select(list(layout.groups)).with_row_index("__dp_i")
        joined = bins.join(index, on=list(layout.groups), how="inner", nulls_equal=True)
    else:
        joined = bins.with_columns(pl.lit(0, dtype=pl.UInt32).alias("__dp_i"))
    chosen = quantile_gaps.gap_quantiles(stream, joined["__dp_i"].to_numpy(), joined[layout.partials[m.key]].to_numpy(),
                                         joined["__dp_n"].to_numpy(), totals.height, grid.hi_units - grid.lo_units,
                                         m.p, rate)
    lo, hi = float(m.bounds[0]), float(m.bounds[1])
    return np.clip((grid.lo_units + chosen).astype(np.float64) * float(grid.granularity), lo, hi)
