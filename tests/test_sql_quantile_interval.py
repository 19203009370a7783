"""``sql --with-error``: NTILE/MEDIAN get a 95% value interval (histogram's: docs/histogram.md), charged inside
their share of the budget; without --with-error nothing changes."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from dptest import SAMPLE, cli, init_ledger, use_fixed_key

from dpcli.tasks import quantile_interval as qi
from dpcli.tasks.sql.ir import AnonAgg, Col
from dpcli.tasks.sql.plan import Budget, IntervalCalibrated, measures_of, plan_measures

ORDER, EMPLOYEE = SAMPLE / "order.csv", SAMPLE / "employee.csv"
QUERY = "SELECT dept, ANON_MEDIAN(amount, 0, 1024) med FROM Employee JOIN Order USING(uid) GROUP BY dept"
TABLES = ["--table", f"Employee={EMPLOYEE}", "--table", f"Order={ORDER}", "--privacy-unit", "Employee.uid",
          "--privacy-unit", "Order.uid"]


@pytest.fixture(autouse=True)
def fixed_key(state_dir):
    use_fixed_key(state_dir)


def test_an_ntile_with_error_has_a_per_partition_interval_holding_its_bounded_median():
    init_ledger("approx", "--epsilon", "100", "--delta", "0.1")
    r = cli("sql", QUERY, *TABLES, "--epsilon", "20", "--delta", "1e-6", "--with-error", "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    table = pl.DataFrame(out["result"])
    assert out["summary"]["margins"]["med"].startswith("95% interval of the bounded sample quantile")
    margin = table["med_moe95"].to_numpy()
    assert np.isfinite(margin).all() and (margin > 0).all() and (margin < 1024).all()
    # the partials: each user's nearest median of its amounts in the department, clamped
    orders = pl.read_csv(ORDER).join(pl.read_csv(EMPLOYEE), on="uid")
    per_user = orders.group_by("dept", "uid").agg(pl.col("amount").quantile(0.5, "nearest").clip(0, 1024).alias("m"))
    star = per_user.group_by("dept").agg(pl.col("m").sort().alias("ms")).with_columns(
        pl.col("ms").list.get((pl.col("ms").list.len() / 2).ceil().cast(pl.Int64) - 1).alias("star"))
    got = table.join(star, on="dept")
    # at ε = 20 over two measurements each end misses with probability ≤ 2%: this fixed key covers every one
    assert ((got["med"] - got["star"]).abs() <= got["med_moe95"] + 1).all(), got


def test_the_plan_splits_the_ntiles_share():
    budget = Budget(epsilon=Fraction(2))
    task_measures = list(measures_of(_aggregates(), 1, False))
    plain = plan_measures(tuple(task_measures), budget, "keys", 1, "approx")
    error = plan_measures(tuple(task_measures), budget, "keys", 1, "approx", with_error=True)
    ntile = next(c for c in error.calibrated if c.measure.kind == "ntile")
    before = next(c for c in plain.calibrated if c.measure.kind == "ntile")
    assert isinstance(ntile, IntervalCalibrated) and not isinstance(before, IntervalCalibrated)
    assert ntile.em_rate == before.em_rate * qi.POINT_SHARE
    assert ntile.end_rate == Fraction(2) / len(task_measures) * qi.END_SHARE / 2
    assert error.events == plain.events


def _aggregates() -> tuple[AnonAgg, ...]:
    return (AnonAgg("ntile", Col("x"), bounds=(Fraction(0), Fraction(10)), p=Fraction(1, 2)),)
