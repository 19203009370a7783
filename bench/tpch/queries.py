"""The TPC-H queries of the bench (issue 41 item 5): the DuckDB privacy extension's DP set, Q1, Q5, Q6, Q14, Q19.

Each query three ways: in dpcli's SQL dialect (``DPCLI``, with the tables' declarations and bounds in ``ARGS``),
as the standard TPC-H text for DuckDB (``DUCKDB``), and as plain polars (:mod:`bench.tpch.plain_polars`). The
customer is the privacy unit: ``orders`` carries it (``o_custkey``), ``customer`` is its own unit table
(``c_custkey``, Q5), and ``lineitem`` is owned through ``orders`` (``--owned-by
lineitem.l_orderkey=orders.o_orderkey``: a line belongs to the customer of its order). ``part``, ``supplier``,
``nation`` and ``region`` are public.

Rewrites (the dialect lacks nothing else these queries need):

* dates: the literals of the standard text with the interval folded (Q1's ``date '1998-12-01' - interval '90'
  day`` is ``DATE '1998-09-02'``; Q6's ``+ interval '1' year`` is ``'1995-01-01'``); dpcli has no INTERVAL;
* Q5: the comma joins become explicit equality joins; ``s_nationkey = c_nationkey`` joins ``supplier`` on the
  composite key (``l_suppkey``, ``c_nationkey``) = (``s_suppkey``, ``s_nationkey``);
* Q14: ``100 * SUM(promo) / SUM(all)`` is two releases of one query (``promo_revenue`` and ``revenue``), the
  ratio taken after the noise (post-processing);
* Q19: ``p_partkey = l_partkey`` is the join's ``ON`` (it stands in each branch of the standard ``OR``);
* ``ORDER BY`` is left out of the plain queries too (four rows at most);
* the aggregates are the query's own (Q1: four sums, three means and a count), each with public bounds.

Bounds: each close to the 99.9th percentile of the per-customer partial at SF1 (measured once; the partials of a
larger scale factor grow little: a customer's orders do not multiply with the scale factor). Caps: at most 32
orders per customer carry its ownership (``--max-keys-per-owner 32``; the 99th percentile at SF1 is 30, the largest
41), so the stability is S = 1 + 2·32 = 65; at most 400 rows per customer and table (Q5 reads three private
tables, so 400³ ≤ 10⁸; a customer's largest number of lines is 287 at SF1); K = 4 for Q1 (its four groups), 1 for
Q5 (a customer's nation is one).
"""

from __future__ import annotations

Q1_DATE = "1998-09-02"

DPCLI = {
    "Q1": (
        "SELECT l_returnflag, l_linestatus, ANON_SUM(l_quantity, 0, 2000) AS sum_qty, "
        "ANON_SUM(l_extendedprice, 0, 3000000) AS sum_base_price, "
        "ANON_SUM(l_extendedprice * (1 - l_discount), 0, 3000000) AS sum_disc_price, "
        "ANON_SUM(l_extendedprice * (1 - l_discount) * (1 + l_tax), 0, 3000000) AS sum_charge, "
        "ANON_AVG(l_quantity, 1, 50) AS avg_qty, ANON_AVG(l_extendedprice, 900, 105000) AS avg_price, "
        "ANON_AVG(l_discount, 0, 0.1) AS avg_disc, ANON_COUNT(*, 80) AS count_order "
        f"FROM lineitem WHERE l_shipdate <= DATE '{Q1_DATE}' GROUP BY l_returnflag, l_linestatus"
    ),
    "Q5": (
        "SELECT n.n_name, ANON_SUM(l.l_extendedprice * (1 - l.l_discount), 0, 250000) AS revenue "
        "FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
        "JOIN lineitem l ON l.l_orderkey = o.o_orderkey "
        "JOIN supplier s ON l.l_suppkey = s.s_suppkey AND c.c_nationkey = s.s_nationkey "
        "JOIN nation n ON s.s_nationkey = n.n_nationkey JOIN region r ON n.n_regionkey = r.r_regionkey "
        "WHERE r.r_name = 'ASIA' AND o.o_orderdate >= DATE '1994-01-01' AND o.o_orderdate < DATE '1995-01-01' "
        "GROUP BY n.n_name"
    ),
    "Q6": (
        "SELECT ANON_SUM(l_extendedprice * l_discount, 0, 10000) AS revenue FROM lineitem "
        "WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01' "
        "AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24"
    ),
    "Q14": (
        "SELECT ANON_SUM(CASE WHEN p.p_type LIKE 'PROMO%' THEN l.l_extendedprice * (1 - l.l_discount) ELSE 0 END, "
        "0, 400000) AS promo_revenue, ANON_SUM(l.l_extendedprice * (1 - l.l_discount), 0, 400000) AS revenue "
        "FROM lineitem l JOIN part p ON l.l_partkey = p.p_partkey "
        "WHERE l.l_shipdate >= DATE '1995-09-01' AND l.l_shipdate < DATE '1995-10-01'"
    ),
    "Q19": (
        "SELECT ANON_SUM(l.l_extendedprice * (1 - l.l_discount), 0, 100000) AS revenue "
        "FROM lineitem l JOIN part p ON p.p_partkey = l.l_partkey "
        "WHERE (p.p_brand = 'Brand#12' AND p.p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG') "
        "AND l.l_quantity >= 1 AND l.l_quantity <= 11 AND p.p_size BETWEEN 1 AND 5 "
        "AND l.l_shipmode IN ('AIR', 'AIR REG') AND l.l_shipinstruct = 'DELIVER IN PERSON') "
        "OR (p.p_brand = 'Brand#23' AND p.p_container IN ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK') "
        "AND l.l_quantity >= 10 AND l.l_quantity <= 20 AND p.p_size BETWEEN 1 AND 10 "
        "AND l.l_shipmode IN ('AIR', 'AIR REG') AND l.l_shipinstruct = 'DELIVER IN PERSON') "
        "OR (p.p_brand = 'Brand#34' AND p.p_container IN ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG') "
        "AND l.l_quantity >= 20 AND l.l_quantity <= 30 AND p.p_size BETWEEN 1 AND 15 "
        "AND l.l_shipmode IN ('AIR', 'AIR REG') AND l.l_shipinstruct = 'DELIVER IN PERSON')"
    ),
}

#: The caps every query shares (see the module docstring).
MAX_KEYS, MAX_ROWS = 32, 400
#: Per query: the public tables it joins, whether it reads ``customer``, K (None: no GROUP BY).
SHAPE: dict[str, tuple[tuple[str, ...], bool, int | None]] = {
    "Q1": ((), False, 4), "Q5": (("supplier", "nation", "region"), True, 1), "Q6": ((), False, None),
    "Q14": (("part",), False, None), "Q19": (("part",), False, None),
}


def dpcli_args(query: str, data: str, epsilon: str) -> list[str]:
    """``dpcli sql``'s arguments for ``query`` over the Parquet files in ``data`` (one release, charged)."""
    public, customer, k = SHAPE[query]
    args = ["sql", DPCLI[query], "--table", f"lineitem={data}/lineitem.parquet", "--table",
            f"orders={data}/orders.parquet", "--privacy-unit", "orders.o_custkey", "--owned-by",
            "lineitem.l_orderkey=orders.o_orderkey", "--max-keys-per-owner", str(MAX_KEYS),
            "--max-rows-per-table", str(MAX_ROWS), "--epsilon", epsilon, "--no-report-bias"]
    if customer:
        args += ["--table", f"customer={data}/customer.parquet", "--privacy-unit", "customer.c_custkey"]
    for t in public:
        args += ["--public-table", f"{t}={data}/{t}.parquet"]
    if k is not None:
        args += ["--max-partitions", str(k), "--delta", "1e-7"]
    return args


DUCKDB = {
    "Q1": """SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base_price,
  sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
  sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge, avg(l_quantity) AS avg_qty,
  avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc, count(*) AS count_order
FROM lineitem WHERE l_shipdate <= date '1998-12-01' - interval '90' day
GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""",
    "Q5": """SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue
FROM customer, orders, lineitem, supplier, nation, region
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey AND c_nationkey = s_nationkey
  AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'ASIA'
  AND o_orderdate >= date '1994-01-01' AND o_orderdate < date '1994-01-01' + interval '1' year
GROUP BY n_name ORDER BY revenue DESC""",
    "Q6": """SELECT sum(l_extendedprice * l_discount) AS revenue FROM lineitem
WHERE l_shipdate >= date '1994-01-01' AND l_shipdate < date '1994-01-01' + interval '1' year
  AND l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01 AND l_quantity < 24""",
    "Q14": """SELECT 100.00 * sum(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
  / sum(l_extendedprice * (1 - l_discount)) AS promo_revenue
FROM lineitem, part
WHERE l_partkey = p_partkey AND l_shipdate >= date '1995-09-01' AND l_shipdate < date '1995-09-01' + interval '1' month""",
    "Q19": """SELECT sum(l_extendedprice * (1 - l_discount)) AS revenue FROM lineitem, part
WHERE (p_partkey = l_partkey AND p_brand = 'Brand#12' AND p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
   AND l_quantity >= 1 AND l_quantity <= 1 + 10 AND p_size BETWEEN 1 AND 5 AND l_shipmode IN ('AIR', 'AIR REG')
   AND l_shipinstruct = 'DELIVER IN PERSON')
OR (p_partkey = l_partkey AND p_brand = 'Brand#23' AND p_container IN ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
   AND l_quantity >= 10 AND l_quantity <= 10 + 10 AND p_size BETWEEN 1 AND 10 AND l_shipmode IN ('AIR', 'AIR REG')
   AND l_shipinstruct = 'DELIVER IN PERSON')
OR (p_partkey = l_partkey AND p_brand = 'Brand#34' AND p_container IN ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
   AND l_quantity >= 20 AND l_quantity <= 20 + 10 AND p_size BETWEEN 1 AND 15 AND l_shipmode IN ('AIR', 'AIR REG')
   AND l_shipinstruct = 'DELIVER IN PERSON')""",
}

QUERIES = tuple(DPCLI)
