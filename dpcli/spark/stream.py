"""``stream-replay``'s bounded events in Spark SQL, equal to :func:`dpcli.tasks.stream.events.prepare_events`.

Spark does the pass over every record (times, the per-record drops, each unit's first C records
in time order); the bounded events, at most C per unit, return through Arrow and the DP-SQLP
algorithm runs on the driver, as for polars. Each step mirrors the polars one:

* times: timestamps as epoch seconds (floored), dates at midnight UTC, numbers as epoch seconds
  (floored, finite and within ±10^12); a record whose window does not lie within 0001-01-01 …
  9999-12-31 is dropped. Text times are refused on Spark (a schema error, before any data is
  read): polars parses them with its own layouts, which Spark's parsers do not reproduce value
  for value, so give a timestamp column (Parquet) or use ``--engine polars``;
* units: null and NaN units are dropped (Spark has no dates outside 0001 … 9999, no ns times);
* values: the grammar :data:`dpcli.bounding.NUMBER` for text, ``bround`` (half to even, as
  polars rounds) to grid units, clamped; non-finite values are dropped;
* the cap: a window ``row_number`` per unit over (time, unit, keys, value), nulls last, minus
  the records the unit used in earlier runs of a persisted stream.

Floor divisions are written with ``pmod`` on integers (Spark's ``/`` is a float division).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.errors import DataError, type_text
from dpcli.tasks.stream.query import MAX_SECONDS, MIN_SECONDS, StreamQuery

if TYPE_CHECKING:
    from polars.datatypes import DataTypeClass

    from dpcli.bounding import ValueGrid


def _floor_div(x: Any, d: int) -> Any:
    """⌊x / d⌋ for an integer column below 2^53 in magnitude (epoch seconds) and a positive integer ``d``
    (``x − (x mod d)`` is a multiple of ``d``, so the float division is exact)."""
    from pyspark.sql import functions as F

    return ((x - F.pmod(x, F.lit(d))) / F.lit(d)).cast("bigint")


def time_seconds(name: str, dtype: Any) -> Any:
    """The time column as integer epoch seconds (:func:`dpcli.tasks.stream.events.event_seconds`'s rules)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    t = F.col(name)
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        return F.unix_seconds(t.cast("timestamp"))  # floored, as polars' epoch("s")
    if isinstance(dtype, T.DateType):
        return F.datediff(t, F.lit("1970-01-01").cast("date")).cast("bigint") * F.lit(86400)
    if isinstance(dtype, T.NumericType):
        x = t.cast("double")
        ok = ~F.isnan(x) & (F.abs(x) <= F.lit(1e12))
        return F.when(ok, F.floor(x).cast("bigint"))
    if isinstance(dtype, T.StringType):
        raise DataError(f"column {name!r} holds text: on --engine spark the time column must hold timestamps, dates "
                        "or epoch seconds (Parquet keeps them typed); text times are parsed by --engine polars")
    raise DataError(f"column {name!r} must hold timestamps, but is {type_text(dtype)}")


def events_engine(sdf: Any, session: Any) -> Any:
    """A :data:`dpcli.tasks.stream.events.EventsEngine` over the Spark DataFrame ``sdf``."""

    def engine(q: StreamQuery, through: int | None, after: int | None, used: Mapping[Any, int] | None,
               unit_type: pl.DataType) -> pl.DataFrame:
        return bounded_events(sdf, session, q, through=through, after=after, used=used, unit_type=unit_type)

    return engine


def bounded_events(sdf: Any, session: Any, q: StreamQuery, *, through: int | None = None, after: int | None = None,
                   used: Mapping[Any, int] | None = None,
                   unit_type: pl.DataType | DataTypeClass = pl.String) -> pl.DataFrame:
    """:func:`dpcli.tasks.stream.events.prepare_events` of a Spark DataFrame: the same events, in time order."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in sdf.schema.fields}
    _check_key_types(types, q)
    cols, keep = _record_columns(types, q)
    summed = q.grid is not None and q.value is not None
    rows = sdf.select(*cols).filter(keep)
    g = _floor_div(F.col("__t"), q.step) + F.lit(1)
    if after is not None:
        rows = rows.filter(g > F.lit(after))
    if through is not None:
        rows = rows.filter(g <= F.lit(through))
    order = ["__t", "__unit", *q.keys, *(["__v"] if summed else [])]
    rows = _capped(rows, order, session, q, used, unit_type)
    rows = rows.select(*order, *[k for k in q.keys if k not in order],
                       (F.col("__t") - F.pmod(F.col("__t"), F.lit(q.window))).alias("__window"),
                       (_floor_div(F.pmod(F.col("__t"), F.lit(q.window)), q.step) + F.lit(1)).alias("__trigger"),
                       (_floor_div(F.col("__t"), q.step) + F.lit(1)).alias("__g"))
    return _to_polars(rows, q, order, summed)


def _record_columns(types: dict[str, Any], q: StreamQuery) -> tuple[list[Any], Any]:
    """The columns of a record (``__t``, ``__unit``, the keys, ``__v``) and the per-record keep condition."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    seconds = time_seconds(q.time, types[q.time])
    start = seconds - F.pmod(seconds, F.lit(q.window))
    cols = [F.when((start >= F.lit(MIN_SECONDS)) & (start + F.lit(q.window) <= F.lit(MAX_SECONDS)), seconds)
            .alias("__t"), F.col(q.unit).alias("__unit"), *[F.col(k) for k in q.keys]]
    keep = F.col("__t").isNotNull() & F.col("__unit").isNotNull()
    if isinstance(types[q.unit], (T.FloatType, T.DoubleType)):  # NaN is no unit (as for polars)
        keep = keep & ~F.isnan(F.col(q.unit))
    grid = q.grid
    if grid is not None and q.value is not None:
        cols.append(_value_units(q.value, types[q.value], grid))
        keep = keep & F.col("__v").isNotNull()
    return cols, keep


def _to_polars(rows: Any, q: StreamQuery, order: list[str], summed: bool) -> pl.DataFrame:
    """The bounded events through Arrow, typed and sorted as polars' are."""
    table = pl.from_arrow(rows.toArrow())
    assert isinstance(table, pl.DataFrame)
    names = ["__t", "__unit", *q.keys, *(["__v"] if summed else []), "__window", "__trigger", "__g"]
    ints = {"__t", "__v", "__window", "__trigger", "__g"}
    table = table.select([pl.col(c).cast(pl.Int64) if c in ints else pl.col(c) for c in names])
    return table.sort(order, nulls_last=True)


def _check_key_types(types: dict[str, Any], q: StreamQuery) -> None:
    """Spark and polars would not group floats alike: a float key column is refused (a schema error)."""
    from pyspark.sql import types as T

    for k in q.keys:
        if isinstance(types[k], (T.FloatType, T.DoubleType)):
            raise DataError(f"column {k!r} has type {type_text(types[k])}: on --engine spark a key column must "
                            "hold text, integers, booleans, dates or times (cast it)")


def _value_units(value: str, vtype: Any, grid: ValueGrid) -> Any:
    """``__v``: the value column in grid units (``bround``, clamped), null where it is not finite."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from dpcli.spark.bounding import numeric_text

    if isinstance(vtype, T.StringType):
        x = numeric_text(F.col(value))
    elif isinstance(vtype, T.NumericType):
        x = F.col(value).cast("double")
    else:
        raise DataError(f"column {value!r} must be numeric but is {type_text(vtype)}")
    finite = x.isNotNull() & ~F.isnan(x) & (F.abs(x) != F.lit(float("inf")))
    units = F.least(F.greatest(F.bround(x / F.lit(float(grid.granularity)), 0), F.lit(float(grid.lo_units))),
                    F.lit(float(grid.hi_units))).cast("bigint")
    return F.when(finite, units).alias("__v")


def _capped(rows: Any, order: list[str], session: Any, q: StreamQuery, used: Mapping[Any, int] | None,
            unit_type: pl.DataType | DataTypeClass) -> Any:
    """Each unit's first C records in ``order``, less those it used in earlier runs (``used``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rank = F.row_number().over(Window.partitionBy("__unit").orderBy(*[F.col(c).asc_nulls_last() for c in order])) - 1
    if not used:
        return rows.withColumn("__rank", rank).filter(F.col("__rank") < F.lit(q.max_records)).drop("__rank")
    prior = pl.DataFrame({"__unit": pl.Series(list(used), dtype=unit_type),
                          "__used": pl.Series(list(used.values()), dtype=pl.Int64)})
    rows = rows.join(session.createDataFrame(prior.to_arrow()), on="__unit", how="left")
    return (rows.withColumn("__rank", rank).filter(F.col("__rank") + F.coalesce(F.col("__used"), F.lit(0))
                                                   < F.lit(q.max_records)).drop("__rank", "__used"))
