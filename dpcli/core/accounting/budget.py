"""Accounting modes: how a ledger turns privacy events into spend, and its limits.

One ledger uses one mode, chosen at ``budget init``:

========  ======================================  ==========================================
mode      limits                                   one event costs
========  ======================================  ==========================================
pure      ε                                        ε (pure events; ``br`` events: units·ε_per)
approx    ε, δ (basic composition)                 (ε, δ); zCDP events via the optimal
                                                   conversion at the event's δ
zcdp      ρ, δ (δ-approximate zCDP)                pure ε → ε²/2; ρ; approx (ε, δ) → ε²/2 and δ;
                                                   br → units·ε_per²/8 (BR ⇒ ε²/8-zCDP) and δ
rdp       ε at target δ                            RDP curves summed over α, converted by
                                                   SafeTab eq. 6; δ parts are added
br        ε_per, δ, information budget k*,         ``br`` events only: units from k*, calls from ℓ*
          call budget ℓ*, δ′                       (LinkedIn Algorithm 5, Theorem 2)
pld       ε, δ (a filter over blocks: Σε_j, Σδ_j)  a release is one block, costed (ε_j, δ_j) by the
                                                   PLD composition of its events; a series of N
                                                   releases reserved in advance is one block, its
                                                   N-fold PLD (:mod:`dpcli.core.accounting.pld`)
========  ======================================  ==========================================

Everything except the RDP total is exact ``Fraction`` arithmetic, so ten spends
of 0.1 exhaust a limit of 1 exactly. This module holds the data (limits,
spend); :mod:`dpcli.core.accounting.accountants` holds one accountant class per mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from dpcli.core.exact import fraction_text, to_fraction

Mode = Literal["pure", "approx", "zcdp", "rdp", "br", "pld"]
MODES: tuple[str, ...] = ("pure", "approx", "zcdp", "rdp", "br", "pld")

#: Which limit fields each mode requires (others must be absent).
LIMIT_FIELDS: dict[str, tuple[str, ...]] = {
    "pure": ("epsilon",),
    "approx": ("epsilon", "delta"),
    "zcdp": ("rho", "delta"),
    "rdp": ("epsilon", "delta"),
    "br": ("epsilon_per", "delta", "info_budget", "call_budget", "delta_prime"),
    "pld": ("epsilon", "delta"),
}
_INTEGER_LIMITS = ("info_budget", "call_budget")
_MAX_INTEGER_LIMIT = 10**15  # counts of units and calls (exact in a double)
_MAX_LIMIT = Fraction(10) ** 300


class ChargeRefused(Exception):
    """An event cannot be charged in this mode, or would exceed a limit."""


@dataclass(frozen=True)
class Limits:
    """A ledger's accounting mode and its limits (exact)."""

    mode: str
    values: dict[str, Fraction] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown accounting mode {self.mode!r} (choose from {', '.join(MODES)})")
        _check_fields(self.mode, self.values)
        exact = {name: _checked_limit(name, Fraction(value)) for name, value in self.values.items()}
        object.__setattr__(self, "values", exact)  # a copy: the caller's dict is never changed
        _check_nonzero_deltas(self.mode, exact)

    def __getitem__(self, name: str) -> Fraction:
        return self.values[name]

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, **{k: fraction_text(v) for k, v in self.values.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Limits:
        values = {k: to_fraction(v) for k, v in data.items() if k != "mode"}
        return cls(mode=str(data["mode"]), values=values)


def _check_fields(mode: str, values: dict[str, Fraction]) -> None:
    """Refuse limits the mode needs but lacks (first), then limits it does not take."""
    wanted = LIMIT_FIELDS[mode]
    missing = [f for f in wanted if f not in values]
    if missing:
        raise ValueError(f"mode {mode} needs {', '.join(missing)}")
    extra = [f for f in values if f not in wanted]
    if extra:
        raise ValueError(f"mode {mode} does not take {', '.join(extra)}")


def _checked_limit(name: str, value: Fraction) -> Fraction:
    """``value`` if it is in range for the limit ``name`` (counts, probabilities, positive budgets)."""
    if name in _INTEGER_LIMITS:
        if value.denominator != 1 or not 1 <= value <= _MAX_INTEGER_LIMIT:
            raise ValueError(f"{name} must be an integer between 1 and {_MAX_INTEGER_LIMIT:.0e}")
    elif name in ("delta", "delta_prime"):
        if not 0 <= value < 1:
            raise ValueError(f"{name} must be in [0, 1)")
    elif value <= 0:
        raise ValueError(f"{name} must be > 0")
    elif value > _MAX_LIMIT:  # accounting converts limits to floats
        raise ValueError(f"{name} must be at most 1e300")
    return value


def _check_nonzero_deltas(mode: str, values: dict[str, Fraction]) -> None:
    """rdp, pld and br state an (ε, δ) guarantee: their δ (and br's δ′) must be positive."""
    if mode in ("rdp", "pld") and values["delta"] == 0:
        raise ValueError(f"{mode} mode needs δ > 0 to state an (ε, δ) guarantee")
    if mode == "br" and (values["delta"] == 0 or values["delta_prime"] == 0):
        raise ValueError("br mode needs δ > 0 and δ′ > 0")


@dataclass(frozen=True)
class Spend:
    """What a list of events has spent in one mode (fields unused by the mode are 0)."""

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    rho: Fraction = Fraction(0)
    units: int = 0
    calls: int = 0
    rdp_curve: tuple[float, ...] = ()
