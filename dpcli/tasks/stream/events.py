"""Records → bounded events: which records count, in time order, with their window and trigger.

The bounded transformation, per record and then per unit (so one unit's
records never change which records of others count):

* a record is dropped when its time is missing, does not parse (ISO 8601 with
  an optional offset, or epoch seconds; the layout is fixed, never inferred
  from the data) or lies in a window not wholly within 0001-01-01 … 9999-12-31
  UTC; when its unit is null (or NaN); when its unit or a key is a date outside
  years 1 … 9999 or a duration of 10^9 days (Python cannot hold them); when a
  value column is summed and its value is missing, unparsable or not finite
  (:func:`dpcli.bounding.numeric_value`);
  when its trigger ends after the run's public ``through`` trigger (a persisted stream fed with
  ``keep`` keeps such events until their trigger runs, :func:`with_kept`); for a persisted stream,
  when its trigger has already run (a late event);
* then each unit keeps its first C remaining records in time order, over the
  whole stream (:func:`dpcli.bounding.stream_records.cap_records`).

Dropped records are never counted or reported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import polars as pl

from dpcli import bounding
from dpcli.bounding.stability import Bounded
from dpcli.bounding.stream_records import cap_records
from dpcli.errors import DataError, type_text
from dpcli.frames import collect
from dpcli.tasks.stream.query import MAX_SECONDS, MIN_SECONDS, StreamQuery

#: ISO 8601 layouts accepted in text timestamps (a trailing Z counts as +00:00); anything else that is
#: not a number of epoch seconds is unparsable.
ISO_LAYOUTS = ("%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d")


def event_seconds(schema: pl.Schema, q: StreamQuery) -> pl.Expr:
    """The time column as integer epoch seconds (UTC), null where it is missing, unparsable or out of range.

    Text is read as ISO 8601 (:data:`ISO_LAYOUTS`, naive times are UTC) or
    as epoch seconds, each value on its own: the layout is never inferred from
    other rows. Numbers are epoch seconds (floored); dates are midnight UTC.
    """
    dtype = schema[q.time]
    t = pl.col(q.time)
    if dtype == pl.String:
        text = t.str.strip_chars()
        iso = text.str.replace(r"[zZ]$", "+00:00")
        parsed = [iso.str.to_datetime(f, time_unit="us", strict=False, exact=True).dt.epoch("s") for f in ISO_LAYOUTS]
        parsed += [iso.str.to_datetime(f + "%z", time_unit="us", strict=False, exact=True).dt.epoch("s")
                   for f in ISO_LAYOUTS[:-1]]
        seconds = pl.coalesce(*parsed, _float_seconds(text.cast(pl.Float64, strict=False)))
    elif dtype == pl.Date:
        seconds = t.cast(pl.Int32).cast(pl.Int64) * 86400
    elif isinstance(dtype, pl.Datetime):
        seconds = t.dt.epoch("s")
    elif dtype.is_numeric():
        seconds = _float_seconds(t.cast(pl.Float64, strict=False))
    else:  # the column's type, not its values, decides: the same for every dataset of this schema
        raise DataError(f"column {q.time!r} must hold timestamps, but is {type_text(dtype)}")
    start = seconds // q.window * q.window  # the window, which must start and end on showable dates
    return pl.when((start >= MIN_SECONDS) & (start + q.window <= MAX_SECONDS)).then(seconds)


def _float_seconds(x: pl.Expr) -> pl.Expr:
    """Floored epoch seconds of a float, null unless finite and (loosely) in range."""
    ok = x.is_finite() & (x.abs() <= 1e12)
    return pl.when(ok).then(x.floor()).cast(pl.Int64, strict=False)


def _python_holds(col: str, dtype: pl.DataType) -> pl.Expr | None:
    """Whether a value of the column becomes a Python value (dates: years 1 … 9999, durations: under
    10^9 days); None when every value of the type does."""
    if dtype == pl.Date or (isinstance(dtype, pl.Datetime) and dtype.time_unit != "ns"):
        years = [pl.col(col).dt.year()]
        if getattr(dtype, "time_zone", None) is not None:  # Python goes through UTC as well
            years.append(pl.col(col).dt.convert_time_zone("UTC").dt.year())
        return pl.all_horizontal([y.is_between(1, 9999) for y in years])
    if isinstance(dtype, pl.Duration) and dtype.time_unit == "ms":
        return pl.col(col).dt.total_days().abs() < 999_999_999
    return None


def record_exprs(frame: pl.LazyFrame, q: StreamQuery, name: str) -> tuple[list[pl.Expr], pl.Expr]:
    """The columns of a record (``__t``, ``__unit``, the keys, ``__v``) and the per-record keep condition."""
    schema = frame.collect_schema()
    unit, unit_type = _unit_column(q.unit, schema[q.unit])
    cols = [event_seconds(schema, q).alias("__t"), unit.alias("__unit"), *[pl.col(k) for k in q.keys]]
    keep = pl.col("__t").is_not_null() & pl.col("__unit").is_not_null()
    if schema[q.unit].is_float():  # NaN is no unit: Python's sets and dicts (restarted rounds, the
        keep &= pl.col("__unit").is_not_nan()  # state's per-unit counts) never match it to itself
    for c, col in ((q.unit, "__unit"), *((k, k) for k in q.keys)):  # values Python cannot hold (released keys,
        holds = _python_holds(col, unit_type if col == "__unit" else schema[c])  # restarted rounds' units and
        if holds is not None:  # states become Python values): dropped, never an error for some data
            keep &= pl.col(col).is_null() | holds
    grid = q.grid
    if grid is not None and q.value is not None:
        cols += [_value_units(q.value, schema[q.value], grid, name)]
        keep &= pl.col("__v").is_not_null()
    return cols, keep


def _unit_column(column: str, dtype: pl.DataType) -> tuple[pl.Expr, pl.DataType]:
    """The unit column as compared: times, durations and nanosecond datetimes by their integers (Python's
    values stop at microseconds, so units would merge in restarted rounds, or at 10^9 days)."""
    if dtype == pl.Time or isinstance(dtype, pl.Duration) or (isinstance(dtype, pl.Datetime)
                                                             and dtype.time_unit == "ns"):
        return pl.col(column).to_physical(), pl.Int64()
    return pl.col(column), dtype


def _value_units(column: str, dtype: pl.DataType, grid: bounding.ValueGrid, name: str) -> pl.Expr:
    """``__v``: the value column in grid units, null where it is missing, unparsable or not finite."""
    if not (dtype.is_numeric() or dtype == pl.String):
        raise DataError(f"column {column!r} must be numeric but is {type_text(dtype)} in {name}")
    x = bounding.numeric_value(pl.col(column), dtype)
    # Snapped, then clamped to the grid's exact integers (|units| ≤ 2^10 per record: the grid has
    # ≥ 2^9 steps per L), so Int64 sums stay exact up to 2^53 records; totals across triggers are
    # Python integers (no wrap-around). Non-finite values are dropped like unparsable ones.
    return pl.when(x.is_finite()).then(bounding.grid_units(x, grid)).alias("__v")


def bounded_events(frame: pl.LazyFrame, q: StreamQuery, *, through: int | None = None, after: int | None = None,
                   used: Mapping[Any, int] | None = None, name: str = "the input") -> Bounded:
    """The bounded events (lazy) and their stability: see the module docstring.

    Keeps records whose global trigger (``__t // step + 1``) is after ``after``
    and at most ``through``; ``used`` (records used by units in earlier runs)
    counts towards the cap. Columns: ``__t``, ``__unit``, the keys, ``__v``
    (grid units, with a value column), ``__window``, ``__trigger`` and ``__g``
    (the global trigger index). ``name`` names the input in messages.
    """
    cols, keep = record_exprs(frame, q, name)
    g = pl.col("__t") // q.step + 1
    if after is not None:
        keep &= g > after
    if through is not None:
        keep &= g <= through
    capped = cap_records(frame.select(cols).filter(keep), "__unit", record_columns(q), q.max_records, q.grid, used)
    return Bounded(_with_triggers(capped.frame, q), capped.stability)


def record_columns(q: StreamQuery) -> list[str]:
    """An event's own columns, in the order events are sorted: time order, ties broken by the record's
    content (not its position in the file), so which of a unit's records are its first C never depends
    on row order. A persisted stream keeps events of triggers not yet run with these columns."""
    return ["__t", "__unit", *q.keys, *(["__v"] if q.grid is not None and q.value is not None else [])]


def _with_triggers(frame: pl.LazyFrame, q: StreamQuery) -> pl.LazyFrame:
    """``frame`` with each event's window, its trigger in the window and its global trigger."""
    return frame.with_columns(
        (pl.col("__t") // q.window * q.window).alias("__window"),
        ((pl.col("__t") % q.window) // q.step + 1).cast(pl.Int64).alias("__trigger"),
        (pl.col("__t") // q.step + 1).alias("__g"),
    )


def with_kept(new: pl.DataFrame, kept: pl.DataFrame | None, q: StreamQuery,
              used: Mapping[Any, int] | None) -> pl.DataFrame:
    """A persisted stream's events for one run: ``new`` (from :func:`prepare_events`, without ``through``)
    and the events ``kept`` from earlier runs (triggers not yet run), capped together.

    Each unit keeps its first C records over the whole stream: both parts are each unit's first
    (C − used) records of what they hold, and the first k of A ∪ B are the first k of
    first-k(A) ∪ first-k(B), so capping them together gives the first (C − used) of all events fed
    and not yet run, as one replay of every input would.
    """
    cols = record_columns(q)
    if kept is None or not kept.height:
        return new
    both = pl.concat([kept.select(cols).cast(new.select(cols).schema), new.select(cols)])
    capped = cap_records(both.lazy(), "__unit", cols, q.max_records, q.grid, used)
    return collect(_with_triggers(capped.frame, q), "cannot combine the stream's kept events")


#: (query, through, after, used, the unit column's type) → the events :func:`prepare_events` gives,
#: computed on another engine (:func:`dpcli.spark.stream.events_engine`).
EventsEngine = Callable[[StreamQuery, "int | None", "int | None", "Mapping[Any, int] | None", pl.DataType],
                        pl.DataFrame]


def prepare_events(frame: pl.LazyFrame, q: StreamQuery, through: int | None = None, *, after: int | None = None,
                   used: Mapping[Any, int] | None = None, name: str = "the input",
                   engine: EventsEngine | None = None) -> pl.DataFrame:
    """:func:`bounded_events`, collected: the events in time order (on ``engine`` if given; ``frame``
    then gives the schema only)."""
    if engine is not None:
        record_exprs(frame, q, name)  # the schema checks, as for polars
        return engine(q, through, after, used, frame.collect_schema()[q.unit])
    return collect(bounded_events(frame, q, through=through, after=after, used=used, name=name).frame,
                   f"cannot read {name}")
