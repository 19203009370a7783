"""``dpcli sql``'s scalar expressions in Spark SQL: the same kinds, coercions and formulas as polars'.

Each operator is :mod:`dpcli.tasks.sql.typed`'s, written with Spark's built-in functions: kinds come
from the schema (a CSV's columns are text on both engines), text is read as a number by the same
grammar (:func:`dpcli.spark.bounding.numeric_text`), arithmetic is in doubles by the same IEEE
formulas, dividing by 0 gives NULL, and every cast is a ``try_`` cast: with ANSI mode on (Spark 4's
default) nothing any record holds can raise an error inside a job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpcli.errors import DataError
from dpcli.spark.bounding import numeric_text
from dpcli.tasks.sql.ir import Col, Expr, Lit, Op
from dpcli.tasks.sql.lengths import MAX_TEXT_LENGTH
from dpcli.tasks.sql.typed import unified_kind


def quoted(name: str) -> str:
    """A column name as Spark SQL reads it whatever it holds (dots, spaces, backquotes)."""
    return "`" + name.replace("`", "``") + "`"


def col(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col(quoted(name))


def kind_of(dtype: Any) -> str:
    from pyspark.sql import types as T

    if isinstance(dtype, T.StringType):
        return "text"
    if isinstance(dtype, T.BooleanType):
        return "bool"
    if isinstance(dtype, T.NullType):
        return "null"
    if isinstance(dtype, T.NumericType):
        return "number"
    if isinstance(dtype, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        return "temporal"
    return "other"


@dataclass(frozen=True)
class Typed:
    """A Spark column with its kind and (when known) its type."""

    expr: Any
    kind: str
    dtype: Any = None


def as_number(t: Typed) -> Any:
    if t.kind == "number":
        return t.expr
    if t.kind == "text":
        return numeric_text(t.expr)
    if t.kind in ("bool", "null"):
        return t.expr.try_cast("double")
    raise DataError(f"a {t.kind} column is used as a number by the query")


def as_text(t: Typed) -> Any:
    """:func:`dpcli.tasks.sql.typed.as_text`: another type's text cut to
    :data:`~dpcli.tasks.sql.lengths.MAX_TEXT_LENGTH` characters (an array's or a binary column's text is a table's)."""
    from pyspark.sql import functions as F

    if t.kind == "text":
        return t.expr
    return F.substring(t.expr.try_cast("string"), 1, MAX_TEXT_LENGTH)


def as_bool(t: Typed, what: str) -> Any:
    if t.kind in ("bool", "null"):
        return t.expr.try_cast("boolean")
    raise DataError(f"{what} needs a condition (a comparison), not a {t.kind} value: compare it")


def numeric_value_column(t: Typed) -> Any:
    """A value aggregated by an ANON_ function: a double, NaN as null."""
    from pyspark.sql import functions as F

    x = as_number(t).try_cast("double")
    return F.when(F.isnan(x), F.lit(None).cast("double")).otherwise(x)


class Compiler:
    """Compiles expressions against one Spark DataFrame's schema."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema

    def typed(self, e: Expr) -> Typed:
        if isinstance(e, Col):
            return Typed(col(e.name), kind_of(self.schema[e.name]), self.schema[e.name])
        if isinstance(e, Lit):
            return literal(e.value)
        return _OPS[e.op](self, [self.typed(a) for a in e.args], e)

    def condition(self, e: Expr, what: str) -> Any:
        return as_bool(self.typed(e), what)


def literal(value: Fraction | str | bool | None) -> Typed:
    from pyspark.sql import functions as F

    if value is None:
        return Typed(F.lit(None), "null")
    if isinstance(value, bool):
        return Typed(F.lit(value), "bool")
    if isinstance(value, str):
        return Typed(F.lit(value), "text")
    if value.denominator == 1 and abs(value) < 1 << 63:
        return Typed(F.lit(int(value)).cast("bigint"), "number")
    return Typed(F.lit(float(value)).cast("double"), "number")


def comparable(a: Typed, b: Typed) -> tuple[Any, Any]:
    """As :func:`dpcli.tasks.sql.typed.comparable`."""
    kinds = {a.kind, b.kind}
    if a.kind == b.kind or "null" in kinds:
        return a.expr, b.expr
    if "number" in kinds and kinds <= {"number", "text", "bool"}:
        return as_number(a), as_number(b)
    if kinds == {"temporal", "text"}:
        target = (a.dtype if a.kind == "temporal" else b.dtype).simpleString()
        return a.expr.try_cast(target), b.expr.try_cast(target)
    return as_text(a), as_text(b)


def _d(x: Any) -> Any:
    return x.try_cast("double")


def _nonzero(y: Any, value: Any) -> Any:
    from pyspark.sql import functions as F

    return F.when(y != 0, value).otherwise(F.lit(None).cast("double"))


def _truncated(q: Any) -> Any:
    from pyspark.sql import functions as F

    return F.when(q >= 0, F.floor(q)).otherwise(F.ceil(q)).try_cast("double")


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
    "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y,
}
_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda x, y: _d(x) + _d(y), "sub": lambda x, y: _d(x) - _d(y), "mul": lambda x, y: _d(x) * _d(y),
    "div": lambda x, y: _nonzero(y, _d(x) / _d(y)),
    "mod": lambda x, y: _nonzero(y, _d(x) - _d(y) * _truncated(_d(x) / _d(y))),
    "intdiv": lambda x, y: _nonzero(y, _floor(_d(x) / _d(y))),
}


def _floor(x: Any) -> Any:
    from pyspark.sql import functions as F

    return F.floor(x).try_cast("double")


def _numeric(op: str, x: Any) -> Any:
    from pyspark.sql import functions as F

    x = _d(x)
    table = {"neg": lambda: -x, "abs": lambda: F.abs(x), "floor": lambda: _floor(x),
             "ceil": lambda: F.ceil(x).try_cast("double"), "exp": lambda: F.exp(x),
             "sqrt": lambda: F.when(x >= 0, F.sqrt(x)), "ln": lambda: F.when(x > 0, F.ln(x))}
    return table[op]()


def _text(op: str, x: Any) -> Any:
    from pyspark.sql import functions as F

    return {"lower": F.lower, "upper": F.upper, "trim": F.trim}[op](x)


def _ops_compare(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(_COMPARE[e.op](*comparable(args[0], args[1])), "bool")


def _ops_arithmetic(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(_ARITHMETIC[e.op](as_number(args[0]), as_number(args[1])), "number")


def _ops_numeric(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(_numeric(e.op, as_number(args[0])), "number")


def _ops_text(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(_text(e.op, as_text(args[0])), "text")


def _logic(c: Compiler, args: list[Typed], e: Op) -> Typed:
    what = e.op.upper()
    if e.op == "not":
        return Typed(~as_bool(args[0], what), "bool")
    x, y = as_bool(args[0], what), as_bool(args[1], what)
    return Typed(x & y if e.op == "and" else x | y, "bool")


def _in(c: Compiler, args: list[Typed], e: Op) -> Typed:
    from pyspark.sql import functions as F

    out = None
    for v in args[1:]:
        test = _COMPARE["eq"](*comparable(args[0], v))
        out = test if out is None else out | test
    return Typed(out if out is not None else F.lit(False), "bool")


def _like(c: Compiler, args: list[Typed], e: Op) -> Typed:
    pattern = e.args[1]
    if not (isinstance(pattern, Lit) and isinstance(pattern.value, str)):
        raise DataError("LIKE takes a text literal as its pattern")
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern.value)
    flags = "(?si)" if e.op == "ilike" else "(?s)"
    return Typed(as_text(args[0]).rlike(f"{flags}\\A{regex}\\z"), "bool")


def unify(values: list[Typed]) -> tuple[list[Any], str]:
    """Values of one column, in the kind polars gives them (:func:`dpcli.tasks.sql.typed.unified_kind`)."""
    kind, convert = unified_kind({v.kind for v in values})
    if not convert:
        return [v.expr for v in values], kind
    return [(as_number if kind == "number" else as_text)(v) for v in values], kind


def _case(c: Compiler, args: list[Typed], e: Op) -> Typed:
    from pyspark.sql import functions as F

    conditions = [as_bool(a, "CASE WHEN") for a in args[:-1:2]]
    values, kind = unify([*args[1:-1:2], args[-1]])
    chain = F.when(conditions[0], values[0])
    for cond, value in zip(conditions[1:], values[1:-1], strict=True):
        chain = chain.when(cond, value)
    return Typed(chain.otherwise(values[-1]), kind)


def _coalesce(c: Compiler, args: list[Typed], e: Op) -> Typed:
    from pyspark.sql import functions as F

    values, kind = unify(args)
    return Typed(F.coalesce(*values), kind)


def _nullif(c: Compiler, args: list[Typed], e: Op) -> Typed:
    from pyspark.sql import functions as F

    equal = _COMPARE["eq"](*comparable(args[0], args[1]))
    return Typed(F.when(equal, F.lit(None)).otherwise(args[0].expr), args[0].kind, args[0].dtype)


def _concat(c: Compiler, args: list[Typed], e: Op) -> Typed:
    from pyspark.sql import functions as F

    return Typed(F.concat(*[as_text(a) for a in args]), "text")


def _length(c: Compiler, args: list[Typed], e: Op) -> Typed:
    from pyspark.sql import functions as F

    return Typed(F.char_length(as_text(args[0])).try_cast("bigint"), "number")


def _round(c: Compiler, args: list[Typed], e: Op) -> Typed:
    from pyspark.sql import functions as F

    places = e.args[1]
    assert isinstance(places, Lit) and isinstance(places.value, Fraction)
    return Typed(F.bround(_d(as_number(args[0])), int(places.value)), "number")


def _is_null(c: Compiler, args: list[Typed], e: Op) -> Typed:
    return Typed(args[0].expr.isNull(), "bool")


_TRUE, _FALSE = ("true", "t", "1", "yes", "y"), ("false", "f", "0", "no", "n")


def _cast(c: Compiler, args: list[Typed], e: Op) -> Typed:
    from pyspark.sql import functions as F

    t = args[0]
    if e.op == "cast_int":
        return Typed(as_number(t).try_cast("bigint"), "number")
    if e.op == "cast_float":
        return Typed(_d(as_number(t)), "number")
    if e.op == "cast_text":
        return Typed(as_text(t), "text")
    if e.op == "cast_date":
        if t.kind == "temporal":
            return Typed(t.expr.try_cast("date"), "temporal")
        return Typed(F.try_to_date(F.trim(as_text(t)), F.lit("yyyy-MM-dd")), "temporal")
    if t.kind in ("bool", "null"):
        return Typed(t.expr.try_cast("boolean"), "bool")
    if t.kind == "number":
        return Typed(t.expr != 0, "bool")
    text = F.lower(F.trim(as_text(t)))
    return Typed(F.when(text.isin(*_TRUE), F.lit(True)).when(text.isin(*_FALSE), F.lit(False)), "bool")


_OPS: dict[str, Callable[[Compiler, list[Typed], Op], Typed]] = {
    **dict.fromkeys(_COMPARE, _ops_compare), **dict.fromkeys(_ARITHMETIC, _ops_arithmetic),
    **dict.fromkeys(("neg", "abs", "floor", "ceil", "sqrt", "ln", "exp"), _ops_numeric),
    **dict.fromkeys(("lower", "upper", "trim"), _ops_text),
    **dict.fromkeys(("cast_int", "cast_float", "cast_text", "cast_bool", "cast_date"), _cast),
    "and": _logic, "or": _logic, "not": _logic, "in": _in, "like": _like, "ilike": _like, "case": _case,
    "coalesce": _coalesce, "nullif": _nullif, "concat": _concat, "length": _length, "round": _round,
    "is_null": _is_null,
}
