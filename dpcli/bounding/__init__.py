"""User-level contribution bounding on polars LazyFrames.

Turns raw rows into one row per (privacy unit, group) whose influence is capped: values snapped
to an integer grid and clamped, at most C rows per unit and group, at most K groups per unit.
Bad records (null units, NaN or unparsable values) are dropped inside the transformation, never
reported; only the public schema can make it fail. :meth:`BoundingSpec.stability` says what the
caps guarantee. The steps, rules and reasons are in ``docs/bounding.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from math import ceil, floor, isfinite
from typing import Any

import polars as pl

from dpcli.bounding.keyed_order import keep_first
from dpcli.bounding.stability import Bounded, Stability
from dpcli.errors import DataError, UsageError, type_text
from dpcli.frames import collect

#: Internal column names start with this prefix; a query naming such a column is refused
#: (:class:`BoundingSpec`), so they cannot clash with user columns.
RESERVED_PREFIX = "__dp_"
N_ROWS = "__dp_rows"
C_SUM = "__dp_csum"
C_SUMSQ = "__dp_csumsq"
GRID = "__dp_grid"

#: Version of the bounding semantics (grid, clamping, bad records), part of every release seed (see
#: :func:`dpcli.release.release_seed`): a release computed under other semantics gets fresh noise and
#: a fresh charge, never a "replay" whose noise cancels against an old release of different aggregates.
#: 2: grid ⌈lo/g⌉…⌊hi/g⌋ clamped in integers; null units and NaN values dropped, ±inf clamped.
#: 3: selection v2, rows and groups kept by a keyed SHA-256 order (keyed_order.py) that every
#: engine computes alike, instead of polars' seeded hash; text values parsed by the grammar
#: NUMBER (the same on every engine), not by polars' own leniency.
#: 4: selection v3, a keyed order computed as a chain of 64-bit XXH64 steps instead of
#: SHA-256 over text (about 2.5 times faster); groups tied at a cap are dropped, never chosen by row order.
#: 5: a uniform row sample under the per-(unit, group) row cap: each row's key adds its occurrence number
#: among the unit's identical records in that group (identical records no longer share one key, which kept
#: each distinct value, not each row, equally likely); rows tied at the cap are dropped, as groups are.
SEMANTICS = 5

#: Largest |grid value| allowed (see docs/bounding.md: squares fit Int64, totals fit Int128).
MAX_GRID_UNITS = 1 << 31
#: Smallest granularity: the smallest normal float (below it ``float(g)`` loses precision or is 0).
MIN_GRANULARITY = Fraction(2) ** -1022

#: Parquet inputs with more rows than ``SINGLE_PASS_ROWS`` are bounded in buckets of units of about
#: ``BUCKET_ROWS`` rows (one pass over the file per bucket), so the per-(unit, group) table of a pass
#: stays small: a memory bound (50M rows in about 1 GB instead of 4), not a speed-up.
SINGLE_PASS_ROWS = 10_000_000
BUCKET_ROWS = 7_000_000
_BUCKET_SEED = 0x5EED_B0C4


def show_number(x: Fraction) -> str:
    """A short decimal rendering of an exact number of any magnitude (for messages)."""
    with localcontext() as ctx:
        ctx.prec = 6
        return format((Decimal(x.numerator) / Decimal(x.denominator)).normalize(), "g")


@dataclass(frozen=True)
class ValueGrid:
    """How real values are snapped and clamped to integers (validated on construction).

    A value x becomes ``clamp(round(x / granularity), lo_units, hi_units)``
    grid units, where ``lo_units = ⌈lo/g⌉`` and ``hi_units = ⌊hi/g⌋`` are
    exact (so the grid points lie inside ``[lo, hi]``); the centre used for
    mean and variance is ``mid_units``. Every sensitivity is derived from
    these integers. Raises :class:`UsageError` (the grid is public) when the
    granularity is below :data:`MIN_GRANULARITY`, leaves fewer than two grid
    points in the bounds, or puts a bound more than :data:`MAX_GRID_UNITS`
    steps from 0.
    """

    lo: float
    hi: float
    granularity: Fraction

    def __post_init__(self) -> None:
        g = Fraction(self.granularity)
        bounds = f"{self.lo!r}:{self.hi!r}"
        if not (isfinite(self.lo) and isfinite(self.hi) and self.lo < self.hi):
            raise UsageError(f"the bounds must be finite with LO < HI, got {bounds}")
        if not g > 0:
            raise UsageError(f"the granularity must be > 0, got {show_number(g)}")
        if g < MIN_GRANULARITY:
            raise UsageError(
                f"granularity {show_number(g)} for the bounds {bounds} is below 2.2e-308 (the smallest normal float); "
                "rescale the values"
            )
        if self.hi_units <= self.lo_units:
            raise UsageError(
                f"granularity {show_number(g)} leaves fewer than two grid points in the bounds {bounds}; "
                "use a finer one"
            )
        if self.max_abs_units > MAX_GRID_UNITS:
            raise UsageError(
                f"granularity {show_number(g)} is too fine for the bounds {bounds}: "
                f"{show_number(Fraction(self.max_abs_units))} grid steps from 0, more than 2^31 "
                "(sums must stay exact); use a coarser granularity"
            )

    @property
    def lo_units(self) -> int:
        """The lowest grid point inside the bounds, ⌈lo/g⌉ (exact)."""
        return ceil(Fraction(self.lo) / Fraction(self.granularity))

    @property
    def hi_units(self) -> int:
        """The highest grid point inside the bounds, ⌊hi/g⌋ (exact)."""
        return floor(Fraction(self.hi) / Fraction(self.granularity))

    @property
    def mid_units(self) -> int:
        return (self.lo_units + self.hi_units) // 2

    @property
    def max_abs_units(self) -> int:
        """Largest |value| in grid units (sensitivity of one row in a plain sum)."""
        return max(abs(self.lo_units), abs(self.hi_units))

    @property
    def half_width_units(self) -> int:
        """Largest |value − centre| in grid units."""
        return max(self.hi_units - self.mid_units, self.mid_units - self.lo_units)


#: The numbers a text value may hold (after trimming spaces and tabs): decimal or scientific
#: notation in ASCII digits, or an infinity. The grammar, not a parser's leniency, decides what
#: parses, so every engine reads the same values (polars and Spark both round correctly). It is
#: anchored with \A and \z, which mean the same in Rust's and Java's regexes (``$`` does not:
#: Java's also matches before a final line terminator).
NUMBER = r"\A[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?\z"
TRIM = r"\A[ \t]+|[ \t]+\z"
POSITIVE_INFINITY = ("inf", "+inf", "infinity", "+infinity")
NEGATIVE_INFINITY = ("-inf", "-infinity")


def numeric_value(value: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """``value`` (a column of type ``dtype``) as Float64, parsed record by record when it is text.

    Text is stripped of surrounding spaces and tabs and parsed by the grammar
    :data:`NUMBER` (decimal or scientific notation) or as an infinity (``inf``,
    ``-infinity``, any case); anything else (a word, an empty field, ``1,5``,
    ``nan``, ``1_000``, JSON lists or objects of an NDJSON record) becomes null,
    which the caller drops like a null value. Numeric
    columns are cast as they are. Which of the two happens depends on the
    schema only. Raises :class:`DataError` for any other type (a schema error).
    """
    if dtype == pl.String:
        text = value.str.replace_all(TRIM, "")
        lower = text.str.to_lowercase()
        return (pl.when(text.str.contains(NUMBER)).then(text.cast(pl.Float64, strict=False))
                .when(lower.is_in(POSITIVE_INFINITY)).then(pl.lit(math.inf))
                .when(lower.is_in(NEGATIVE_INFINITY)).then(pl.lit(-math.inf))
                .otherwise(pl.lit(None, dtype=pl.Float64)))
    if dtype.is_numeric():
        return value.cast(pl.Float64, strict=False)
    raise DataError(f"a value column must be numeric (or text holding numbers), not {type_text(dtype)}")


def grid_units(value: pl.Expr, grid: ValueGrid) -> pl.Expr:
    """``value`` in grid units: ``round(x / g)`` clamped to ``[lo_units, hi_units]``, Int64.

    ``value`` must be numeric (pass text through :func:`numeric_value` first;
    the cast here is non-strict, so text that reached it would become null,
    never an error). Null and NaN become null (the caller drops them); ±inf
    and any value beyond the bounds become the nearest end of the grid. The
    division and rounding are float, but the clamp is to the exact integers
    (representable as floats, being ≤ 2^31), so the result is always one of them.
    """
    lo, hi = float(grid.lo_units), float(grid.hi_units)
    x = value.cast(pl.Float64, strict=False)
    return (x / float(grid.granularity)).round(0).clip(lo, hi).cast(pl.Int64, strict=False)


def default_granularity(lo: float, hi: float, steps: int = 1 << 12) -> Fraction:
    """The largest power of two g with (hi − lo)/g ≥ ``steps`` (at least 4096 grid steps), computed exactly.

    Raises :class:`UsageError` when that g would be below :data:`MIN_GRANULARITY`
    (bounds narrower than about ``steps`` × 2.2e-308).
    """
    width = Fraction(hi) - Fraction(lo)
    if not width > 0:
        raise ValueError("bounds must satisfy lo < hi")
    target = width / steps
    exponent = target.numerator.bit_length() - target.denominator.bit_length()
    if Fraction(2) ** exponent > target:
        exponent -= 1
    g = Fraction(2) ** exponent
    if g < MIN_GRANULARITY:
        raise UsageError(
            f"the bounds {lo!r}:{hi!r} are too narrow for a grid of {steps} steps (each below 2.2e-308, the "
            "smallest normal float); rescale the values"
        )
    return g


#: The totals :func:`group_totals` computes per group, beside the group columns (which must not share their names).
TOTALS_COLUMNS = ("units", "rows", "csum", "csumsq")


@dataclass(frozen=True)
class BoundingSpec:
    """What to bound and how tightly (all caps ≥ 1)."""

    unit: str
    by: tuple[str, ...]
    max_partitions: int | None  # None: unrestricted (a unit may touch every group)
    max_contributions: int
    value: str | None = None
    grid: ValueGrid | None = None

    def __post_init__(self) -> None:
        if (self.max_partitions is not None and self.max_partitions < 1) or self.max_contributions < 1:
            raise ValueError("contribution caps must be ≥ 1")
        if (self.value is None) != (self.grid is None):
            raise ValueError("a value column needs a grid and vice versa")
        for column in (self.unit, *self.by, *([self.value] if self.value else [])):
            if column.startswith(RESERVED_PREFIX):
                # The bounding's own columns (GRID, N_ROWS, the order key…) would replace it: a unit
                # column named like GRID would become each row's value, unbounding every person.
                raise UsageError(f"column {column!r}: names starting with {RESERVED_PREFIX!r} are dpcli's own; "
                                 "rename the column")
        for column in self.by:
            if column in TOTALS_COLUMNS:  # a group column beside the totals of the same name (found after a debit)
                raise UsageError(f"group column {column!r} has the name of a total dpcli computes per group "
                                 f"({', '.join(TOTALS_COLUMNS)}); rename the column")

    def stability(self) -> Stability:
        """What these bounds guarantee per group, in the units of each bounded total (:func:`group_totals`).

        ``rows``: at most C rows per unit and group; ``units``: a unit counts once per group;
        with a value grid, ``sum`` (grid units from 0, |value| ≤ max_abs), ``csum`` (centred,
        |value − mid| ≤ half width) and ``csumsq`` (squares of centred values); all over at most
        ``max_partitions`` groups. (A cap of 0 grid units is counted as 1: the noise stays proper.)
        """
        c = self.max_contributions
        per_group: dict[str, int] = {"rows": c, "units": 1}
        if self.grid is not None:
            hw = max(self.grid.half_width_units, 1)
            per_group.update(sum=c * max(self.grid.max_abs_units, 1), csum=c * hw, csumsq=c * hw * hw)
        return Stability(self.max_partitions, per_group)

    def bound(self, frame: pl.LazyFrame, salt: int) -> Bounded:
        """:func:`bound_contributions` of ``frame``, with the stability those bounds guarantee."""
        return Bounded(bound_contributions(frame, self, salt), self.stability())

    @property
    def partial_dtype(self) -> pl.DataType:
        """Integer type of the per-(unit, group) sums: Int64 when C rows of the largest square fit, else Int128."""
        hw = self.grid.half_width_units if self.grid is not None else 0
        return pl.Int64() if self.max_contributions * hw * hw < (1 << 63) else pl.Int128()


def _select_columns(frame: pl.LazyFrame, spec: BoundingSpec) -> pl.LazyFrame:
    cols = [spec.unit, *spec.by] + ([spec.value] if spec.value else [])
    return frame.select([pl.col(c) for c in dict.fromkeys(cols)])


def bounded_rows(frame: pl.LazyFrame, spec: BoundingSpec, salt: int) -> pl.LazyFrame:
    """Steps 1-2 for a value column: grid values (``GRID``, centred) of at most C rows per (unit, group).

    Rows with a null unit, or a null, NaN or unparsable value, are dropped
    (docs/bounding.md; a text value column is parsed by :func:`numeric_value`).
    Without a value column the rows are returned as they are (row counts are
    capped, and null units dropped, after aggregation instead).
    """
    lf = _select_columns(frame, spec)
    if spec.value is None or spec.grid is None:
        return lf
    g = spec.grid
    keys = [spec.unit, *spec.by]
    dtype = lf.collect_schema()[spec.value]
    lf = lf.with_columns((grid_units(numeric_value(pl.col(spec.value), dtype), g) - g.mid_units).alias(GRID))
    lf = lf.filter(pl.col(GRID).is_not_null() & pl.col(spec.unit).is_not_null())
    schema = lf.collect_schema()
    fields = [(c, schema[c]) for c in keys] + [(GRID, pl.Int64)]
    return keep_first(lf, keys, fields, salt, "rows", spec.max_contributions)


def bound_contributions(frame: pl.LazyFrame, spec: BoundingSpec, salt: int) -> pl.LazyFrame:
    """Per-(unit, group) partial aggregates after all contribution bounds.

    ``salt`` (128 bits, secret) keys both samples: :func:`dpcli.bounding.keyed_order.keep_first`
    ranks a unit's rows in a group (purpose ``rows``: a uniform sample of its rows, identical records
    told apart by their occurrence number) and a unit's groups (purpose ``groups``).

    Columns: the unit, the group columns, ``N_ROWS`` (rows counted, ≤ C) and,
    with a value column, ``C_SUM``/``C_SUMSQ`` (sum and sum of squares of the
    centred grid values of the kept rows, of type :attr:`BoundingSpec.partial_dtype`).
    Rows whose unit is null are dropped.
    """
    keys = [spec.unit, *spec.by]
    lf = bounded_rows(frame, spec, salt)
    aggs: list[pl.Expr] = [pl.len().alias(N_ROWS)]
    if spec.value is not None:
        acc = spec.partial_dtype
        aggs += [
            pl.col(GRID).cast(acc).sum().alias(C_SUM),
            (pl.col(GRID) * pl.col(GRID)).cast(acc).sum().alias(C_SUMSQ),
        ]
    partial = lf.group_by(keys).agg(aggs).filter(pl.col(spec.unit).is_not_null())
    partial = partial.with_columns(pl.col(N_ROWS).cast(pl.Int64).clip(upper_bound=spec.max_contributions))
    if spec.max_partitions is None:
        return partial
    schema = partial.collect_schema()
    return keep_first(partial, [spec.unit], [(c, schema[c]) for c in keys], salt, "groups", spec.max_partitions)


def group_totals(partial: pl.DataFrame | pl.LazyFrame, spec: BoundingSpec) -> Any:
    """Sum the bounded partials per group, sorted by the group columns (deterministic order).

    Columns: the group columns, ``units`` (distinct units), ``rows`` (bounded
    row count) and, with a value column, ``csum``/``csumsq`` in grid units (Int128).
    """
    aggs = [pl.len().cast(pl.Int64).alias("units"), pl.col(N_ROWS).sum().cast(pl.Int64).alias("rows")]
    names = partial.collect_schema().names() if isinstance(partial, pl.LazyFrame) else partial.columns
    if C_SUM in names:  # Int128: < 2^64 rows of |centred value|² ≤ 2^62 cannot wrap
        aggs += [pl.col(C_SUM).cast(pl.Int128).sum().alias("csum"),
                 pl.col(C_SUMSQ).cast(pl.Int128).sum().alias("csumsq")]
    return partial.group_by(list(spec.by)).agg(aggs).sort(list(spec.by), nulls_last=True)


#: Another engine's bounding (``--engine spark``): (spec, salt) → the table :func:`bounded_totals`
#: would return for the same input, bit for bit.
TotalsEngine = Callable[["BoundingSpec", int], pl.DataFrame]


def unit_buckets(rows: int | None) -> int:
    """How many unit buckets to bound an input of ``rows`` rows in: 1, or one per :data:`BUCKET_ROWS`
    rows over :data:`SINGLE_PASS_ROWS`. ``rows`` is None when counting would need a pass over the
    data (CSV, NDJSON): one bucket (:func:`dpcli.frames.cheap_row_count` gives Parquet's from metadata)."""
    if rows is None or rows <= SINGLE_PASS_ROWS:
        return 1
    return -(-rows // BUCKET_ROWS)


def bounded_totals(
    frame: pl.LazyFrame,
    spec: BoundingSpec,
    salt: int,
    buckets: int = 1,
    each: Callable[[pl.LazyFrame, pl.DataFrame], None] | None = None,
    name: str = "the input",
) -> pl.DataFrame:
    """:func:`group_totals` of the bounded input, computed in ``buckets`` passes over disjoint sets of units.

    Every bound is per unit, so bounding each bucket of units on its own gives
    exactly the partials of one pass, and group totals add up across buckets.
    ``each(frame, partial)`` sees every bucket's input frame and partial
    table (for statistics that need them, e.g. quantiles' per-value counts). An input with
    no rows gives an empty table (no error: see docs/bounding.md).
    """
    if buckets == 1:
        frames = [frame]
    else:
        bucket = pl.col(spec.unit).hash(_BUCKET_SEED) % buckets
        frames = [frame.filter(bucket == b) for b in range(buckets)]
    parts = []
    for part in frames:
        partial_lf = bound_contributions(part, spec, salt)
        if each is None:  # totals in one streaming query; the partial table is never materialised
            parts.append(collect(group_totals(partial_lf, spec), f"cannot read {name}"))
            continue
        partial = collect(partial_lf, f"cannot read {name}")
        each(part, partial)
        parts.append(group_totals(partial, spec))
    if len(parts) == 1:
        return parts[0]
    by = list(spec.by)
    total = pl.concat(parts).group_by(by).agg(pl.exclude(by).sum())
    return total.sort(by, nulls_last=True)


def cap_memberships(frame: pl.LazyFrame, memberships: str, cap: int) -> Bounded:
    """Each record keeps the first ``cap`` entries of its list column ``memberships``.

    For tabulations where a record is a privacy unit (a person) and the list holds the groups it
    belongs to, in a public order: afterwards a record counts in at most ``cap`` groups, once in
    each (SafeTab's stability). Entries beyond the cap are dropped, never reported.
    """
    if cap < 1:
        raise ValueError("a membership cap must be ≥ 1")
    return Bounded(frame.with_columns(pl.col(memberships).list.head(cap)), Stability(cap, {"count": 1}))
