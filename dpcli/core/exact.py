"""Exact numbers: parse, print and round floats to Fractions in a known direction.

Privacy parameters are exact ``Fraction``s everywhere (ledgers never
accumulate float rounding). Where a float computation (a bisection, an
``exp``) yields a parameter, it is rounded to a Fraction in the direction
that is safe for its use: budgets down, costs up. This module is the one
home of those roundings.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any


def to_fraction(value: Any) -> Fraction:
    """Parse a number exactly: ints, ``Fraction``, decimal strings ("0.1"), ``"n/d"``; floats by repr."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, bool):
        raise ValueError("not a number")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(Decimal(repr(value)))
    if isinstance(value, Decimal):
        return _decimal_fraction(value)
    if isinstance(value, str):
        text = value.strip()
        if "/" in text:
            return Fraction(text)
        return _decimal_fraction(Decimal(text))
    raise ValueError(f"not a number: {value!r}")


#: Decimal exponents beyond this are refused: Fraction(Decimal("1e-1000000000")) would build 10^10^9.
MAX_DECIMAL_EXPONENT = 1000


def _decimal_fraction(value: Decimal) -> Fraction:
    """A finite Decimal with a sane exponent as an exact Fraction (ValueError otherwise)."""
    if not value.is_finite():
        raise ValueError(f"not a finite number: {value}")
    if value and abs(value.adjusted()) > MAX_DECIMAL_EXPONENT:
        raise ValueError(f"exponent out of range: {value}")
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)  # a finite Decimal's ('n', 'N', 'F' are NaN and infinity)
    if abs(exponent) > 2 * MAX_DECIMAL_EXPONENT:  # e.g. 0E-1000000000
        raise ValueError(f"exponent out of range: {value}")
    return Fraction(value)


def fraction_text(value: Fraction) -> str:
    """Exact text for a Fraction: a plain decimal when it terminates, else ``n/d``."""
    value = Fraction(value)
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den == 1 and max(twos, fives) <= 30:
        digits = max(twos, fives)
        text = format(Decimal(value.numerator) / Decimal(value.denominator), f".{digits}f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return f"{value.numerator}/{value.denominator}"


def fraction_at_least(x: float, digits: int = 12) -> Fraction:
    """A decimal Fraction ≥ the float ``x`` (rounded up at ``digits`` significant digits).

    ValueError for NaN or ∞ (no finite fraction is ≥ ∞).
    """
    if not math.isfinite(x):
        raise ValueError(f"cannot round {x} up to a fraction")
    if x <= 0:
        return Fraction(0)
    d = Decimal(x)  # the float's exact value, so the rounding direction holds exactly
    exp = d.adjusted() - digits + 1
    quantum = Decimal(1).scaleb(exp)
    return Fraction(d.quantize(quantum, rounding="ROUND_CEILING"))


def float_up(value: Fraction) -> float:
    """The smallest float ≥ ``value`` (∞ beyond the float range): an exact ε shown or used as a float."""
    try:
        f = float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
    return math.nextafter(f, math.inf) if math.isfinite(f) and Fraction(f) < value else f


def fraction_at_most(x: float, digits: int = 12) -> Fraction:
    """A decimal Fraction ≤ the float ``x`` (rounded down at ``digits`` significant digits; 0 for x ≤ 0)."""
    if not x > 0:
        return Fraction(0)
    if x == math.inf:
        raise ValueError("cannot round ∞ down to a fraction")
    d = Decimal(x)  # the float's exact value, so the rounding direction holds exactly
    exp = d.adjusted() - digits + 1
    quantum = Decimal(1).scaleb(exp)
    return Fraction(d.quantize(quantum, rounding="ROUND_FLOOR"))


def floor_fraction(x: float | Fraction, quantum: int) -> Fraction:
    """``x`` rounded down (exactly) to a multiple of 1/``quantum``."""
    return Fraction(math.floor(Fraction(x) * quantum), quantum)


def floor_decimal(x: float, digits: int = 12) -> Fraction:
    """``x`` rounded down (exactly) to ``digits`` decimals: 0 for 0 < x < 10^-digits."""
    return floor_fraction(x, 10**digits)


def floor_parameter(x: float, digits: int = 12) -> Fraction:
    """A calibrated parameter (ε, ρ) rounded down: to ``digits`` decimals, or to ``digits`` significant
    digits when that would give 0; never 0 for ``x`` > 0 (a little less budget than computed is safe)."""
    return floor_decimal(x, digits) or fraction_at_most(x, digits)
