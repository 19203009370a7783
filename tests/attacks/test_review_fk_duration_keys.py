"""Adversarial review of ``dpcli sql``'s ownership through foreign keys (issue 41, item 2): rule 4 for a key of a
type that joins as its stored integer.

Found: a link's two sides are compared as join keys are (:func:`dpcli.tasks.sql.compile.key_pair`), which casts
keys of two different types to text; :func:`dpcli.tasks.sql.owners.check_key` accepts durations, and polars cannot
cast a duration to text. The cast fails only when it meets a value, so with a duration key on one side (a Parquet
``o_orderkey``) and text on the other (a CSV's ``l_orderkey``) the run ended 0 while no unit claimed a key and 65
("the file does not parse", after the debit) as soon as one did: D (one customer whose only order has no key) and
D′ = D plus a customer with an order were told apart by the exit code. The fix compares a duration as its stored
integer, as Spark reads a Parquet duration (a bigint), in every join (a plain join of such keys failed alike).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest
from report_diff import APPROX, report_diff, run_cli

from dpcli.tasks.sql.compile import key_pair


def test_attack_one_more_customer_does_not_change_the_exit(tmp_path: Path):
    orders, lines = tmp_path / "orders.parquet", tmp_path / "lineitem.csv"
    lines.write_text("l_orderkey,l_returnflag\n" + "".join(f"{i},A\n" for i in range(20)))
    v = {"o_orderkey": [None], "o_custkey": ["v"]}
    u = {"o_orderkey": [None, dt.timedelta(days=1)], "o_custkey": ["v", "u"]}
    args = ["sql", "SELECT ANON_COUNT(*, 5) AS n FROM lineitem", "--table", f"lineitem={lines}", "--table",
            f"orders={orders}", "--privacy-unit", "orders.o_custkey", "--owned-by",
            "lineitem.l_orderkey=orders.o_orderkey", "--max-contributions", "1", "--no-report-bias", "--epsilon", "1",
            "--json"]
    reports = []
    for label, frame in (("D", v), ("D-prime", u)):
        pl.DataFrame(frame, schema={"o_orderkey": pl.Duration("ms"), "o_custkey": pl.String}).write_parquet(orders)
        reports.append(run_cli(args, tmp_path / f"state-{label}", [APPROX]))
    assert reports[0].exit_code == 0, reports[0].stderr
    assert report_diff(*reports) == []


@pytest.mark.parametrize("other", [pl.String(), pl.Int64(), pl.Duration("us"), pl.Date()])
def test_a_duration_key_meets_a_key_of_another_type_without_an_error(other):
    keys = pl.DataFrame({"k": pl.Series([dt.timedelta(milliseconds=5)], dtype=pl.Duration("ms"))})
    values = {pl.String(): ["5"], pl.Int64(): [5], pl.Duration("us"): [dt.timedelta(microseconds=5)],
              pl.Date(): [dt.date(1970, 1, 6)]}[other]
    others = pl.DataFrame({"j": pl.Series(values, dtype=other)})
    for left, right, lt, rt in ((keys, others, pl.Duration("ms"), other), (others, keys, other, pl.Duration("ms"))):
        a, b = ("k", "j") if left is keys else ("j", "k")
        lk, rk = key_pair(pl.col(a), lt, pl.col(b), rt)
        joined = left.lazy().join(right.lazy(), left_on=lk, right_on=rk).collect()
        assert joined.height == (1 if other in (pl.String(), pl.Int64(), pl.Duration("us")) else 0)
