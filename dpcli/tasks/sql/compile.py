"""The resolved relation as a polars lazy frame: the per-user stage of a ``dpcli sql`` query.

Built from the plan only (:mod:`dpcli.tasks.sql.ir`), never by executing SQL text: each relation
becomes the polars operation that means the same (scan → select, WHERE → filter, a projection →
select, a join → join, a per-user GROUP BY → group_by). Types come from the schema
(:mod:`dpcli.tasks.sql.typed`). Rows whose privacy unit is null are dropped where a private table
is read and after every join (an outer join with a public table can leave a row with no owner).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import polars as pl

from dpcli.errors import DataError
from dpcli.tasks.sql.ir import (
    AggCall,
    Aggregate,
    Col,
    Expr,
    Filter,
    Join,
    Project,
    Relation,
    Scan,
    columns_of,
    expressions_of,
    scans_of,
)
from dpcli.tasks.sql.lengths import MAX_TEXT_LENGTH
from dpcli.tasks.sql.typed import Compiler, as_number, schema_of


def needed_columns(relation: Relation, extra: list[Expr]) -> dict[str, set[str]]:
    """Per table read (by its prefix), the columns the query reads from it (its unit always)."""
    used: set[str] = set().union(*(columns_of(e) for e in [*expressions_of(relation), *extra]))
    out: dict[str, set[str]] = {}
    for scan in scans_of(relation):
        mine = {c[len(scan.prefix) + 1:] for c in used if c.startswith(scan.prefix + ".")}
        if scan.unit is not None:
            mine.add(scan.unit[len(scan.prefix) + 1:])
        out[scan.prefix] = mine
    return out


def compile_relation(rel: Relation, tables: Mapping[str, pl.LazyFrame], needed: Mapping[str, set[str]]
                     ) -> pl.LazyFrame:
    """``rel`` as a lazy frame over ``tables`` (by declared name), reading ``needed`` columns of each scan."""
    if isinstance(rel, Scan):
        return _scan(rel, tables[rel.table], sorted(needed.get(rel.prefix, ())))
    if isinstance(rel, Join):
        return _join(rel, compile_relation(rel.left, tables, needed), compile_relation(rel.right, tables, needed))
    frame = compile_relation(rel.input, tables, needed)
    return _UNARY[type(rel)](rel, frame)


def _scan(scan: Scan, frame: pl.LazyFrame, columns: list[str]) -> pl.LazyFrame:
    schema = schema_of(frame)
    for c in columns:
        if c not in schema:
            raise DataError(f"column {c!r} not found in {scan.table}")
    out = frame.select([_read_column(c, schema[c]).alias(f"{scan.prefix}.{c}") for c in columns])
    return out.filter(pl.col(scan.unit).is_not_null()) if scan.unit is not None else out


def _read_column(name: str, dtype: pl.DataType) -> pl.Expr:
    """A column as the query reads it: text cut to its first :data:`~dpcli.tasks.sql.lengths.MAX_TEXT_LENGTH`
    characters (so every value the query computes has a public bound, :mod:`dpcli.tasks.sql.lengths`)."""
    return pl.col(name).str.slice(0, MAX_TEXT_LENGTH) if dtype == pl.String else pl.col(name)


def _filter(rel: Relation, frame: pl.LazyFrame) -> pl.LazyFrame:
    assert isinstance(rel, Filter)
    return frame.filter(Compiler(schema_of(frame)).condition(rel.condition, "WHERE"))


def _project(rel: Relation, frame: pl.LazyFrame) -> pl.LazyFrame:
    assert isinstance(rel, Project)
    c = Compiler(schema_of(frame))
    out = frame.select([c.typed(e).expr.alias(name) for name, e in rel.items])
    return out.unique() if rel.distinct else out


def _aggregate(rel: Relation, frame: pl.LazyFrame) -> pl.LazyFrame:
    assert isinstance(rel, Aggregate)
    c = Compiler(schema_of(frame))
    aggs = [_agg_call(c, call).alias(name) for name, call in rel.aggs]
    if not rel.keys:
        return frame.select(aggs)
    return frame.group_by([c.typed(e).expr.alias(name) for name, e in rel.keys]).agg(aggs)


def _agg_call(c: Compiler, call: AggCall) -> pl.Expr:
    """A plain aggregate of a sub-query (per user): SQL's meaning, nulls skipped."""
    if call.arg is None:
        return pl.len().cast(pl.Int64)
    arg = c.typed(call.arg)
    if call.function == "count":
        return arg.expr.count().cast(pl.Int64)
    if call.function == "count_distinct":
        return arg.expr.drop_nulls().n_unique().cast(pl.Int64)
    if call.function in ("min", "max"):
        return arg.expr.min() if call.function == "min" else arg.expr.max()
    number = as_number(arg)
    return number.sum() if call.function == "sum" else number.cast(pl.Float64).mean()


_UNARY: dict[type, Callable[[Relation, pl.LazyFrame], pl.LazyFrame]] = {
    Filter: _filter, Project: _project, Aggregate: _aggregate,
}


def key_pair(left: pl.Expr, ltype: pl.DataType, right: pl.Expr, rtype: pl.DataType) -> tuple[pl.Expr, pl.Expr]:
    """Join keys of one type: as they are when alike, 64-bit integers or floats when both are numbers,
    else both as text (decided by the schema alone). Every cast is non-strict, as Spark's ``try_cast``:
    a value the common type cannot hold (an unsigned 64-bit key past 2^63 against a signed one) is a
    null key that matches nothing, never an error one record could raise (rule 4). A duration against another
    type is its stored integer, in its own unit (what Spark reads: a Parquet duration is a bigint there): polars
    cannot cast a duration to text, and would fail at the first value, not at the schema."""
    if ltype == rtype:
        return left, right
    if isinstance(ltype, pl.Duration):
        left, ltype = left.to_physical(), pl.Int64()
    if isinstance(rtype, pl.Duration):
        right, rtype = right.to_physical(), pl.Int64()
    if ltype == rtype:
        return left, right
    if ltype.is_integer() and rtype.is_integer():
        target: pl.DataType = pl.Int64()
    elif ltype.is_numeric() and rtype.is_numeric():
        target = pl.Float64()
    else:
        target = pl.String()
    return left.cast(target, strict=False), right.cast(target, strict=False)


def _join(rel: Join, left: pl.LazyFrame, right: pl.LazyFrame) -> pl.LazyFrame:
    """A join on the coerced key pairs; merged columns (USING, the unit) hold either side's value."""
    ls, rs = schema_of(left), schema_of(right)
    lc, rc = Compiler(ls), Compiler(rs)
    keys = []
    for a, b in rel.on:
        ta, tb = lc.typed(a), rc.typed(b)
        assert ta.dtype is not None and tb.dtype is not None
        keys.append(key_pair(ta.expr, ta.dtype, tb.expr, tb.dtype))
    if keys:
        how = rel.how if rel.how != "cross" else "inner"
        joined = left.join(right, left_on=[k[0] for k in keys], right_on=[k[1] for k in keys], how=how,
                           coalesce=False)
    else:
        joined = left.join(right, how="cross")
    merged = [_merged(name, lcol, rcol, rel, keys) for name, lcol, rcol in rel.merged]
    if merged:
        joined = joined.with_columns(merged)
    if rel.extra is not None:
        joined = joined.filter(Compiler(schema_of(joined)).condition(rel.extra, "ON"))
    if rel.unit is None or rel.how in ("inner", "cross"):  # an inner join keeps the units its sides had
        return joined
    return joined.filter(pl.col(rel.unit).is_not_null())


def _merged(name: str, lcol: str, rcol: str, rel: Join, keys: list[tuple[pl.Expr, pl.Expr]]) -> pl.Expr:
    """A merged column: the left value, else the right one, as the join compared them (for a key of an
    inner or one-sided join, the kept side's, which is the same)."""
    for (a, b), (lk, rk) in zip(rel.on, keys, strict=True):
        if a == Col(lcol) and b == Col(rcol):
            sides = {"inner": [lk], "left": [lk], "right": [rk]}.get(rel.how, [lk, rk])
            return pl.coalesce(sides).alias(name)
    return pl.coalesce([pl.col(lcol), pl.col(rcol)]).alias(name)


def group_key_check(schema: Mapping[str, pl.DataType], column: str, what: str) -> None:
    """A unit or group column must be one every engine hashes alike: no floats, no nested values."""
    dtype = schema[column]
    hashable = (dtype == pl.String or dtype == pl.Boolean or dtype.is_integer() or dtype == pl.Date
                or isinstance(dtype, (pl.Datetime, pl.Duration, pl.Categorical, pl.Enum)))
    if not hashable:
        raise DataError(f"{what} has type {dtype.base_type()}: a privacy unit or group holds text, integers, "
                        "booleans, dates or times (CAST it)")
