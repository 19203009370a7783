"""Contribution bounding and group totals in Spark SQL, equal to :func:`dpcli.bounding.bounded_totals`.

Every step mirrors the polars one, value for value:

* values: text is parsed by the grammar :data:`dpcli.bounding.NUMBER` (else null), NaN is
  null, and grid units are ``bround(x / g)`` (half to even, as polars rounds) clamped to the
  grid's integers; rows with a null unit or value are dropped;
* at most C rows per (unit, group) and K groups per unit, chosen by the keyed order of
  :mod:`dpcli.bounding.keyed_order` (a chain of Spark's own ``xxhash64`` over the same 64-bit
  words, nulls given their word explicitly; a row's occurrence number among its identical records
  as its last word; equal keys ranked as on polars);
* sums in ``decimal(38, 0)`` (no wrap-around), returned through Arrow as polars Int128.

Only built-in Spark SQL runs on the executors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from dpcli import bounding
from dpcli.bounding import keyed_order
from dpcli.errors import DataError, UsageError, type_text

_DEC = "decimal(38,0)"
_NULL_SENTINEL = "\u0000dpcli: no field is this\u0000"


def read_input(spark: Any, paths: str | list[str], fmt: str, delimiter: str = ",") -> Any:
    """The input (one file, or a dataset's files) as a Spark DataFrame: CSV with a header and every
    column as text (as polars reads the columns a query names), or Parquet with its declared types.

    CSV is read as RFC 4180 (and polars) has it: a quote inside a quoted field is doubled, and a
    quoted field may hold line breaks (``multiLine``: one task per file, the price of not
    splitting a record in two, which could credit one person's text to another unit); fields keep
    their white space, and an unquoted empty field is null while a quoted one is empty text (Spark
    reads both as null when its ``nullValue`` is empty, so that is set to :data:`_NULL_SENTINEL`,
    a text no real field holds, and Univocity then gives an unquoted empty field as null).
    """
    paths = [paths] if isinstance(paths, str) else paths
    if fmt == "csv":
        return (spark.read.option("header", True).option("sep", delimiter).option("inferSchema", False)
                .option("quote", '"').option("escape", '"').option("multiLine", True)
                .option("nullValue", _NULL_SENTINEL)
                .option("mode", "PERMISSIVE").option("encoding", "UTF-8").csv(paths))
    if fmt == "parquet":
        return spark.read.parquet(*paths)
    raise UsageError(f"--engine spark reads CSV or Parquet, not {fmt}")


def numeric_text(text: Any) -> Any:
    """:func:`dpcli.bounding.numeric_value` for text in Spark SQL: the same grammar, the same values.

    ``try_cast``: a cast never raises inside a Spark job (an exception's text can quote the record).
    """
    from pyspark.sql import functions as F

    t = F.regexp_replace(text, bounding.TRIM, "")
    lower = F.lower(t)
    return (F.when(t.rlike(bounding.NUMBER), t.try_cast("double"))
            .when(lower.isin(*bounding.POSITIVE_INFINITY), F.lit(float("inf")))
            .when(lower.isin(*bounding.NEGATIVE_INFINITY), F.lit(float("-inf")))
            .otherwise(F.lit(None).cast("double")))


def _word(name: str, dtype: Any) -> Any:
    """:func:`dpcli.bounding.keyed_order.field_word` in Spark SQL (a ``bigint``: the word's bits)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    c = F.col(name)
    if isinstance(dtype, T.StringType):
        word = F.xxhash64(c)  # XXH64 of the UTF-8 bytes with seed 42, as polars-hash's xxhash64(seed=42)
    elif isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType)):
        word = c.cast("long")
    elif isinstance(dtype, T.DateType):
        word = F.datediff(c, F.lit("1970-01-01").cast("date")).cast("long")
    elif isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        word = F.unix_micros(c.cast("timestamp"))
    else:
        raise DataError(f"column {name!r} has type {type_text(dtype)}: a privacy-unit or group column must hold "
                        "text, integers, booleans, dates or times (cast it), so that rows can be sampled the same "
                        "on every engine")
    return F.when(c.isNull(), F.lit(keyed_order.signed(keyed_order.NULL_WORD)).cast("long")).otherwise(word)


def order_key(sdf: Any, columns: list[str], salt: int, purpose: str, extra: Sequence[tuple[str, str]] = ()) -> Any:
    """The order key of :mod:`dpcli.bounding.keyed_order` over ``columns`` (+ ``extra`` integer columns):
    each step is Spark's own ``xxhash64`` of a ``bigint`` (no 64-bit arithmetic in SQL, which ANSI
    mode would refuse to wrap)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    types = {f.name: f.dataType for f in sdf.schema.fields}
    words = [_word(c, types[c]) for c in columns] + [_word(c, T.LongType()) for c, _ in extra]
    h = F.lit(keyed_order.signed(keyed_order.start_word(salt, purpose))).cast("long")
    for word in words:
        h = F.xxhash64(h.bitwiseXOR(word))
    return h


def _keep_first(sdf: Any, over: list[str], key: Any, cap: int, purpose: str) -> Any:
    """:func:`dpcli.bounding.keyed_order.keep_first`: equal keys ranked as ``keyed_order.TIES`` says,
    by ``row_number`` or by a count over a range frame, which counts every row whose key is ≤ this
    one, tied rows included (a rank by "max")."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ordered = Window.partitionBy(*over).orderBy(key)
    if keyed_order.TIES[purpose] == "max":
        rank = F.count(F.lit(1)).over(ordered.rangeBetween(Window.unboundedPreceding, Window.currentRow))
    else:
        rank = F.row_number().over(ordered)
    return sdf.withColumn("__dp_rank", rank).filter(F.col("__dp_rank") <= cap).drop("__dp_rank")


_OCC = "__dp_occ"


def with_occurrence(sdf: Any, record: list[str], name: str) -> Any:
    """``sdf`` with each row's occurrence number (0, 1, …) among the rows equal on ``record`` (a ``bigint``
    column ``name``), as :func:`dpcli.bounding.keyed_order.keep_first` numbers them for purpose ``rows``.

    ``row_number`` over the partition of identical records, ordered by those same columns: within the
    partition every row ties on the order, so Spark may number them in any order, and that does not
    matter. The partition holding a record m times gets the numbers 0 … m − 1 however they are dealt,
    and the rows that receive them are identical, so the keys, the rows kept and every total are the
    same for every order (and equal to polars', which deals them in file order).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    same = Window.partitionBy(*record).orderBy(*record)
    return sdf.withColumn(name, (F.row_number().over(same) - 1).cast("long"))


def _bounded(sdf: Any, spec: bounding.BoundingSpec, salt: int) -> tuple[Any, Any, list[Any]]:
    """The bounded rows (grid values, at most C per (unit, group)) and the per-(unit, group) partials
    after the group cap, as :func:`dpcli.bounding.bounded_rows` and :func:`~dpcli.bounding.bound_contributions`."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    keys = [spec.unit, *spec.by]
    types = {f.name: f.dataType for f in sdf.schema.fields}
    cols = list(dict.fromkeys(keys + ([spec.value] if spec.value else [])))
    rows = sdf.select(*cols)
    aggs = [F.count(F.lit(1)).alias(bounding.N_ROWS)]
    if spec.value is not None and spec.grid is not None:
        g = spec.grid
        v = F.col(spec.value)
        if isinstance(types[spec.value], T.StringType):
            x = numeric_text(v)
        elif isinstance(types[spec.value], T.NumericType):
            x = v.cast("double")
        else:
            raise DataError(f"a value column must be numeric (or text holding numbers), not {types[spec.value]}")
        units = F.least(F.greatest(F.bround(x / F.lit(float(g.granularity)), 0), F.lit(float(g.lo_units))),
                        F.lit(float(g.hi_units)))
        grid = F.when(x.isNull() | F.isnan(x), F.lit(None)).otherwise(units.cast("long") - F.lit(g.mid_units))
        rows = rows.withColumn(bounding.GRID, grid)
        rows = rows.filter(F.col(bounding.GRID).isNotNull() & F.col(spec.unit).isNotNull())
        rows = with_occurrence(rows, [*keys, bounding.GRID], _OCC)
        key = order_key(rows, keys, salt, "rows", [(bounding.GRID, "long"), (_OCC, "long")])
        rows = _keep_first(rows, keys, key, spec.max_contributions, "rows").drop(_OCC)
        gv = F.col(bounding.GRID).cast(_DEC)
        aggs += [F.sum(gv).alias(bounding.C_SUM), F.sum(gv * gv).cast(_DEC).alias(bounding.C_SUMSQ)]
    partial = rows.groupBy(*keys).agg(*aggs).filter(F.col(spec.unit).isNotNull())
    partial = partial.withColumn(bounding.N_ROWS, F.least(F.col(bounding.N_ROWS), F.lit(spec.max_contributions)))
    if spec.max_partitions is not None:
        partial = _keep_first(partial, [spec.unit], order_key(partial, keys, salt, "groups"), spec.max_partitions,
                              "groups")
    return rows, partial, keys


def bounded_totals(sdf: Any, spec: bounding.BoundingSpec, salt: int) -> pl.DataFrame:
    """:func:`dpcli.bounding.bounded_totals` of a Spark DataFrame: the same table, computed on Spark."""
    from pyspark.sql import functions as F

    _, partial, _ = _bounded(sdf, spec, salt)
    totals = [F.count(F.lit(1)).cast("long").alias("units"), F.sum(bounding.N_ROWS).cast("long").alias("rows")]
    if spec.value is not None:
        totals += [F.sum(bounding.C_SUM).cast(_DEC).alias("csum"), F.sum(bounding.C_SUMSQ).cast(_DEC).alias("csumsq")]
    table = pl.from_arrow(partial.groupBy(*spec.by).agg(*totals).toArrow())
    assert isinstance(table, pl.DataFrame)
    casts = [pl.col("units").cast(pl.Int64), pl.col("rows").cast(pl.Int64)]
    if spec.value is not None:
        casts += [pl.col("csum").cast(pl.Int128), pl.col("csumsq").cast(pl.Int128)]
    return table.with_columns(casts).sort(list(spec.by), nulls_last=True)


def quantile_counts(sdf: Any, spec: bounding.BoundingSpec, salt: int) -> pl.DataFrame:
    """Per group, the bounded rows of the kept (unit, group) pairs at each grid value (columns: the group columns,
    ``__x``: the value's offset from lo in grid units, clamped to [0, hi − lo], and ``__n``), as the histogram's
    polars quantile pass (the gap sampler's input)."""
    from pyspark.sql import functions as F

    assert spec.grid is not None
    g = spec.grid
    rows, partial, keys = _bounded(sdf, spec, salt)
    top = g.hi_units - g.lo_units
    x = F.least(F.greatest(F.col(bounding.GRID) + F.lit(g.mid_units - g.lo_units), F.lit(0)), F.lit(top))
    kept = partial.select(*[F.col(k).alias(f"__kept{i}") for i, k in enumerate(keys)])  # no self-join ambiguity
    on = [F.col(k).eqNullSafe(F.col(f"__kept{i}")) for i, k in enumerate(keys)]
    offsets = rows.join(kept, on=on, how="left_semi").select(*spec.by, x.cast("long").alias("__x"))
    table = pl.from_arrow(offsets.groupBy(*spec.by, "__x").agg(F.count(F.lit(1)).cast("long").alias("__n")).toArrow())
    assert isinstance(table, pl.DataFrame)
    return table.with_columns(pl.col("__x").cast(pl.Int64), pl.col("__n").cast(pl.Int64))
