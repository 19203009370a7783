"""User-level contribution bounding on polars LazyFrames.

This is the relational half of every release: it turns raw rows into one row
per (privacy unit, group) whose influence is bounded, so the mechanism core
only ever sees a small table with known sensitivities. The steps follow the
two-stage rewrite of Wilson et al. (paper 002):

1. **Per-row**: values are clamped to ``[lo, hi]`` and rounded to a grid of
   spacing ``granularity`` (a power of two), becoming integers in grid units,
   so sums can get exact integer noise.
2. **Rows per unit per group**: at most ``max_contributions`` rows of a unit
   count in a group. When row values are aggregated, which rows is decided by
   ranking a keyed hash (a uniform sample without replacement, as reservoir
   sampling gives); for row counts alone the cap is simply ``min(n, C)``.
   Rows whose value is null are ignored when a value column is used.
3. **Per-unit per-group partial aggregation**: row count, sum and sum of
   squares of the centred grid values, one row per (unit, group).
4. **Groups per unit**: at most ``max_partitions`` groups per unit, chosen
   uniformly at random per unit by ranking a keyed hash of (unit, group).

Everything stays lazy and runs on polars' streaming engine; there is no
per-row Python. The randomness used for *selection* here only affects which
contributions are kept, never the privacy guarantee (any selection rule that
respects the caps gives the same sensitivity); it comes from polars' seeded
hash, keyed by a salt drawn from the release's keyed stream, and the polars
version is part of the release seed so an upgrade that changes the hash gets
fresh noise (and a fresh charge) instead of a "replay" over different rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from math import floor, log2
from typing import Any

import polars as pl

from dpcli.errors import DataError
from dpcli.tables import InputTable, collect

#: Internal column names (prefixed so they cannot clash with user columns).
N_ROWS = "__dp_rows"
C_SUM = "__dp_csum"
C_SUMSQ = "__dp_csumsq"
GRID = "__dp_grid"
NONFINITE = "__dp_nonfinite"
_MASK64 = (1 << 64) - 1

#: Parquet inputs with more rows than ``SINGLE_PASS_ROWS`` are bounded in buckets of units of about
#: ``BUCKET_ROWS`` rows (one pass over the file per bucket), so the per-(unit, group) table of a pass
#: stays small: a memory bound (50M rows in about 1 GB instead of 4), not a speed-up.
SINGLE_PASS_ROWS = 10_000_000
BUCKET_ROWS = 7_000_000
_BUCKET_SEED = 0x5EED_B0C4


@dataclass(frozen=True)
class ValueGrid:
    """How real values are clamped and snapped to integers.

    A value x becomes ``round(clamp(x, lo, hi) / granularity)`` grid units; the
    bounds in grid units are ``lo_units``/``hi_units``; the centre used for
    mean and variance is ``mid_units``.
    """

    lo: float
    hi: float
    granularity: Fraction

    @property
    def lo_units(self) -> int:
        return round(Fraction(self.lo) / self.granularity)

    @property
    def hi_units(self) -> int:
        return round(Fraction(self.hi) / self.granularity)

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


def default_granularity(lo: float, hi: float, steps: int = 1 << 12) -> Fraction:
    """The largest power of two g with (hi − lo)/g ≥ ``steps`` (at least 4096 grid steps)."""
    width = hi - lo
    if not width > 0:
        raise ValueError("bounds must satisfy lo < hi")
    exponent = floor(log2(width / steps))
    return Fraction(2) ** exponent


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


def _check_columns(frame: pl.LazyFrame, spec: BoundingSpec) -> pl.LazyFrame:
    cols = [spec.unit, *spec.by] + ([spec.value] if spec.value else [])
    return frame.select([pl.col(c) for c in dict.fromkeys(cols)])


def bounded_rows(frame: pl.LazyFrame, spec: BoundingSpec, salt: int) -> pl.LazyFrame:
    """Steps 1-2 for a value column: clamped grid values (``GRID``, centred) of at most C rows per (unit, group).

    Without a value column the rows are returned as they are (row counts are
    capped after aggregation instead). Non-finite values are kept, flagged in
    ``NONFINITE``, so they can be reported; rows with a null value are dropped.
    """
    lf = _check_columns(frame, spec)
    if spec.value is None or spec.grid is None:
        return lf
    g = spec.grid
    keys = [spec.unit, *spec.by]
    units = (pl.col(spec.value).cast(pl.Float64).clip(g.lo, g.hi) / float(g.granularity)).round(0).cast(
        pl.Int64, strict=False
    ) - g.mid_units
    bad = pl.col(spec.value).cast(pl.Float64).is_finite().not_()
    lf = lf.filter(pl.col(spec.value).is_not_null()).with_columns(units.alias(GRID), bad.alias(NONFINITE))
    rank = pl.struct(keys + [GRID]).hash(salt & _MASK64).rank("ordinal").over(keys)
    return lf.filter((rank <= spec.max_contributions) | pl.col(NONFINITE))


def bound_contributions(frame: pl.LazyFrame, spec: BoundingSpec, salt: int) -> pl.LazyFrame:
    """Per-(unit, group) partial aggregates after all contribution bounds.

    ``salt`` is 128 bits: the low 64 key the row sample, the high 64 the group sample.

    Columns: the unit, the group columns, ``N_ROWS`` (rows counted, ≤ C) and,
    with a value column, ``C_SUM``/``C_SUMSQ`` (sum and sum of squares of the
    centred grid values of the kept rows) and ``NONFINITE``. Rows whose unit is
    null are kept (as a null unit) so that :func:`check_bounded` can report them.
    """
    keys = [spec.unit, *spec.by]
    lf = bounded_rows(frame, spec, salt)
    aggs: list[pl.Expr] = [pl.len().alias(N_ROWS)]
    if spec.value is not None:
        aggs += [
            pl.col(GRID).sum().alias(C_SUM),
            (pl.col(GRID) * pl.col(GRID)).sum().alias(C_SUMSQ),
            pl.col(NONFINITE).sum().alias(NONFINITE),
        ]
    partial = lf.group_by(keys).agg(aggs)
    partial = partial.with_columns(pl.col(N_ROWS).cast(pl.Int64).clip(upper_bound=spec.max_contributions))
    if spec.max_partitions is None:
        return partial
    group_rank = pl.struct(keys).hash((salt >> 64) & _MASK64).rank("ordinal").over(spec.unit)
    return partial.filter(group_rank <= spec.max_partitions)


def check_bounded(partial: pl.DataFrame, spec: BoundingSpec, name: str, allow_empty: bool = False) -> pl.DataFrame:
    """Refuse data that cannot be released: null units and non-finite values (and no rows at all).

    Works on the collected partial table (no extra pass over the input).
    Returns it without the null-unit and diagnostic columns.
    """
    bad = int(partial[NONFINITE].sum()) if NONFINITE in partial.columns else 0
    _refuse(partial.height, partial[spec.unit].null_count(), bad, spec, name, allow_empty)
    return partial.drop(NONFINITE) if NONFINITE in partial.columns else partial


def _refuse(rows: int, null_units: int, nonfinite: int, spec: BoundingSpec, name: str, allow_empty: bool) -> None:
    if rows == 0 and not allow_empty:
        raise DataError(f"{name} has no rows to aggregate")
    if null_units:
        raise DataError(
            f"column {spec.unit!r} (the privacy unit) has null values in {name}; "
            "every row must belong to a unit (drop or fill them first)"
        )
    if nonfinite:
        raise DataError(
            f"column {spec.value!r} has {nonfinite} non-finite value(s) (NaN or ±inf) in {name}; clean or drop them first"
        )


def group_totals(partial: pl.DataFrame | pl.LazyFrame, spec: BoundingSpec) -> Any:
    """Sum the bounded partials per group, sorted by the group columns (deterministic order).

    Columns: the group columns, ``units`` (distinct units), ``rows`` (bounded
    row count) and, with a value column, ``csum``/``csumsq`` in grid units.
    """
    aggs = [pl.len().cast(pl.Int64).alias("units"), pl.col(N_ROWS).sum().cast(pl.Int64).alias("rows")]
    names = partial.collect_schema().names() if isinstance(partial, pl.LazyFrame) else partial.columns
    if C_SUM in names:
        aggs += [pl.col(C_SUM).sum().cast(pl.Int64).alias("csum"), pl.col(C_SUMSQ).sum().cast(pl.Int64).alias("csumsq")]
    return partial.group_by(list(spec.by)).agg(aggs).sort(list(spec.by), nulls_last=True)


def unit_buckets(table: InputTable) -> int:
    """How many unit buckets to bound ``table`` in: 1, or one per :data:`BUCKET_ROWS` rows of a Parquet
    input over :data:`SINGLE_PASS_ROWS` (its row count is metadata; other formats would need a pass to count)."""
    if table.format != "parquet":
        return 1
    rows = int(collect(table.frame.select(pl.len()), f"cannot read {table.name}").item())
    return 1 if rows <= SINGLE_PASS_ROWS else -(-rows // BUCKET_ROWS)


def bounded_totals(
    table: InputTable,
    spec: BoundingSpec,
    salt: int,
    buckets: int = 1,
    each: Callable[[pl.LazyFrame, pl.DataFrame], None] | None = None,
) -> pl.DataFrame:
    """:func:`group_totals` of the bounded input, computed in ``buckets`` passes over disjoint sets of units.

    Every bound is per unit, so bounding each bucket of units on its own gives
    exactly the partials of one pass, and group totals add up across buckets.
    ``each(frame, partial)`` sees every bucket's input frame and checked
    partial table (for statistics that need them, e.g. quantile bins).
    """
    if buckets == 1:
        frames = [table.frame]
    else:
        bucket = pl.col(spec.unit).hash(_BUCKET_SEED) % buckets
        frames = [table.frame.filter(bucket == b) for b in range(buckets)]
    parts = []
    rows = 0
    for frame in frames:
        partial_lf = bound_contributions(frame, spec, salt)
        if each is None:  # totals and checks in one streaming query; the partial table is never materialised
            checks = [pl.len().alias("rows"), pl.col(spec.unit).null_count().alias("nulls")]
            if spec.value is not None:
                checks.append(pl.col(NONFINITE).sum().alias("bad"))
            try:
                totals, found = pl.collect_all([group_totals(partial_lf, spec), partial_lf.select(checks)],
                                               engine="streaming")
            except pl.exceptions.PolarsError as exc:
                raise DataError(f"cannot read {table.name}: {str(exc).splitlines()[0]}") from None
            n = int(found["rows"][0])
            _refuse(n, int(found["nulls"][0]), int(found["bad"][0]) if "bad" in found.columns else 0, spec,
                    table.name, allow_empty=True)
            rows += n
            parts.append(totals)
            continue
        partial = check_bounded(collect(partial_lf, f"cannot read {table.name}"), spec, table.name, allow_empty=True)
        rows += partial.height
        each(frame, partial)
        parts.append(group_totals(partial, spec))
    if rows == 0:
        raise DataError(f"{table.name} has no rows to aggregate")
    if len(parts) == 1:
        return parts[0]
    by = list(spec.by)
    total = pl.concat(parts).group_by(by).agg(pl.exclude(by).sum())
    return total.sort(by, nulls_last=True)
