"""Privacy events: what one release costs, as frozen, JSON-serialisable data.

A mechanism returns its release together with a list of :class:`PrivacyEvent`;
the ledger turns events into spend in its accounting mode
(:mod:`dpcli.core.budget`). Amounts are exact ``Fraction``s and serialise as
``"n/d"`` strings so a ledger never accumulates float rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

EventKind = Literal["pure", "zcdp", "approx", "br"]
_KINDS = ("pure", "zcdp", "approx", "br")


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
    if abs(value.as_tuple().exponent) > 2 * MAX_DECIMAL_EXPONENT:  # e.g. 0E-1000000000
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


@dataclass(frozen=True)
class PrivacyEvent:
    """The privacy cost of one mechanism invocation.

    * ``pure``: ε-DP (``epsilon``). ``rdp_curve="discrete_laplace"`` marks the
      discrete Laplace on a sensitivity-1 query with scale 1/ε, whose exact RDP
      curve is tighter than the generic one.
    * ``zcdp``: ρ-zCDP (``rho``); ``delta`` is the δ the query asked for when its
      guarantee is stated as (ε, δ) (used by approx ledgers for the conversion).
    * ``approx``: (ε, δ)-DP that is not zCDP (e.g. thresholded partition selection).
    * ``br``: LinkedIn's accounting: ``units`` ε_per-bounded-range mechanisms
      (information budget), ``calls`` unknown-domain calls, failure ``delta``.
    """

    kind: EventKind
    mechanism: str
    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    rho: Fraction = Fraction(0)
    units: int = 0
    calls: int = 0
    rdp_curve: str = "pure"
    detail: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}")
        for name in ("epsilon", "delta", "rho"):
            value = Fraction(getattr(self, name))
            if value < 0:
                raise ValueError(f"{name} must be ≥ 0")
            object.__setattr__(self, name, value)
        if self.delta >= 1:
            raise ValueError("delta must be < 1")
        if self.units < 0 or self.calls < 0:
            raise ValueError("units and calls must be ≥ 0")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "mechanism": self.mechanism}
        for name in ("epsilon", "delta", "rho"):
            value = getattr(self, name)
            if value:
                out[name] = fraction_text(value)
        if self.units:
            out["units"] = self.units
        if self.calls:
            out["calls"] = self.calls
        if self.rdp_curve != "pure":
            out["rdp_curve"] = self.rdp_curve
        if self.detail:
            out["detail"] = dict(self.detail)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "PrivacyEvent":
        return cls(
            kind=data["kind"],
            mechanism=str(data.get("mechanism", "")),
            epsilon=to_fraction(data.get("epsilon", "0")),
            delta=to_fraction(data.get("delta", "0")),
            rho=to_fraction(data.get("rho", "0")),
            units=int(data.get("units", 0)),
            calls=int(data.get("calls", 0)),
            rdp_curve=str(data.get("rdp_curve", "pure")),
            detail={str(k): str(v) for k, v in data.get("detail", {}).items()},
        )
