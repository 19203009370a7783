"""Choosing ε (or ρ) from the accuracy a user needs: ``--target-moe`` and ``--target-relative-moe``.

A target names output columns and the 95% margin each must meet (``count=50,sum=2000``, or one number
for every column the query has). The parameter is searched from public quantities only: the query's
plan (its noise scales, from the contribution bounds and the budget split) and each noise's exact
:meth:`dpcli.core.mechanisms.Noise.margin95`; never the data. The search (:func:`smallest`) returns the
smallest value on a grid of :data:`DIGITS` significant digits whose margins meet the target, so the
same inputs always choose the same parameter (and so the same seed: a replay stays free).

A relative target (``--target-relative-moe 0.05``) is a fraction of a count the user states with
``--rows N`` (the count of the smallest group the margin must hold for): its margin is ⌊R·N⌋.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from dpcli.core.exact import fraction_text
from dpcli.errors import UsageError

#: Significant digits of a chosen ε or ρ: rounding up to this grid costs at most 0.1% more budget.
DIGITS = 4
#: The search looks for ε (or ρ) within [MIN_PARAMETER, MAX_PARAMETER].
MIN_PARAMETER = Fraction(1, 10**9)
MAX_PARAMETER = Fraction(10**4)


@dataclass(frozen=True)
class MarginTarget:
    """A parsed ``--target-moe`` or ``--target-relative-moe``: (column, margin) pairs, column None for
    "every column of the query"; ``relative``: the values are fractions of ``size`` (``--rows N``).
    ``field``: the option's library field (``target_moe`` or ``target_relative_moe``), for errors."""

    field: str
    items: tuple[tuple[str | None, Fraction], ...]
    relative: bool = False
    size: int | None = None

    def absolute(self, value: Fraction) -> Fraction:
        """A target value as an absolute margin (⌊R·N⌋ for a relative one: margins are whole counts)."""
        if not self.relative:
            return value
        assert self.size is not None  # parse_target refuses a relative target without --rows
        return Fraction(math.floor(value * self.size))


def parse_target(text: str, relative: bool = False, size: int | None = None) -> MarginTarget:
    """``X`` or ``COLUMN=X[,COLUMN=X…]`` with X > 0 (a relative X also ≤ 1, and ``size`` given: the caller
    asks for it); one-line usage errors."""
    field = "target_relative_moe" if relative else "target_moe"
    items: list[tuple[str | None, Fraction]] = []
    for part in text.split(","):
        column, _, number = part.rpartition("=")
        value = _number(field, number.strip())
        if relative and value > 1:
            raise UsageError(f"is a fraction of the expected count, in (0, 1], got {number.strip()!r}", field=field)
        items.append((column.strip() or None, value) if "=" in part else (None, value))
    names = [c for c, _ in items]
    if None in names and len(items) > 1:
        raise UsageError("is one number for every column, or COLUMN=X pairs (e.g. count=50,sum=2000)", field=field)
    if len(set(names)) != len(names):
        raise UsageError("names a column twice", field=field)
    return MarginTarget(field, tuple(items), relative, size)


def _number(field: str, text: str) -> Fraction:
    try:
        value = Fraction(text) if len(text) <= 40 else None
    except (ValueError, ZeroDivisionError):
        value = None
    if value is None or value <= 0:
        raise UsageError(f"needs positive numbers, e.g. 50 or count=50, got {text!r}", field=field)
    return value


def _exponent(x: Fraction) -> int:
    """The e with 10^(DIGITS−1) ≤ x / 10^e < 10^DIGITS (exactly)."""
    e = math.floor(math.log10(float(x))) - DIGITS + 1
    while x / Fraction(10) ** e >= 10**DIGITS:
        e += 1
    while x / Fraction(10) ** e < 10 ** (DIGITS - 1):
        e -= 1
    return e


def round_up(x: Fraction) -> Fraction:
    """The smallest grid value (DIGITS significant digits) ≥ ``x`` > 0."""
    e = _exponent(x)
    return Fraction(math.ceil(x / Fraction(10) ** e)) * Fraction(10) ** e


def round_down(x: Fraction) -> Fraction:
    """The largest grid value ≤ ``x`` > 0."""
    e = _exponent(x)
    return Fraction(math.floor(x / Fraction(10) ** e)) * Fraction(10) ** e


def step_down(v: Fraction) -> Fraction:
    """The grid value just below the grid value ``v``."""
    e = _exponent(v)
    n = v / Fraction(10) ** e
    if n > 10 ** (DIGITS - 1):
        return (n - 1) * Fraction(10) ** e
    return Fraction(10**DIGITS - 1) * Fraction(10) ** (e - 1)


def step_up(v: Fraction) -> Fraction:
    """The grid value just above the grid value ``v``."""
    e = _exponent(v)
    n = v / Fraction(10) ** e
    if n < 10**DIGITS - 1:
        return (n + 1) * Fraction(10) ** e
    return Fraction(10 ** (DIGITS - 1)) * Fraction(10) ** (e + 1)


def _bisect(ok: Callable[[Fraction], bool], lo: Fraction, hi: Fraction) -> tuple[Fraction, Fraction]:
    """Narrow [lo, hi] (``ok(hi)``, not ``ok(lo)``, ``ok`` monotone) to a relative width below 10^−(DIGITS+2)."""
    while hi - lo > hi / 10 ** (DIGITS + 2):
        mid = (lo + hi) / 2
        mid = Fraction(mid.numerator * 2**64 // mid.denominator + 1, 2**64) if mid.denominator > 2**64 else mid
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return lo, hi


def smallest(meets: Callable[[Fraction], bool]) -> Fraction | None:
    """The smallest grid value in [MIN_PARAMETER, MAX_PARAMETER] with ``meets`` (monotone: false below
    some value, true above), or None if even MAX_PARAMETER does not meet it."""
    hi = Fraction(1)
    while not meets(hi):
        if hi >= MAX_PARAMETER:
            return None
        hi = min(hi * 4, MAX_PARAMETER)
    lo = hi / 4
    while meets(lo):
        if lo <= MIN_PARAMETER:
            return round_up(MIN_PARAMETER)
        lo, hi = max(lo / 4, MIN_PARAMETER), lo
    _, hi = _bisect(meets, lo, hi)
    v = round_up(hi)
    while meets(step_down(v)):  # a step or two at most: hi is within the grid's step of the least value
        v = step_down(v)
    return v


def largest(pays: Callable[[Fraction], bool], above: Fraction) -> Fraction | None:
    """The largest grid value below ``above`` with ``pays`` (monotone: true below some value), or None
    if even MIN_PARAMETER does not pay."""
    if not pays(MIN_PARAMETER):
        return None
    lo, _ = _bisect(lambda x: not pays(x), MIN_PARAMETER, above)
    v = round_down(lo)
    while step_up(v) < above and pays(step_up(v)):  # a step at most: lo is within the grid's step of the most
        v = step_up(v)
    return v


def show(value: Fraction) -> str:
    """A chosen parameter as text (exact: grid values are short decimals)."""
    return fraction_text(value)


__all__ = ["DIGITS", "MarginTarget", "largest", "parse_target", "round_down", "round_up", "show", "smallest",
           "step_down", "step_up"]
