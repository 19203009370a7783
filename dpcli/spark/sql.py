"""``dpcli sql --engine spark``: the per-user stage of a resolved query in Spark SQL.

The plan (:mod:`dpcli.tasks.sql.ir`) becomes Spark DataFrame operations with built-in functions
only, step for step as :mod:`dpcli.tasks.sql.compile` and :mod:`dpcli.tasks.sql.run` build it in
polars: the relation (scans, filters, projections, joins, per-user aggregations), each user's
partials per partition (the same clamps, ``bround`` as polars' half-to-even rounding, NTILE's
nearest value at index ⌊(n − 1)·p + ½⌋), at most K partitions per user by the keyed order of
:mod:`dpcli.spark.bounding`, and the totals per partition, returned through Arrow as the polars
tables :func:`dpcli.tasks.sql.run.compute_totals` returns. Sums, means and VAR's mean squares are
computed as polars computes them (:mod:`dpcli.tasks.sql.fixed`): each value's fixed-point integer
from the same IEEE-754 products and half-to-even rounding (``rint``), exact decimal(38,0) sums, and
an exact division rounded half to even, so the partials are polars', bit for bit, in any row order
and over any partitioning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.errors import DataError, UsageError
from dpcli.spark.bounding import _keep_first, order_key, read_input
from dpcli.spark.sql_exprs import Compiler, as_number, col, numeric_value_column
from dpcli.tasks.sql import fixed
from dpcli.tasks.sql.compile import needed_columns
from dpcli.tasks.sql.ir import AggCall, Aggregate, Col, Filter, Join, Project, Relation, Scan
from dpcli.tasks.sql.lengths import MAX_TEXT_LENGTH
from dpcli.tasks.sql.plan import Measure

if TYPE_CHECKING:
    from dpcli.io.tables import InputTable
    from dpcli.tasks.sql.plan import SqlPlan
    from dpcli.tasks.sql.run import Layout
    from dpcli.tasks.sql.task import SqlTask

_DEC = "decimal(38,0)"
_WIDE = ("sum", "csum", "csq")

#: (task, plan, layout, salt, the polars per-user frame's schema) → (totals, NTILE bins), as polars computes them.
SqlTotals = Callable[["SqlTask", "SqlPlan", "Layout", int, pl.Schema], tuple[pl.DataFrame, dict[str, pl.DataFrame]]]


def sql_engine(session: Any, data: Any, others: Mapping[str, tuple[list[str], InputTable]]) -> SqlTotals:
    """``sql``'s data pass on Spark: ``data`` is the data input's DataFrame; ``others`` each other input's
    Spark paths and opened table, by role (``table:NAME``), read when a query runs."""

    def run(task: SqlTask, plan: SqlPlan, layout: Layout, salt: int, schema: pl.Schema
            ) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
        frames = {name: data if role == "data" else _read(session, *others[role])
                  for name, role in task.roles().items()}
        frames = capped_tables(task, frames, salt)
        frame = per_user_frame(task, plan, layout, frames)
        partial = bounded_partials(frame, layout, plan, salt)
        return totals_of(partial, layout, plan, schema), ntile_bins(partial, layout, plan, schema)

    return run


def _read(session: Any, paths: list[str], table: InputTable) -> Any:
    if table.format not in ("csv", "parquet"):
        raise UsageError(f"--engine spark reads CSV or Parquet tables, not {table.format} ({table.name})")
    delimiter = table.reading.delimiter if table.reading is not None else None
    return read_input(session, paths, table.format, delimiter or ",")


def capped_tables(task: SqlTask, frames: Mapping[str, Any], salt: int) -> dict[str, Any]:
    """:meth:`dpcli.tasks.sql.task.SqlTask.capped_tables` in Spark SQL: the same rows kept, bit for bit (owned
    tables' units resolved first: :mod:`dpcli.spark.sql_owners`)."""
    from dpcli.spark.sql_owners import resolve
    from dpcli.tasks.sql.ir import scans_of

    columns, frames = task.table_columns(), resolve(task.table_map, frames)
    scanned, out = {s.table for s in scans_of(task.query.relation)}, dict(frames)
    for t in task.tables:
        if t.unit is None or t.name not in scanned:
            continue
        names = set(frames[t.name].columns)
        for c in columns[t.name]:
            if c not in names:
                raise DataError(f"column {c!r} not found in {t.name}")
        fields = [t.unit, *(c for c in columns[t.name] if c != t.unit)]
        out[t.name] = cap_rows(frames[t.name], t.unit, fields, salt, t.name, task.options.max_rows_per_table)
    return out


def cap_rows(sdf: Any, unit: str, fields: list[str], salt: int, table: str, cap: int) -> Any:
    """:func:`dpcli.bounding.keyed_order.cap_rows`: the words (a double's is Spark's ``xxhash64`` of it, −0.0
    and NaN made canonical first), the occurrence number among a unit's rows of equal words, the chain of
    ``xxhash64`` steps, and a rank by "max" (a count over a range frame) within each unit."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from dpcli.bounding import keyed_order
    from dpcli.spark.bounding import _word

    types = _schema(sdf)
    words = []
    hashed = [c for c in fields if isinstance(types[c], (T.StringType, T.ByteType, T.ShortType, T.IntegerType,
                                                         T.LongType, T.BooleanType, T.DateType, T.TimestampType,
                                                         T.TimestampNTZType, T.FloatType, T.DoubleType,
                                                         T.DecimalType))]
    for i, c in enumerate(hashed):
        if isinstance(types[c], T.DecimalType):  # the unscaled integer: its value within 64 bits, else XXH64 of it
            # the plain text without its point ("-0.05" → "-005"): no arithmetic that ANSI mode could refuse
            unscaled = F.regexp_replace(F.col(c).cast("string"), r"\.", "").try_cast("decimal(38,0)")
            def big(v: int) -> Any:
                return F.lit(str(v)).cast("decimal(38,0)")

            fits = (unscaled >= big(-(1 << 63))) & (unscaled <= big((1 << 63) - 1))
            high = (unscaled > big((1 << 63) - 1)) & (unscaled <= big((1 << 64) - 1))
            word = (F.when(F.col(c).isNull(), F.lit(keyed_order.signed(keyed_order.NULL_WORD)).cast("long"))
                    .when(fits, unscaled.cast("long"))
                    .when(high, (unscaled - big(1 << 64)).try_cast("long"))
                    .otherwise(F.xxhash64(unscaled.cast("string"))))
        elif isinstance(types[c], (T.FloatType, T.DoubleType)):
            x = F.col(c).cast("double")
            canonical = (F.when(x == F.lit(0.0), F.lit(0.0)).when(F.isnan(x), F.lit(float("nan")))
                         .otherwise(x))
            word = F.when(x.isNull(), F.lit(keyed_order.signed(keyed_order.NULL_WORD)).cast("long")
                          ).otherwise(F.xxhash64(canonical))
        else:
            word = _word(c, types[c])
        words.append((f"__dp_tw{i}", word))
    kept = sdf.withColumns(dict(words))
    names = [w for w, _ in words]
    occurrence = F.row_number().over(Window.partitionBy(*names).orderBy(*names)) - 1
    kept = kept.withColumn("__dp_tocc", occurrence.cast("long"))
    h = F.lit(keyed_order.signed(keyed_order.start_word(salt, keyed_order.table_purpose(table)))).cast("long")
    for w in [*names, "__dp_tocc"]:
        h = F.xxhash64(h.bitwiseXOR(F.col(w)))
    kept = kept.withColumn("__dp_torder", h)
    ordered = Window.partitionBy(unit).orderBy("__dp_torder")
    rank = F.count(F.lit(1)).over(ordered.rangeBetween(Window.unboundedPreceding, Window.currentRow))
    kept = kept.withColumn("__dp_trank", rank)
    return kept.filter(F.col("__dp_trank") <= cap).drop(*names, "__dp_tocc", "__dp_torder", "__dp_trank")


def _schema(sdf: Any) -> dict[str, Any]:
    return {f.name: f.dataType for f in sdf.schema.fields}


# ---- the relation -------------------------------------------------------------------------------


def relation(rel: Relation, frames: Mapping[str, Any], needed: Mapping[str, set[str]]) -> Any:
    """``rel`` as a Spark DataFrame (column names as polars', see :mod:`dpcli.tasks.sql.ir`)."""
    if isinstance(rel, Scan):
        return _scan(rel, frames[rel.table], sorted(needed.get(rel.prefix, ())))
    if isinstance(rel, Join):
        return _join(rel, relation(rel.left, frames, needed), relation(rel.right, frames, needed))
    frame = relation(rel.input, frames, needed)
    c = Compiler(_schema(frame))
    if isinstance(rel, Filter):
        return frame.filter(c.condition(rel.condition, "WHERE"))
    if isinstance(rel, Project):
        out = frame.select(*[c.typed(e).expr.alias(name) for name, e in rel.items])
        return out.dropDuplicates() if rel.distinct else out
    assert isinstance(rel, Aggregate)
    aggs = [_agg_call(c, call).alias(name) for name, call in rel.aggs]
    if not rel.keys:
        return frame.agg(*aggs)
    return frame.groupBy(*[c.typed(e).expr.alias(name) for name, e in rel.keys]).agg(*aggs)


def _scan(scan: Scan, frame: Any, columns: list[str]) -> Any:
    """:func:`dpcli.tasks.sql.compile._scan`: text cut to its first :data:`~dpcli.tasks.sql.lengths.MAX_TEXT_LENGTH`
    characters."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    types = _schema(frame)
    for c in columns:
        if c not in types:
            raise DataError(f"column {c!r} not found in {scan.table}")
    read = [F.substring(col(c), 1, MAX_TEXT_LENGTH) if isinstance(types[c], T.StringType) else col(c)
            for c in columns]
    out = frame.select(*[r.alias(f"{scan.prefix}.{c}") for r, c in zip(read, columns, strict=True)])
    return out.filter(col(scan.unit).isNotNull()) if scan.unit is not None else out


def _agg_call(c: Compiler, call: AggCall) -> Any:
    from pyspark.sql import functions as F

    if call.arg is None:
        return F.count(F.lit(1)).cast("bigint")
    arg = c.typed(call.arg)
    if call.function == "count":
        return F.count(arg.expr).cast("bigint")
    if call.function == "count_distinct":
        return F.count_distinct(arg.expr).cast("bigint")
    if call.function in ("min", "max"):
        return F.min(arg.expr) if call.function == "min" else F.max(arg.expr)
    number = as_number(arg)
    return F.try_sum(number) if call.function == "sum" else F.avg(number.try_cast("double"))


def key_pair(left: Any, ltype: Any, right: Any, rtype: Any) -> tuple[Any, Any]:
    """As :func:`dpcli.tasks.sql.compile.key_pair`."""
    from pyspark.sql import types as T

    integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    if ltype == rtype:
        return left, right
    if isinstance(ltype, integral) and isinstance(rtype, integral):
        return left.try_cast("bigint"), right.try_cast("bigint")
    if isinstance(ltype, T.NumericType) and isinstance(rtype, T.NumericType):
        return left.try_cast("double"), right.try_cast("double")
    return left.try_cast("string"), right.try_cast("string")


_HOW = {"inner": "inner", "left": "left", "right": "right", "full": "full_outer", "cross": "inner"}


def _join(rel: Join, left: Any, right: Any) -> Any:
    from pyspark.sql import functions as F

    lc, rc = Compiler(_schema(left)), Compiler(_schema(right))
    keys = [key_pair(lc.typed(a).expr, lc.typed(a).dtype, rc.typed(b).expr, rc.typed(b).dtype) for a, b in rel.on]
    if keys:
        condition = keys[0][0] == keys[0][1]
        for lk, rk in keys[1:]:
            condition = condition & (lk == rk)
        joined = left.join(right, on=condition, how=_HOW[rel.how])
    else:
        joined = left.crossJoin(right)
    for name, lcol, rcol in rel.merged:
        pair = next(((lk, rk) for (a, b), (lk, rk) in zip(rel.on, keys, strict=True)
                     if a == Col(lcol) and b == Col(rcol)), (col(lcol), col(rcol)))
        joined = joined.withColumn(name, F.coalesce(*pair))
    if rel.extra is not None:
        joined = joined.filter(Compiler(_schema(joined)).condition(rel.extra, "ON"))
    return joined.filter(col(rel.unit).isNotNull()) if rel.unit is not None else joined


# ---- the per-user stage -------------------------------------------------------------------------


def per_user_frame(task: SqlTask, plan: SqlPlan, layout: Layout, frames: Mapping[str, Any]) -> Any:
    """The relation as (unit, group keys, values), with the columns of ``layout`` (polars' names)."""
    query = task.query
    measures = [c.measure for c in plan.calibrated]
    extra = [*query.groups, *(m.value for m in measures if m.value is not None)]
    rel = relation(query.relation, frames, needed_columns(query.relation, extra))
    c = Compiler(_schema(rel))
    selected = [col(query.unit).alias(layout.unit)]
    selected += [c.typed(g).expr.alias(n) for g, n in zip(query.groups, layout.groups, strict=True)]
    values: dict[str, Any] = {}
    for m in measures:
        if m.value is not None and layout.values[m.key] not in values:
            typed = c.typed(m.value)
            values[layout.values[m.key]] = numeric_value_column(typed) if m.kind != "count" else typed.expr
    return rel.select(*selected, *[e.alias(n) for n, e in values.items()])


def row_columns(plan: SqlPlan, layout: Layout) -> dict[str, Any]:
    """As :func:`dpcli.tasks.sql.run.row_columns`: each value's fixed-point integer r (a long, from the same two
    products of doubles, clamped, and ``rint``: half to even) and each VAR's exact square (decimal(38,0))."""
    from pyspark.sql import functions as F

    out: dict[str, Any] = {}
    bound = float(fixed.ROW_BOUND)
    for c in plan.calibrated:
        m = c.measure
        if m.kind not in ("sum", "csum", "csq"):
            continue
        v = layout.values[m.key]
        s1, s2 = fixed.row_scales(m.grid)
        y = (col(v) * F.lit(s1)) * F.lit(s2)
        clamped = F.when(y > F.lit(bound), F.lit(bound)).when(y < F.lit(-bound), F.lit(-bound)).otherwise(y)
        r = F.rint(clamped).cast("bigint")
        out[fixed.fixed_column(v, m.grid)] = r
        if m.kind == "csq":
            limit = fixed.distance_bound(m.grid)
            d = r - F.lit(m.grid.mid_units << fixed.FRACTION_BITS).cast("bigint")
            d = F.when(d > F.lit(limit), F.lit(limit)).when(d < F.lit(-limit), F.lit(-limit)).otherwise(d)
            out[fixed.square_column(v, m.grid)] = d.cast(_DEC) * d.cast(_DEC)
    return out


def _dec(value: int) -> Any:
    from pyspark.sql import functions as F

    return F.lit(str(value)).cast(_DEC)


def _round_div(num: Any, den: Any) -> Any:
    """:func:`dpcli.tasks.sql.fixed.round_div` on decimal(38,0): num / den (den > 0) rounded half to even, a long."""
    from pyspark.sql import functions as F

    rem = F.pmod(num, den)  # in [0, den): num − rem is a multiple of den, its quotient exact
    # One person's exact total can pass 2^63 · den (more than 2^21 rows of r = ±2^62 after the joins): the quotient
    # is clamped to ±2^62 before the cast, which ANSI mode would refuse (a failure after the debit that only that
    # person's rows cause). Every caller clamps the result to its grid's ±2^31 range next, so nothing else changes.
    limit = _dec(fixed.ROW_BOUND)
    q = F.least(F.greatest((num - rem) / den, -limit), limit).cast("bigint")
    twice = rem * _dec(2)
    up = (twice > den) | ((twice == den) & (F.pmod(q, F.lit(2).cast("bigint")) == 1))
    return q + up.cast("bigint")


def _scaled_count(n: Any, bits: int) -> Any:
    from pyspark.sql import functions as F

    return F.greatest(n, F.lit(1)).cast(_DEC) * _dec(1 << bits)


def partial_expr(m: Measure, value: str | None) -> Any:
    """As :func:`dpcli.tasks.sql.run.partial_expr`, in Spark SQL: exact decimal(38,0) sums of the rows' fixed-point
    integers (:func:`row_columns`), the same partials as polars', bit for bit."""
    from pyspark.sql import functions as F

    v = col(value) if value is not None else F.lit(None)
    if m.kind in ("rows", "count"):
        n = F.count(F.lit(1)) if m.kind == "rows" else F.count(v)
        return F.least(n, F.lit(m.cap)).cast("bigint")
    if m.kind == "ntile":
        return _ntile(m, v)
    assert value is not None
    count = F.count(v)
    if m.kind == "n":
        return (count > 0).cast("bigint")
    g = m.grid
    if m.kind in ("sum", "csum"):
        total = F.coalesce(F.try_sum(col(fixed.fixed_column(value, m.grid)).cast(_DEC)), _dec(0))
        bits = fixed.FRACTION_BITS
        den = _dec(1 << bits) if m.kind == "sum" else _scaled_count(count, bits)
        units = _clamped_int(_round_div(total, den), g.lo_units, g.hi_units)
        if m.kind == "csum":
            units = units - F.lit(g.mid_units).cast("bigint")
    else:
        top = max(g.half_width_units, 1) ** 2
        total = F.coalesce(F.try_sum(col(fixed.square_column(value, m.grid))), _dec(0))
        units = _clamped_int(_round_div(total, _scaled_count(count, 2 * fixed.FRACTION_BITS)), 0, top)
    return F.when(count > 0, units).otherwise(0).cast("bigint")


def _clamped_int(x: Any, lo: int, hi: int) -> Any:
    from pyspark.sql import functions as F

    return F.least(F.greatest(x, F.lit(lo).cast("bigint")), F.lit(hi).cast("bigint"))


def _clamped(x: Any, lo: float, hi: float) -> Any:
    from pyspark.sql import functions as F

    return F.least(F.greatest(x, F.lit(float(lo))), F.lit(float(hi)))


def _ntile(m: Measure, v: Any) -> Any:
    """The user's nearest p-quantile (polars' ``quantile(p, "nearest")``), clamped, as its grid offset from L."""
    from pyspark.sql import functions as F

    assert m.bounds is not None and m.p is not None
    lo, hi = float(m.bounds[0]), float(m.bounds[1])
    values = F.sort_array(F.collect_list(v))
    n = F.size(values)
    index = (F.floor((n - 1).cast("double") * float(m.p) + 0.5) + 1).cast("int")
    q = F.try_element_at(values, index)
    g = m.grid
    units = F.bround(_clamped(q, lo, hi) / float(g.granularity), 0) - F.lit(float(g.lo_units))
    offset = _clamped(units, 0, g.hi_units - g.lo_units)
    return F.when((n > 0) & ~F.isnan(q), offset.cast("bigint"))


def bounded_partials(frame: Any, layout: Layout, plan: SqlPlan, salt: int) -> Any:
    """One row per (unit, partition) with every partial, at most K partitions per unit."""
    from pyspark.sql import functions as F

    keys = [layout.unit, *layout.groups]
    aggs = [partial_expr(c.measure, layout.values.get(c.measure.key)).alias(layout.partials[c.measure.key])
            for c in plan.calibrated if c.measure.key in layout.partials]
    rows = row_columns(plan, layout)
    source = frame.withColumns(rows) if rows else frame
    partial = source.groupBy(*[col(k) for k in keys]).agg(*(aggs or [F.count(F.lit(1)).alias("__dp_rows")]))
    if not layout.groups:
        return partial
    key = order_key(partial, keys, salt, "groups")
    return _keep_first(partial, keys[:1], key, plan.max_partitions, "groups")


def totals_of(partial: Any, layout: Layout, plan: SqlPlan, schema: pl.Schema) -> pl.DataFrame:
    """As :func:`dpcli.tasks.sql.run.totals_of`: the same columns and types, sorted the same."""
    from pyspark.sql import functions as F

    aggs = [F.count(F.lit(1)).cast("bigint").alias("units")]
    casts = [pl.col("units").cast(pl.Int64)]
    for c in plan.calibrated:
        m = c.measure
        if m.key in layout.partials and m.kind != "ntile":
            name = layout.partials[m.key]
            wide = m.kind in _WIDE
            aggs.append(F.coalesce(F.sum(col(name)), F.lit(0)).cast(_DEC if wide else "bigint").alias(name))
            casts.append(pl.col(name).cast(pl.Int128 if wide else pl.Int64))
    grouped = partial.groupBy(*[col(g) for g in layout.groups]).agg(*aggs) if layout.groups else partial.agg(*aggs)
    table = _to_polars(grouped).with_columns(*casts, *[pl.col(g).cast(schema[g]) for g in layout.groups])
    return table.sort(list(layout.groups), nulls_last=True) if layout.groups else table


def ntile_bins(partial: Any, layout: Layout, plan: SqlPlan, schema: pl.Schema) -> dict[str, pl.DataFrame]:
    """As :func:`dpcli.tasks.sql.run.ntile_bins`, for every NTILE of the plan."""
    from pyspark.sql import functions as F

    out = {}
    for c in plan.calibrated:
        if c.measure.kind != "ntile":
            continue
        name = layout.partials[c.measure.key]
        binned = (partial.filter(col(name).isNotNull()).groupBy(*[col(g) for g in layout.groups], col(name))
                  .agg(F.count(F.lit(1)).cast("bigint").alias("__dp_n")))
        out[c.measure.key] = _to_polars(binned).with_columns(
            pl.col(name).cast(pl.Int64), pl.col("__dp_n").cast(pl.Int64), *[pl.col(g).cast(schema[g])
                                                                            for g in layout.groups])
    return out


def _to_polars(sdf: Any) -> pl.DataFrame:
    table = pl.from_arrow(sdf.toArrow())
    assert isinstance(table, pl.DataFrame)
    return table
