"""Parsing of numeric options into exact values, with one-line errors."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Annotated

import typer

from dpcli.core.events import to_fraction
from dpcli.errors import UsageError


def parse_number(option: str, text: str | None) -> Fraction | None:
    """``text`` as an exact Fraction (decimal or n/d), or None when absent."""
    if text is None:
        return None
    try:
        value = to_fraction(text)
    except (ValueError, ArithmeticError):
        raise UsageError(f"{option} must be a number, got {text!r}") from None
    return value


def positive(option: str, text: str | None, required: bool = False) -> Fraction | None:
    """A number > 0 (ε, ρ, scales)."""
    value = parse_number(option, text)
    if value is None:
        if required:
            raise UsageError(f"{option} is required")
        return None
    if value <= 0:
        raise UsageError(f"{option} must be > 0, got {text}")
    return value


def probability(option: str, text: str | None, required: bool = False, allow_zero: bool = True) -> Fraction | None:
    """A δ in [0, 1) (or (0, 1) when ``allow_zero`` is false)."""
    value = parse_number(option, text)
    if value is None:
        if required:
            raise UsageError(f"{option} is required")
        return None
    if not (0 <= value < 1) or (value == 0 and not allow_zero):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise UsageError(f"{option} must be in {interval}, got {text}")
    if value > 0 and float(value) == 0.0:  # calibration works in floats: a δ that is 0 there is not (0, 1)
        raise UsageError(f"{option} {text} is below the smallest positive float (about 5e-324)")
    return value


def bounds(option: str, text: str | None) -> tuple[float, float] | None:
    """``LO:HI`` as two finite floats with LO < HI."""
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 2:
        raise UsageError(f"{option} must look like LO:HI (e.g. 0:600), got {text!r}")
    try:
        lo, hi = float(parts[0]), float(parts[1])
    except ValueError:
        raise UsageError(f"{option} must look like LO:HI with numbers, got {text!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        raise UsageError(f"{option} needs finite LO < HI, got {text!r}")
    return lo, hi


def columns(option: str, text: str) -> tuple[str, ...]:
    """A comma-separated list of column names (no empties, no repeats)."""
    names = tuple(c.strip() for c in text.split(","))
    if not names or any(not c for c in names):
        raise UsageError(f"{option} must be a comma-separated list of column names, got {text!r}")
    if len(set(names)) != len(names):
        raise UsageError(f"{option} lists a column twice: {text!r}")
    return names


# Shared option declarations for commands that read a table and release a result.
InputArg = Annotated[str, typer.Argument(help="Input file (CSV, Parquet or NDJSON; '-' reads stdin).", show_default=False)]
InputFormatOpt = Annotated[
    str | None, typer.Option("--input-format", help="Input format: csv, parquet or ndjson (default: from the extension).")
]
OutputOpt = Annotated[
    str | None, typer.Option("--output", "-o", help="Write the result to FILE (atomically) instead of stdout.")
]
FormatOpt = Annotated[
    str | None, typer.Option("--format", help="Output format: csv, parquet or json (default: from -o, else csv).")
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Machine-readable summary: on stdout with -o FILE; without -o, result and summary as one JSON document.",
    ),
]
UnitOpt = Annotated[str, typer.Option("--privacy-unit", help="Column identifying the privacy unit (e.g. user_id).")]
EpsilonOpt = Annotated[str | None, typer.Option("--epsilon", help="ε of this release (total over all its parts).")]
DeltaOpt = Annotated[str | None, typer.Option("--delta", help="δ of this release, in [0, 1).")]
