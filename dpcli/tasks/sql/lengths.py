"""How long a text value of a ``dpcli sql`` query can be: a bound computed from the plan, before any read.

One record must not decide how much work a run does (README, "Threat model", rule 10), and ``g || g``
doubles a value: thirty CTEs of it would make one eight-character value eight gigabytes, for the one
person a CASE keeps it for. So every text value has a public bound, in characters:

* every text value read from a table is cut to its first :data:`MAX_TEXT_LENGTH` characters where
  the table is read (on polars and Spark alike), and a value of another type read as text (a
  number, a date, a categorical, binary data) is cut likewise where it becomes text;
* every expression's longest value follows from its arguments' (:func:`text_bound`): a literal's is
  its length, ``||`` and ``CONCAT`` add their parts', ``UPPER`` and ``LOWER`` triple theirs (one
  character can become three: ``ß`` → ``SS``, ``ΐ`` → three), ``TRIM``, ``NULLIF`` and ``CAST`` to
  text keep theirs, ``CASE`` and ``COALESCE`` take their longest value's, a sub-query's column or a
  per-user ``MIN``/``MAX`` the bound of what it holds, and a number, a boolean or a date computed by
  the query is at most :data:`SCALAR_TEXT_LENGTH` characters as text;
* a query with any expression (in any clause, sub-query or CTE, the innermost first) whose bound
  exceeds :data:`MAX_COMPUTED_TEXT_LENGTH` is refused (``text-length``, exit 2) before any data is read.

So no row holds a text value longer than :data:`MAX_COMPUTED_TEXT_LENGTH` characters, whatever its
records hold, and the text one row's expressions compute is at most that times the number of
expressions in the query: a public bound.
"""

from __future__ import annotations

from dpcli.tasks.sql.ir import (
    Aggregate,
    Col,
    Expr,
    Filter,
    Join,
    Lit,
    Op,
    Project,
    Relation,
    ResolvedQuery,
    Scan,
)
from dpcli.tasks.sql.rules import refuse

#: The most characters of a text value read from a table (a longer value is read as its first ones).
MAX_TEXT_LENGTH = 10_000
#: The most characters any text value the query computes may hold (by :func:`text_bound`).
MAX_COMPUTED_TEXT_LENGTH = 100_000
#: The most characters of a number, a boolean or a date the query computes, as text (a double's
#: longest is 24, ``-1.7976931348623157e+308``).
SCALAR_TEXT_LENGTH = 32
#: How many characters one character can become in UPPER or LOWER (Unicode's full case mappings).
CASE_MAPPING_GROWTH = 3

#: Operators whose value is their first argument's, shortened or as it is (or NULL).
_KEEPING = frozenset({"nullif", "trim", "cast_text"})
#: How the operators of :mod:`dpcli.tasks.sql.exprs` are spelt in a refusal.
_SPELLING = {"concat": "||", "upper": "UPPER", "lower": "LOWER"}


class Bounds:
    """The length bounds of the columns of a query's relations (internal names), as they are computed."""

    def __init__(self) -> None:
        self.columns: dict[str, int] = {}

    def of(self, e: Expr) -> int:
        """``e``'s bound (each sub-expression's checked first: refused over the cap)."""
        if isinstance(e, Col):
            return self.columns.get(e.name, MAX_TEXT_LENGTH)  # a table's column: cut where it is read
        if isinstance(e, Lit):
            return _literal_bound(e)
        parts = [self.of(a) for a in e.args]
        bound = _op_bound(e, parts)
        if bound > MAX_COMPUTED_TEXT_LENGTH:
            what = _SPELLING.get(e.op, e.op.upper())
            raise refuse("text-length", f"a text value of the query may be longer than "
                         f"{MAX_COMPUTED_TEXT_LENGTH:,} characters ({what} can make {bound:,}: a table's text "
                         f"is read as its first {MAX_TEXT_LENGTH:,}, || adds its parts' lengths, UPPER and "
                         f"LOWER may triple one)")
        return bound

    def relation(self, rel: Relation) -> None:
        """Check every expression of ``rel`` and record the bounds of the columns it computes."""
        if isinstance(rel, Scan):
            return
        if isinstance(rel, Join):
            self._join(rel)
            return
        self.relation(rel.input)
        if isinstance(rel, Filter):
            self.of(rel.condition)
        elif isinstance(rel, Project):
            for name, e in rel.items:
                self.columns[name] = self.of(e)
        else:
            self._aggregate(rel)

    def _join(self, rel: Join) -> None:
        self.relation(rel.left)
        self.relation(rel.right)
        for e in [*(e for pair in rel.on for e in pair), *([rel.extra] if rel.extra is not None else [])]:
            self.of(e)
        for name, left, right in rel.merged:
            self.columns[name] = max(self.of(Col(left)), self.of(Col(right)))

    def _aggregate(self, rel: Aggregate) -> None:
        for name, e in rel.keys:
            self.columns[name] = self.of(e)
        for name, call in rel.aggs:
            bound = self.of(call.arg) if call.arg is not None else SCALAR_TEXT_LENGTH
            self.columns[name] = bound if call.function in ("min", "max") else SCALAR_TEXT_LENGTH


def _literal_bound(e: Lit) -> int:
    return len(e.value) if isinstance(e.value, str) else 0 if e.value is None else SCALAR_TEXT_LENGTH


def _op_bound(e: Op, parts: list[int]) -> int:
    """An operator's bound from its arguments' (see the module docstring)."""
    if e.op == "concat":
        return sum(parts)
    if e.op in ("upper", "lower"):
        return CASE_MAPPING_GROWTH * parts[0]
    if e.op == "case":  # (condition, value, …, default): the values only
        return max([*parts[1:-1:2], parts[-1]])
    if e.op == "coalesce":
        return max(parts)
    if e.op in _KEEPING:
        return parts[0]
    return SCALAR_TEXT_LENGTH  # numbers, booleans, dates


def check_text_lengths(query: ResolvedQuery) -> None:
    """Refuse (``text-length``, exit 2) a query with an expression whose text may exceed
    :data:`MAX_COMPUTED_TEXT_LENGTH` characters: its relation's, its group keys' and its aggregated values'."""
    bounds = Bounds()
    bounds.relation(query.relation)
    for e in query.groups:
        bounds.of(e)
    for agg in query.aggregates:
        if agg.value is not None:
            bounds.of(agg.value)


__all__ = ["CASE_MAPPING_GROWTH", "MAX_COMPUTED_TEXT_LENGTH", "MAX_TEXT_LENGTH", "SCALAR_TEXT_LENGTH", "Bounds",
           "check_text_lengths"]
