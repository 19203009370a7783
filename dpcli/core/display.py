"""How dpcli shows privacy parameters and times to people: one format for every command (issue 39 item 8).

* ε, δ and ρ in text (``budget show``, ``budget history``, the summary line on stderr, notes, refusals):
  :func:`parameter_text`, at most :data:`PARAMETER_DIGITS` (4) significant digits, exact when the value has
  no more, otherwise rounded so that nobody reads more budget left than there is: what is spent, charged or
  reserved is rounded up, what remains is rounded down. ``--json`` keeps every figure exact.
* times dpcli computes (a stream's windows and triggers, ``--through``): :func:`utc_text`, ISO 8601 in UTC
  with ``Z``, to the second, with fractional seconds only when they are not zero.

Released tables follow the same rules column by column in :func:`dpcli.io.outputs.shown` (integers as
integers, never ``-0``, these times with ``Z``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

from dpcli.core.exact import to_fraction

#: Significant digits of ε, δ and ρ in text for people (``--json`` keeps the exact values).
PARAMETER_DIGITS = 4

#: Which way a parameter is rounded: ``up`` for what is spent, charged or reserved, ``down`` for what remains
#: (and for a long limit): never more budget left on the page than in the ledger.
Rounding = Literal["up", "down"]

#: Beyond these decimal exponents a parameter is written in scientific notation (``1e-09``, ``6.667e-10``).
_SMALLEST_PLAIN, _LARGEST_PLAIN = -4, 15

#: :func:`utc_text` as a polars ``strftime`` format (``%.f``: the fraction only when it is not zero).
UTC_FORMAT = "%Y-%m-%dT%H:%M:%S%.fZ"


def parameter_text(value: Fraction | Decimal | str | int | float, rounding: Rounding) -> str:
    """ε, δ or ρ for people: ``0.5``, ``0.1124``, ``1e-09``, ``6.667e-10``.

    Exact when ``value`` has at most :data:`PARAMETER_DIGITS` significant digits; otherwise rounded to that
    many, ``up`` (towards +∞: spent, charged, reserved) or ``down`` (towards −∞: remaining). ``value`` is
    anything :func:`dpcli.core.exact.to_fraction` reads (a ledger's exact text, ``"n/d"``, a Fraction; a
    float by its shortest repr, so ``1e-09`` stays ``1e-09``). Infinity and NaN are shown as such.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    x = to_fraction(value)
    if x == 0:
        return "0"
    exponent = _exponent(abs(x))
    quantum = _power_of_ten(exponent - PARAMETER_DIGITS + 1)
    scaled = x / quantum
    digits = math.ceil(scaled) if rounding == "up" else math.floor(scaled)
    return _decimal_text(Decimal(digits).scaleb(exponent - PARAMETER_DIGITS + 1).normalize())


#: The figures of a ledger, a cost or a limit that are ε, δ or ρ (the others, a br ledger's units and calls, are
#: counts, shown as they are).
PARAMETERS = frozenset({"epsilon", "delta", "rho", "epsilon_per", "delta_per", "delta_prime", "epsilon_reached",
                        "epsilon_limit"})
#: Figures that are spent whatever list they come in (an RDP ledger's "remaining" names the ε reached so far).
_SPENT = frozenset({"epsilon_reached"})


def parameters_text(values: Mapping[str, Any], rounding: Rounding) -> str:
    """``epsilon=0.1124, delta=1e-07``: a ledger's figures (what is spent, what remains, a cost, its limits) for
    people, each ε, δ and ρ by :func:`parameter_text` rounded ``rounding`` (an ε reached: always up), counts as
    they are."""
    return ", ".join(f"{k}={figure_text(k, v, rounding)}" for k, v in values.items())


def figure_text(name: str, value: Any, rounding: Rounding) -> str:
    """One figure named ``name`` of :func:`parameters_text`: a parameter rounded, anything else as it is."""
    if name not in PARAMETERS or value is None or isinstance(value, bool):
        return str(value)
    try:
        return parameter_text(value, "up" if name in _SPENT else rounding)
    except ValueError:  # not a finite number (an RDP ledger's ε reached, "inf", once its δ is used up)
        return str(value)


def _power_of_ten(n: int) -> Fraction:
    return Fraction(10**n) if n >= 0 else Fraction(1, 10**-n)


def _exponent(x: Fraction) -> int:
    """The decimal exponent of ``x`` > 0: the e with 10^e ≤ x < 10^(e+1), exactly."""
    e = len(str(x.numerator)) - len(str(x.denominator))
    while _power_of_ten(e) > x:
        e -= 1
    while _power_of_ten(e + 1) <= x:
        e += 1
    return e


def _decimal_text(d: Decimal) -> str:
    """A normalised Decimal as plain text (``0.1124``, ``12350``), or scientific beyond the plain range
    (``1e-09``, ``6.667e-10``: Python's own spelling of small floats)."""
    if _SMALLEST_PLAIN <= d.adjusted() <= _LARGEST_PLAIN:
        return format(d, "f")
    sign, digits, _ = d.as_tuple()
    mantissa = "".join(map(str, digits))
    mantissa = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{d.adjusted():+03d}"


def quantity_text(value: float | str) -> str:
    """A released or noisy quantity in a sentence for people (a note's typical value and margin, a dry run's
    margins, a plot's labels): whole with thousands separators from 1,000 on (``2,683``), else 4 significant
    digits (``228``, ``0.1235``), never ``-0``; a string is read as an exact fraction (``"3/8"``)."""
    x = float(Fraction(value)) if isinstance(value, str) else float(value)
    if not math.isfinite(x):
        return str(x)
    text = f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
    return text.removeprefix("-") if float(text.replace(",", "")) == 0 else text


def utc_text(moment: datetime) -> str:
    """A moment dpcli computed, as ISO 8601 in UTC with ``Z``: ``2013-01-02T00:00:00Z`` (a naive moment is
    UTC). Fractional seconds only when they are not zero, in milliseconds or microseconds as needed
    (``…T00:00:00.500Z``, ``…T00:00:00.000500Z``), as :data:`UTC_FORMAT` writes table columns."""
    utc = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    micro = utc.microsecond
    spec = "seconds" if micro == 0 else "milliseconds" if micro % 1000 == 0 else "microseconds"
    return utc.replace(tzinfo=None).isoformat(timespec=spec) + "Z"
