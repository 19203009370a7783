"""Command-line spellings of durations (``--window 1d``) and moments (``--through 2026-11-02``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dpcli.errors import UsageError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``6h``, ``1d`` → seconds (positive)."""
    t = text.strip().lower()
    try:
        if t and t[-1] in _UNITS:
            value = int(t[:-1]) * _UNITS[t[-1]]
        else:
            value = int(t)
    except ValueError:
        raise UsageError(f"cannot read duration {text!r} (use e.g. 90s, 15m, 6h, 1d)") from None
    if value <= 0:
        raise UsageError(f"duration {text!r} must be positive")
    return value


def parse_moment(text: str) -> datetime:
    """``--through``: ISO 8601 (naive means UTC) or integer epoch seconds; a usage error otherwise."""
    try:
        if text.strip().lstrip("-").isdigit():
            return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=int(text))
        moment = datetime.fromisoformat(text.strip())
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"cannot read --through {text!r} (use e.g. 2026-11-02T00:00:00 or epoch seconds)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
