"""``histogram --target-moe``: the smallest ε (Laplace noise) or ρ (Gaussian noise) whose 95% margins
meet the target, from the query's plan alone (:mod:`dpcli.tasks.targets`).

Served columns: ``count`` and ``count_units`` (margins in rows or units) and ``sum_<value>`` (in the
value's units; absolute targets only). A mean's or a variance's margin depends on the released
counts, and a quantile's error is a rank, so ε cannot be chosen for them from public quantities:
naming them is refused. The margin targeted is the noise's own exact 95% margin, the one
``--dry-run`` shows (thresholded unit counts are then shown with a margin conditional on their
selection, which the target does not cover).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from dpcli.core.events import PrivacyEvent
from dpcli.errors import UsageError
from dpcli.tasks import targets
from dpcli.tasks.histogram import HistogramQuery, parse_quantile, plan_histogram

#: The measurement (and so the noise) behind each served aggregation.
SERVED = {"count": "rows", "count-units": "units", "sum": "sum"}


@dataclass(frozen=True)
class Choice:
    """What a target chose: the query at the chosen parameter, and the target, for reports."""

    query: HistogramQuery
    parameter: str  # epsilon or rho
    value: Fraction
    limits: dict[str, tuple[str, Fraction]]  # measurement → (column, the largest margin allowed, column units)
    target: targets.MarginTarget

    def to_json(self) -> dict[str, Any]:
        """The target and its choice, for ``--dry-run`` and the release's metadata (all public)."""
        margins = margins_of(self.query, self.limits)
        return {"option": self.target.field, self.parameter: targets.show(self.value),
                "size": self.target.size,
                "columns": {c: {"target": _text(limit), "moe95": margins[n]} for n, (c, limit) in self.limits.items()},
                "digits": targets.DIGITS}


def _text(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):.6g}"


def _aggregation(column: str, q: HistogramQuery) -> str:
    """The aggregation a target's column names (``count``, ``count_units``, ``sum`` or ``sum_<value>``)."""
    name = column.replace("_", "-")
    if q.value is not None and column == f"sum_{q.value}":
        name = "sum"
    if name not in q.aggregations and column not in q.aggregations:
        raise UsageError(f"names {column!r}, which the query does not release", field="target_moe")
    return name if name in q.aggregations else column


def _refuse_unserved(aggregation: str, field: str) -> None:
    if aggregation in ("mean", "variance"):
        raise UsageError(f"cannot choose ε for {aggregation}: its margin depends on the released counts; "
                         "targets serve count, count-units and sum", field=field)
    if parse_quantile(aggregation) is not None:
        raise UsageError(f"cannot choose ε for {aggregation}: a quantile's error is a rank, not a value; "
                         "targets serve count, count-units and sum", field=field)


def column_limits(q: HistogramQuery, target: targets.MarginTarget) -> dict[str, tuple[str, Fraction]]:
    """Each targeted measurement → (its output column, the target as an absolute margin in column units)."""
    wanted: dict[str, Fraction] = {}
    for column, value in target.items:
        aggregations = q.aggregations if column is None else (_aggregation(column, q),)
        for a in aggregations:
            _refuse_unserved(a, target.field)
            if target.relative and a == "sum":
                raise UsageError("is a fraction of an expected count: give sums an absolute --target-moe",
                                 field=target.field)
            wanted[a] = target.absolute(value)
    return {SERVED[a]: (f"sum_{q.value}" if a == "sum" else a.replace("-", "_"), x) for a, x in wanted.items()}


def margins_of(q: HistogramQuery, limits: dict[str, tuple[str, Fraction]]) -> dict[str, float]:
    """The targeted columns' 95% margins (column units) of the planned query."""
    plan = plan_histogram(q, "pure", {})
    scale = q.grid.granularity if q.grid is not None else Fraction(1)
    out: dict[str, float] = {}
    for name in limits:
        noise = plan.measurements[name].noise
        assert noise is not None  # served measurements are noisy counts or sums
        out[name] = float(noise.margin95() * (scale if name == "sum" else 1))
    return out


def _meets(q: HistogramQuery, limits: dict[str, tuple[str, Fraction]]) -> bool:
    """Every targeted margin within its target (exactly: integer margins × the grid against the target)."""
    plan = plan_histogram(q, "pure", {})
    scale = q.grid.granularity if q.grid is not None else Fraction(1)
    for name, (_, limit) in limits.items():
        noise = plan.measurements[name].noise
        assert noise is not None
        if noise.margin95() * (scale if name == "sum" else 1) > limit:
            return False
    return True


def _at(q: HistogramQuery, parameter: str, value: Fraction) -> HistogramQuery:
    return replace(q, rho=value) if parameter == "rho" else replace(q, epsilon=value)


def choose(q: HistogramQuery, target: targets.MarginTarget, mode: str) -> Choice:
    """The query at the smallest ε (ρ for Gaussian noise) meeting ``target`` (usage error if none does)."""
    if mode == "br":
        raise UsageError("cannot choose ε on a br ledger: its ε is the ledger's ε_per", field=target.field)
    limits = column_limits(q, target)
    parameter = "rho" if q.noise == "gaussian" else "epsilon"
    plan_histogram(_at(q, parameter, Fraction(1)), "pure", {})  # the query's own problems, reported as such

    def meets(value: Fraction) -> bool:
        try:
            return _meets(_at(q, parameter, value), limits)
        except UsageError:  # noise too wide to sample, or ε too small for Gaussian noise: not this value
            return False

    value = targets.smallest(meets)
    if value is None:
        raise UsageError(f"cannot be met by any {parameter} up to {targets.MAX_PARAMETER}", field=target.field)
    return Choice(_at(q, parameter, value), parameter, value, limits, target)


def reachable(choice: Choice, pays: Callable[[list[PrivacyEvent]], bool]) -> str:
    """Why a chosen parameter cannot be paid, with the best margins the ledger can pay now (one clause)."""
    def affordable(value: Fraction) -> bool:
        try:
            return pays(plan_histogram(_at(choice.query, choice.parameter, value), "pure", {}).events)
        except UsageError:  # too small to plan (noise too wide to sample): costs next to nothing
            return True

    best = targets.largest(affordable, choice.value)
    wanted = f"the target needs {choice.parameter}={targets.show(choice.value)}"
    try:
        margins = margins_of(_at(choice.query, choice.parameter, best), choice.limits) if best else None
    except UsageError:
        margins = None
    if best is None or margins is None:
        return f"{wanted}; the ledger cannot pay a {choice.parameter} that gives this query a usable margin now"
    shown = ", ".join(f"{c} ±{margins[n]:.6g}" for n, (c, _) in choice.limits.items())
    return f"{wanted}; the most the ledger can pay now, {choice.parameter}={targets.show(best)}, gives {shown}"


__all__ = ["SERVED", "Choice", "choose", "column_limits", "margins_of", "reachable"]
