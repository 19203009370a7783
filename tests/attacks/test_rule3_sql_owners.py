"""Rule 3 (and 4) for ``dpcli sql`` over a chain of foreign keys (issue 41, item 2): ``lineitem`` owned through
``orders``, whose ``o_custkey`` is the unit.

D and D′ are released under one forced seed (``report_diff``): the exit code, stderr, every ``--json`` summary
field and the ledger entries must be identical; only the released rows may differ. D′ is

* D plus one customer one of whose orders duplicates another customer's order key (and its lines of it): the
  other customer's lines of that order become contested and are dropped, inside the bounded transformation;
* D plus one customer with a line naming no order at all (a dangling key), dropped;
* D with one line moved from one customer's order to another's.

Nothing in the data may fail the run or show in a message: with the same declarations and schemas, the same
public report. The new customer's own lines have a return flag that sorts last (``Z``), so the noise draws of the
other partitions stay aligned and its own partition shows with probability at most δ.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from report_diff import APPROX, report_diff, run_cli

QUERIES = {
    "lines alone": "SELECT l_returnflag, ANON_COUNT(*, 10) AS n, ANON_SUM(l_extendedprice, 0, 500) AS s "
                   "FROM lineitem GROUP BY l_returnflag",
    "joined on the link": "SELECT l_returnflag, ANON_AVG(l_extendedprice, 0, 100) AS a, ANON_COUNT(DISTINCT "
                          "o_custkey) AS u FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey "
                          "WHERE o_orderstatus <> 'P' GROUP BY l_returnflag",
    "per customer": "SELECT ANON_AVG(total, 0, 2000) AS t FROM (SELECT o_custkey, SUM(l_extendedprice) AS total "
                    "FROM lineitem GROUP BY o_custkey) x",
}


def _tables() -> tuple[pl.DataFrame, pl.DataFrame]:
    orders = pl.DataFrame({"o_orderkey": list(range(1, 1201)), "o_custkey": [f"c{i % 500:03d}" for i in range(1200)],
                           "o_orderstatus": [("O", "F", "P")[i % 3] for i in range(1200)]})
    lines = pl.DataFrame({"l_orderkey": [1 + i % 1200 for i in range(3000)],
                          "l_returnflag": [("A", "N", "R")[i % 7 % 3] for i in range(3000)],
                          "l_extendedprice": [float(i % 89) for i in range(3000)]})
    return orders, lines


def _neighbours() -> dict[str, tuple[tuple[pl.DataFrame, pl.DataFrame], tuple[pl.DataFrame, pl.DataFrame]]]:
    orders, lines = _tables()
    new_order = pl.DataFrame({"o_orderkey": [7, 999], "o_custkey": ["zz-new"] * 2, "o_orderstatus": ["O", "F"]})
    new_lines = pl.DataFrame({"l_orderkey": [7, 999, 999], "l_returnflag": ["Z"] * 3,
                              "l_extendedprice": [50.0, 60.0, 70.0]})
    dangling_order = new_order.filter(pl.col("o_orderkey") == 999)
    dangling_lines = pl.DataFrame({"l_orderkey": [999, 5000], "l_returnflag": ["Z", "Z"],
                                   "l_extendedprice": [10.0, 20.0]})
    moved = lines.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(2).otherwise(pl.col("l_orderkey"))
                               .alias("l_orderkey"))
    return {
        "a duplicated order key": ((orders, lines), (pl.concat([orders, new_order]), pl.concat([lines, new_lines]))),
        "a dangling key": ((orders, lines), (pl.concat([orders, dangling_order]), pl.concat([lines, dangling_lines]))),
        "a line moved between owners": ((orders, lines), (orders, moved)),
    }


@pytest.mark.parametrize("case", list(_neighbours()))
@pytest.mark.parametrize("name", list(QUERIES))
def test_a_neighbour_changes_nothing_public(tmp_path: Path, case: str, name: str) -> None:
    o_path, l_path = tmp_path / "orders.csv", tmp_path / "lineitem.csv"
    args = ["sql", QUERIES[name], "--table", f"lineitem={l_path}", "--table", f"orders={o_path}", "--privacy-unit",
            "orders.o_custkey", "--owned-by", "lineitem.l_orderkey=orders.o_orderkey", "--max-keys-per-owner", "4",
            "--max-rows-per-table", "1000", "--max-partitions", "3", "--max-contributions", "1", "--no-report-bias",
            "--epsilon", "10", "--delta", "1e-6", "--json"]
    reports = []
    for label, (orders, lines) in zip(("D", "D-prime"), _neighbours()[case], strict=True):
        orders.write_csv(o_path)
        lines.write_csv(l_path)
        reports.append(run_cli(args, tmp_path / f"state-{label}", [APPROX]))
    a, b = reports
    assert a.exit_code == 0, a.stderr
    assert a.json["result"], "D releases its partitions"
    assert a.json["summary"]["stability"] == 9
    diff = report_diff(a, b)
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)
