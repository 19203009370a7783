"""The resolved plan of a ``dpcli sql`` query: typed, validated, and independent of how it was spelt.

The resolver (:mod:`dpcli.tasks.sql.query`) turns sqlglot's syntax tree into these frozen
objects before any data is read; the compiler (:mod:`dpcli.tasks.sql.compile`) turns them into
polars lazy frames, and the Spark engine into Spark SQL. Nothing else of the query text survives:
aliases, letter case, quoting and the ``WITH ANONYMIZATION`` marker are gone, so two spellings of
one query resolve to one plan, and :func:`canonical` of the plan is what the release seed binds.

Columns are named internally: ``s<i>.<column>`` for column ``<column>`` of the i-th table read
(in the order the query names them), ``c<j>`` for the j-th column the query computes. Every
relation knows its privacy-unit column (``unit``; None for a relation of public tables only).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from dpcli.tasks import free_replay

# ---- scalar expressions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """A column of the relation the expression is evaluated on (its internal name)."""

    name: str


@dataclass(frozen=True)
class Lit:
    """A literal: an exact number, text, a boolean, or NULL (None)."""

    value: Fraction | str | bool | None


@dataclass(frozen=True)
class Op:
    """An operator or function applied to its arguments (the names are :data:`dpcli.tasks.sql.exprs.OPS`'s)."""

    op: str
    args: tuple[Expr, ...]


Expr = Col | Lit | Op


def expr_canonical(e: Expr) -> Any:
    """An expression as plain data (exact numbers, literal kinds kept apart)."""
    if isinstance(e, Col):
        return {"col": e.name}
    if isinstance(e, Lit):
        v = e.value
        if v is None:
            return {"null": True}
        if isinstance(v, bool):
            return {"bool": v}
        if isinstance(v, Fraction):
            return {"num": f"{v.numerator}/{v.denominator}"}
        return {"text": v}
    return {"op": e.op, "args": [expr_canonical(a) for a in e.args]}


def columns_of(e: Expr) -> set[str]:
    """The internal names of the columns ``e`` reads."""
    if isinstance(e, Col):
        return {e.name}
    if isinstance(e, Lit):
        return set()
    return set().union(*(columns_of(a) for a in e.args)) if e.args else set()


# ---- relations ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scan:
    """One read of a declared table: its columns become ``<prefix>.<column>``."""

    table: str
    prefix: str
    unit: str | None  # internal name of its privacy-unit column; None: a public table


@dataclass(frozen=True)
class Filter:
    """Rows of ``input`` for which ``condition`` is true (SQL's WHERE and a sub-query's HAVING)."""

    input: Relation
    condition: Expr

    @property
    def unit(self) -> str | None:
        return self.input.unit


@dataclass(frozen=True)
class Project:
    """New columns computed from each row of ``input`` (a SELECT list); the unit column is carried."""

    input: Relation
    items: tuple[tuple[str, Expr], ...]
    unit: str | None
    distinct: bool = False


JoinHow = Literal["inner", "left", "right", "full", "cross"]


@dataclass(frozen=True)
class Join:
    """``left`` joined with ``right`` on key pairs (``on``: column equalities), then ``extra`` (inner joins only).

    ``merged``: columns that hold either side's value (SQL's USING columns, and the privacy unit
    of a join of two private relations): (name, left column, right column).
    """

    left: Relation
    right: Relation
    how: JoinHow
    on: tuple[tuple[Expr, Expr], ...]
    extra: Expr | None
    merged: tuple[tuple[str, str, str], ...]
    unit: str | None


@dataclass(frozen=True)
class AggCall:
    """A plain SQL aggregate of a sub-query grouped by the unit (per user: COUNT, SUM, AVG, MIN, MAX)."""

    function: str  # count_rows, count, count_distinct, sum, avg, min, max
    arg: Expr | None


@dataclass(frozen=True)
class Aggregate:
    """A sub-query's GROUP BY: one row per distinct key (the privacy unit among them for private rows)."""

    input: Relation
    keys: tuple[tuple[str, Expr], ...]
    aggs: tuple[tuple[str, AggCall], ...]
    unit: str | None


Relation = Scan | Filter | Project | Join | Aggregate


def unit_columns(r: Relation) -> frozenset[str]:
    """The columns of ``r`` that hold its privacy unit on every row (none for public rows): the unit itself
    and, through joins, the sides' own unit columns where the join keeps every row of that side as it is
    (an inner join keeps both: their unit columns are equal on every joined row; a LEFT JOIN keeps the left
    side's, a RIGHT JOIN the right's; a FULL JOIN only the merged unit). A projection or an aggregate
    carries the one unit column it names."""
    if r.unit is None:
        return frozenset()
    if isinstance(r, Filter):
        return frozenset({r.unit}) | unit_columns(r.input)
    if not isinstance(r, Join):
        return frozenset({r.unit})
    kept = {"inner": (r.left, r.right), "left": (r.left,), "right": (r.right,)}.get(r.how, ())
    sides = [unit_columns(side) for side in kept if side.unit is not None]
    private = [side for side in (r.left, r.right) if side.unit is not None]
    if len(private) == 1 and private[0].unit == r.unit:  # a join with public rows keeps the private side's
        return frozenset({r.unit}) | unit_columns(private[0])
    return frozenset({r.unit}).union(*sides)


def relation_canonical(r: Relation) -> Any:
    """A relation as plain data (what the seed binds)."""
    if isinstance(r, Scan):
        return {"scan": r.table, "as": r.prefix, "unit": r.unit}
    if isinstance(r, Filter):
        return {"filter": relation_canonical(r.input), "where": expr_canonical(r.condition)}
    if isinstance(r, Project):
        return {"project": relation_canonical(r.input), "distinct": r.distinct, "unit": r.unit,
                "items": [[n, expr_canonical(e)] for n, e in r.items]}
    if isinstance(r, Join):
        return {"join": r.how, "left": relation_canonical(r.left), "right": relation_canonical(r.right),
                "on": [[expr_canonical(a), expr_canonical(b)] for a, b in r.on],
                "extra": expr_canonical(r.extra) if r.extra is not None else None,
                "merged": [list(m) for m in r.merged], "unit": r.unit}
    return {"aggregate": relation_canonical(r.input), "unit": r.unit,
            "keys": [[n, expr_canonical(e)] for n, e in r.keys],
            "aggs": [[n, a.function, expr_canonical(a.arg) if a.arg is not None else None] for n, a in r.aggs]}


def column_source(r: Relation, name: str) -> tuple[str, str] | None:
    """The declared table and its column whose values column ``name`` of ``r`` holds as read (through
    filters, joins, sub-query columns and keys that name it, and a sub-query's MIN or MAX of it); None
    when the query computes it."""
    if isinstance(r, Scan):
        prefix = r.prefix + "."
        return (r.table, name[len(prefix):]) if name.startswith(prefix) else None
    if isinstance(r, Filter):
        return column_source(r.input, name)
    if isinstance(r, Join):
        merged = next(((lcol, rcol) for m, lcol, rcol in r.merged if m == name), (name, name))
        return column_source(r.left, merged[0]) or column_source(r.right, merged[1])
    if isinstance(r, Project):
        expr = dict(r.items).get(name)
    else:
        calls = {n: a.arg for n, a in r.aggs if a.function in ("min", "max")}
        expr = dict(r.keys).get(name) or calls.get(name)
    if expr is None and name == r.unit:
        return column_source(r.input, name)  # the unit column, carried
    return column_source(r.input, expr.name) if isinstance(expr, Col) else None


def scans_of(r: Relation) -> list[Scan]:
    """Every table read of ``r``, in the order the query names them."""
    if isinstance(r, Scan):
        return [r]
    if isinstance(r, Join):
        return scans_of(r.left) + scans_of(r.right)
    return scans_of(r.input)


def expressions_of(r: Relation) -> list[Expr]:
    """Every scalar expression evaluated anywhere in ``r`` (to find the columns each table must hold)."""
    if isinstance(r, Scan):
        return []
    if isinstance(r, Filter):
        return [r.condition, *expressions_of(r.input)]
    if isinstance(r, Project):
        return [e for _, e in r.items] + expressions_of(r.input)
    if isinstance(r, Join):
        pairs = [e for pair in r.on for e in pair]
        extra = [r.extra] if r.extra is not None else []
        merged = [Col(c) for _, left, right in r.merged for c in (left, right)]
        return pairs + extra + merged + expressions_of(r.left) + expressions_of(r.right)
    keys = [e for _, e in r.keys]
    args = [a.arg for _, a in r.aggs if a.arg is not None]
    return keys + args + expressions_of(r.input)


# ---- the anonymized aggregation -----------------------------------------------------------------

#: The functions of paper 002's Table 4.2 as dpcli resolves them (MEDIAN, MIN and MAX are NTILEs).
AnonFunction = Literal["count", "count_units", "sum", "avg", "var", "stddev", "ntile"]


@dataclass(frozen=True)
class AnonAgg:
    """One anonymized aggregate with its literal parameters resolved (defaults filled in).

    ``value``: the expression aggregated (None for ``ANON_COUNT(*)`` and ``ANON_COUNT(DISTINCT unit)``);
    ``cap``: a count's per-user cap U; ``bounds``: [L, U] of a value; ``p``: an NTILE's fraction.
    """

    function: AnonFunction
    value: Expr | None = None
    cap: int | None = None
    bounds: tuple[Fraction, Fraction] | None = None
    p: Fraction | None = None

    def canonical(self) -> dict[str, Any]:
        return {"function": self.function, "value": expr_canonical(self.value) if self.value is not None else None,
                "cap": self.cap, "bounds": [_frac(b) for b in self.bounds] if self.bounds else None,
                "p": _frac(self.p) if self.p is not None else None}


def _frac(x: Fraction) -> str:
    return f"{x.numerator}/{x.denominator}"


@dataclass(frozen=True)
class OutputColumn:
    """One column of the released table: a group key (``group`` index) or an aggregate (``aggregate`` index)."""

    name: str
    group: int | None = None
    aggregate: int | None = None


@dataclass(frozen=True)
class PostStep:
    """What is applied to the noisy table after the release (HAVING, ORDER BY, LIMIT): post-processing.

    ``having`` is an expression over the output columns (``Col`` names are output column names);
    ``order`` lists (output column, descending); ``limit`` keeps the first rows.
    """

    having: Expr | None = None
    order: tuple[tuple[str, bool], ...] = ()
    limit: int | None = None


@dataclass(frozen=True)
class ResolvedQuery:
    """A ``dpcli sql`` query, resolved: the private relation, its grouping and its anonymized aggregates.

    ``groups`` are expressions over ``relation``'s columns; ``aggregates`` are sorted by their
    canonical form, so their order in the SELECT list is presentation only (``outputs``).
    """

    relation: Relation
    groups: tuple[Expr, ...]
    aggregates: tuple[AnonAgg, ...]
    outputs: tuple[OutputColumn, ...] = free_replay("sql output aliases", "sql SELECT order", default=())
    post: PostStep = free_replay("sql HAVING", "sql ORDER BY", "sql LIMIT", default=PostStep())

    @property
    def unit(self) -> str:
        assert self.relation.unit is not None  # the resolver refuses a query over public tables only
        return self.relation.unit

    @property
    def group_names(self) -> tuple[str, ...]:
        """The output names of the group keys, in key order."""
        names = {o.group: o.name for o in self.outputs if o.group is not None}
        return tuple(names[i] for i in range(len(self.groups)))

    def canonical(self) -> dict[str, Any]:
        """What shapes the released values (the seed binds it): not aliases, column order or post-processing."""
        return {"relation": relation_canonical(self.relation), "groups": [expr_canonical(g) for g in self.groups],
                "aggregates": [a.canonical() for a in self.aggregates]}
