"""The fan-out of a query's joins with public relations, read from the public tables before any private data.

A join with a public relation can match one private row to many public rows. Every join has an
equality key (the ``join-key`` rule of :mod:`dpcli.tasks.sql.rules`), so one private row matches at
most the largest multiplicity of a key value on the public side (a composite key counts as one key:
the most public rows sharing one tuple of its values). The product of those multiplicities over the
query's joins with a public side bounds how many rows one private row becomes: it must be at most
:data:`MAX_FANOUT`, so that the work done per person is bounded by public parameters (README,
"Threat model", rule 10). The public tables are public: their multiplicities may be read, and are
named in the refusal.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import polars as pl

from dpcli.tasks.sql.compile import compile_relation, needed_columns
from dpcli.tasks.sql.ir import Expr, Join, Relation, Scan
from dpcli.tasks.sql.rules import refuse
from dpcli.tasks.sql.typed import Compiler, Typed, schema_of

#: The most rows one private row may become through a query's joins with public relations.
MAX_FANOUT = 1000

#: The most rows one person's rows may join to through the query's private reads (each capped by
#: ``--max-rows-per-table``: the default, 10,000, read twice, is 10^8).
MAX_ROWS_PER_PERSON = 10**8


def public_sides(rel: Relation) -> Iterator[tuple[Relation, list[Expr]]]:
    """Every join of a private relation with a public one: the public side and its key expressions."""
    if isinstance(rel, Scan):
        return
    if isinstance(rel, Join):
        if (rel.left.unit is None) != (rel.right.unit is None):
            if rel.left.unit is None:
                yield rel.left, [a for a, _ in rel.on]
            else:
                yield rel.right, [b for _, b in rel.on]
        yield from public_sides(rel.left)
        yield from public_sides(rel.right)
        return
    yield from public_sides(rel.input)


def multiplicity(side: Relation, keys: list[Expr], tables: Mapping[str, pl.LazyFrame]) -> int:
    """The most rows of the public relation ``side`` that share one value of its (composite) key; rows with a
    null key match nothing and are not counted."""
    frame = compile_relation(side, tables, needed_columns(side, keys))
    compiler = Compiler(schema_of(frame))
    names = [f"__dp_k{i}" for i in range(len(keys))]
    keyed = frame.select([_widest(compiler.typed(k)).alias(n) for k, n in zip(keys, names, strict=True)])
    keyed = keyed.drop_nulls()
    counts = keyed.group_by(names).agg(pl.len().alias("__dp_n")).select(pl.col("__dp_n").max()).collect()
    value = counts.item() if counts.height else None
    return int(value) if value is not None else 0


def _widest(key: Typed) -> pl.Expr:
    """A public key as the coarsest type a join may give it (:func:`dpcli.tasks.sql.compile.key_pair`): a number
    as a 64-bit float, where distinct integers past 2^53 (or decimals) can become one value; text and other
    casts keep distinct values distinct. So the multiplicity counted is never below the join's, whatever the
    other side's type (a duration is its stored integer there, so it counts as a number)."""
    if isinstance(key.dtype, pl.Duration):
        return key.expr.to_physical().cast(pl.Float64(), strict=False)
    if key.dtype is not None and key.dtype.is_numeric():
        return key.expr.cast(pl.Float64(), strict=False)
    return key.expr


def private_reads(rel: Relation) -> int:
    """How many times the query reads a private table (a self-join or a sub-query read twice counts twice)."""
    if isinstance(rel, Scan):
        return int(rel.unit is not None)
    if isinstance(rel, Join):
        return private_reads(rel.left) + private_reads(rel.right)
    return private_reads(rel.input)


def check_private_work(rel: Relation, cap: int, most: int = MAX_ROWS_PER_PERSON) -> None:
    """Refuse (usage error) a query whose private reads, each capped at ``cap`` rows per person
    (``--max-rows-per-table``), can join to more than ``most`` rows of one person: ``cap`` to the power of
    the number of private reads, a public bound on the work one person's rows can cause."""
    reads = private_reads(rel)
    if reads > 1 and cap**reads > most:
        largest = next(c for c in range(cap, 0, -1) if c**reads <= most)
        raise refuse("join-fan-out", f"the query reads private tables {reads} times, so one person's rows can join "
                     f"to {cap}^{reads} rows (at most {most:,}); give --max-rows-per-table {largest} or less")


def fanout(rel: Relation, tables: Mapping[str, pl.LazyFrame], cap: int = MAX_FANOUT) -> int:
    """The product of the largest key multiplicities of ``rel``'s public joins (reading stops past ``cap``)."""
    product = 1
    for side, keys in public_sides(rel):
        product *= max(multiplicity(side, keys, tables), 1)
        if product > cap:
            break
    return product


def check_fanout(rel: Relation, tables: Mapping[str, pl.LazyFrame], rows_cap: int, cap: int = MAX_FANOUT,
                 most: int = MAX_ROWS_PER_PERSON) -> None:
    """Refuse (usage error) a query whose public joins can make one private row more than ``cap`` rows, or
    whose work per person, one bound for both kinds of join, can pass ``most`` rows: ``rows_cap`` (the rows
    each private read keeps per person) to the power of the private reads, times the public fan-out."""
    product = fanout(rel, tables, cap)
    if product > cap:
        raise refuse("join-fan-out", f"the joins with public tables can match one private row to more "
                     f"than {cap} rows (the product of each join's most public rows per key value is at least "
                     f"{product}); join on keys that are (nearly) unique in the public tables")
    reads = private_reads(rel)
    if rows_cap**reads * product > most:
        largest = next((c for c in range(rows_cap, 0, -1) if c**reads * product <= most), 0)
        raise refuse("join-fan-out", f"one person's {rows_cap} rows per private read ({reads} read(s)) can join to "
                     f"{rows_cap}^{reads} × {product} rows through the joins (at most {most:,}); give "
                     f"--max-rows-per-table {largest} or less")


__all__ = ["MAX_FANOUT", "MAX_ROWS_PER_PERSON", "check_fanout", "check_private_work", "fanout", "multiplicity",
           "private_reads", "public_sides"]
