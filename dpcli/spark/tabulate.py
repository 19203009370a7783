"""``tabulate``'s bounded counts in Spark SQL, equal to :func:`dpcli.tasks.tabulate.level_counts`.

Each step mirrors the polars one, value for value:

* codes (ethnicity, age, race entries): integers as they are; text stripped of Unicode white
  space (the set polars' ``strip_chars`` strips) and parsed only if it is ``[+-]?[0-9]+`` and
  fits 64 bits, else null (Spark's own cast also strips control characters);
* race text: ``[a, b]`` (an NDJSON list read as text, quotes dropped) split on commas, anything
  else on ``;``; block and sex as text (float columns are refused: engines render them differently);
* the records the tabulation keeps (:func:`dpcli.tasks.tabulate._usable`), an inner join with the
  public block list, the iterations each record matches in the spec's order, the first s kept
  (the level's stability), then a count per (geography, iteration, sex, age bins).

Only built-in Spark SQL runs on the executors (higher-order ``exists``/``forall``/``filter`` are
SQL lambdas, not Python); the counts return through Arrow.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from dpcli.errors import DataError, type_text
from dpcli.tasks.tabulate import COUNT_SCHEMA, LevelCounts
from dpcli.tasks.tabulate.query import Iteration, Level, Spec

#: Unicode White_Space, as Rust's ``char::is_whitespace`` (polars' ``strip_chars``) has it.
_WHITE = "[\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]"
_STRIP = f"\\A{_WHITE}+|{_WHITE}+\\z"
_INTEGER = "\\A[+-]?[0-9]+\\z"


def _strip(text: Any) -> Any:
    from pyspark.sql import functions as F

    return F.regexp_replace(text, _STRIP, "")


def _code_of_text(text: Any) -> Any:
    from pyspark.sql import functions as F

    t = _strip(text)
    return F.when(t.rlike(_INTEGER), t.try_cast("bigint")).otherwise(F.lit(None).cast("bigint"))


def _codes(column: Any, dtype: Any) -> Any:
    from pyspark.sql import types as T

    if isinstance(dtype, T.StringType):
        return _code_of_text(column)
    return column.try_cast("bigint")


def _text(name: str, dtype: Any) -> Any:
    """A block or sex column as text, as polars casts it."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, (T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType,
                          T.DateType)):
        return F.col(name).cast("string")
    raise DataError(f"column {name!r} has type {type_text(dtype)}: on --engine spark, block and sex columns "
                    "must hold text, integers, booleans or dates (cast it)")


def _race(name: str, dtype: Any) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    c = F.col(name)
    if isinstance(dtype, T.StringType):
        text = _strip(c)
        listed = text.startswith("[") & text.endswith("]")
        items = F.regexp_replace(F.substring(text, F.lit(2), F.length(text) - 2), '"', "")
        parts = F.when(listed, F.split(items, ",")).otherwise(F.split(text, ";"))
        return F.transform(parts, _code_of_text)
    if isinstance(dtype, T.ArrayType):
        inner = dtype.elementType
        return F.transform(c, lambda x: _codes(x, inner))
    return F.array(c.try_cast("bigint"))


def _in_ranges(x: Any, ranges: tuple[tuple[int, int], ...]) -> Any:
    from pyspark.sql import functions as F

    cond = F.lit(False)
    for lo, hi in ranges:
        cond = cond | x.between(lo, hi)
    return cond


def _membership(it: Iteration) -> Any:
    from pyspark.sql import functions as F

    if it.kind == "ethnicity":
        return _in_ranges(F.col("__eth"), it.ranges)
    if it.alone:
        return F.forall("__race", lambda x: _in_ranges(x, it.ranges))
    return F.exists("__race", lambda x: _in_ranges(x, it.ranges))


def _age_bin(edges: tuple[int, ...]) -> Any:
    from pyspark.sql import functions as F

    idx = F.lit(0).cast("bigint")
    for j, e in enumerate(edges[1:], start=1):
        idx = F.when(F.col("__age") >= e, F.lit(j).cast("bigint")).otherwise(idx)
    return idx


def level_counts(sdf: Any, session: Any) -> Any:
    """A :data:`dpcli.tasks.tabulate.CountsEngine` over the Spark DataFrame ``sdf`` (the person records)."""

    def engine(spec: Spec, blocks: pl.DataFrame) -> LevelCounts:
        return _counts(sdf, session, spec, blocks)

    return engine


def _counts(sdf: Any, session: Any, spec: Spec, blocks: pl.DataFrame) -> LevelCounts:
    from pyspark.sql import functions as F

    c = spec.columns
    types = {f.name: f.dataType for f in sdf.schema.fields}
    persons = sdf.select(
        _text(c["block"], types[c["block"]]).alias("__block"),
        _race(c["race"], types[c["race"]]).alias("__race"),
        _codes(F.col(c["ethnicity"]), types[c["ethnicity"]]).alias("__eth"),
        _text(c["sex"], types[c["sex"]]).alias("__sex"),
        _codes(F.col(c["age"]), types[c["age"]]).alias("__age"),
    )
    usable = (F.col("__block").isNotNull() & F.col("__race").isNotNull() & F.col("__eth").isNotNull()
              & F.col("__sex").isNotNull() & F.col("__age").isNotNull() & (F.size("__race") > 0)
              & ~F.exists("__race", lambda x: x.isNull()) & F.col("__sex").isin(*spec.sexes) & (F.col("__age") >= 0))
    areas = sorted({g.column for g in spec.geo_levels.values() if g.column})
    public = session.createDataFrame(
        blocks.select([pl.col("block").alias("__block"), *[pl.col(a).alias(f"__area_{a}") for a in areas]]).to_arrow())
    persons = persons.filter(usable).join(public, on="__block", how="inner")
    persons = persons.select(
        "__block", "__sex", *[f"__area_{a}" for a in areas],
        *[_age_bin(edges).alias(f"__a{i}") for i, edges in enumerate(spec.age_bins)],
        *[F.filter(F.array(*[F.when(_membership(it), F.lit(it.code)) for it in its]), lambda x: x.isNotNull())
          .alias(f"__its_{name}") for name, its in spec.iterations.items()],
    )

    def one_level(level: Level) -> pl.DataFrame:
        geo = spec.geo_levels[level.geography]
        if geo.prefix == 0:
            geo_id = F.lit("ALL")
        elif geo.prefix is not None:
            geo_id = F.substring("__block", 1, geo.prefix)
        else:
            area = F.col(f"__area_{geo.column}")
            geo_id = F.when(area == "", F.lit(None)).otherwise(area)
        # The level's stability: each record keeps its first s iterations (the spec's order).
        rows = (persons.select(geo_id.alias("geo_id"), "__sex", "__a0", "__a1", "__a2",
                               F.slice(f"__its_{level.iterations}", 1, level.stability).alias("__its"))
                .filter(F.col("geo_id").isNotNull())
                .select("geo_id", F.explode("__its").alias("iteration"), "__sex", "__a0", "__a1", "__a2"))
        table = pl.from_arrow(rows.groupBy("geo_id", "iteration", "__sex", "__a0", "__a1", "__a2")
                              .agg(F.count(F.lit(1)).cast("long").alias("n")).toArrow())
        assert isinstance(table, pl.DataFrame)
        return table.select([pl.col(col).cast(dtype) for col, dtype in COUNT_SCHEMA.items()])

    done: dict[int, pl.DataFrame] = {}

    def counts(level: Level) -> pl.DataFrame:
        # Every level on the first call, over the records parsed and matched once (kept by Spark, on
        # disk if they do not fit in memory), then released.
        if not done:
            from pyspark import StorageLevel

            persons.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                done.update({lv.index: one_level(lv) for lv in spec.levels})
            finally:
                persons.unpersist()
        return done[level.index]

    return counts
