"""How a release names the bounds :mod:`dpcli.tasks.auto_bounds` chose and the budget that chose them (text and
metadata only: nothing here reads data; re-exported by the package)."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dpcli.core.exact import fraction_text
from dpcli.tasks.reports import AutoReport


def budget_json(epsilon: Fraction | None, rho: Fraction | None, share: Fraction) -> AutoReport:
    """A part's budget for metadata: ``{"epsilon": …}`` or ``{"rho": …}``."""
    if rho is not None:
        return {"rho": fraction_text(rho * share)}
    assert epsilon is not None
    return {"epsilon": fraction_text(epsilon * share)}


def chosen_text(chosen: Mapping[str, Any] | None) -> str:
    """The summary line's tail naming the chosen bounds (empty without): ``; chosen: max_partitions 3, …``."""
    if not chosen:
        return ""
    shown = [f"{k} {v}" for k, v in chosen.items() if k in ("max_partitions", "max_contributions")]
    if "bounds" in chosen:
        shown.append(f"bounds {chosen['bounds'][0]:.6g}:{chosen['bounds'][1]:.6g}")
    if chosen.get("reduced"):
        shown.append("reduced to the defaults (the noise at the bounds chosen was too large to sample)")
    return "; chosen: " + ", ".join(shown) if shown else ""


def rho_or_epsilon_text(epsilon: Fraction | None, rho: Fraction | None, share: Fraction) -> str:
    """How a part's budget reads: ``ε=…`` or ``ρ=…``."""
    if rho is not None:
        return f"ρ={fraction_text(rho * share)}"
    assert epsilon is not None
    return f"ε={fraction_text(epsilon * share)}"
