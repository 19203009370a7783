"""The plain (non-private) TPC-H query in polars, lazy and streaming: ``python plain_polars.py Q DIR``.

What an engineer writes in polars for the standard text of :data:`bench.tpch.queries.DUCKDB` (same filters,
joins and aggregates; decimals read as doubles, as dpcli reads them).
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable

import polars as pl

F = pl.Float64


def _scan(data: str, table: str) -> pl.LazyFrame:
    return pl.scan_parquet(f"{data}/{table}.parquet")


def _n(c: str) -> pl.Expr:
    return pl.col(c).cast(F)


DISC = _n("l_extendedprice") * (1 - _n("l_discount"))


def q1(d: str) -> pl.LazyFrame:
    li = _scan(d, "lineitem").filter(pl.col("l_shipdate") <= dt.date(1998, 9, 2))
    return li.group_by("l_returnflag", "l_linestatus").agg(
        _n("l_quantity").sum().alias("sum_qty"), _n("l_extendedprice").sum().alias("sum_base_price"),
        DISC.sum().alias("sum_disc_price"), (DISC * (1 + _n("l_tax"))).sum().alias("sum_charge"),
        _n("l_quantity").mean().alias("avg_qty"), _n("l_extendedprice").mean().alias("avg_price"),
        _n("l_discount").mean().alias("avg_disc"), pl.len().alias("count_order"),
    ).sort("l_returnflag", "l_linestatus")


def q5(d: str) -> pl.LazyFrame:
    orders = _scan(d, "orders").filter(pl.col("o_orderdate").is_between(dt.date(1994, 1, 1), dt.date(1995, 1, 1),
                                                                         closed="left"))
    region = _scan(d, "region").filter(pl.col("r_name") == "ASIA")
    nation = _scan(d, "nation").join(region, left_on="n_regionkey", right_on="r_regionkey")
    joined = (_scan(d, "customer").join(orders, left_on="c_custkey", right_on="o_custkey")
              .join(_scan(d, "lineitem"), left_on="o_orderkey", right_on="l_orderkey")
              .join(_scan(d, "supplier"), left_on=["l_suppkey", "c_nationkey"], right_on=["s_suppkey", "s_nationkey"])
              .join(nation, left_on="c_nationkey", right_on="n_nationkey"))
    return joined.group_by("n_name").agg(DISC.sum().alias("revenue")).sort("revenue", descending=True)


def q6(d: str) -> pl.LazyFrame:
    li = _scan(d, "lineitem").filter(
        pl.col("l_shipdate").is_between(dt.date(1994, 1, 1), dt.date(1995, 1, 1), closed="left")
        & _n("l_discount").is_between(0.05, 0.07) & (_n("l_quantity") < 24))
    return li.select((_n("l_extendedprice") * _n("l_discount")).sum().alias("revenue"))


def q14(d: str) -> pl.LazyFrame:
    li = _scan(d, "lineitem").filter(pl.col("l_shipdate").is_between(dt.date(1995, 9, 1), dt.date(1995, 10, 1),
                                                                      closed="left"))
    joined = li.join(_scan(d, "part"), left_on="l_partkey", right_on="p_partkey")
    promo = pl.when(pl.col("p_type").str.starts_with("PROMO")).then(DISC).otherwise(0.0)
    return joined.select((100.0 * promo.sum() / DISC.sum()).alias("promo_revenue"))


def _q19_branch(brand: str, size: str, qty: int, top: int) -> pl.Expr:
    containers = [f"{size} {c}" for c in (("CASE", "BOX", "PACK", "PKG") if size != "MED" else
                                           ("BAG", "BOX", "PKG", "PACK"))]
    return ((pl.col("p_brand") == brand) & pl.col("p_container").is_in(containers)
            & _n("l_quantity").is_between(qty, qty + 10) & pl.col("p_size").is_between(1, top)
            & pl.col("l_shipmode").is_in(["AIR", "AIR REG"]) & (pl.col("l_shipinstruct") == "DELIVER IN PERSON"))


def q19(d: str) -> pl.LazyFrame:
    joined = _scan(d, "lineitem").join(_scan(d, "part"), left_on="l_partkey", right_on="p_partkey")
    keep = _q19_branch("Brand#12", "SM", 1, 5) | _q19_branch("Brand#23", "MED", 10, 10) | _q19_branch(
        "Brand#34", "LG", 20, 15)
    return joined.filter(keep).select(DISC.sum().alias("revenue"))


PLAIN: dict[str, Callable[[str], pl.LazyFrame]] = {"Q1": q1, "Q5": q5, "Q6": q6, "Q14": q14, "Q19": q19}

if __name__ == "__main__":
    print(PLAIN[sys.argv[1]](sys.argv[2]).collect(engine="streaming"))
