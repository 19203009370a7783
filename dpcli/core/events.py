"""Privacy events: what one release costs, as frozen, JSON-serialisable data.

A mechanism returns its release together with a list of :class:`PrivacyEvent`;
the ledger turns events into spend in its accounting mode
(:mod:`dpcli.core.accounting.budget`). Amounts are exact ``Fraction``s and serialise as
``"n/d"`` strings so a ledger never accumulates float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from dpcli.core.exact import fraction_text, to_fraction

EventKind = Literal["pure", "zcdp", "approx", "br"]
_KINDS = ("pure", "zcdp", "approx", "br")


@dataclass(frozen=True)
class PrivacyEvent:
    """The privacy cost of one mechanism invocation.

    * ``pure``: ε-DP (``epsilon``). ``rdp_curve="discrete_laplace"`` marks the
      discrete Laplace on a sensitivity-1 query with scale 1/ε, whose exact RDP
      curve is tighter than the generic one.
    * ``zcdp``: ρ-zCDP (``rho``); ``delta`` is the δ the query asked for when its
      guarantee is stated as (ε, δ) (used by approx ledgers for the conversion).
      ``rdp_curve="discrete_gaussian"`` marks the discrete Gaussian on a sensitivity-1
      count with σ² = 1/(2ρ) (as the sampler rounds it), whose own privacy loss
      distribution a pld ledger composes (:mod:`dpcli.core.accounting.pld`);
      every other mode reads it as any ρ.
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
    def from_json(cls, data: dict[str, Any]) -> PrivacyEvent:
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
