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
========  ======================================  ==========================================

Everything except the RDP total is exact ``Fraction`` arithmetic, so ten spends
of 0.1 exhaust a limit of 1 exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable, Literal

import numpy as np

from dpcli.core import accounting as acc
from dpcli.core.exact import fraction_at_least, fraction_text, to_fraction
from dpcli.core.events import PrivacyEvent

Mode = Literal["pure", "approx", "zcdp", "rdp", "br"]
MODES: tuple[str, ...] = ("pure", "approx", "zcdp", "rdp", "br")

#: Which limit fields each mode requires (others must be absent).
LIMIT_FIELDS: dict[str, tuple[str, ...]] = {
    "pure": ("epsilon",),
    "approx": ("epsilon", "delta"),
    "zcdp": ("rho", "delta"),
    "rdp": ("epsilon", "delta"),
    "br": ("epsilon_per", "delta", "info_budget", "call_budget", "delta_prime"),
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
        wanted = LIMIT_FIELDS[self.mode]
        missing = [f for f in wanted if f not in self.values]
        if missing:
            raise ValueError(f"mode {self.mode} needs {', '.join(missing)}")
        extra = [f for f in self.values if f not in wanted]
        if extra:
            raise ValueError(f"mode {self.mode} does not take {', '.join(extra)}")
        for name, value in self.values.items():
            value = Fraction(value)
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
            self.values[name] = value
        if self.mode in ("rdp",) and self.values["delta"] == 0:
            raise ValueError("rdp mode needs δ > 0 to state an (ε, δ) guarantee")
        if self.mode == "br" and (self.values["delta"] == 0 or self.values["delta_prime"] == 0):
            raise ValueError("br mode needs δ > 0 and δ′ > 0")

    def __getitem__(self, name: str) -> Fraction:
        return self.values[name]

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, **{k: fraction_text(v) for k, v in self.values.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Limits":
        values = {k: to_fraction(v) for k, v in data.items() if k != "mode"}
        return cls(mode=str(data["mode"]), values=values)


@dataclass(frozen=True)
class Spend:
    """What a list of events has spent in one mode (fields unused by the mode are 0)."""

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    rho: Fraction = Fraction(0)
    units: int = 0
    calls: int = 0
    rdp_curve: tuple[float, ...] = ()

    def to_json(self, mode: str) -> dict[str, Any]:
        if mode == "pure":
            return {"epsilon": fraction_text(self.epsilon)}
        if mode == "approx":
            return {"epsilon": fraction_text(self.epsilon), "delta": fraction_text(self.delta)}
        if mode == "zcdp":
            return {"rho": fraction_text(self.rho), "delta": fraction_text(self.delta)}
        if mode == "rdp":
            return {"delta": fraction_text(self.delta)}
        return {"info_units": self.units, "calls": self.calls}


def _event_spend(mode: str, ev: PrivacyEvent, limits: Limits) -> Spend:
    """The spend of one event in ``mode``; raises :class:`ChargeRefused` if it cannot be charged."""
    if mode == "br":
        if ev.kind != "br":
            raise ChargeRefused(
                f"a br ledger only accepts LinkedIn-style (bounded-range) releases; "
                f"{ev.mechanism} is a {ev.kind} mechanism"
            )
        if ev.epsilon != limits["epsilon_per"]:
            raise ChargeRefused(
                f"{ev.mechanism} was calibrated to ε_per = {fraction_text(ev.epsilon)}, "
                f"the ledger's is {fraction_text(limits['epsilon_per'])}"
            )
        if ev.delta > limits["delta"] * 2 * ev.calls:
            raise ChargeRefused(f"{ev.mechanism} has a larger δ than the ledger allows per call")
        return Spend(units=ev.units, calls=ev.calls)
    # Reduce br events to the pure/approx event they imply outside br ledgers.
    if ev.kind == "br":
        eps = ev.epsilon * ev.units
        if mode == "zcdp":
            return Spend(rho=ev.epsilon * ev.epsilon * ev.units / 8, delta=ev.delta)
        ev = PrivacyEvent("approx" if ev.delta else "pure", ev.mechanism, epsilon=eps, delta=ev.delta)
    if mode == "pure":
        if ev.kind != "pure":
            raise ChargeRefused(
                f"{ev.mechanism} does not satisfy pure ε-DP; use a pure-DP noise option "
                "or a ledger in approx, zcdp or rdp mode"
            )
        return Spend(epsilon=ev.epsilon)
    if mode == "approx":
        if ev.kind == "zcdp":
            if ev.delta == 0:
                raise ChargeRefused(f"{ev.mechanism} is zCDP: give --delta so it can be charged as (ε, δ)")
            eps = fraction_at_least(acc.zcdp_to_approx(float(ev.rho), float(ev.delta)))
            return Spend(epsilon=eps, delta=ev.delta)
        return Spend(epsilon=ev.epsilon, delta=ev.delta)
    if mode == "zcdp":
        if ev.kind == "zcdp":
            return Spend(rho=ev.rho)
        return Spend(rho=ev.epsilon * ev.epsilon / 2, delta=ev.delta)
    # rdp
    if ev.kind == "zcdp":
        curve = acc.zcdp_rdp(float(ev.rho))
        return Spend(rdp_curve=tuple(curve))
    if ev.kind == "pure" and ev.rdp_curve == "discrete_laplace":
        curve = acc.discrete_laplace_rdp(float(ev.epsilon))
    else:
        curve = acc.pure_rdp(float(ev.epsilon))
    return Spend(rdp_curve=tuple(curve), delta=ev.delta if ev.kind == "approx" else Fraction(0))


def total_spend(mode: str, events: Iterable[PrivacyEvent], limits: Limits) -> Spend:
    """Compose ``events`` in ``mode`` (sums; RDP curves add pointwise)."""
    return add_spend(mode, Spend(), events, limits)


def add_spend(mode: str, base: Spend, events: Iterable[PrivacyEvent], limits: Limits) -> Spend:
    """``base`` composed with ``events`` in ``mode``: the same fold as :func:`total_spend`, continued.

    Adding events one charge at a time gives bit-for-bit the total of composing them all at once
    (the RDP curve is summed in the same order), which lets a ledger keep a running total.
    """
    eps, delta, rho, units, calls = base.epsilon, base.delta, base.rho, base.units, base.calls
    curve = np.asarray(base.rdp_curve) if base.rdp_curve else np.zeros(acc.RDP_ORDERS.size)
    for ev in events:
        s = _event_spend(mode, ev, limits)
        eps += s.epsilon
        delta += s.delta
        rho += s.rho
        units += s.units
        calls += s.calls
        if s.rdp_curve:
            curve = curve + np.asarray(s.rdp_curve)
    return Spend(eps, delta, rho, units, calls, tuple(curve) if mode == "rdp" else ())


def guarantee(limits: Limits, spend: Spend, report_delta: float | None = None) -> tuple[float, float]:
    """The overall (ε, δ)-DP guarantee of ``spend`` under the ledger's mode."""
    mode = limits.mode
    if mode == "pure":
        return float(spend.epsilon), 0.0
    if mode == "approx":
        return float(spend.epsilon), float(spend.delta)
    if mode == "zcdp":
        d = report_delta if report_delta is not None else 1e-9
        if spend.rho == 0:
            return 0.0, float(spend.delta)
        return acc.zcdp_to_approx(float(spend.rho), d), d + float(spend.delta)
    if mode == "rdp":
        target = float(limits["delta"])
        room = target - float(spend.delta)
        if room <= 0:
            return float("inf"), target
        if not any(spend.rdp_curve):
            return 0.0, float(spend.delta)
        eps, _ = acc.rdp_to_approx(np.asarray(spend.rdp_curve), room)
        return eps, target
    eps = acc.br_composition(float(limits["epsilon_per"]), spend.units, float(limits["delta_prime"]))
    dlt = 2.0 * spend.calls * float(limits["delta"]) + float(limits["delta_prime"]) if spend.units else 0.0
    return eps, dlt


def check_fits(limits: Limits, spent: Spend, extra: Spend) -> str | None:
    """``None`` if ``spent + extra`` stays within the limits, else a message saying what is short."""
    mode = limits.mode
    if mode == "pure":
        total = spent.epsilon + extra.epsilon
        if total > limits["epsilon"]:
            return _short("ε", limits["epsilon"] - spent.epsilon, extra.epsilon)
    elif mode == "approx":
        if spent.epsilon + extra.epsilon > limits["epsilon"]:
            return _short("ε", limits["epsilon"] - spent.epsilon, extra.epsilon)
        if spent.delta + extra.delta > limits["delta"]:
            return _short("δ", limits["delta"] - spent.delta, extra.delta)
    elif mode == "zcdp":
        if spent.rho + extra.rho > limits["rho"]:
            return _short("ρ", limits["rho"] - spent.rho, extra.rho)
        if spent.delta + extra.delta > limits["delta"]:
            return _short("δ", limits["delta"] - spent.delta, extra.delta)
    elif mode == "rdp":
        curve = np.asarray(spent.rdp_curve or np.zeros(acc.RDP_ORDERS.size)) + np.asarray(
            extra.rdp_curve or np.zeros(acc.RDP_ORDERS.size)
        )
        both = Spend(delta=spent.delta + extra.delta, rdp_curve=tuple(curve))
        eps, _ = guarantee(limits, both)
        if eps > float(limits["epsilon"]):
            before, _ = guarantee(limits, spent)
            return (
                f"the ledger's (ε, δ) = ({fraction_text(limits['epsilon'])}, {fraction_text(limits['delta'])}) "
                f"would be exceeded: ε would reach {eps:.4g} (now {before:.4g})"
            )
    else:
        if spent.units + extra.units > limits["info_budget"]:
            return (
                f"information budget has {int(limits['info_budget']) - spent.units} units left; "
                f"this query needs {extra.units}"
            )
        if spent.calls + extra.calls > limits["call_budget"]:
            return f"call budget has {int(limits['call_budget']) - spent.calls} calls left; this query needs {extra.calls}"
    return None


def _short(name: str, left: Fraction, need: Fraction) -> str:
    return f"{name} left is {fraction_text(max(left, Fraction(0)))}; this query needs {fraction_text(need)}"
