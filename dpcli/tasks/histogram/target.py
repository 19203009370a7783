"""``histogram --target-moe``: the smallest ε (Laplace noise) or ρ (Gaussian noise) whose 95% margins
meet the target, from the query's plan alone (:mod:`dpcli.tasks.targets`).

Served columns: ``count`` and ``count_units`` (margins in rows or units), ``sum_<value>`` (in the
value's units; absolute targets only) and ``mean_<value>`` for groups of at least a stated number of
rows N (``--rows N``: public, never read): the released mean is then within the target of the bounded
mean with probability at least 95% in every group of at least N bounded rows, whatever its values
(:func:`_mean_margin`). That is a bound on the mean's error, from public quantities only; the margin
``--with-error`` prints beside a released mean is a conservative interval around the released value,
computed from the released counts, and is usually wider. A quantile is served by its rank, named
``<column>_rank`` (``median_<value>_rank=500``, or ``median_rank=500``): the 95% rank margin in bounded
rows (:func:`dpcli.tasks.histogram.quantile_rank_margin`), which follows from ε's share, the sensitivity
C·max(num, den − num) and the grid's points (public: ``--bounds`` and the grid step), whatever the group's
size; its value margin depends on the data, so naming the quantile's own column is refused. A variance's
error depends on the released values: refused too. For counts and sums the margin targeted is the noise's
own exact 95% margin, the one ``--dry-run`` shows (thresholded unit counts are then shown with a margin
conditional on their selection, which the target does not cover).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from dpcli.core.events import PrivacyEvent
from dpcli.errors import UsageError
from dpcli.tasks import targets
from dpcli.tasks.histogram.plan import plan_histogram, quantile_rank_margin
from dpcli.tasks.histogram.query import HistogramQuery, parse_quantile, quantile_label, quantile_measurement

#: The measurement (and so the noise) behind each served aggregation (a quantile's rank: its own, ``q`` + p).
SERVED = {"count": "rows", "count-units": "units", "sum": "sum", "mean": "mean"}
#: How a target names a quantile's rank margin: its output column (or its aggregation) and this suffix.
RANK_SUFFIX = "_rank"


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
        margins = margins_of(self.query, self.limits, self.target.size)
        return {"option": self.target.field, self.parameter: targets.show(self.value),
                "size": self.target.size,
                "columns": {c: {"target": _text(limit), "moe95": margins[n]} for n, (c, limit) in self.limits.items()},
                "digits": targets.DIGITS}


def _text(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):.6g}"


def _quantile_named(column: str, q: HistogramQuery) -> str | None:
    """The quantile aggregation ``column`` names (``median``/``median_<value>``, ``p90``/``p90_<value>``), or None."""
    for a in q.aggregations:
        p = parse_quantile(a)
        if p is not None and column in (a, quantile_label(p), f"{quantile_label(p)}_{q.value}"):
            return a
    return None


def _aggregation(column: str, q: HistogramQuery) -> str:
    """The aggregation a target's column names (``count``, ``count_units``, ``sum``/``sum_<value>``, ``mean``/
    ``mean_<value>``; a quantile's rank: ``rank`` + the quantile, e.g. ``rank:median`` for ``median_<value>_rank``)."""
    if column.endswith(RANK_SUFFIX):
        quantile = _quantile_named(column[: -len(RANK_SUFFIX)], q)
        if quantile is not None:
            return f"rank:{quantile}"
    quantile = _quantile_named(column, q)
    if quantile is not None:
        return quantile
    name = column.replace("_", "-")
    for value_aggregation in ("sum", "mean"):
        if q.value is not None and column == f"{value_aggregation}_{q.value}":
            name = value_aggregation
    if name not in q.aggregations and column not in q.aggregations:
        raise UsageError(f"names {column!r}, which the query does not release", field="target_moe")
    return name if name in q.aggregations else column


def _refuse_unserved(aggregation: str, target: targets.MarginTarget, value: str | None) -> None:
    field = target.field
    if aggregation == "variance":
        raise UsageError("cannot choose ε for variance: its margin depends on the released values; "
                         "targets serve count, count-units, sum and mean", field=field)
    if aggregation == "mean" and (target.size is None or target.relative):
        raise UsageError("needs --rows N for a mean (the rows of the smallest group the target must hold for, "
                         "stated, never read from the data), and an absolute target", field=field)
    p = parse_quantile(aggregation)
    if p is not None:
        raise UsageError(f"cannot choose ε for {aggregation}'s value (its margin in value units depends on the data): "
                         f"target its rank margin in rows, {quantile_label(p)}_{value}{RANK_SUFFIX}=N", field=field)


def column_limits(q: HistogramQuery, target: targets.MarginTarget) -> dict[str, tuple[str, Fraction]]:
    """Each targeted measurement → (its output column, the target as an absolute margin in column units)."""
    wanted: dict[str, Fraction] = {}
    for column, value in target.items:
        aggregations = q.aggregations if column is None else (_aggregation(column, q),)
        for a in aggregations:
            if a.startswith("rank:"):
                wanted[a] = target.absolute(value)  # rows: a relative target is a share of the stated rows
                continue
            _refuse_unserved(a, target, q.value)
            if target.relative and a == "sum":
                raise UsageError("is a fraction of an expected count: give sums an absolute --target-moe",
                                 field=target.field)
            wanted[a] = target.absolute(value)
    return dict(_limit(a, x, q) for a, x in wanted.items())


def _limit(a: str, x: Fraction, q: HistogramQuery) -> tuple[str, tuple[str, Fraction]]:
    """(measurement, (column, target)) of a served aggregation (``rank:<quantile>``: the quantile's measurement)."""
    if a.startswith("rank:"):
        quantile = a.removeprefix("rank:")
        p = parse_quantile(quantile)
        measurement = quantile_measurement(quantile)
        assert p is not None and measurement is not None  # _aggregation names quantiles only
        return measurement, (f"{quantile_label(p)}_{q.value}{RANK_SUFFIX}", x)
    return SERVED[a], (f"{a}_{q.value}" if a in ("sum", "mean") else a.replace("-", "_"), x)


def _mean_margin(q: HistogramQuery, plan: Any, rows: int) -> Fraction | None:
    """A 95% bound (value units) on the error of the released mean of any group of at least ``rows`` bounded
    rows, whatever its values (None: no bound, N ≤ m_n).

    The released centred mean is (nμ + e_s)/(n + e_n) for n ≥ N true rows of centred mean μ (|μ| ≤ H, the
    bounds' half-width in grid steps) and the noises e_n, e_s of the count and the centred sum. Both lie within
    their 97.5% margins m_n, m_s with probability ≥ 95% (union bound), and then the error (e_s − μ·e_n)/(n + e_n)
    is at most (m_s + H·m_n)/(N − m_n); clamping to the bounds, which hold μ, only brings it closer."""
    from dpcli.core import intervals

    grid = q.grid
    assert grid is not None
    alpha = intervals.ALPHA / 2
    m_n = Fraction(plan.measurements["rows"].noise.margin(alpha))
    m_s = Fraction(plan.measurements["csum"].noise.margin(alpha))
    if rows <= m_n:
        return None
    return (m_s + grid.half_width_units * m_n) / (rows - m_n) * grid.granularity


def _rank_margin(q: HistogramQuery, plan: Any, name: str) -> float:
    """A quantile's 95% rank margin (bounded rows) in the planned query: public, whatever the group's size."""
    assert q.grid is not None  # a quantile reads values: validated queries have bounds
    return quantile_rank_margin(plan.measurements[name], q.grid)


def margins_of(q: HistogramQuery, limits: dict[str, tuple[str, Fraction]],
               rows: int | None = None) -> dict[str, float]:
    """The targeted columns' 95% margins (column units) of the planned query (a mean's: at ``rows``)."""
    plan = plan_histogram(q, "pure", {})
    scale = q.grid.granularity if q.grid is not None else Fraction(1)
    out: dict[str, float] = {}
    for name in limits:
        if name == "mean":
            assert rows is not None  # column_limits refuses a mean's target without --rows
            margin = _mean_margin(q, plan, rows)
            out[name] = float(margin) if margin is not None else float("inf")
            continue
        if name.startswith("q"):
            out[name] = _rank_margin(q, plan, name)
            continue
        noise = plan.measurements[name].noise
        assert noise is not None  # served measurements are noisy counts or sums
        out[name] = float(noise.margin95() * (scale if name == "sum" else 1))
    return out


def _meets(q: HistogramQuery, limits: dict[str, tuple[str, Fraction]], rows: int | None = None) -> bool:
    """Every targeted margin within its target (exactly: integer margins × the grid against the target)."""
    plan = plan_histogram(q, "pure", {})
    scale = q.grid.granularity if q.grid is not None else Fraction(1)
    for name, (_, limit) in limits.items():
        if name == "mean":
            assert rows is not None
            bound = _mean_margin(q, plan, rows)
            if bound is None or bound > limit:
                return False
            continue
        if name.startswith("q"):  # a logarithm: compared in floating point, the same way every time
            if _rank_margin(q, plan, name) > float(limit):
                return False
            continue
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
            return _meets(_at(q, parameter, value), limits, target.size)
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
        margins = (margins_of(_at(choice.query, choice.parameter, best), choice.limits, choice.target.size)
                   if best else None)
    except UsageError:
        margins = None
    if best is None or margins is None:
        return f"{wanted}; the ledger cannot pay a {choice.parameter} that gives this query a usable margin now"
    shown = ", ".join(f"{c} ±{margins[n]:.6g}" for n, (c, _) in choice.limits.items())
    return f"{wanted}; the most the ledger can pay now, {choice.parameter}={targets.show(best)}, gives {shown}"


__all__ = ["RANK_SUFFIX", "SERVED", "Choice", "choose", "column_limits", "margins_of", "reachable"]
