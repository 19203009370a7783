"""Scalar expressions: sqlglot's nodes resolved into the plan's :class:`~dpcli.tasks.sql.ir.Expr`.

What a query may compute on a row (every operator is applied to one row's values, so it keeps
the row's owner): arithmetic, comparisons, AND/OR/NOT, IS NULL, IN and BETWEEN with values,
LIKE, CASE, COALESCE, NULLIF, CAST and a few text and number functions (:data:`FUNCTIONS`).
Columns, aggregates and ANON_ calls are handed to a :class:`Context`, which knows the scope (and
refuses what its clause may not hold). Anything else is refused as unsupported.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Protocol

from sqlglot import exp

from dpcli.tasks.sql.ir import Col, Expr, Lit, Op
from dpcli.tasks.sql.rules import refuse

#: Binary operators: sqlglot's node type → the plan's operator.
BINARY: dict[type[exp.Expression], str] = {
    exp.Add: "add", exp.Sub: "sub", exp.Mul: "mul", exp.Div: "div", exp.Mod: "mod", exp.IntDiv: "intdiv",
    exp.EQ: "eq", exp.NEQ: "ne", exp.LT: "lt", exp.LTE: "le", exp.GT: "gt", exp.GTE: "ge",
    exp.And: "and", exp.Or: "or", exp.DPipe: "concat", exp.Like: "like", exp.ILike: "ilike",
    exp.Nullif: "nullif",
}
#: Functions of one argument: sqlglot's node type → the plan's operator.
FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Lower: "lower", exp.Upper: "upper", exp.Length: "length", exp.Abs: "abs", exp.Floor: "floor",
    exp.Ceil: "ceil", exp.Trim: "trim", exp.Not: "not", exp.Neg: "neg", exp.Sqrt: "sqrt", exp.Ln: "ln",
    exp.Exp: "exp",
}
#: CAST targets: sqlglot's type names → the plan's cast.
CASTS: dict[str, str] = {
    "INT": "int", "BIGINT": "int", "SMALLINT": "int", "TINYINT": "int",
    "DOUBLE": "float", "FLOAT": "float", "DECIMAL": "float", "REAL": "float",
    "VARCHAR": "text", "TEXT": "text", "CHAR": "text", "NVARCHAR": "text", "NCHAR": "text",
    "BOOLEAN": "bool", "DATE": "date",
}
#: Plain SQL aggregates (per user in a sub-query; refused in the outer query).
AGGREGATES: tuple[type[exp.Expression], ...] = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
#: The arguments of each node the resolver reads: any other one the query gives is refused, never dropped
#: (``TRIM(BOTH 'x' FROM g)``, ``FLOOR(x, 1)``, ``MAX(a, b)``). ``safe`` on ``||`` and ``CONCAT`` is
#: sqlglot's mark that non-text parts are converted, as dpcli does; ``big_int`` on COUNT its integer result.
READ_ARGS: dict[type[exp.Expression], frozenset[str]] = {
    **dict.fromkeys(BINARY, frozenset({"this", "expression"})),
    **dict.fromkeys(FUNCTIONS, frozenset({"this"})),
    exp.DPipe: frozenset({"this", "expression", "safe"}),
    exp.Paren: frozenset({"this"}),
    exp.Is: frozenset({"this", "expression"}),
    exp.In: frozenset({"this", "expressions", "query", "unnest"}),  # a sub-query is refused by its own rule
    exp.Between: frozenset({"this", "low", "high"}),
    exp.Case: frozenset({"this", "ifs", "default"}),
    exp.If: frozenset({"this", "true", "false"}),
    exp.Coalesce: frozenset({"this", "expressions", "is_nvl", "is_null"}),  # IFNULL, NVL: the same
    exp.Concat: frozenset({"expressions", "safe"}),
    exp.Cast: frozenset({"this", "to"}),
    exp.Round: frozenset({"this", "decimals"}),
    exp.Count: frozenset({"this", "big_int"}),
    **dict.fromkeys((exp.Sum, exp.Avg, exp.Min, exp.Max), frozenset({"this"})),
}


def check_arguments(node: exp.Expression) -> None:
    """Refuse a node of :data:`READ_ARGS` that is given an argument the resolver does not read."""
    read = READ_ARGS.get(type(node))
    if read is None:
        return
    extra = sorted(k for k, v in node.args.items() if k not in read and v is not None and v is not False and v != [])
    if extra:
        name = node.sql_name() if isinstance(node, exp.Func) else node.key.upper()
        raise refuse("unsupported", f"{name} with its {' and '.join(extra)} argument (dpcli would ignore it: give "
                     f"{name} without it)", node)


class Context(Protocol):
    """What an expression's clause allows: how it resolves columns, aggregates and ANON_ calls."""

    def column(self, node: exp.Column) -> Expr: ...

    def aggregate(self, node: exp.Expression) -> Expr: ...

    def matched(self, node: exp.Expression) -> Expr | None:
        """The expression ``node`` stands for as a whole (a group key after aggregation), else None."""
        ...


def resolve_expr(node: exp.Expression, ctx: Context) -> Expr:
    """``node`` as a plan expression (refused with the rule it breaks, or as unsupported)."""
    whole = ctx.matched(node)
    if whole is not None:
        return whole
    check_arguments(node)
    handler = _HANDLERS.get(type(node))
    if handler is not None:
        return handler(node, ctx)
    if type(node) in BINARY:
        return Op(BINARY[type(node)], (resolve_expr(node.this, ctx), resolve_expr(node.expression, ctx)))
    if type(node) in FUNCTIONS:
        return Op(FUNCTIONS[type(node)], (resolve_expr(node.this, ctx),))
    if isinstance(node, AGGREGATES) or _is_anonymized(node):
        return ctx.aggregate(node)
    raise _special_refusal(node)


def _special_refusal(node: exp.Expression) -> Exception:
    """The refusal of a node no handler takes: a window, a sub-query, or anything unsupported."""
    if isinstance(node, exp.Window):
        return refuse("exact-release", "window functions compute a row from other rows (of other users too)", node)
    if isinstance(node, (exp.Subquery, exp.Exists, exp.Select)) or node.find(exp.Select) is not None:
        return refuse("ownership/sub-query", "an expression cannot hold a sub-query (join the table instead)", node)
    return refuse("unsupported", f"{node.key.upper()} is not supported in an expression", node)


def _is_anonymized(node: exp.Expression) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.this).upper().startswith("ANON_")


def number_literal(node: exp.Expression) -> Fraction | None:
    """A numeric literal's exact value (``-`` and parentheses allowed), else None."""
    sign = 1
    while isinstance(node, (exp.Neg, exp.Paren)):
        if isinstance(node, exp.Neg):
            sign = -sign
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return sign * Fraction(node.this)
        except (ValueError, ZeroDivisionError):
            return None
    return None


def _literal(node: exp.Expression, ctx: Context) -> Expr:
    assert isinstance(node, exp.Literal)
    if node.is_string:
        return Lit(str(node.this))
    value = number_literal(node)
    if value is None:
        raise refuse("unsupported", "this number cannot be read exactly", node)
    return Lit(value)


def _column(node: exp.Expression, ctx: Context) -> Expr:
    assert isinstance(node, exp.Column)
    if isinstance(node.this, exp.Star):
        raise refuse("unsupported", "* selects columns only as a whole SELECT list", node)
    return ctx.column(node)


def _is(node: exp.Expression, ctx: Context) -> Expr:
    if not isinstance(node.expression, exp.Null):
        raise refuse("unsupported", "IS compares with NULL only", node)
    return Op("is_null", (resolve_expr(node.this, ctx),))


def _in(node: exp.Expression, ctx: Context) -> Expr:
    if node.args.get("query") is not None or node.args.get("unnest") is not None:
        raise refuse("ownership/sub-query", "IN takes a list of values, not a sub-query (join the table instead)",
                     node)
    values = tuple(resolve_expr(v, ctx) for v in node.expressions)
    return Op("in", (resolve_expr(node.this, ctx), *values))


def _between(node: exp.Expression, ctx: Context) -> Expr:
    x = resolve_expr(node.this, ctx)
    return Op("and", (Op("ge", (x, resolve_expr(node.args["low"], ctx))),
                      Op("le", (x, resolve_expr(node.args["high"], ctx)))))


def _case(node: exp.Expression, ctx: Context) -> Expr:
    """CASE [x] WHEN … THEN … [ELSE …] END as (condition, value, …, default)."""
    subject = node.this
    parts: list[Expr] = []
    for branch in node.args.get("ifs") or []:
        cond = resolve_expr(branch.this, ctx)
        if subject is not None:
            cond = Op("eq", (resolve_expr(subject, ctx), cond))
        parts += [cond, resolve_expr(branch.args["true"], ctx)]
    default = node.args.get("default")
    parts.append(resolve_expr(default, ctx) if default is not None else Lit(None))
    return Op("case", tuple(parts))


def _if(node: exp.Expression, ctx: Context) -> Expr:
    false = node.args.get("false")
    return Op("case", (resolve_expr(node.this, ctx), resolve_expr(node.args["true"], ctx),
                       resolve_expr(false, ctx) if false is not None else Lit(None)))


def _coalesce(node: exp.Expression, ctx: Context) -> Expr:
    return Op("coalesce", tuple(resolve_expr(a, ctx) for a in [node.this, *node.expressions]))


def _concat(node: exp.Expression, ctx: Context) -> Expr:
    return Op("concat", tuple(resolve_expr(a, ctx) for a in node.expressions))


def _cast(node: exp.Expression, ctx: Context) -> Expr:
    to = node.args["to"]
    name = to.this.name if hasattr(to.this, "name") else str(to.this)
    if to.expressions:
        raise refuse("unsupported", f"CAST to {name} with a length or precision (give {name} alone)", node)
    target = CASTS.get(name.upper())
    if target is None:
        raise refuse("unsupported", f"CAST to {name} is not supported (INT, DOUBLE, VARCHAR, BOOLEAN, DATE are)", node)
    return Op("cast_" + target, (resolve_expr(node.this, ctx),))


def _round(node: exp.Expression, ctx: Context) -> Expr:
    decimals = node.args.get("decimals")
    places = number_literal(decimals) if decimals is not None else Fraction(0)
    if places is None or places.denominator != 1 or not 0 <= places <= 15:
        raise refuse("literal-bounds", "ROUND's decimals are a whole number in 0–15", node)
    return Op("round", (resolve_expr(node.this, ctx), Lit(places)))


_HANDLERS: dict[type[exp.Expression], Callable[[exp.Expression, Context], Expr]] = {
    exp.Literal: _literal,
    exp.Boolean: lambda node, ctx: Lit(bool(node.this)),
    exp.Null: lambda node, ctx: Lit(None),
    exp.Paren: lambda node, ctx: resolve_expr(node.this, ctx),
    exp.Column: _column,
    exp.Is: _is,
    exp.In: _in,
    exp.Between: _between,
    exp.Case: _case,
    exp.If: _if,
    exp.Coalesce: _coalesce,
    exp.Concat: _concat,
    exp.Cast: _cast,
    exp.Round: _round,
}


def conjuncts(e: Expr) -> list[Expr]:
    """``a AND b AND c`` as [a, b, c]."""
    if isinstance(e, Op) and e.op == "and":
        return [c for a in e.args for c in conjuncts(a)]
    return [e]


def conjunction(parts: list[Expr]) -> Expr | None:
    """[a, b, c] as ``a AND b AND c`` (None for no parts)."""
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = Op("and", (out, p))
    return out


def is_unit_column(e: Expr, units: frozenset[str]) -> bool:
    """Whether ``e`` is a column that holds the privacy unit (``units``: :func:`dpcli.tasks.sql.ir.unit_columns`)."""
    return isinstance(e, Col) and e.name in units
