"""Parsing of numeric options into exact values, with one-line errors."""

from __future__ import annotations

from fractions import Fraction

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
    return value
