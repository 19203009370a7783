"""Review (session 57) of sql's fixed-point sums on Spark: a user's exact sum beyond 2^83 in 2^−F grid units.

Spark's :func:`dpcli.spark.sql._round_div` cast the quotient total / 2^F to a long before the clamp to [L, U]; ANSI
mode (Spark 4's default) raises on a cast that overflows. One person's rows reach a quotient past 2^63 when each
row's r is clamped to 2^62 (a huge value or ±∞) and the person has more than 2^21 rows after the joins, which the
rules allow at the default cap: 2,200 rows of one private read × a public join of fan-out 1,000 (2.2 million ≤
10^8 rows a person). So a neighbour D′ that adds such a person made ``--engine spark`` fail after the debit where
D releases: the exit code told. polars holds the quotient in Int128 and clamps it; the fix clamps the decimal
quotient to ±2^62 before the cast (the clamp to [L, U] ⊂ ±2^31 that follows is unchanged by it).
"""

from __future__ import annotations

from fractions import Fraction

import polars as pl
import pytest

pytest.importorskip("pyspark")

from dpcli.io.inputs import open_input
from dpcli.tasks.sql import Budget, SqlOptions, SqlTask, TableDecl
from dpcli.tasks.sql.run import compute_totals, per_user_frame
from dpcli.tasks.sql.typed import schema_of

pytestmark = pytest.mark.spark
SALT = 0x5E55_1057


@pytest.mark.parametrize("value", ["1e300", "inf", "-1e12"])
def test_one_persons_huge_sum_does_not_fail_spark(spark, tmp_path, value):
    from dpcli.spark.bounding import read_input
    from dpcli.spark.sql import sql_engine

    # × the public fan-out 1000: 2.2M rows > 2^21, so |Σ r| ≥ 2.2M · 2^62 > 2^83 (for "-1e12" too: 1e12 ≫ 2^42 g)
    rows = 2200
    t = tmp_path / "t.csv"
    pl.DataFrame({"uid": ["a"] * rows + ["b", "c"], "k": [1] * (rows + 2),
                  "x": [value] * rows + ["0.5", "0.25"]}).write_csv(t)
    p = tmp_path / "p.csv"
    pl.DataFrame({"k": [1] * 1000, "j": list(range(1000))}).write_csv(p)
    decls = {"t": TableDecl("t", "uid", ("uid", "k", "x")), "p": TableDecl("p", None, ("k", "j"))}
    task = SqlTask.from_text("SELECT ANON_SUM(x, 0, 1) AS s FROM t JOIN p USING (k)", decls,
                             SqlOptions(Budget(epsilon=Fraction(1), delta=Fraction(1, 10**6))))
    plan = task.plan("approx", {})
    columns = task.table_columns()
    frames = {"t": open_input(str(t), text_columns=columns["t"]).frame.lazy(),
              "p": open_input(str(p), text_columns=columns["p"]).frame.lazy()}
    frame, layout = per_user_frame(task.query, plan, task.capped_tables(frames, SALT), task.query.group_names)
    totals, _ = compute_totals(frame, layout, plan, SALT, "test")
    roles = task.roles()
    data = read_input(spark, str(t), "csv")
    others = {roles["p"]: ([str(p)], open_input(str(p), text_columns=columns["p"]))}
    spark_totals, _ = sql_engine(spark, data, others)(task, plan, layout, SALT, schema_of(frame))
    assert spark_totals.equals(totals), (spark_totals, totals)


@pytest.mark.parametrize("uri", [False, True], ids=["path", "file-uri"])
@pytest.mark.parametrize("dtype", [pl.Float64, pl.Decimal(10, 2), pl.Binary])
def test_spark_refuses_a_key_column_of_an_unkeyable_type_before_the_debit(tmp_path, dtype, uri):
    """Item 3 of the review on ``--engine spark``: the Parquet schema Spark reads (:func:`dpcli.spark.inputs
    .polars_type`) goes through the same :func:`dpcli.io.schemas.keyable`, so the refusal comes before the debit
    (found sound)."""
    from dptest import cli, history, init_ledger

    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    path = tmp_path / "f.parquet"
    raw = [str(i % 17) for i in range(200)]
    column = pl.Series(raw).cast(pl.Binary) if dtype == pl.Binary else pl.Series(raw).cast(pl.Float64).cast(dtype)
    pl.DataFrame({"plane": [f"N{i % 40}" for i in range(200)], "delay": column}).write_parquet(path)  # (file:// URI:
    # a URI Spark lists and reads, the schema Spark's)
    r = cli("histogram", path.as_uri() if uri else path, "--by", "delay", "--privacy-unit", "plane", "--epsilon", "0.3",
            "--delta", "1e-7", "--engine", "spark", "--master", "local[2]")  # (the fixture's master)
    assert r.exit_code == 65, r.stderr
    assert "column 'delay' has type" in r.stderr and "charged" not in r.stderr
    assert history() == []
