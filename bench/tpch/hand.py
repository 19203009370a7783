"""The bounded per-customer pipelines of the TPC-H bench, written by hand in polars (no noise):
``python hand.py Q DIR [SALT]`` prints the per-partition totals a release adds noise to.

Every step ``dpcli sql``'s rules require for the query, as plain polars (one lazy query, streaming), with dpcli's
keyed order for the bounds (the words and the XXH64 chain of :mod:`dpcli.bounding.keyed_order`: the same order, so
the same rows kept, not a cheaper one) and dpcli's grids for the clamps:

1. the public tables' key multiplicities (the ``join-fan-out`` rule reads them before any private row);
2. the owners of ``lineitem``: each customer claims its first 32 orders by the public order (salt 0) among its
   distinct ``(o_custkey, o_orderkey)`` pairs (ordered only past 32), a key owned when exactly one customer claims
   it; each line takes its order's owner (an inner join: dangling and contested lines are dropped);
3. text read as its first 10,000 characters, units never null;
4. at most 400 rows per customer of each private table read, before its WHERE and joins (the keyed order of the
   columns read, with each row's occurrence among the customer's identical rows; ordered only past the cap);
5. the query's joins (private relations also on the unit) and WHERE;
6. one row per (customer, partition): each aggregate's partial from exact sums of the values' fixed-point integers
   (:mod:`dpcli.tasks.sql.fixed`), clamped on its grid (sums and means to their
   bounds, counts to their cap); at most K partitions per customer by the keyed order (ordered only past K);
7. per partition: the number of customers and the sums of the partials (128-bit).

The secret salt of a release is drawn from its seed; here it is a fixed number (``SALT``): the work is the same.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl

from dpcli.bounding import ValueGrid, default_granularity
from dpcli.bounding.keyed_order import row_word, with_order_key
from dpcli.tasks.sql import fixed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queries import MAX_KEYS, MAX_ROWS, SHAPE

UNIT = "o_custkey"
TEXT = 10_000
F = pl.Float64


def _scan(data: str, table: str, columns: list[str]) -> pl.LazyFrame:
    frame = pl.scan_parquet(f"{data}/{table}.parquet")
    schema = frame.collect_schema()
    return frame.select(pl.col(c).str.slice(0, TEXT) if schema[c] == pl.String else pl.col(c) for c in columns)


def _first(frame: pl.LazyFrame, over: str, fields: list[str], cap: int, salt: int, purpose: str) -> pl.LazyFrame:
    """The rows of each ``over`` value among its first ``cap`` by the keyed order of ``fields`` (ties dropped),
    the order computed only for the values with more than ``cap`` rows."""
    schema = frame.collect_schema()
    sized = frame.with_columns(pl.len().over(over).alias("__n")).cache()
    within = sized.filter(pl.col("__n") <= cap).drop("__n")
    beyond = with_order_key(sized.filter(pl.col("__n") > cap).drop("__n"), [(c, schema[c]) for c in fields], salt,
                            purpose, "__k")
    return pl.concat([within, beyond.filter(pl.col("__k").rank("max").over(over) <= cap).drop("__k")])


def owned_lines(data: str, columns: list[str]) -> pl.LazyFrame:
    """Step 2: ``lineitem``'s ``columns`` with each line's owner in ``o_custkey``."""
    pairs = _scan(data, "orders", [UNIT, "o_orderkey"]).drop_nulls().unique()
    claims = _first(pairs, UNIT, [UNIT, "o_orderkey"], MAX_KEYS, 0, "owners|orders|o_orderkey")
    owned = claims.group_by("o_orderkey").agg(pl.col(UNIT).min(), pl.col(UNIT).max().alias("__hi"))
    owned = owned.filter(pl.col(UNIT) == pl.col("__hi")).drop("__hi")
    lines = _scan(data, "lineitem", sorted({"l_orderkey", *columns}))
    return lines.join(owned, left_on="l_orderkey", right_on="o_orderkey")


def capped(frame: pl.LazyFrame, unit: str, table: str, salt: int) -> pl.LazyFrame:
    """Step 4: at most :data:`MAX_ROWS` rows per unit, by the keyed order of (unit, the columns read in name order,
    the occurrence), as ``--max-rows-per-table`` keeps them."""
    schema = frame.collect_schema()
    columns = [unit, *sorted(c for c in schema if c != unit)]
    sized = frame.with_columns(pl.len().over(unit).alias("__n")).cache()
    within = sized.filter(pl.col("__n") <= MAX_ROWS).drop("__n")
    over = sized.filter(pl.col("__n") > MAX_ROWS).drop("__n")
    words = [f"__w{i}" for i in range(len(columns))]
    over = over.with_columns((pl.col(c).to_physical() if isinstance(schema[c], pl.Decimal) else pl.col(c)).alias(w)
                             for c, w in zip(columns, words, strict=True))
    over = over.with_columns(row_word(w, pl.Int128 if isinstance(schema[c], pl.Decimal) else schema[c]).alias(w)
                             for c, w in zip(columns, words, strict=True))
    over = over.with_columns(pl.int_range(pl.len(), dtype=pl.UInt64).over(words).alias("__occ"))
    over = with_order_key(over, [*((w, pl.UInt64) for w in words), ("__occ", pl.UInt64)], salt,
                          f"table-rows|{table}", "__k")
    kept = over.filter(pl.col("__k").rank("max").over(unit) <= MAX_ROWS).drop("__k", "__occ", *words)
    return pl.concat([within, kept])


def _grid(lo: float, hi: float) -> ValueGrid:
    return ValueGrid(lo, hi, default_granularity(lo, hi))


def _sum(value: pl.Expr, lo: float, hi: float, name: str) -> tuple[pl.Expr, pl.Expr]:
    """(the aggregate, the partial) of ``ANON_SUM(value, lo, hi)`` (0 inside the bounds: no count needed): the exact
    Int128 sum of the values' fixed-point integers (:mod:`dpcli.tasks.sql.fixed`), rounded half to even, clamped."""
    g = _grid(lo, hi)
    one = fixed.int128(1 << fixed.FRACTION_BITS)
    part = fixed.round_div(pl.col(name).fill_null(0), one).clip(g.lo_units, g.hi_units)
    return fixed.row_units(value, g).cast(pl.Int128).sum().alias(name), part.cast(pl.Int64).alias(name)


def _mean(value: pl.Expr, lo: float, hi: float, name: str) -> tuple[list[pl.Expr], list[pl.Expr]]:
    """(the aggregates, the partials n and the centred sum) of ``ANON_AVG(value, lo, hi)``: the exact sum of the
    values' fixed-point integers over n · 2^F, rounded half to even, clamped, minus the centre."""
    g = _grid(lo, hi)
    n = pl.col(f"{name}_cnt")
    mean = fixed.round_div(pl.col(name).fill_null(0), fixed.scaled_count(n, fixed.FRACTION_BITS))
    units = mean.clip(g.lo_units, g.hi_units) - g.mid_units
    aggs = [value.count().alias(f"{name}_cnt"), fixed.row_units(value, g).cast(pl.Int128).sum().alias(name)]
    return aggs, [(n > 0).cast(pl.Int64).alias(f"{name}_n"),
                  pl.when(n > 0).then(units).otherwise(0).cast(pl.Int64).alias(name)]


def bounded_totals(rel: pl.LazyFrame, groups: list[str], sums: dict[str, tuple[pl.Expr, float, float]],
                   means: dict[str, tuple[pl.Expr, float, float]], count_cap: int | None, k: int | None,
                   salt: int) -> pl.LazyFrame:
    """Steps 6 and 7 over the joined, filtered relation ``rel`` (unit in ``o_custkey``)."""
    aggs, parts = [], []
    for name, (value, lo, hi) in sums.items():
        agg, part = _sum(value, lo, hi, name)
        aggs.append(agg)
        parts.append(part)
    for name, (value, lo, hi) in means.items():
        more, ps = _mean(value, lo, hi, name)
        aggs += more
        parts += ps
    if count_cap is not None:
        aggs.append(pl.len().alias("rows"))
        parts.append(pl.col("rows").clip(upper_bound=count_cap).cast(pl.Int64).alias("rows"))
    keys = [UNIT, *groups]
    partial = rel.group_by(keys).agg(aggs).select(*keys, *parts)
    if groups and k is not None:
        partial = _first(partial, UNIT, keys, k, salt, "groups")
    wide = [pl.col(c).cast(pl.Int128).sum() for c in partial.collect_schema() if c not in keys]
    totals = [pl.len().cast(pl.Int64).alias("units"), *wide]
    return partial.group_by(groups).agg(totals).sort(groups) if groups else partial.select(totals)


def multiplicities(data: str, joins: list[tuple[str, list[str]]]) -> int:
    """Step 1: the product of each public join's largest key multiplicity (dpcli reads them before any private
    row, its keys as doubles)."""
    product = 1
    for table, keys in joins:
        frame = _scan(data, table, keys).select(pl.col(k).cast(F) for k in keys).drop_nulls()
        product *= int(frame.group_by(keys).len().select(pl.col("len").max()).collect().item() or 1)
    return product


def _n(c: str) -> pl.Expr:
    return pl.col(c).cast(F)


DISC = _n("l_extendedprice") * (1 - _n("l_discount"))


def q1(d: str, salt: int) -> pl.LazyFrame:
    cols = ["l_quantity", "l_extendedprice", "l_discount", "l_tax", "l_returnflag", "l_linestatus", "l_shipdate"]
    rel = capped(owned_lines(d, cols), UNIT, "lineitem", salt).filter(pl.col("l_shipdate") <= dt.date(1998, 9, 2))
    sums = {"sum_qty": (_n("l_quantity"), 0, 2000), "sum_base_price": (_n("l_extendedprice"), 0, 3e6),
            "sum_disc_price": (DISC, 0, 3e6), "sum_charge": (DISC * (1 + _n("l_tax")), 0, 3e6)}
    means = {"avg_qty": (_n("l_quantity"), 1, 50), "avg_price": (_n("l_extendedprice"), 900, 105000),
             "avg_disc": (_n("l_discount"), 0, 0.1)}
    return bounded_totals(rel, ["l_returnflag", "l_linestatus"], sums, means, 80, SHAPE["Q1"][2], salt)


def q5(d: str, salt: int) -> pl.LazyFrame:
    multiplicities(d, [("supplier", ["s_suppkey", "s_nationkey"]), ("nation", ["n_nationkey"]),
                       ("region", ["r_regionkey"])])
    customer = capped(_scan(d, "customer", ["c_custkey", "c_nationkey"]).filter(pl.col("c_custkey").is_not_null()),
                      "c_custkey", "customer", salt)
    orders = capped(_scan(d, "orders", [UNIT, "o_orderdate", "o_orderkey"]).filter(pl.col(UNIT).is_not_null()),
                    UNIT, "orders", salt)
    lines = capped(owned_lines(d, ["l_discount", "l_extendedprice", "l_suppkey"]), UNIT, "lineitem", salt)
    region = _scan(d, "region", ["r_name", "r_regionkey"])
    rel = (customer.join(orders, left_on="c_custkey", right_on=UNIT)
           .join(lines, left_on=["o_orderkey", "c_custkey"], right_on=["l_orderkey", UNIT])
           .join(_scan(d, "supplier", ["s_suppkey", "s_nationkey"]), left_on=["l_suppkey", "c_nationkey"],
                 right_on=["s_suppkey", "s_nationkey"])
           .join(_scan(d, "nation", ["n_name", "n_nationkey", "n_regionkey"]), left_on="c_nationkey",
                 right_on="n_nationkey")
           .join(region, left_on="n_regionkey", right_on="r_regionkey")
           .filter((pl.col("r_name") == "ASIA") & (pl.col("o_orderdate") >= dt.date(1994, 1, 1))
                   & (pl.col("o_orderdate") < dt.date(1995, 1, 1)))
           .rename({"c_custkey": UNIT}))
    return bounded_totals(rel, ["n_name"], {"revenue": (DISC, 0, 250000)}, {}, None, SHAPE["Q5"][2], salt)


def q6(d: str, salt: int) -> pl.LazyFrame:
    lines = capped(owned_lines(d, ["l_discount", "l_extendedprice", "l_quantity", "l_shipdate"]), UNIT,
                   "lineitem", salt)
    rel = lines.filter((pl.col("l_shipdate") >= dt.date(1994, 1, 1)) & (pl.col("l_shipdate") < dt.date(1995, 1, 1))
                       & _n("l_discount").is_between(0.05, 0.07) & (_n("l_quantity") < 24))
    return bounded_totals(rel, [], {"revenue": (_n("l_extendedprice") * _n("l_discount"), 0, 10000)}, {}, None,
                          None, salt)


def q14(d: str, salt: int) -> pl.LazyFrame:
    multiplicities(d, [("part", ["p_partkey"])])
    lines = capped(owned_lines(d, ["l_discount", "l_extendedprice", "l_partkey", "l_shipdate"]), UNIT, "lineitem",
                   salt)
    rel = lines.join(_scan(d, "part", ["p_partkey", "p_type"]), left_on="l_partkey", right_on="p_partkey").filter(
        (pl.col("l_shipdate") >= dt.date(1995, 9, 1)) & (pl.col("l_shipdate") < dt.date(1995, 10, 1)))
    promo = pl.when(pl.col("p_type").str.starts_with("PROMO")).then(DISC).otherwise(0.0)
    return bounded_totals(rel, [], {"promo_revenue": (promo, 0, 400000), "revenue": (DISC, 0, 400000)}, {}, None,
                          None, salt)


def _q19_branch(brand: str, size: str, qty: int, top: int) -> pl.Expr:
    kinds = ("BAG", "BOX", "PKG", "PACK") if size == "MED" else ("CASE", "BOX", "PACK", "PKG")
    return ((pl.col("p_brand") == brand) & pl.col("p_container").is_in([f"{size} {c}" for c in kinds])
            & _n("l_quantity").is_between(qty, qty + 10) & pl.col("p_size").is_between(1, top)
            & pl.col("l_shipmode").is_in(["AIR", "AIR REG"]) & (pl.col("l_shipinstruct") == "DELIVER IN PERSON"))


def q19(d: str, salt: int) -> pl.LazyFrame:
    multiplicities(d, [("part", ["p_partkey"])])
    cols = ["l_discount", "l_extendedprice", "l_partkey", "l_quantity", "l_shipinstruct", "l_shipmode"]
    lines = capped(owned_lines(d, cols), UNIT, "lineitem", salt)
    part = _scan(d, "part", ["p_brand", "p_container", "p_partkey", "p_size"])
    keep = _q19_branch("Brand#12", "SM", 1, 5) | _q19_branch("Brand#23", "MED", 10, 10) | _q19_branch(
        "Brand#34", "LG", 20, 15)
    rel = lines.join(part, left_on="l_partkey", right_on="p_partkey").filter(keep)
    return bounded_totals(rel, [], {"revenue": (DISC, 0, 100000)}, {}, None, None, salt)


HAND: dict[str, Callable[[str, int], pl.LazyFrame]] = {"Q1": q1, "Q5": q5, "Q6": q6, "Q14": q14, "Q19": q19}
SALT = 0x5EED

if __name__ == "__main__":
    salt = int(sys.argv[3]) if len(sys.argv) > 3 else SALT
    print(HAND[sys.argv[1]](sys.argv[2], salt).collect(engine="streaming"))
