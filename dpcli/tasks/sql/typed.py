"""Scalar expressions of the plan as polars expressions, typed from the schema (never from the records).

A column's kind (number, text, boolean, temporal) comes from its type in the schema, which is
public; what the query does with it decides how it is read. Text is read as a number where the
query computes with it or compares it with a number (by :func:`dpcli.bounding.numeric_value`'s
grammar: a record that does not parse is null), so a CSV, whose columns dpcli reads as text,
means what the same Parquet means. Two columns of different kinds are compared as numbers when
one is a number, else as text. Every cast is non-strict (a value that does not convert is null),
so no record can make the query fail.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import polars as pl

from dpcli.bounding import numeric_value
from dpcli.errors import DataError, type_text
from dpcli.tasks.sql.ir import Col, Expr, Lit, Op
from dpcli.tasks.sql.lengths import MAX_TEXT_LENGTH

Kind = str  # number, text, bool, temporal, null, other


def schema_of(frame: pl.LazyFrame) -> pl.Schema:
    """A frame's schema; operations whose types do not fit together are a data error (polars' text withheld)."""
    try:
        return frame.collect_schema()
    except pl.exceptions.PolarsError as exc:
        raise DataError(f"the query's columns do not fit its operations ({type(exc).__name__}; the message is "
                        "withheld): CAST them") from None


def kind_of(dtype: pl.DataType) -> Kind:
    if dtype == pl.String:
        return "text"
    if dtype == pl.Boolean:
        return "bool"
    if dtype == pl.Null:
        return "null"
    if dtype.is_numeric():
        return "number"
    if dtype.is_temporal():
        return "temporal"
    return "other"


@dataclass(frozen=True)
class Typed:
    """A polars expression with its kind and (when known) its type."""

    expr: pl.Expr
    kind: Kind
    dtype: pl.DataType | None = None


def as_number(t: Typed) -> pl.Expr:
    """The expression as a number (text parsed by the number grammar; NULL as a null number)."""
    if t.kind == "number":
        return t.expr
    if t.kind == "text":
        return numeric_value(t.expr, pl.String())
    if t.kind in ("bool", "null"):
        return t.expr.cast(pl.Float64)
    raise DataError(f"a {type_text(t.dtype)} column is used as a number by the query")


def as_text(t: Typed) -> pl.Expr:
    """The value as text; a value of another type at most :data:`~dpcli.tasks.sql.lengths.MAX_TEXT_LENGTH`
    characters of it (a categorical or binary column's text is a table's text)."""
    if t.kind == "text":
        return t.expr
    return t.expr.cast(pl.String, strict=False).str.slice(0, MAX_TEXT_LENGTH)


def as_bool(t: Typed, what: str) -> pl.Expr:
    if t.kind == "bool" and t.dtype == pl.Boolean:  # already one: a cast would hide a conjunction's parts from
        return t.expr  # polars' predicate pushdown (a WHERE on one table of a join filters that table first)
    if t.kind in ("bool", "null"):
        return t.expr.cast(pl.Boolean)
    raise DataError(f"{what} needs a condition (a comparison), not a {t.kind} value: compare it")


def numeric_value_column(t: Typed) -> pl.Expr:
    """A value aggregated by an ANON_ function: a Float64 number, NaN as null (dropped like null)."""
    return as_number(t).cast(pl.Float64).fill_nan(None)


class Compiler:
    """Compiles expressions against one relation's schema."""

    def __init__(self, schema: Mapping[str, pl.DataType]) -> None:
        self.schema = schema

    def typed(self, e: Expr) -> Typed:
        if isinstance(e, Col):
            dtype = self.schema[e.name]
            if isinstance(dtype, pl.Decimal):
                # A decimal is read as a double, as arithmetic is: polars raises when a decimal sum, or an
                # integer made a decimal (COALESCE, CASE), does not fit, and no record may fail a run (rule 4).
                return Typed(pl.col(e.name).cast(pl.Float64), "number", pl.Float64())
            return Typed(pl.col(e.name), kind_of(dtype), dtype)
        if isinstance(e, Lit):
            return literal(e.value)
        handler = _OPS.get(e.op)
        if handler is None:
            raise DataError(f"operator {e.op} has no polars form")  # the resolver only builds known ones
        return handler(self, [self.typed(a) for a in e.args], e)

    def condition(self, e: Expr, what: str) -> pl.Expr:
        return as_bool(self.typed(e), what)


def literal(value: Fraction | str | bool | None) -> Typed:
    if value is None:
        return Typed(pl.lit(None), "null", pl.Null())
    if isinstance(value, bool):
        return Typed(pl.lit(value), "bool", pl.Boolean())
    if isinstance(value, str):
        return Typed(pl.lit(value, dtype=pl.String), "text", pl.String())
    if value.denominator == 1 and abs(value) < 1 << 63:
        return Typed(pl.lit(int(value), dtype=pl.Int64), "number", pl.Int64())
    return Typed(pl.lit(float(value), dtype=pl.Float64), "number", pl.Float64())


def comparable(a: Typed, b: Typed) -> tuple[pl.Expr, pl.Expr]:
    """Two values as one kind: as they are when alike (or one is NULL), as numbers when one is a number,
    text as the other's temporal type, else as text."""
    kinds = {a.kind, b.kind}
    if a.kind == b.kind or "null" in kinds:
        return a.expr, b.expr
    if "number" in kinds and kinds <= {"number", "text", "bool"}:
        return as_number(a), as_number(b)
    if kinds == {"temporal", "text"}:
        target = a.dtype if a.kind == "temporal" else b.dtype
        assert target is not None  # a column's kind comes with its type
        return _as_temporal(a, target), _as_temporal(b, target)
    return as_text(a), as_text(b)


def _as_temporal(t: Typed, target: pl.DataType) -> pl.Expr:
    """A temporal value as it is, or text read as the other side's temporal type: a date as ``CAST(… AS DATE)``
    reads it (polars 2 casts no text to a date); other types by a non-strict cast."""
    if t.kind == "temporal":
        return t.expr
    if target == pl.Date:
        return _cast_date(t).expr
    return t.expr.cast(target, strict=False)


_COMPARE: dict[str, Callable[[pl.Expr, pl.Expr], pl.Expr]] = {
    "eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
    "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y,
}
def _float(x: pl.Expr) -> pl.Expr:
    return x.cast(pl.Float64)


def _nonzero(y: pl.Expr, value: pl.Expr) -> pl.Expr:
    """``value`` where the divisor ``y`` is not 0, else NULL (SQL's answer, on every engine)."""
    return pl.when(y != 0).then(value).otherwise(None)


def _truncated(q: pl.Expr) -> pl.Expr:
    return pl.when(q >= 0).then(q.floor()).otherwise(q.ceil())


#: Arithmetic in doubles, one IEEE formula per operator (Spark computes the same: dpcli/spark/sql_exprs.py):
#: nothing wraps, and dividing by 0 gives NULL; MOD's sign is the dividend's (SQL's, not Python's).
_ARITHMETIC: dict[str, Callable[[pl.Expr, pl.Expr], pl.Expr]] = {
    "add": lambda x, y: _float(x) + _float(y), "sub": lambda x, y: _float(x) - _float(y),
    "mul": lambda x, y: _float(x) * _float(y),
    "div": lambda x, y: _nonzero(y, _float(x) / _float(y)),
    "mod": lambda x, y: _nonzero(y, _float(x) - _float(y) * _truncated(_float(x) / _float(y))),
    "intdiv": lambda x, y: _nonzero(y, (_float(x) / _float(y)).floor()),
}
#: Functions of one number, in doubles; outside their domain (√ of a negative, ln of 0 or less) NULL.
_NUMERIC: dict[str, Callable[[pl.Expr], pl.Expr]] = {
    "neg": lambda x: -_float(x), "abs": lambda x: _float(x).abs(), "floor": lambda x: _float(x).floor(),
    "ceil": lambda x: _float(x).ceil(),
    "sqrt": lambda x: pl.when(_float(x) >= 0).then(_float(x).sqrt()).otherwise(None),
    "ln": lambda x: pl.when(_float(x) > 0).then(_float(x).log()).otherwise(None), "exp": lambda x: _float(x).exp(),
}
_TEXT: dict[str, Callable[[pl.Expr], pl.Expr]] = {
    "lower": lambda x: x.str.to_lowercase(), "upper": lambda x: x.str.to_uppercase(),
    "trim": lambda x: x.str.strip_chars(" "),  # spaces only, as SQL (and Spark)
}


def _compare(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(_COMPARE[e.op](*comparable(args[0], args[1])), "bool", pl.Boolean())


def _arithmetic(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(_ARITHMETIC[e.op](as_number(args[0]), as_number(args[1])), "number")


def _numeric(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(_NUMERIC[e.op](as_number(args[0])), "number")


def _text(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(_TEXT[e.op](as_text(args[0])), "text", pl.String())


def _logic(c: Compiler, args: list[Typed], e: Op) -> Typed:
    what = e.op.upper()
    if e.op == "not":
        return Typed(~as_bool(args[0], what), "bool", pl.Boolean())
    x, y = as_bool(args[0], what), as_bool(args[1], what)
    return Typed(x & y if e.op == "and" else x | y, "bool", pl.Boolean())


def _in(c: Compiler, args: list[Typed], e: Op) -> Typed:
    x, values = args[0], args[1:]
    out: pl.Expr | None = None
    for v in values:
        test = _COMPARE["eq"](*comparable(x, v))
        out = test if out is None else out | test
    return Typed(out if out is not None else pl.lit(False), "bool", pl.Boolean())


def _like(c: Compiler, args: list[Typed], e: Op) -> Typed:
    pattern = e.args[1]
    if not (isinstance(pattern, Lit) and isinstance(pattern.value, str)):
        raise DataError("LIKE takes a text literal as its pattern")
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern.value)
    flags = "(?si)" if e.op == "ilike" else "(?s)"
    return Typed(as_text(args[0]).str.contains(f"{flags}\\A{regex}\\z"), "bool", pl.Boolean())


def unified_kind(kinds: set[Kind]) -> tuple[Kind, bool]:
    """The kind values of one column take (CASE branches, COALESCE arguments), and whether they must be
    converted to it: theirs when alike (NULLs fit any), else numbers when all are numbers or booleans,
    else text. Both engines follow this one rule (:func:`dpcli.spark.sql_exprs.unify`)."""
    found = kinds - {"null"}
    if len(found) <= 1:
        return next(iter(found), "null"), False
    return ("number" if found <= {"number", "bool"} else "text"), True


def unify(values: list[Typed]) -> tuple[list[pl.Expr], Kind]:
    """Values of one column, in the kind :func:`unified_kind` gives them."""
    kind, convert = unified_kind({v.kind for v in values})
    if not convert:
        return [v.expr for v in values], kind
    return [(as_number if kind == "number" else as_text)(v) for v in values], kind


def _case(c: Compiler, args: list[Typed], e: Op) -> Typed:
    conditions = [as_bool(a, "CASE WHEN") for a in args[:-1:2]]
    values, kind = unify([*args[1:-1:2], args[-1]])
    chain: Any = pl.when(conditions[0]).then(values[0])
    for cond, value in zip(conditions[1:], values[1:-1], strict=True):
        chain = chain.when(cond).then(value)
    return Typed(chain.otherwise(values[-1]), kind)


def _coalesce(c: Compiler, args: list[Typed], e: Op) -> Typed:
    values, kind = unify(args)
    return Typed(pl.coalesce(values), kind)


def _nullif(c: Compiler, args: list[Typed], e: Op) -> Typed:
    equal = _COMPARE["eq"](*comparable(args[0], args[1]))
    return Typed(pl.when(equal).then(None).otherwise(args[0].expr), args[0].kind, args[0].dtype)


def _concat(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(pl.concat_str([as_text(a) for a in args]), "text", pl.String())


def _length(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(as_text(args[0]).str.len_chars().cast(pl.Int64), "number", pl.Int64())


def _round(c: Compiler, args: list[Typed], e: Op) -> Typed:
    places = e.args[1]
    assert isinstance(places, Lit) and isinstance(places.value, Fraction)
    return Typed(as_number(args[0]).cast(pl.Float64).round(int(places.value)), "number", pl.Float64())


def _is_null(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(args[0].expr.is_null(), "bool", pl.Boolean())


def _cast(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return _CASTS[e.op](args[0])


_TRUE, _FALSE = ("true", "t", "1", "yes", "y"), ("false", "f", "0", "no", "n")


def _cast_bool(t: Typed) -> Typed:
    if t.kind in ("bool", "null"):
        return Typed(t.expr.cast(pl.Boolean), "bool", pl.Boolean())
    if t.kind == "number":
        return Typed(t.expr != 0, "bool", pl.Boolean())
    text = as_text(t).str.strip_chars(" ").str.to_lowercase()
    return Typed(pl.when(text.is_in(_TRUE)).then(True).when(text.is_in(_FALSE)).then(False).otherwise(None),
                 "bool", pl.Boolean())


def _cast_date(t: Typed) -> Typed:
    if t.kind == "temporal":
        return Typed(t.expr.cast(pl.Date, strict=False), "temporal", pl.Date())
    parsed = as_text(t).str.strip_chars(" ").str.to_date("%Y-%m-%d", strict=False)
    if t.expr.meta.is_literal():  # a date literal (DATE '1994-01-01'), parsed once by the same function: a plain
        parsed = pl.lit(pl.select(parsed).item(), dtype=pl.Date)  # date lets polars push a WHERE on it down
    return Typed(parsed, "temporal", pl.Date())


_CASTS: dict[str, Callable[[Typed], Typed]] = {
    "cast_int": lambda t: Typed(as_number(t).cast(pl.Int64, strict=False), "number", pl.Int64()),
    "cast_float": lambda t: Typed(as_number(t).cast(pl.Float64), "number", pl.Float64()),
    "cast_text": lambda t: Typed(as_text(t), "text", pl.String()),
    "cast_bool": _cast_bool,
    "cast_date": _cast_date,
}

_OPS: dict[str, Callable[[Compiler, list[Typed], Op], Typed]] = {
    **dict.fromkeys(_COMPARE, _compare), **dict.fromkeys(_ARITHMETIC, _arithmetic),
    **dict.fromkeys(_NUMERIC, _numeric), **dict.fromkeys(_TEXT, _text), **dict.fromkeys(_CASTS, _cast),
    "and": _logic, "or": _logic, "not": _logic, "in": _in, "like": _like, "ilike": _like, "case": _case,
    "coalesce": _coalesce, "nullif": _nullif, "concat": _concat, "length": _length, "round": _round,
    "is_null": _is_null,
}
