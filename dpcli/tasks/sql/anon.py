"""The anonymized aggregates of paper 002's Table 4.2, read from their calls with literal parameters.

=================================  ==============================================================
call                               resolves to
=================================  ==============================================================
``ANON_COUNT(*)``                  ``count`` of rows, cap U = ``--max-contributions``
``ANON_COUNT(*, U)``               ``count`` of rows, per-user cap U
``ANON_COUNT(col[, U])``           ``count`` of non-null values of ``col``, per-user cap U
``ANON_COUNT(DISTINCT unit)``      ``count_units`` (the unit column only)
``ANON_SUM(col, L, U)``            ``sum``
``ANON_AVG(col, L, U)``            ``avg``
``ANON_VAR(col, L, U)``            ``var`` (also ``ANON_VARIANCE``)
``ANON_STDDEV(col, L, U)``         ``stddev``
``ANON_NTILE(col, p, L, U)``       ``ntile`` at p ∈ [0, 1]
``ANON_MEDIAN(col, L, U)``         ``ntile`` at 1/2
``ANON_MIN`` / ``ANON_MAX``        ``ntile`` at 0 / 1
=================================  ==============================================================

Every parameter is a number literal (``literal-bounds``): a bound computed from the data would
read it before any noise.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from sqlglot import exp

from dpcli import bounding
from dpcli.errors import UsageError
from dpcli.tasks.sql.exprs import number_literal
from dpcli.tasks.sql.ir import AnonAgg, AnonFunction, Expr
from dpcli.tasks.sql.rules import refuse

#: Largest per-user cap of a count (``--max-contributions``'s range).
MAX_CAP = 10**6
#: An NTILE's fraction has a denominator of at most this (it scales the exponential mechanism's utility).
MAX_NTILE_DENOMINATOR = 10**6

#: Resolves an expression of the aggregated relation (the caller's scope).
ValueOf = Callable[[exp.Expression], Expr]


def is_anonymized(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.this).upper().startswith("ANON_")


def holds_aggregate(node: exp.Expression) -> bool:
    """Whether ``node`` is or holds an aggregate, plain or anonymized."""
    return any(isinstance(n, (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)) or is_anonymized(n)
               for n in node.walk())


def read_anon(node: exp.Anonymous, value_of: ValueOf, unit_of: Callable[[Expr], bool],
              default_cap: int) -> AnonAgg:
    """The :class:`AnonAgg` a call stands for (refused when its shape or parameters are wrong)."""
    name = str(node.this).upper()
    args = list(node.expressions)
    if name == "ANON_COUNT":
        return _count(node, args, value_of, unit_of, default_cap)
    if name in _BOUNDED:
        value, lo, hi = _bounded(node, args, 3)
        bounds = _checked_bounds(node, lo, hi, grid=True)
        if _BOUNDED[name] in ("var", "stddev") and ((bounds[1] - bounds[0]) / 2) ** 2 > MAX_VARIANCE:
            # the released variance lies in [0, ((U − L)/2)²]: beyond a double it could not be computed
            raise UsageError(f"{node.sql()[:60]}: its bounds make ((U − L)/2)² larger than 1e300 (a variance "
                             "beyond a double); use narrower bounds")
        return AnonAgg(_BOUNDED[name], value_of(value), bounds=bounds)
    if name in _NTILES:
        value, lo, hi = _bounded(node, args, 3)
        bounds = _checked_bounds(node, lo, hi)
        return AnonAgg("ntile", value_of(value), bounds=bounds, p=_NTILES[name])
    if name == "ANON_NTILE":
        if len(args) != 4:
            raise refuse("anonymized-aggregates", "ANON_NTILE takes (value, p, L, U)", node)
        p, bounds = _ntile_fraction(node, args[1]), _checked_bounds(node, args[2], args[3])
        return AnonAgg("ntile", value_of(args[0]), bounds=bounds, p=p)
    raise refuse("anonymized-aggregates", f"{name} is not an anonymized aggregate of dpcli (see Table 4.2 in "
                 "docs/commands/sql.md)", node)


#: The largest variance range ((U − L)/2)² an ANON_VAR or ANON_STDDEV may have (its values are doubles).
MAX_VARIANCE = Fraction(10**300)

_BOUNDED: dict[str, AnonFunction] = {"ANON_SUM": "sum", "ANON_AVG": "avg", "ANON_VAR": "var", "ANON_VARIANCE": "var",
            "ANON_STDDEV": "stddev"}
_NTILES = {"ANON_MEDIAN": Fraction(1, 2), "ANON_MIN": Fraction(0), "ANON_MAX": Fraction(1)}


def _count(node: exp.Anonymous, args: list[exp.Expression], value_of: ValueOf, unit_of: Callable[[Expr], bool],
           default_cap: int) -> AnonAgg:
    """ANON_COUNT(*[, U]), ANON_COUNT(col[, U]) or ANON_COUNT(DISTINCT unit)."""
    if not 1 <= len(args) <= 2:
        raise refuse("anonymized-aggregates", "ANON_COUNT takes (*), (*, U), (col), (col, U) or (DISTINCT unit)", node)
    first = args[0]
    if isinstance(first, exp.Distinct):
        inner = first.expressions
        if len(args) != 1 or len(inner) != 1 or not unit_of(value_of(inner[0])):
            raise refuse("anonymized-aggregates", "ANON_COUNT(DISTINCT …) counts the privacy unit only (a distinct "
                         "count of another column cannot be split per user)", node)
        return AnonAgg("count_units")
    cap = _cap(node, args[1]) if len(args) == 2 else default_cap
    if isinstance(first, exp.Star):
        return AnonAgg("count", cap=cap)
    return AnonAgg("count", value_of(first), cap=cap)


def _cap(node: exp.Expression, arg: exp.Expression) -> int:
    value = number_literal(arg)
    if value is None:
        raise refuse("literal-bounds", "a count's per-user cap is a number literal", node)
    if value.denominator != 1 or not 1 <= value <= MAX_CAP:
        raise UsageError(f"{node.sql()}: a count's per-user cap is a whole number in 1–{MAX_CAP}")
    return int(value)


def _bounded(node: exp.Anonymous, args: list[exp.Expression], n: int) -> tuple[exp.Expression, ...]:
    if len(args) != n:
        raise refuse("anonymized-aggregates", f"{str(node.this).upper()} takes (value, L, U)", node)
    return tuple(args)


def _checked_bounds(node: exp.Expression, lo_node: exp.Expression, hi_node: exp.Expression,
                    grid: bool = False) -> tuple[Fraction, Fraction]:
    """[L, U] as exact literals, L < U, each exactly a finite double (and a grid that can honour them)."""
    lo, hi = number_literal(lo_node), number_literal(hi_node)
    if lo is None or hi is None:
        raise refuse("literal-bounds", "the bounds L and U are number literals", node)
    if not lo < hi:
        raise UsageError(f"{node.sql()}: its bounds need L < U")
    if abs(lo) > Fraction(10**300) or abs(hi) > Fraction(10**300):
        raise UsageError(f"{node.sql()}: its bounds are beyond ±1e300")
    if grid:
        bounding.ValueGrid(float(lo), float(hi), bounding.default_granularity(float(lo), float(hi)))
    return lo, hi


def _ntile_fraction(node: exp.Expression, arg: exp.Expression) -> Fraction:
    p = number_literal(arg)
    if p is None:
        raise refuse("literal-bounds", "ANON_NTILE's fraction p is a number literal", node)
    if not 0 <= p <= 1 or p.denominator > MAX_NTILE_DENOMINATOR:
        raise UsageError(f"{node.sql()}: p must be in [0, 1] with at most 6 decimals")
    return p
