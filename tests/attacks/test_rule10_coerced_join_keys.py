"""Review of issue 37 (rule 10): the fan-out is measured on the public key's own type, but the join
coerces both keys to a common type chosen by the *other* side (compile.key_pair). An Int64 public key
joined to a Float64 private key is cast to Float64, where distinct 64-bit integers collapse: 100 distinct
ids near 2**60 are one double. The check reads multiplicity 1 per join; the join makes 100 rows per
private row, and k joins make 100**k (here 10**6 > MAX_FANOUT = 1000, accepted). Fixed: the public key is
counted as the coarsest type a join may give it (numbers as 64-bit floats)."""

from __future__ import annotations

import polars as pl

from dpcli.tasks.sql.compile import compile_relation, needed_columns
from dpcli.tasks.sql.fanout import MAX_FANOUT, fanout
from dpcli.tasks.sql.query import resolve_query
from dpcli.tasks.sql.scope import TableDecl


def test_attack_float_coercion_hides_the_fan_out():
    tables = {"v": TableDecl("v", "user", ("user", "f")), "pub": TableDecl("pub", None, ("k",))}
    pub = pl.LazyFrame({"k": [2**60 + i for i in range(100)]}, schema={"k": pl.Int64})  # distinct: multiplicity 1
    v = pl.LazyFrame({"user": ["u0"], "f": [float(2**60)]}, schema={"user": pl.String, "f": pl.Float64})
    q = resolve_query("SELECT ANON_COUNT(*) FROM v JOIN pub a ON v.f = a.k JOIN pub b ON v.f = b.k "
                      "JOIN pub c ON v.f = c.k", tables)
    measured = fanout(q.relation, {"pub": pub})
    frame = compile_relation(q.relation, {"v": v, "pub": pub}, needed_columns(q.relation, list(q.groups)))
    actual = frame.select(pl.len()).collect().item()
    # the check must bound what the join does to one private row: refused, or the rows it makes counted
    assert measured > MAX_FANOUT or actual <= measured, (measured, actual)
    single = resolve_query("SELECT ANON_COUNT(*) FROM v JOIN pub a ON v.f = a.k", tables)
    assert fanout(single.relation, {"pub": pub}) == 100  # counted as the join's float key, not as distinct ints
