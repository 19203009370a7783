"""FROM clauses, joins and sub-queries resolved into relations, under paper 002's ownership rules.

Every relation below the anonymized aggregation keeps each row owned by one user (Table 4.3):

* **selection** (WHERE) keeps or drops a row: always allowed;
* **projection** (a sub-query's SELECT list) computes from one row and carries the privacy unit as
  it is (added under its own name when the list leaves it out; refused when another column would
  take that name);
* **aggregation** in a sub-query over private rows groups by the privacy unit (per user);
* **join** of two private relations matches their privacy units (``USING (uid)`` or
  ``ON a.uid = b.uid``, other conditions allowed besides), or a key an owned table's link names
  (``ON l.l_orderkey = o.o_orderkey``: the units' equality is added, :mod:`dpcli.tasks.sql.owners`); a
  join with a public relation may use any key, and rows left without a unit by an outer join are
  dropped (compile);
* every join has an equality key, a column of each side (``join-key``: no cross join, ``ON TRUE``
  or condition on one side only), so one row meets a bounded number of rows of the other side
  (:mod:`dpcli.tasks.sql.fanout` caps the product over the public joins).

Relations of public tables only follow no rule (they hold no one's rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from dpcli.errors import UsageError
from dpcli.tasks.sql import exprs
from dpcli.tasks.sql.anon import holds_aggregate, is_anonymized
from dpcli.tasks.sql.ir import (
    AggCall,
    Aggregate,
    Col,
    Expr,
    Filter,
    Join,
    JoinHow,
    Lit,
    Op,
    Project,
    Relation,
    Scan,
    column_source,
    columns_of,
    unit_columns,
)
from dpcli.tasks.sql.rules import refuse
from dpcli.tasks.sql.scope import Scope, TableDecl, Visible, identifier, match_name, owner_of

#: The most table reads a query may make (a CTE is read again wherever it is named, so CTEs that join
#: earlier ones would double the plan at each step).
MAX_SCANS = 32
#: The clauses a sub-query may hold (sqlglot's argument names); others are refused.
SUB_QUERY_CLAUSES = frozenset({"expressions", "from_", "joins", "where", "group", "having", "distinct", "with_"})


@dataclass
class RowContext:
    """Expressions on one row of a FROM clause (WHERE, ON, GROUP BY, a projection): no aggregates."""

    scope: Scope
    clause: str

    def column(self, node: exp.Column) -> Expr:
        return Col(self.scope.column(node))

    def aggregate(self, node: exp.Expression) -> Expr:
        if is_anonymized(node):
            raise refuse("anonymized-aggregates", "ANON_ functions belong to the outer SELECT list only", node)
        raise refuse("unsupported", f"an aggregate in {self.clause} (aggregate in a sub-query grouped by the unit)",
                     node)

    def matched(self, node: exp.Expression) -> Expr | None:
        return None


@dataclass
class GroupedContext:
    """Expressions after a sub-query's GROUP BY: group keys and per-user aggregates only."""

    row: RowContext
    keys: list[tuple[str, Expr]]
    resolver: Resolver
    aggs: list[tuple[str, AggCall]] = field(default_factory=list)

    def column(self, node: exp.Column) -> Expr:
        raise refuse("unsupported", "a column after GROUP BY is a group key or inside an aggregate", node)

    def aggregate(self, node: exp.Expression) -> Expr:
        if is_anonymized(node):
            raise refuse("anonymized-aggregates", "ANON_ functions belong to the outer SELECT list only", node)
        call = plain_aggregate(node, self.row)
        for name, known in self.aggs:
            if known == call:
                return Col(name)
        name = self.resolver.new_column()
        self.aggs.append((name, call))
        return Col(name)

    def matched(self, node: exp.Expression) -> Expr | None:
        return match_key(node, self.row, self.keys)


def match_key(node: exp.Expression, row: RowContext, keys: list[tuple[str, Expr]]) -> Expr | None:
    """The group key ``node`` is (as a column of the grouped relation), a literal expression, or None."""
    if holds_aggregate(node):
        return None
    resolved = exprs.resolve_expr(node, row)
    for name, key in keys:
        if key == resolved:
            return Col(name)
    if not columns_of(resolved):
        return resolved
    if isinstance(node, exp.Column):
        raise refuse("unsupported", "a column after GROUP BY is a group key or inside an aggregate", node)
    return None


def plain_aggregate(node: exp.Expression, row: RowContext) -> AggCall:
    """COUNT(*), COUNT(x), COUNT(DISTINCT x), SUM, AVG, MIN or MAX of one row's expression."""
    exprs.check_arguments(node)
    arg = node.this
    if isinstance(node, exp.Count) and isinstance(arg, exp.Star):
        return AggCall("count_rows", None)
    if isinstance(node, exp.Count) and isinstance(arg, exp.Distinct):
        if len(arg.expressions) != 1:
            raise refuse("unsupported", "COUNT(DISTINCT …) of one expression", node)
        return AggCall("count_distinct", exprs.resolve_expr(arg.expressions[0], row))
    functions: dict[type[exp.Expression], str] = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg",
                                                  exp.Min: "min", exp.Max: "max"}
    function = functions[type(node)]
    return AggCall(function, exprs.resolve_expr(arg, row))


class Resolver:
    """Resolves FROM clauses and sub-queries over the declared tables, naming columns as it goes."""

    def __init__(self, tables: Mapping[str, TableDecl]) -> None:
        self.tables = dict(tables)
        self.ctes: dict[str, exp.Select] = {}
        self._scans = 0
        self._open_ctes: list[str] = []
        self._columns = 0

    def new_column(self) -> str:
        self._columns += 1
        return f"c{self._columns - 1}"

    # ---- FROM items -------------------------------------------------------------------------

    def from_clause(self, select: exp.Select) -> tuple[Relation, Scope]:
        """The relation of a FROM clause and its joins, with the scope its clauses see."""
        source = select.args.get("from_")
        if source is None:
            raise refuse("unsupported", "a query without FROM reads no table", select)
        rel, visible = self.item(source.this)
        scope = Scope([visible])
        for join in select.args.get("joins") or []:
            rel, scope = self.join(rel, scope, join)
        return rel, scope

    def item(self, node: exp.Expression) -> tuple[Relation, Visible]:
        if isinstance(node, exp.Table):
            return self._table(node)
        if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Select):
            table_alias = node.args.get("alias")
            if table_alias is not None and table_alias.args.get("columns"):
                raise refuse("unsupported", "column aliases on a sub-query (name its columns in its SELECT list)", node)
            rel, outputs = self.sub_query(node.this)
            alias = node.alias
            return rel, Visible((alias,) if alias else (), dict(outputs), "", rel.unit)
        raise refuse("unsupported", f"{node.key.upper()} as a FROM item (tables and sub-queries are)", node)

    def _table(self, node: exp.Table) -> tuple[Relation, Visible]:
        if node.args.get("db") is not None or node.args.get("catalog") is not None:
            raise UsageError(f"{node.sql()}: name tables without a schema or catalog")
        alias = node.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            raise refuse("unsupported", "column aliases on a table (rename columns in a sub-query)", node)
        name, quoted = identifier(node)
        cte = match_name(name, quoted, self.ctes)
        if cte is not None:
            return self._cte(node, cte)
        declared = match_name(name, quoted, self.tables)
        if declared is None:
            raise UsageError(f"table {name!r} is not declared (give --table {name}=FILE --privacy-unit "
                             f"{name}.COLUMN, or --public-table {name}=FILE)")
        decl = self.tables[declared]
        if self._scans == MAX_SCANS:
            raise UsageError(f"the query reads tables more than {MAX_SCANS} times (each use of a CTE reads its "
                             "tables again)")
        prefix = f"s{self._scans}"
        self._scans += 1
        unit = f"{prefix}.{decl.unit}" if decl.unit is not None else None
        columns = {c: f"{prefix}.{c}" for c in decl.columns} if decl.columns is not None else None
        if columns is not None and owner_of(decl) is not None and decl.unit is not None:
            columns[decl.unit] = f"{prefix}.{decl.unit}"  # an owned table's unit, resolved through its link
        return Scan(decl.name, prefix, unit), Visible((node.alias or decl.name,), columns, prefix, unit)

    def _cte(self, node: exp.Table, cte: str) -> tuple[Relation, Visible]:
        """A CTE named as a table: its query resolved here (refused when it reads itself, directly or not)."""
        if cte in self._open_ctes:
            raise refuse("unsupported", "a CTE that reads itself (WITH RECURSIVE is not supported)", node)
        self._open_ctes.append(cte)
        try:
            rel, outputs = self.sub_query(self.ctes[cte])
        finally:
            self._open_ctes.pop()
        return rel, Visible((node.alias or cte,), dict(outputs), "", rel.unit)

    # ---- joins ------------------------------------------------------------------------------

    def join(self, left: Relation, scope: Scope, node: exp.Join) -> tuple[Relation, Scope]:
        """``left`` joined with the join's item, checked against the join rule."""
        how = _join_how(node)
        right, visible = self.item(node.this)
        both = Scope([*scope.visibles, visible], dict(scope.merged))
        plan = _JoinParts()
        if node.args.get("using"):
            self._using(node, scope, visible, plan)
        elif node.args.get("on") is not None:
            self._on(node, both, visible, how, plan)
        elif how != "cross":
            raise refuse("unsupported", "an outer join needs ON or USING", node)
        left, right = _filtered(left, plan.left_filters), _filtered(right, plan.right_filters)
        unit = self._join_unit(node, left, right, how, plan, both, scope)
        if not plan.on:  # (two private relations without their units' equality were refused just above)
            raise refuse("join-key", "every join has an equality of a column of each side (USING (col) or "
                         "ON a.col = b.col): a join without one multiplies rows without bound", node)
        extra = exprs.conjunction(plan.extra)
        rel = Join(left, right, how, tuple(plan.on), extra, tuple(plan.merged), unit)
        return rel, Scope(both.visibles, {**both.merged, **plan.merged_names})

    def _using(self, node: exp.Join, left: Scope, right: Visible, plan: _JoinParts) -> None:
        for ident in node.args["using"]:
            name, quoted = identifier(ident)
            column = exp.column(name, quoted=quoted)
            lcol, rcol = left.column(column), Scope([right]).column(column)
            merged = self.new_column()
            plan.on.append((Col(lcol), Col(rcol)))
            plan.merged.append((merged, lcol, rcol))
            plan.merged_names[name] = merged

    def _on(self, node: exp.Join, both: Scope, right: Visible, how: JoinHow, plan: _JoinParts) -> None:
        """ON's conjuncts: column equalities across the sides become keys; the rest filters (see below)."""
        condition = exprs.resolve_expr(node.args["on"], RowContext(both, "ON"))
        for part in exprs.conjuncts(condition):
            sides = {_side(c, right) for c in columns_of(part)}
            if _is_key(part, right):
                assert isinstance(part, Op)
                a, b = part.args
                plan.on.append((a, b) if _side_of(a, right) == "left" else (b, a))
            elif sides == {"right"} and how in ("inner", "left"):
                plan.right_filters.append(part)  # the same rows either way, whatever the join
            elif sides == {"left"} and how in ("inner", "right"):
                plan.left_filters.append(part)
            elif how in ("inner", "cross"):
                plan.extra.append(part)
            else:
                raise refuse("unsupported", "an outer join's ON holds column equalities, and conditions on the "
                             "side whose rows are kept regardless go to WHERE", node)

    def _join_unit(self, node: exp.Join, left: Relation, right: Relation, how: JoinHow, plan: _JoinParts,
                   both: Scope, scope: Scope) -> str | None:
        """The joined relation's privacy unit; two private relations must be joined on theirs."""
        if left.unit is None or right.unit is None:
            return left.unit or right.unit
        pairs = {(Col(a), Col(b)) for a in unit_columns(left) for b in unit_columns(right)}
        if not pairs & set(plan.on) and self._linked(left, right, plan):
            plan.on.append((Col(left.unit), Col(right.unit)))  # rows joined on an owning key: one owner's
        elif not pairs & set(plan.on):
            raise refuse("ownership/join", "two private relations are joined only on their privacy units "
                         "(USING (unit) or ON a.unit = b.unit)", node)
        for merged, lcol, rcol in plan.merged:
            if (lcol, rcol) == (left.unit, right.unit):
                return merged
        merged = self.new_column()
        plan.merged.append((merged, left.unit, right.unit))
        name = _unit_name(scope, left.unit)
        if name is not None and name not in both.merged:
            plan.merged_names[name] = merged
        return merged

    def _linked(self, left: Relation, right: Relation, plan: _JoinParts) -> bool:
        """Whether the join matches a column of each side that names one owning key (``l_orderkey = o_orderkey``,
        :func:`dpcli.tasks.sql.owners.owning_key`): the rows it pairs have one owner when their units are equal
        too, which the join then also asks."""
        from dpcli.tasks.sql.owners import owning_key

        for a, b in plan.on:
            found = [column_source(side, e.name) if isinstance(e, Col) else None for side, e in ((left, a), (right, b))]
            keys = [owning_key(self.tables, *f) if f is not None else None for f in found]
            if keys[0] is not None and keys[0] == keys[1]:
                return True
        return False

    # ---- sub-queries ------------------------------------------------------------------------

    def sub_query(self, select: exp.Select) -> tuple[Relation, list[tuple[str, str]]]:
        """A sub-query's relation and its output columns (SQL name, internal name)."""
        _check_sub_clauses(select)
        saved = dict(self.ctes)
        self.with_clause(select)
        try:
            rel, scope = self.from_clause(select)
            rel = self.where(rel, scope, select)
            if select.args.get("group") is not None or _has_aggregate(select):
                return self._grouped(select, rel, scope)
            return self._projection(select, rel, scope)
        finally:
            self.ctes = saved

    def with_clause(self, select: exp.Select) -> None:
        """Record the query's CTEs (each resolved where it is named, as a sub-query)."""
        with_ = select.args.get("with_")
        if with_ is None:
            return
        if with_.args.get("recursive"):
            raise refuse("unsupported", "WITH RECURSIVE", with_)
        for cte in with_.expressions:
            if not isinstance(cte.this, exp.Select):
                raise refuse("unsupported", "a CTE that is not a SELECT", cte)
            self.ctes[cte.alias] = cte.this

    def where(self, rel: Relation, scope: Scope, select: exp.Select) -> Relation:
        where = select.args.get("where")
        if where is None:
            return rel
        return Filter(rel, exprs.resolve_expr(where.this, RowContext(scope, "WHERE")))

    def _projection(self, select: exp.Select, rel: Relation, scope: Scope) -> tuple[Relation, list[tuple[str, str]]]:
        row = RowContext(scope, "SELECT")
        items = [(name, _item(node, row)) for name, node in _select_items(select, scope)]
        return self._project(select, rel, items, _unit_name(scope, rel.unit), bool(select.args.get("distinct")))

    def _project(self, select: exp.Select, rel: Relation, items: list[tuple[str, Expr]], unit_name: str | None,
                 distinct: bool) -> tuple[Relation, list[tuple[str, str]]]:
        """A Project of ``items`` with the unit carried (see the module docstring)."""
        units = unit_columns(rel)
        if rel.unit is not None and not any(exprs.is_unit_column(e, units) for _, e in items):
            if unit_name is None or match_name(unit_name, True, [n for n, _ in items]) is not None:
                raise refuse("ownership/projection", "the privacy unit must stay a column of its own under its name "
                             "(select it)", select)
            items = [*items, (unit_name, Col(rel.unit))]
        names = [n for n, _ in items]
        if len(set(names)) != len(names):
            raise UsageError("a sub-query names two columns alike: give them distinct aliases")
        internal = [(n, self.new_column()) for n in names]
        unit = next((i for (n, i), (_, e) in zip(internal, items, strict=True) if exprs.is_unit_column(e, units)),
                    None)
        project = Project(rel, tuple((i, e) for (_, i), (_, e) in zip(internal, items, strict=True)), unit, distinct)
        return project, internal

    def _grouped(self, select: exp.Select, rel: Relation, scope: Scope) -> tuple[Relation, list[tuple[str, str]]]:
        """A sub-query with GROUP BY or aggregates: per user when its rows are private."""
        row = RowContext(scope, "GROUP BY")
        group = select.args.get("group")
        keys = [(self.new_column(), exprs.resolve_expr(k, row)) for k in (group.expressions if group else [])]
        unit_key = next((n for n, k in keys if exprs.is_unit_column(k, unit_columns(rel))), None)
        if rel.unit is not None and unit_key is None:
            raise refuse("ownership/aggregation", "a sub-query over private rows aggregates per user: add its privacy "
                         "unit to GROUP BY", group or select)
        ctx = GroupedContext(row, keys, self)
        items = [(name, _item(node, ctx)) for name, node in _select_items(select, None)]
        having = select.args.get("having")
        condition = exprs.resolve_expr(having.this, ctx) if having is not None else None
        grouped: Relation = Aggregate(rel, tuple(keys), tuple(ctx.aggs), unit_key)
        if condition is not None:
            grouped = Filter(grouped, condition)
        return self._project(select, grouped, items, _unit_name(scope, rel.unit), bool(select.args.get("distinct")))


@dataclass
class _JoinParts:
    """A join's keys, filters and merged columns as its ON or USING clause gives them."""

    on: list[tuple[Expr, Expr]] = field(default_factory=list)
    extra: list[Expr] = field(default_factory=list)
    left_filters: list[Expr] = field(default_factory=list)
    right_filters: list[Expr] = field(default_factory=list)
    merged: list[tuple[str, str, str]] = field(default_factory=list)
    merged_names: dict[str, str] = field(default_factory=dict)


def _filtered(rel: Relation, parts: list[Expr]) -> Relation:
    condition = exprs.conjunction(parts)
    return rel if condition is None else Filter(rel, condition)


def _join_how(node: exp.Join) -> JoinHow:
    """inner, left, right, full or cross (a comma join is a cross join); other joins are refused."""
    side, kind, method = (str(node.args.get(k) or "").upper() for k in ("side", "kind", "method"))
    if method or kind in ("SEMI", "ANTI", "ASOF") or node.args.get("global_"):
        raise refuse("unsupported", f"{(method or kind).lower()} joins (inner, left, right, full and cross are)",
                     node)
    if side in ("LEFT", "RIGHT", "FULL"):
        how: JoinHow = "left" if side == "LEFT" else "right" if side == "RIGHT" else "full"
        return how
    if kind == "CROSS" or (not node.args.get("on") and not node.args.get("using")):
        return "cross"
    return "inner"


def _side_of(e: Expr, right: Visible) -> str:
    assert isinstance(e, Col)
    return _side(e.name, right)


def _side(column: str, right: Visible) -> str:
    """Whether an internal column comes from the join's right item or from its left side."""
    if right.columns is None:
        return "right" if column.startswith(right.prefix + ".") else "left"
    return "right" if column in right.columns.values() else "left"


def _is_key(part: Expr, right: Visible) -> bool:
    """A column equality with one column from each side."""
    if not (isinstance(part, Op) and part.op == "eq" and all(isinstance(a, Col) for a in part.args)):
        return False
    return {_side_of(a, right) for a in part.args} == {"left", "right"}


def _unit_name(scope: Scope, unit: str | None) -> str | None:
    """The SQL name under which ``scope`` sees the privacy-unit column (merged columns first)."""
    if unit is None:
        return None
    for name, internal in scope.merged.items():
        if internal == unit:
            return name
    for v in scope.visibles:
        for name, internal in (v.columns or {}).items():
            if internal == unit:
                return name
        if v.columns is None and unit.startswith(v.prefix + "."):
            return unit[len(v.prefix) + 1:]
    return None


def _item(node: exp.Expression | Col, ctx: exprs.Context) -> Expr:
    return node if isinstance(node, Col) else exprs.resolve_expr(node, ctx)


def _select_items(select: exp.Select, scope: Scope | None) -> list[tuple[str, exp.Expression | Col]]:
    """The SELECT list as (output name, expression): * expanded to columns, unnamed expressions named ``_colN``."""
    out: list[tuple[str, exp.Expression | Col]] = []
    for i, node in enumerate(select.expressions):
        if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
            if scope is None or isinstance(node, exp.Column):
                raise refuse("unsupported", "* after GROUP BY, or table.* (name the columns)", node)
            out += [(name, Col(internal)) for name, internal in scope.star(node)]
            continue
        if isinstance(node, exp.Alias):
            out.append((node.alias, node.this))
        elif isinstance(node, exp.Column):
            out.append((identifier(node)[0], node))
        else:
            out.append((f"_col{i}", node))
    return out


def _has_aggregate(select: exp.Select) -> bool:
    return any(holds_aggregate(item) for item in select.expressions)


def _check_sub_clauses(select: exp.Select) -> None:
    """Refuse what a sub-query may not hold: row order and limits, windows, anything not supported."""
    for key, value in select.args.items():
        if value is None or value is False or value == [] or key in SUB_QUERY_CLAUSES:
            continue
        if key in ("limit", "offset", "order"):
            raise refuse("row-order", f"{key.upper()} in a sub-query", select)
        raise refuse("unsupported", f"{key.upper()} in a sub-query", select)
    for node in select.find_all(exp.Window):
        raise refuse("exact-release", "window functions compute a row from other rows (of other users too)", node)


__all__ = ["Lit", "Resolver", "RowContext", "TableDecl"]
