"""The outer query: paper 002's anonymized aggregation, resolved before any data is read.

``SELECT [WITH ANONYMIZATION] keys…, ANON_…(…)… FROM … [WHERE …] [GROUP BY keys] [HAVING …]
[ORDER BY …] [LIMIT n]``: the FROM clause and WHERE make the private relation (under the ownership
rules of :mod:`dpcli.tasks.sql.relations`); GROUP BY makes the partitions; every SELECT item is a
group key or one anonymized aggregate. HAVING, ORDER BY and LIMIT act on the released (noisy)
table only: post-processing, which costs nothing and reveals nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from dpcli.errors import DataError, UsageError
from dpcli.tasks.sql import exprs
from dpcli.tasks.sql.anon import holds_aggregate, is_anonymized, read_anon
from dpcli.tasks.sql.ir import AnonAgg, Col, Expr, OutputColumn, PostStep, ResolvedQuery, unit_columns
from dpcli.tasks.sql.lengths import check_text_lengths
from dpcli.tasks.sql.parse import parse_query
from dpcli.tasks.sql.relations import Resolver, RowContext
from dpcli.tasks.sql.rules import refuse
from dpcli.tasks.sql.scope import TableDecl, identifier

#: The clauses of the outer query (sqlglot's argument names); others are refused.
OUTER_CLAUSES = frozenset({"expressions", "from_", "joins", "where", "group", "having", "order", "limit", "with_"})


def resolve_query(text: str | exp.Select, tables: Mapping[str, TableDecl], default_cap: int = 1) -> ResolvedQuery:
    """Parse (unless ``text`` is already :func:`dpcli.tasks.sql.parse.parse_query`'s tree: the query is parsed once)
    and resolve a ``dpcli sql`` query over ``tables`` (``default_cap``: ANON_COUNT's cap U when the query gives
    none); refusals are usage errors naming the rule and the clause."""
    select = parse_query(text) if isinstance(text, str) else text
    _check_outer_clauses(select)
    resolver = Resolver(tables)
    resolver.with_clause(select)
    relation, scope = resolver.from_clause(select)
    relation = resolver.where(relation, scope, select)
    if relation.unit is None:
        raise UsageError("the query reads no private table (declare one with --table NAME=FILE --privacy-unit "
                         "NAME.COLUMN): there is nothing to protect")
    row = RowContext(scope, "GROUP BY")
    items = _items(select)
    units = unit_columns(relation)
    groups = _group_keys(select, row, items, units)
    outer = _Outer(row, groups, units, default_cap)
    for name, node in items:
        outer.add(name, node)
    outer.check_keys_selected(select)
    aggregates, outputs = outer.sorted()
    post = _post(select, outer, outputs)
    query = ResolvedQuery(relation, tuple(groups), aggregates, outputs, post)
    check_text_lengths(query)
    return query


def _check_outer_clauses(select: exp.Select) -> None:
    for key, value in select.args.items():
        if value is None or value is False or value == [] or key in OUTER_CLAUSES:
            continue
        if key == "distinct":
            raise refuse("unsupported", "SELECT DISTINCT in the outer query (its rows are distinct groups already)",
                         select)
        raise refuse("unsupported", f"{key.upper()} in the outer query", select)
    for node in select.find_all(exp.Window):
        raise refuse("exact-release", "window functions compute a row from other rows (of other users too)", node)


def _items(select: exp.Select) -> list[tuple[str | None, exp.Expression]]:
    """The SELECT list as (alias or None, expression)."""
    out: list[tuple[str | None, exp.Expression]] = []
    for node in select.expressions:
        if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
            raise refuse("anonymized-aggregates", "the outer SELECT lists group keys and ANON_ aggregates, not *", node)
        out.append((node.alias, node.this) if isinstance(node, exp.Alias) else (None, node))
    return out


def _group_keys(select: exp.Select, row: RowContext, items: list[tuple[str | None, exp.Expression]],
                units: frozenset[str]) -> list[Expr]:
    """GROUP BY's keys (a SELECT item's position or alias allowed), each once; never the privacy unit."""
    group = select.args.get("group")
    keys: list[Expr] = []
    for node in group.expressions if group is not None else []:
        key = exprs.resolve_expr(_group_target(node, row, items), row)
        if exprs.is_unit_column(key, units):
            raise refuse("exact-release", "grouping by the privacy unit would release one group per user", node)
        if key not in keys:
            keys.append(key)
    return keys


def _group_target(node: exp.Expression, row: RowContext, items: list[tuple[str | None, exp.Expression]]
                  ) -> exp.Expression:
    """The expression a GROUP BY entry stands for: itself, the SELECT item at its position, or the aliased item."""
    position = exprs.number_literal(node) if isinstance(node, exp.Literal) else None
    if position is not None:
        if position.denominator != 1 or not 1 <= position <= len(items):
            raise UsageError(f"GROUP BY {node.sql()}: no SELECT item at that position")
        return items[int(position) - 1][1]
    if isinstance(node, exp.Column) and not node.table:
        try:
            row.scope.column(node)
        except DataError:
            aliased = [n for alias, n in items if alias == identifier(node)[0]]
            if len(aliased) == 1:
                return aliased[0]
            raise
    return node


@dataclass
class _Outer:
    """The outer SELECT list being resolved: its output columns and distinct anonymized aggregates."""

    row: RowContext
    groups: list[Expr]
    units: frozenset[str]
    default_cap: int

    def __post_init__(self) -> None:
        self.aggregates: list[AnonAgg] = []
        self.outputs: list[OutputColumn] = []

    def anon(self, node: exp.Expression) -> AnonAgg:
        assert isinstance(node, exp.Anonymous)
        return read_anon(node, lambda n: exprs.resolve_expr(n, self.row),
                         lambda e: exprs.is_unit_column(e, self.units), self.default_cap)

    def add(self, alias: str | None, node: exp.Expression) -> None:
        """One SELECT item: an anonymized aggregate of its own, or a group key."""
        if is_anonymized(node):
            agg = self.anon(node)
            if agg not in self.aggregates:
                self.aggregates.append(agg)
            self._output(OutputColumn(alias or _default_name(node), aggregate=self.aggregates.index(agg)), node)
            return
        if holds_aggregate(node):
            raise refuse("anonymized-aggregates", "the outer query aggregates with ANON_ functions only (plain "
                         "aggregates are exact), each a SELECT item of its own", node)
        key = exprs.resolve_expr(node, self.row)
        if key not in self.groups:
            raise refuse("anonymized-aggregates", "a column of the outer SELECT is a GROUP BY key", node)
        self._output(OutputColumn(alias or _default_name(node), group=self.groups.index(key)), node)

    def _output(self, column: OutputColumn, node: exp.Expression) -> None:
        if any(o.name == column.name for o in self.outputs):
            raise UsageError(f"two output columns are named {column.name!r}: give one an alias")
        self.outputs.append(column)

    def check_keys_selected(self, select: exp.Select) -> None:
        selected = {o.group for o in self.outputs if o.group is not None}
        if len(selected) != len(self.groups):
            raise UsageError("select every GROUP BY key (the released rows are told apart by them)")
        if not self.aggregates:
            raise refuse("anonymized-aggregates", "the outer query needs at least one ANON_ aggregate", select)

    def sorted(self) -> tuple[tuple[AnonAgg, ...], tuple[OutputColumn, ...]]:
        """The aggregates in their canonical order (the SELECT order is presentation), outputs re-pointed."""
        order = sorted(range(len(self.aggregates)), key=lambda i: repr(self.aggregates[i].canonical()))
        position = {old: new for new, old in enumerate(order)}
        outputs = tuple(OutputColumn(o.name, o.group, position[o.aggregate] if o.aggregate is not None else None)
                        for o in self.outputs)
        return tuple(self.aggregates[i] for i in order), outputs


def _default_name(node: exp.Expression) -> str:
    """An unaliased item's column name: a column's own name, ``anon_sum_val`` for ``ANON_SUM(t.val, …)``."""
    if isinstance(node, exp.Column):
        return identifier(node)[0]
    if is_anonymized(node):
        name = str(node.this).lower()
        first = node.expressions[0] if node.expressions else None
        if isinstance(first, exp.Distinct):
            return name + "_distinct"
        return f"{name}_{identifier(first)[0]}" if isinstance(first, exp.Column) else name
    raise UsageError(f"give the expression {node.sql()[:40]!r} a name with AS")


@dataclass
class _PostContext:
    """HAVING and ORDER BY after the release: output columns, group keys and the selected ANON_ calls only."""

    outer: _Outer
    outputs: tuple[OutputColumn, ...]
    aggregates: tuple[AnonAgg, ...]

    def column(self, node: exp.Column) -> Expr:
        name = identifier(node)[0]
        if not node.table and any(o.name == name for o in self.outputs):
            return Col(name)
        raise refuse("exact-release", "HAVING and ORDER BY read released columns only (an alias, a group key or a "
                     "selected ANON_ aggregate)", node)

    def aggregate(self, node: exp.Expression) -> Expr:
        if not is_anonymized(node):
            raise refuse("exact-release", "HAVING on an exact aggregate would release it (use the selected ANON_ "
                         "aggregate)", node)
        agg = self.outer.anon(node)
        for o in self.outputs:
            if o.aggregate is not None and self.aggregates[o.aggregate] == agg:
                return Col(o.name)
        raise refuse("exact-release", "HAVING and ORDER BY use ANON_ aggregates of the SELECT list only", node)

    def matched(self, node: exp.Expression) -> Expr | None:
        if holds_aggregate(node):
            return None
        if isinstance(node, exp.Column) and not node.table and any(o.name == identifier(node)[0]
                                                                    for o in self.outputs):
            return None
        try:
            key = exprs.resolve_expr(node, self.outer.row)
        except (UsageError, DataError):
            return None
        for o in self.outputs:
            if o.group is not None and self.outer.groups[o.group] == key:
                return Col(o.name)
        return None


def _post(select: exp.Select, outer: _Outer, outputs: tuple[OutputColumn, ...]) -> PostStep:
    """HAVING, ORDER BY and LIMIT as steps on the released table."""
    aggregates, _ = outer.sorted()
    ctx = _PostContext(outer, outputs, aggregates)
    having = select.args.get("having")
    condition = exprs.resolve_expr(having.this, ctx) if having is not None else None
    order = select.args.get("order")
    steps = tuple(_order_item(o, ctx, outputs) for o in (order.expressions if order is not None else []))
    return PostStep(condition, steps, _limit(select))


def _order_item(node: exp.Expression, ctx: _PostContext, outputs: tuple[OutputColumn, ...]) -> tuple[str, bool]:
    target = node.this
    position = exprs.number_literal(target) if isinstance(target, exp.Literal) else None
    if position is not None and position.denominator == 1 and 1 <= position <= len(outputs):
        return outputs[int(position) - 1].name, bool(node.args.get("desc"))
    resolved = exprs.resolve_expr(target, ctx)
    if not isinstance(resolved, Col):
        raise refuse("unsupported", "ORDER BY sorts by released columns (a name, a position or a selected ANON_ "
                     "aggregate)", node)
    return resolved.name, bool(node.args.get("desc"))


def _limit(select: exp.Select) -> int | None:
    limit = select.args.get("limit")
    if limit is None:
        return None
    value = exprs.number_literal(limit.expression)
    if value is None or value.denominator != 1 or value < 0:
        raise refuse("literal-bounds", "LIMIT takes a whole number", limit)
    return int(value)
