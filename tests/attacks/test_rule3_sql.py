"""Rule 3 for ``dpcli sql``: one more user changes nothing public but noisy values (issue 32).

D and D′ = D plus one user (an employee with orders, a visitor) are released under one forced seed
(``report_diff``): over a private–private join, a filter, a public-table join and a multi-aggregate
query, the exit code, stderr, every ``--json`` summary field and the ledger entries must be
identical; only the released rows may differ. The new user is alone in a department that sorts
last, so the noise draws of the other partitions stay aligned and its own partition is released
with probability at most δ.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from report_diff import APPROX, report_diff, run_cli

DEPTS = ("eng", "ops", "sales")


def _tables() -> tuple[pl.DataFrame, pl.DataFrame]:
    employees = pl.DataFrame({"uid": [f"e{i:03d}" for i in range(240)], "dept": [DEPTS[i % 3] for i in range(240)],
                              "age": [20 + i % 40 for i in range(240)]})
    orders = pl.DataFrame({"uid": [f"e{i % 240:03d}" for i in range(700)],
                           "item": [("pen", "ink", "pad", "cup")[i % 4] for i in range(700)],
                           "amount": [float(i % 97) for i in range(700)], "page": [f"/p/{i % 5}" for i in range(700)]})
    return employees, orders


NEW_EMPLOYEE = pl.DataFrame({"uid": ["zz-new"], "dept": ["zzz"], "age": [33]})
NEW_ORDERS = pl.DataFrame({"uid": ["zz-new"] * 3, "item": ["pen", "ink", "pen"], "amount": [90.0, 80.0, 70.0],
                           "page": ["/p/1", "/p/2", "/p/9"]})

QUERIES = {
    "private-private join": "SELECT dept, ANON_COUNT(*, 3) AS c FROM e JOIN o USING (uid) GROUP BY dept",
    "filter": "SELECT dept, ANON_COUNT(DISTINCT uid) AS u FROM e JOIN o ON e.uid = o.uid WHERE item <> 'cup' "
              "AND age BETWEEN 25 AND 50 GROUP BY dept",
    "multi-aggregate": "SELECT dept, ANON_COUNT(*, 4) c, ANON_SUM(amount, 0, 100) s, ANON_AVG(amount, 0, 100) a, "
                       "ANON_STDDEV(amount, 0, 100) sd, ANON_MEDIAN(amount, 0, 100) m FROM e JOIN o USING (uid) "
                       "GROUP BY dept",
    "public join": "SELECT dept, p.section, ANON_COUNT(*, 2) c FROM e JOIN o USING (uid) LEFT JOIN pages p "
                   "ON o.page = p.page GROUP BY dept, p.section",
    "sub-query per user": "SELECT dept, ANON_AVG(total, 0, 500) a FROM e JOIN (SELECT uid, SUM(amount) AS total "
                          "FROM o GROUP BY uid HAVING COUNT(*) > 1) t USING (uid) GROUP BY dept",
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_one_more_user_changes_nothing_public(tmp_path: Path, name: str) -> None:
    pages = tmp_path / "pages.csv"
    pages.write_text("page,section\n" + "".join(f"/p/{i},{('a', 'b')[i % 2]}\n" for i in range(5)))
    e_path, o_path = tmp_path / "e.csv", tmp_path / "o.csv"
    args = ["sql", QUERIES[name], "--table", f"e={e_path}", "--table", f"o={o_path}", "--privacy-unit", "e.uid",
            "--privacy-unit", "o.uid", "--public-table", f"pages={pages}", "--max-partitions", "2",
            "--epsilon", "10", "--delta", "1e-6", "--json"]
    employees, orders = _tables()
    reports = []
    for label, (emp, ords) in {"D": (employees, orders),
                               "D-prime": (pl.concat([employees, NEW_EMPLOYEE]), pl.concat([orders, NEW_ORDERS]))
                               }.items():
        emp.write_csv(e_path)
        ords.write_csv(o_path)
        reports.append(run_cli(args, tmp_path / f"state-{label}", [APPROX]))
    a, b = reports
    assert a.exit_code == 0, a.stderr
    assert a.json["result"], "D releases its partitions"
    diff = report_diff(a, b)
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)
