"""One accountant per ledger mode: how privacy events compose into spend, and what that guarantees.

An accountant is built from a ledger's :class:`~dpcli.core.accounting.budget.Limits` and is pure: it folds
:class:`~dpcli.core.events.PrivacyEvent` data into a :class:`~dpcli.core.accounting.budget.Spend`
(:meth:`Accountant.spend`), says whether more fits (:meth:`Accountant.fits`), states the overall
(ε, δ) (:meth:`Accountant.guarantee`) and what is left (:meth:`Accountant.remaining`), in the manner
of Google's ``dp_accounting`` (events as data, one accountant per method). The table of modes is in
:mod:`dpcli.core.accounting.budget`.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

from dpcli.core.accounting import composition as acc
from dpcli.core.accounting.budget import ChargeRefused, Limits, Spend
from dpcli.core.display import parameter_text
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_at_least, fraction_text

if TYPE_CHECKING:
    import numpy as np


def _start_curve(base: Spend) -> np.ndarray:
    """``base``'s RDP curve over :func:`dpcli.core.accounting.composition.rdp_orders` (zeros if none)."""
    import numpy as np  # only RDP ledgers need numpy

    return np.asarray(base.rdp_curve) if base.rdp_curve else np.zeros(acc.rdp_orders().size)


def _add_curve(curve: np.ndarray, rdp_curve: tuple[float, ...]) -> np.ndarray:
    import numpy as np

    added: np.ndarray = curve + np.asarray(rdp_curve)
    return added


class Accountant:
    """Composition of privacy events under one ledger's limits (subclassed per mode)."""

    mode: ClassVar[str]

    def __init__(self, limits: Limits) -> None:
        if limits.mode != self.mode:
            raise ValueError(f"a {self.mode} accountant cannot keep a {limits.mode} ledger")
        self.limits = limits

    def cost(self, ev: PrivacyEvent) -> Spend:
        """The spend of one event; :class:`ChargeRefused` if this mode cannot charge it."""
        raise NotImplementedError

    def spend(self, events: Iterable[PrivacyEvent], base: Spend | None = None) -> Spend:
        """``base`` (default: nothing) composed with ``events``: sums, RDP curves added pointwise in order.

        Adding events one charge at a time gives bit-for-bit the total of composing them all at once,
        which lets a ledger keep a running total.
        """
        base = base or Spend()
        eps, delta, rho, units, calls = base.epsilon, base.delta, base.rho, base.units, base.calls
        curve = _start_curve(base) if self.mode == "rdp" else None  # only RDP ledgers keep a curve
        for ev in events:
            s = self.cost(ev)
            eps += s.epsilon
            delta += s.delta
            rho += s.rho
            units += s.units
            calls += s.calls
            if curve is not None and s.rdp_curve:
                curve = _add_curve(curve, s.rdp_curve)
        return Spend(eps, delta, rho, units, calls, tuple(curve) if curve is not None else ())

    def fits(self, spent: Spend, extra: Spend) -> str | None:
        """``None`` if ``spent + extra`` stays within the limits, else a message saying what is short."""
        raise NotImplementedError

    def guarantee(self, spend: Spend, report_delta: float | None = None) -> tuple[float, float]:
        """The overall (ε, δ)-DP guarantee of ``spend``."""
        raise NotImplementedError

    def remaining(self, spent: Spend) -> dict[str, str]:
        """What is left of each limit, as exact text (RDP: the ε reached so far)."""
        raise NotImplementedError

    def spent_json(self, spend: Spend) -> dict[str, Any]:
        """The fields of ``spend`` this mode counts, as exact text."""
        raise NotImplementedError

    def _left(self, name: str, spent: Fraction) -> str:
        return fraction_text(self.limits[name] - spent)

    def _over(self, symbol: str, name: str, spent: Fraction, need: Fraction) -> str | None:
        if spent + need <= self.limits[name]:
            return None
        left = max(self.limits[name] - spent, Fraction(0))
        unset = f" (the ledger's {symbol} limit is 0)" if self.limits[name] == 0 else ""
        return (f"{symbol} left is {parameter_text(left, 'down')}{unset}; this query needs "
                f"{parameter_text(need, 'up')}")


def _br_as_approx(ev: PrivacyEvent) -> PrivacyEvent:
    """A bounded-range event outside a br ledger: the pure/approx event of its units·ε_per."""
    return PrivacyEvent("approx" if ev.delta else "pure", ev.mechanism, epsilon=ev.epsilon * ev.units, delta=ev.delta)


class PureAccountant(Accountant):
    """Pure ε-DP, basic composition."""

    mode = "pure"

    def cost(self, ev: PrivacyEvent) -> Spend:
        if ev.kind == "br":
            ev = _br_as_approx(ev)
        if ev.kind != "pure":
            why = "has a δ" if ev.kind == "approx" else "is zCDP"
            raise ChargeRefused(
                f"{ev.mechanism} {why}, which a pure ε-DP ledger cannot pay: release with pure ε-DP noise and no δ "
                "(Laplace noise over a public list of groups, not groups discovered from the data), "
                "or use a ledger in approx, zcdp or rdp mode"
            )
        return Spend(epsilon=ev.epsilon)

    def fits(self, spent: Spend, extra: Spend) -> str | None:
        return self._over("ε", "epsilon", spent.epsilon, extra.epsilon)

    def guarantee(self, spend: Spend, report_delta: float | None = None) -> tuple[float, float]:
        return float(spend.epsilon), 0.0

    def remaining(self, spent: Spend) -> dict[str, str]:
        return {"epsilon": self._left("epsilon", spent.epsilon)}

    def spent_json(self, spend: Spend) -> dict[str, Any]:
        return {"epsilon": fraction_text(spend.epsilon)}


class ApproxAccountant(Accountant):
    """(ε, δ)-DP, basic composition; zCDP events converted at their own δ."""

    mode = "approx"

    def cost(self, ev: PrivacyEvent) -> Spend:
        if ev.kind == "br":
            ev = _br_as_approx(ev)
        if ev.kind == "zcdp":
            if ev.delta == 0:
                raise ChargeRefused(f"{ev.mechanism} is zCDP: give --delta so it can be charged as (ε, δ)")
            eps = fraction_at_least(acc.zcdp_to_approx(float(ev.rho), float(ev.delta)))
            return Spend(epsilon=eps, delta=ev.delta)
        return Spend(epsilon=ev.epsilon, delta=ev.delta)

    def fits(self, spent: Spend, extra: Spend) -> str | None:
        return (self._over("ε", "epsilon", spent.epsilon, extra.epsilon)
                or self._over("δ", "delta", spent.delta, extra.delta))

    def guarantee(self, spend: Spend, report_delta: float | None = None) -> tuple[float, float]:
        return float(spend.epsilon), float(spend.delta)

    def remaining(self, spent: Spend) -> dict[str, str]:
        return {"epsilon": self._left("epsilon", spent.epsilon), "delta": self._left("delta", spent.delta)}

    def spent_json(self, spend: Spend) -> dict[str, Any]:
        return {"epsilon": fraction_text(spend.epsilon), "delta": fraction_text(spend.delta)}


class ZcdpAccountant(Accountant):
    """δ-approximate zCDP: ρ adds up, δ parts add up; stated as (ε, δ) at the ledger's report δ."""

    mode = "zcdp"

    def cost(self, ev: PrivacyEvent) -> Spend:
        if ev.kind == "br":  # bounded range ⇒ ε²/8-zCDP per unit
            return Spend(rho=ev.epsilon * ev.epsilon * ev.units / 8, delta=ev.delta)
        if ev.kind == "zcdp":
            return Spend(rho=ev.rho)
        return Spend(rho=ev.epsilon * ev.epsilon / 2, delta=ev.delta)

    def fits(self, spent: Spend, extra: Spend) -> str | None:
        return self._over("ρ", "rho", spent.rho, extra.rho) or self._over("δ", "delta", spent.delta, extra.delta)

    def guarantee(self, spend: Spend, report_delta: float | None = None) -> tuple[float, float]:
        d = report_delta if report_delta is not None else 1e-9
        if spend.rho == 0:
            return 0.0, float(spend.delta)
        return acc.zcdp_to_approx(float(spend.rho), d), d + float(spend.delta)

    def remaining(self, spent: Spend) -> dict[str, str]:
        return {"rho": self._left("rho", spent.rho), "delta": self._left("delta", spent.delta)}

    def spent_json(self, spend: Spend) -> dict[str, Any]:
        return {"rho": fraction_text(spend.rho), "delta": fraction_text(spend.delta)}


class RdpAccountant(Accountant):
    """Rényi DP: curves over the orders add up; the ε at the ledger's δ must stay within its ε."""

    mode = "rdp"

    def cost(self, ev: PrivacyEvent) -> Spend:
        if ev.kind == "br":
            ev = _br_as_approx(ev)
        if ev.kind == "zcdp":
            return Spend(rdp_curve=tuple(acc.zcdp_rdp(float(ev.rho))))
        if ev.kind == "pure" and ev.rdp_curve == "discrete_laplace":
            curve = acc.discrete_laplace_rdp(float(ev.epsilon))
        else:
            curve = acc.pure_rdp(float(ev.epsilon))
        return Spend(rdp_curve=tuple(curve), delta=ev.delta if ev.kind == "approx" else Fraction(0))

    def fits(self, spent: Spend, extra: Spend) -> str | None:
        import numpy as np

        zeros = np.zeros(acc.rdp_orders().size)
        curve = np.asarray(spent.rdp_curve or zeros) + np.asarray(extra.rdp_curve or zeros)
        eps, _ = self.guarantee(Spend(delta=spent.delta + extra.delta, rdp_curve=tuple(curve)))
        if eps <= float(self.limits["epsilon"]):
            return None
        before, _ = self.guarantee(spent)
        return (
            f"the ledger's (ε, δ) = ({fraction_text(self.limits['epsilon'])}, {fraction_text(self.limits['delta'])}) "
            f"would be exceeded: ε would reach {parameter_text(eps, 'up')} (now {parameter_text(before, 'up')})"
        )

    def guarantee(self, spend: Spend, report_delta: float | None = None) -> tuple[float, float]:
        target = float(self.limits["delta"])
        room = target - float(spend.delta)
        if room <= 0:
            return float("inf"), target
        if not any(spend.rdp_curve):
            return 0.0, float(spend.delta)
        eps, _ = acc.rdp_to_approx(spend.rdp_curve, room)
        return eps, target

    def remaining(self, spent: Spend) -> dict[str, str]:
        eps, _ = self.guarantee(spent)
        return {"epsilon_reached": f"{eps:.6g}", "epsilon_limit": fraction_text(self.limits["epsilon"])}

    def spent_json(self, spend: Spend) -> dict[str, Any]:
        return {"delta": fraction_text(spend.delta)}


class BrAccountant(Accountant):
    """LinkedIn's budget system: bounded-range releases count units (k*) and calls (ℓ*)."""

    mode = "br"

    def cost(self, ev: PrivacyEvent) -> Spend:
        if ev.kind != "br":
            raise ChargeRefused(
                f"a br ledger only accepts LinkedIn-style (bounded-range) releases; "
                f"{ev.mechanism} is a {ev.kind} mechanism"
            )
        if ev.epsilon != self.limits["epsilon_per"]:
            raise ChargeRefused(
                f"{ev.mechanism} was calibrated to ε_per = {fraction_text(ev.epsilon)}, "
                f"the ledger's is {fraction_text(self.limits['epsilon_per'])}"
            )
        if ev.delta > self.limits["delta"] * 2 * ev.calls:
            raise ChargeRefused(f"{ev.mechanism} has a larger δ than the ledger allows per call")
        return Spend(units=ev.units, calls=ev.calls)

    def fits(self, spent: Spend, extra: Spend) -> str | None:
        if spent.units + extra.units > self.limits["info_budget"]:
            return (
                f"information budget has {int(self.limits['info_budget']) - spent.units} units left; "
                f"this query needs {extra.units}"
            )
        if spent.calls + extra.calls > self.limits["call_budget"]:
            return (f"call budget has {int(self.limits['call_budget']) - spent.calls} calls left; "
                    f"this query needs {extra.calls}")
        return None

    def guarantee(self, spend: Spend, report_delta: float | None = None) -> tuple[float, float]:
        lim = self.limits
        eps = acc.br_composition(float(lim["epsilon_per"]), spend.units, float(lim["delta_prime"]))
        dlt = 2.0 * spend.calls * float(lim["delta"]) + float(lim["delta_prime"]) if spend.units else 0.0
        return eps, dlt

    def remaining(self, spent: Spend) -> dict[str, str]:
        return {"info_units": str(int(self.limits["info_budget"]) - spent.units),
                "calls": str(int(self.limits["call_budget"]) - spent.calls)}

    def spent_json(self, spend: Spend) -> dict[str, Any]:
        return {"info_units": spend.units, "calls": spend.calls}


class PldAccountant(ApproxAccountant):
    """Privacy loss distributions within a block, basic composition across blocks (a privacy filter).

    :meth:`spend` takes its ``events`` as *one block*: one release, composed by their PLDs
    (:func:`dpcli.core.accounting.pld.block_cost`), at its own δ; :meth:`series` is N releases of one cost
    reserved in advance. Blocks add up as (Σε_j, Σδ_j), the rule that stays valid when each block is chosen
    after the outputs of the earlier ones and the ledger refuses past its limits (docs/accounting.md). So, unlike
    the other modes, k charges of one release cost k times one charge, not the PLD of all k events at once.
    """

    mode = "pld"

    def cost(self, ev: PrivacyEvent) -> Spend:
        return self.spend([ev])

    def spend(self, events: Iterable[PrivacyEvent], base: Spend | None = None) -> Spend:
        return self._add(base, self.block(list(events)))

    def block(self, events: list[PrivacyEvent], count: int = 1, delta: Fraction | None = None) -> Spend:
        """The cost of one block (a release, or ``count`` of them at ``delta``)."""
        if not events:
            return Spend()
        from dpcli.core.accounting import pld  # dp_accounting only when a pld ledger costs something

        if not pld.available():  # refused before the release reads anything, even where no PLD is needed
            raise pld.PldUnavailable()
        eps, dlt = pld.block_cost(events, count, delta)
        return Spend(epsilon=eps, delta=dlt)

    def series(self, events: list[PrivacyEvent], count: int, delta: Fraction) -> Spend:
        """``count`` releases costing ``events``, reserved in advance, stated at ``delta``: one block."""
        return self.block(events, count, delta)

    @staticmethod
    def _add(base: Spend | None, extra: Spend) -> Spend:
        base = base or Spend()
        return Spend(epsilon=base.epsilon + extra.epsilon, delta=base.delta + extra.delta)


#: The accountant class of each ledger mode.
ACCOUNTANTS: dict[str, type[Accountant]] = {
    cls.mode: cls for cls in (PureAccountant, ApproxAccountant, ZcdpAccountant, RdpAccountant, BrAccountant,
                              PldAccountant)
}


def accountant_for(limits: Limits) -> Accountant:
    """The accountant that keeps a ledger with these limits."""
    return ACCOUNTANTS[limits.mode](limits)
