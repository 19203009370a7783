"""Golden ``dpcli sql`` releases: with a fixed secret key, the same bytes before and after a change of speed.

Recorded with the tree before issue 41 item 3 (the per-user stage made cheaper: one computation of a table
behind its row cap, claims ordered only past the cap, sums without a count where 0 is inside their bounds), and
held since: a change of plan must not change a released value, summary field or ledger line. The queries cover
what those changes touch: sums whose bounds hold 0 and sums whose bounds do not (with users who have no value),
counts, means and a median; a unit table's release with a binding row cap and K; tables owned through one link
and through a chain, with owners past ``--max-keys-per-owner``, a duplicated key and a dangling one. Re-record
(``DPCLI_GOLDEN_RECORD=1``) only after a deliberate change of semantics, which must change the seed too.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from dptest import runner
from test_golden import FIXED_KEY, GOLDEN, RECORD, SAMPLE, _normalise

from dpcli.cli.app import app

pytestmark = pytest.mark.filterwarnings("ignore")


def _tables(tmp: Path) -> dict[str, str]:
    """customers → orders → lines (CSV, deterministic): 60 customers, owners with up to 9 orders, a duplicated
    order key (orders 7 and 8 share one), a line naming no order, a customer with many lines; ``v`` null on some."""
    customers = pl.DataFrame({"c_custkey": list(range(60)), "c_seg": [f"s{i % 3}" for i in range(60)]})
    okeys = list(range(300))
    owners = [(k * 7) % 60 if k % 11 else k % 5 for k in okeys]
    orders = pl.DataFrame({"o_orderkey": [*okeys, 7], "o_custkey": [*owners, 41],
                           "o_flag": [("a", "b", "c")[k % 3] for k in [*okeys, 7]]})
    lk = [k % 301 for k in range(1500)]  # 300 names no order
    lines = pl.DataFrame({"l_orderkey": lk, "l_rf": [("R", "A", "N")[k % 3] for k in range(1500)],
                          "l_price": [float((k * 37) % 101) for k in range(1500)],
                          "v": [None if k % 13 == 0 else float(k % 17) - 3 for k in range(1500)]})
    out = {}
    for name, frame in (("customer", customers), ("orders", orders), ("lineitem", lines)):
        out[name] = str(tmp / f"{name}.csv")
        frame.write_csv(out[name])
    return out


def _cases(tmp: Path) -> list[list[str]]:
    t = _tables(tmp)
    emp, order = str(SAMPLE / "employee.csv"), str(SAMPLE / "order.csv")
    eo = ["--table", f"Employee={emp}", "--table", f"Order={order}", "--privacy-unit", "Employee.uid",
          "--privacy-unit", "Order.uid"]
    link = ["--table", f"lineitem={t['lineitem']}", "--table", f"orders={t['orders']}", "--privacy-unit",
            "orders.o_custkey", "--owned-by", "lineitem.l_orderkey=orders.o_orderkey"]
    chain = ["--table", f"lineitem={t['lineitem']}", "--table", f"orders={t['orders']}", "--table",
             f"customer={t['customer']}", "--privacy-unit", "customer.c_custkey", "--owned-by",
             "lineitem.l_orderkey=orders.o_orderkey", "--owned-by", "orders.o_custkey=customer.c_custkey"]
    return [
        ["budget", "init", "default", "--mode", "approx", "--epsilon", "50", "--delta", "1e-5"],
        ["sql", "SELECT dept, ANON_COUNT(*, 5) AS n, ANON_SUM(amount, 0, 500) AS s, "
         "ANON_SUM(amount, 100, 500) AS s_hi, ANON_SUM(amount, -500, -10) AS s_neg, "
         "ANON_AVG(amount, 0, 2000) AS m, ANON_MEDIAN(amount, 0, 2000) AS med "
         "FROM Employee JOIN Order USING (uid) GROUP BY dept", *eo, "--max-partitions", "2",
         "--max-rows-per-table", "2", "--epsilon", "2", "--delta", "1e-7", "--no-report-bias", "--json"],
        ["sql", "SELECT item, ANON_SUM(CASE WHEN amount > 300 THEN amount END, 0, 800) AS big, "
         "ANON_SUM(CASE WHEN amount > 300 THEN amount END, 50, 800) AS big_lo FROM Order GROUP BY item",
         "--table", f"Order={order}", "--privacy-unit", "Order.uid", "--max-partitions", "3", "--epsilon", "1",
         "--delta", "1e-7", "--no-report-bias", "--json"],
        ["sql", "SELECT l_rf, ANON_COUNT(*, 20) AS n, ANON_SUM(l_price, 0, 2000) AS s, ANON_SUM(v, 1, 40) AS sv, "
         "ANON_AVG(l_price, 0, 100) AS m FROM lineitem GROUP BY l_rf", *link, "--max-keys-per-owner", "4",
         "--max-partitions", "2", "--max-rows-per-table", "12", "--epsilon", "3", "--delta", "1e-7",
         "--no-report-bias", "--json"],
        ["sql", "SELECT o_flag, ANON_COUNT(*, 30) AS n, ANON_SUM(l_price, 0, 3000) AS s FROM lineitem l "
         "JOIN orders o ON l.l_orderkey = o.o_orderkey GROUP BY o_flag", *link, "--max-keys-per-owner", "3",
         "--max-partitions", "3", "--epsilon", "3", "--delta", "1e-7", "--no-report-bias", "--json"],
        ["sql", "SELECT ANON_COUNT(*, 40) AS n, ANON_SUM(v, -5, 20) AS sv, ANON_SUM(v, 2, 20) AS sv2 FROM lineitem",
         *chain, "--max-keys-per-owner", "3", "--epsilon", "3", "--no-report-bias", "--json"],
        ["sql", "SELECT c_seg, ANON_COUNT(*, 10) AS n FROM lineitem l JOIN customer c USING (c_custkey) "
         "GROUP BY c_seg", *chain, "--max-keys-per-owner", "5", "--max-partitions", "1", "--max-contributions",
         "1", "--epsilon", "3", "--delta", "1e-7", "--json"],
        ["budget", "history", "--json"],
    ]


def test_sql_golden(tmp_path, state_dir):
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = state_dir / "secret.key"
    key.write_bytes(FIXED_KEY)
    key.chmod(0o600)
    got = []
    for argv in _cases(tmp_path):
        r = runner.invoke(app, argv)
        assert r.exit_code == 0, (argv, r.stderr)
        got.append(f"$ dpcli {' '.join(argv)}\n{r.stdout}")
    text = _normalise("\n".join(got), tmp_path)
    path = GOLDEN / "sql.txt"
    if RECORD:
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: record with DPCLI_GOLDEN_RECORD=1"
    assert text == path.read_text(), f"sql: a release differs from {path} (a change of plan changed released bytes)"
