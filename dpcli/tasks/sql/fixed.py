"""Exact per-user sums: every value as a fixed-point integer before anything is added.

A sum of doubles depends on the order it is added in (and on polars' threads and chunks, or Spark's
partitions), so the same rows in another order could round a user's partial to another grid point and
release another number under the same seed. Here nothing is added in floating point:

1. each value x of a measurement on grid g = 2^e becomes r = round(x · 2^(F − e)), half to even,
   with F = :data:`FRACTION_BITS` fractional bits per grid step. The product by a power of two is exact
   in IEEE-754 (it is done as two factors, each a double, so that no factor overflows; the result is
   exact whenever its rounding matters), so r is a function of the row alone, the same on any engine;
   |r| is clamped to :data:`ROW_BOUND` (2^62) first. A bound lies at most 2^31 grid steps from 0
   (:data:`dpcli.bounding.MAX_GRID_UNITS`), 2^51 in these units, so the clamp touches only values more
   than 2^11 times farther from 0 than every bound (and ±∞): each counts as ±2^62 units, a value beyond
   every bound, so ±∞ on their own clamp the user's sum as before, and +∞ with −∞ now cancel (a double
   sum made them NaN: no contribution).
2. a user's sum is the Int128 sum of the r (exact: it holds 2^65 rows of 2^62), its mean that sum over
   n · 2^F, and VAR's mean square the Int128 sum of (r − mid · 2^F)² over n · 2^(2F), each divided exactly
   and rounded half to even (:data:`ROUNDING`) to whole grid units, then clamped as before. A mean square's sum
   holds 2^33 rows at its largest term (2^94: a half-width of at most 4096 grid steps, clamped as in 3.), far
   beyond the 10^8 rows a person may hold.
3. VAR's per-row distance |r − mid · 2^F| is clamped to :func:`distance_bound`, 2^:data:`VAR_SLACK_BITS`
   half-widths of the grid, so that its square fits with room: a clamped row adds 2^30 · ((U − L)/2)² in
   grid units², so a user with at most 2^30 values in the partition (every real one) has a mean square
   past the top of the clamp with or without the row clamp, and the partial is unchanged.

The privacy guarantee does not depend on any of this: each user's partial is still a function of that
user's rows alone, clamped to the same range as before ([L, U] for a sum, [L, U] − centre for a mean,
[0, ((U − L)/2)²] for a mean square), so every sensitivity of :mod:`dpcli.tasks.sql.plan` holds as it
did; what changes is that the partial no longer depends on the order of the rows. The constants here
are sql rules (:data:`dpcli.release.seeds.RULE_MODULES`): changing one changes every sql seed.
"""

from __future__ import annotations

from fractions import Fraction

import polars as pl

from dpcli import bounding

#: Fractional bits of a value's fixed-point representation, per grid step.
FRACTION_BITS = 20
#: The largest |r| a value's fixed-point integer may take (values beyond are clamped to it).
ROW_BOUND = 1 << 62
#: VAR's per-row distance to the centre is clamped to 2^VAR_SLACK_BITS half-widths of the grid.
VAR_SLACK_BITS = 15
#: How an exact quotient becomes whole grid units (a value's r, a sum, a mean, a mean square).
ROUNDING = "half-to-even"


def grid_exponent(grid: bounding.ValueGrid) -> int:
    """e with the grid's granularity g = 2^e (:func:`dpcli.bounding.default_granularity` is a power of two)."""
    g = Fraction(grid.granularity)
    exponent = g.numerator.bit_length() - g.denominator.bit_length()
    assert Fraction(2) ** exponent == g, g
    return exponent


def row_scales(grid: bounding.ValueGrid) -> tuple[float, float]:
    """The two factors (powers of two, each a finite double) whose product is 2^(F − e)."""
    k = FRACTION_BITS - grid_exponent(grid)
    return 2.0 ** (k // 2), 2.0 ** (k - k // 2)


def distance_bound(grid: bounding.ValueGrid) -> int:
    """The largest |r − mid · 2^F| VAR's per-row square reads (2^VAR_SLACK_BITS half-widths, in 2^−F steps)."""
    return max(grid.half_width_units, 1) << (FRACTION_BITS + VAR_SLACK_BITS)


def fixed_column(v: str, grid: bounding.ValueGrid) -> str:
    """The name of value column ``v``'s per-row fixed-point integer on ``grid`` (:func:`row_units`)."""
    return f"__dp_r{v}_{grid_exponent(grid)}"


def square_column(v: str, grid: bounding.ValueGrid) -> str:
    """The name of ``v``'s per-row squared distance to ``grid``'s centre (:func:`row_square`)."""
    return f"__dp_d{v}_{grid_exponent(grid)}_{grid.mid_units}_{grid.half_width_units}"


def row_units(x: pl.Expr, grid: bounding.ValueGrid) -> pl.Expr:
    """A value's fixed-point integer r (Int64; null for null)."""
    s1, s2 = row_scales(grid)
    bound = float(ROW_BOUND)
    return ((x * s1) * s2).clip(-bound, bound).round(0, mode="half_to_even").cast(pl.Int64)


def row_square(r: pl.Expr, grid: bounding.ValueGrid) -> pl.Expr:
    """A value's squared distance to the grid's centre in 2^−2F grid units², exact (Int128; null for null)."""
    bound = distance_bound(grid)
    d = (r - grid.mid_units * (1 << FRACTION_BITS)).clip(-bound, bound).cast(pl.Int128)
    return d * d


def int128(value: int) -> pl.Expr:
    return pl.lit(value, dtype=pl.Int128)


def round_div(num: pl.Expr, den: pl.Expr) -> pl.Expr:
    """num / den rounded half to even, exactly (Int128; ``den`` > 0)."""
    num, den = num.cast(pl.Int128), den.cast(pl.Int128)
    q = num // den
    twice = (num - q * den) * int128(2)
    up = (twice > den) | ((twice == den) & ((q % int128(2)) != int128(0)))
    return q + up.cast(pl.Int128)


def scaled_count(n: pl.Expr, bits: int) -> pl.Expr:
    """max(n, 1) · 2^bits (Int128): a mean's divisor (n = 0 is masked by the caller)."""
    return n.cast(pl.Int128).clip(lower_bound=1) * int128(1 << bits)
