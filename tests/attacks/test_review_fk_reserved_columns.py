"""Adversarial review of ``dpcli sql``'s ownership through foreign keys (issue 41, item 2): an owned table's own
columns must never become its rows' owner.

Found: :func:`dpcli.tasks.sql.owners.resolve` joined each row of an owned table with the owned keys
(``__dp_key``, ``__dp_owner``) and renamed ``__dp_owner`` to the unit. A table with a column of that name (a CSV
header, a Parquet column: the query need not read it, a CSV's every column is in its frame) kept its own column
under the name, polars suffixed the resolved owner ``__dp_owner_right``, and the rename made the *data's* column the
privacy unit: every row its own "unit" if the column says so, dangling keys kept, the release's bounds per unit
bounding nothing (a customer with 100 lines counted 100 times under ``ANON_COUNT(*, 5)``). The fix refuses, from
the schema before any read or charge, a column of an owned table that is named like dpcli's own (``__dp_…``) or
like the unit its rows are given (the NDJSON or library frame that :func:`settle` cannot see from a header).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from dptest import cli, init_ledger

from dpcli.errors import DataError
from dpcli.tasks.sql import owners
from dpcli.tasks.sql.scope import OwnedTable, OwnerLink, TableDecl

TABLES = {"orders": TableDecl("orders", "cust", ("okey", "cust")),
          "lines": OwnedTable("lines", None, None, OwnerLink("okey", "orders", "okey", 2))}


@pytest.mark.parametrize("column", ["__dp_owner", "__dp_key", "__dp_match", "cust"])
def test_a_column_named_like_the_resolutions_own_is_refused_not_made_the_owner(column):
    settled = owners.settle(TABLES)
    orders = pl.DataFrame({"okey": [1, 2], "cust": ["a", "b"]})
    lines = pl.DataFrame({"okey": [1, 2, 3], column: ["forged1", "forged2", "forged3"]})
    with pytest.raises(DataError, match=f"column '{column}' of lines") as caught:
        owners.resolve(settled, {"orders": orders.lazy(), "lines": lines.lazy()})
    assert "\n" not in str(caught.value)


def test_attack_a_csv_column_named_like_the_owner_does_not_make_each_line_a_unit(tmp_path: Path):
    """Two customers, 200 lines, ANON_COUNT(*, 5): at most 10 lines can count. With the data's ``__dp_owner``
    (f0 … f199) taken for the unit, all 200 were released (at ε 10^4 the noise is ±0.1)."""
    (tmp_path / "orders.csv").write_text("o_orderkey,o_custkey\n1,a\n2,b\n")
    (tmp_path / "lineitem.csv").write_text("l_orderkey,__dp_owner,x\n"
                                           + "".join(f"{1 + i % 2},f{i},1\n" for i in range(200)))
    init_ledger("approx", "--epsilon", "100000", "--delta", "0.5")
    r = cli("sql", "SELECT ANON_COUNT(*, 5) AS n FROM lineitem", "--table", f"lineitem={tmp_path / 'lineitem.csv'}",
            "--table", f"orders={tmp_path / 'orders.csv'}", "--privacy-unit", "orders.o_custkey",
            "--owned-by", "lineitem.l_orderkey=orders.o_orderkey", "--epsilon", "10000", "--no-report-bias",
            "--json")
    if r.exit_code == 0:
        assert json.loads(r.stdout)["result"][0]["n"] <= 11, "the data's column was taken for the privacy unit"
    else:
        assert r.exit_code == 65, r.stderr
        lines = [line for line in r.stderr.strip().splitlines() if "error" in line]
        assert len(lines) == 1 and "'__dp_owner'" in lines[0] and "charged" not in r.stderr, r.stderr
    shown = cli("budget", "show", "--json")
    assert json.loads(shown.stdout)["spent"]["epsilon"] == "0", "refused from the schema: nothing charged"
