"""What a bounding transformation guarantees: how far one privacy unit can move its output.

Every bounding function returns a :class:`Bounded`: the bounded frame and its
:class:`Stability`. The mechanisms read their sensitivities from there, so
the number that calibrates the noise is written next to the code that
enforces it (as ``tmlt.core`` transformations carry a stability function).

Neighbouring datasets differ by all records of one privacy unit (add or
remove). After bounding, that unit touches at most ``max_groups`` output
groups, and in each it changes a released column by at most
``per_group[column]`` (in the column's own units: rows, units, grid units).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import polars as pl


@dataclass(frozen=True)
class Stability:
    """User-level sensitivities of a bounded table, per released column."""

    max_groups: int | None  # None: a unit may touch every group (only per-group bounds hold)
    per_group: Mapping[str, int | Fraction] = field(default_factory=dict)

    def linf(self, column: str) -> int | Fraction:
        """The most one unit changes ``column`` in any one group (L∞ sensitivity)."""
        try:
            return self.per_group[column]
        except KeyError:
            raise KeyError(f"bounding gives no stability for column {column!r}") from None

    def l1(self, column: str) -> int | Fraction:
        """The most one unit changes ``column`` summed over all groups (L1 sensitivity)."""
        return self._groups() * self.linf(column)

    def l2_squared(self, column: str) -> int | Fraction:
        """The squared L2 sensitivity of ``column``: ``max_groups`` groups, each moved by at most L∞."""
        return self._groups() * self.linf(column) ** 2

    def _groups(self) -> int:
        if self.max_groups is None:
            raise ValueError("no bound on the groups one unit touches: only per-group (L∞) sensitivities hold")
        return self.max_groups


@dataclass(frozen=True)
class Bounded:
    """A bounded (lazy) table and the stability that bounding guarantees for it."""

    frame: pl.LazyFrame
    stability: Stability
