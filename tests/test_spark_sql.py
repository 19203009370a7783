"""``dpcli sql --engine spark`` (``make test-spark``): the per-user stage in Spark SQL, equal to polars'.

For each query, the bounded totals (and NTILE bins) Spark computes from the resolved plan are the
ones polars computes, value for value, under one salt; and the CLI runs end to end on Spark.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("pyspark")

from dptest import init_ledger, runner  # noqa: E402

from dpcli.cli.app import app  # noqa: E402
from dpcli.io.inputs import open_input  # noqa: E402
from dpcli.tasks.sql import Budget, SqlOptions, SqlTask, TableDecl  # noqa: E402
from dpcli.tasks.sql.run import compute_totals, per_user_frame  # noqa: E402
from dpcli.tasks.sql.typed import schema_of  # noqa: E402

pytestmark = pytest.mark.spark
SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"
EMPLOYEE, ORDER, PAGES, VIEWS = (SAMPLE / "employee.csv", SAMPLE / "order.csv", SAMPLE / "pages.csv",
                                 SAMPLE / "page_views.parquet")
SALT = 0x1234_5678_9ABC_DEF0_0FED_CBA9_8765_4321
TABLES = {"Employee": (EMPLOYEE, "uid"), "Order": (ORDER, "uid"), "pages": (PAGES, None), "views": (VIEWS, "user_id")}

QUERIES = [
    "SELECT dept, ANON_COUNT(*, 5) AS c FROM Employee E JOIN Order O USING(uid) GROUP BY dept",
    "SELECT dept, ANON_COUNT(*, 3) c, ANON_COUNT(DISTINCT uid) u, ANON_SUM(amount, 0, 1000) s, "
    "ANON_AVG(amount, 0, 1000) a, ANON_VAR(amount, 0, 1000) v, ANON_MEDIAN(amount, 0, 1000) m, "
    "ANON_NTILE(amount, 0.9, 0, 1000) p, ANON_COUNT(item, 2) n FROM Employee JOIN Order ON Employee.uid = Order.uid "
    "WHERE item <> 'books' AND amount / 2 > 10 GROUP BY dept",
    "SELECT item, ANON_AVG(total, 0, 5000) a FROM Employee JOIN (SELECT uid, item, SUM(amount) AS total, COUNT(*) "
    "AS k FROM Order GROUP BY uid, item HAVING COUNT(*) > 1) t USING (uid) GROUP BY item",
    "SELECT p.section, CASE WHEN duration_s > 60 THEN 'long' ELSE 'short' END AS kind, ANON_COUNT(*, 4) c, "
    "ANON_SUM(duration_s, 0, 600) s FROM views v LEFT JOIN pages p ON v.page = p.page GROUP BY p.section, kind",
    "SELECT ANON_COUNT(*) n, ANON_MAX(salary, 0, 200000) hi, ANON_STDDEV(salary, 0, 200000) sd FROM Employee "
    "WHERE LOWER(dept) LIKE '%a%' OR salary BETWEEN 40000 AND 60000",
]


def _task(query: str) -> SqlTask:
    decls = {name: TableDecl(name, unit, tuple(pl.read_csv(path, n_rows=0).columns if path.suffix == ".csv"
                                               else pl.read_parquet_schema(path)))
             for name, (path, unit) in TABLES.items()}
    return SqlTask.from_text(query, decls, SqlOptions(Budget(epsilon=Fraction(1), delta=Fraction(1, 10**6)),
                                                      max_partitions=2))


@pytest.mark.parametrize("query", QUERIES, ids=range(len(QUERIES)))
def test_spark_computes_the_per_user_stage_exactly_like_polars(spark, query):
    from dpcli.spark.bounding import read_input
    from dpcli.spark.sql import sql_engine

    task = _task(query)
    plan = task.plan("approx", {})
    columns = task.table_columns()
    polars_frames = {t.name: open_input(str(TABLES[t.name][0]), text_columns=columns[t.name]).frame
                     for t in task.tables}
    frame, layout = per_user_frame(task.query, plan, polars_frames, task.query.group_names)
    totals, bins = compute_totals(frame, layout, plan, SALT, "test")
    roles = task.roles()
    spark_frames = {role: read_input(spark, str(TABLES[name][0]), TABLES[name][0].suffix.lstrip("."))
                    for name, role in roles.items()}
    others = {role: ([str(TABLES[name][0])], open_input(str(TABLES[name][0]), text_columns=columns[name]))
              for name, role in roles.items() if role != "data"}
    engine = sql_engine(spark, spark_frames["data"], others)
    spark_totals, spark_bins = engine(task, plan, layout, SALT, schema_of(frame))
    assert totals.height > 0
    assert spark_totals.equals(totals), (spark_totals, totals)
    for key, table in bins.items():
        order = [*layout.groups, layout.partials[key]]
        assert spark_bins[key].sort(order, nulls_last=True).equals(table.sort(order, nulls_last=True))


def test_the_cli_runs_on_spark(tmp_path):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    r = runner.invoke(app, ["sql", QUERIES[0], "--table", f"Employee={EMPLOYEE}", "--table", f"Order={ORDER}",
                            "--privacy-unit", "Employee.uid", "--privacy-unit", "Order.uid", "--epsilon", "1",
                            "--delta", "1e-6", "--json", "--engine", "spark", "--master", "local[2]"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {row["dept"] for row in doc["result"]} >= {"engineering", "sales"}


@pytest.mark.parametrize(("join", "rule"), [("CROSS JOIN pages p", "join-key"),
                                            ("JOIN pages p ON TRUE", "join-key"),
                                            (" ".join(f"JOIN pages p{i} ON v.section = p{i}.section"
                                                      for i in range(2)), "join-fan-out")])
def test_the_join_rules_hold_on_spark_before_anything_is_read(join, rule):
    """Rule 10 on Spark: the keyless join and the fan-out past the cap are refused (exit 2) before Spark starts."""
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    query = f"SELECT ANON_COUNT(*) AS c FROM (SELECT user_id, page AS section FROM views) v {join}"
    r = runner.invoke(app, ["sql", query, "--table", f"views={VIEWS}", "--privacy-unit", "views.user_id",
                            "--public-table", f"pages={PAGES}", "--epsilon", "1", "--engine", "spark",
                            "--master", "local[2]"])
    assert r.exit_code == 2, r.stderr
    assert f"refused ({rule})" in r.stderr


ROW_CAP_QUERIES = [QUERIES[0], QUERIES[1], QUERIES[3]]


@pytest.mark.parametrize("query", ROW_CAP_QUERIES, ids=range(len(ROW_CAP_QUERIES)))
def test_spark_caps_each_units_rows_per_table_like_polars(spark, query):
    """``--max-rows-per-table`` at 2 (it binds on most units of every table here): the same rows kept."""
    from dataclasses import replace

    from dpcli.spark.bounding import read_input
    from dpcli.spark.sql import sql_engine

    task = _task(query)
    task = replace(task, options=replace(task.options, max_rows_per_table=2))
    plan = task.plan("approx", {})
    columns = task.table_columns()
    polars_frames = {t.name: open_input(str(TABLES[t.name][0]), text_columns=columns[t.name]).frame.lazy()
                     for t in task.tables}
    capped = task.capped_tables(polars_frames, SALT)
    frame, layout = per_user_frame(task.query, plan, capped, task.query.group_names)
    totals, _ = compute_totals(frame, layout, plan, SALT, "test")
    uncapped, _ = compute_totals(per_user_frame(task.query, plan, polars_frames, task.query.group_names)[0], layout,
                                 plan, SALT, "test")
    assert not totals.equals(uncapped)  # the cap binds
    roles = task.roles()
    spark_frames = {role: read_input(spark, str(TABLES[name][0]), TABLES[name][0].suffix.lstrip("."))
                    for name, role in roles.items()}
    others = {role: ([str(TABLES[name][0])], open_input(str(TABLES[name][0]), text_columns=columns[name]))
              for name, role in roles.items() if role != "data"}
    spark_totals, _ = sql_engine(spark, spark_frames["data"], others)(task, plan, layout, SALT, schema_of(frame))
    assert spark_totals.equals(totals), (spark_totals, totals)


def test_spark_float_and_date_words_match_polars(spark, tmp_path):
    """Every word type of a Parquet table's row (doubles with −0.0, NaN, ±inf and nulls; dates; booleans;
    decimals within and beyond 64 bits unscaled)."""
    import datetime as dt
    import math
    from decimal import Decimal

    from dpcli.bounding.keyed_order import cap_rows as polars_cap
    from dpcli.spark.bounding import read_input
    from dpcli.spark.sql import cap_rows as spark_cap

    n = 400
    df = pl.DataFrame({
        "u": [f"u{i % 4}" for i in range(n)],
        "x": [[1.5, -0.0, 0.0, math.nan, None, math.inf, -math.inf, 1e-300][i % 8] * (1 + i % 3) if i % 8 != 4
              else None for i in range(n)],
        "d": [None if i % 9 == 0 else dt.date(2000, 1, 1 + i % 28) for i in range(n)],
        "b": [None if i % 10 == 0 else i % 3 == 0 for i in range(n)],
        "k": [i % 13 for i in range(n)],
        "m": pl.Series([None if i % 17 == 0 else Decimal(f"{'-' if i % 2 else ''}{i % 23}.{i % 10}0") *
                        [Decimal(10) ** 20, Decimal(10) ** 10, Decimal("0.0000001"), 1, 1][i % 5] for i in range(n)],
                       dtype=pl.Decimal(38, 8)),
    })
    path = tmp_path / "floats.parquet"
    df.write_parquet(path)
    fields = list(df.schema.items())
    mine = polars_cap(df.lazy(), "u", fields, SALT, "t", 7).collect()
    theirs = pl.from_arrow(spark_cap(read_input(spark, str(path), "parquet"), "u", [c for c, _ in fields], SALT,
                                     "t", 7).toArrow())
    assert isinstance(theirs, pl.DataFrame)
    zero = pl.when(pl.col("x") == 0.0).then(0.0).otherwise(pl.col("x")).alias("x")  # −0.0 and 0.0: one value

    def rows(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.with_columns(zero).sort(["u", pl.col("x").fill_nan(99.0), "d", "b", "k"], nulls_last=True)

    assert mine.height == 28
    assert rows(theirs).equals(rows(mine))


def test_text_is_read_as_its_first_characters_on_spark(spark):
    """:mod:`dpcli.tasks.sql.lengths` on Spark: a text value read is cut to MAX_TEXT_LENGTH characters where the
    table is read, as polars cuts it, so the static bound holds on both engines."""
    from dpcli.spark.sql import relation
    from dpcli.tasks.sql.compile import compile_relation, needed_columns
    from dpcli.tasks.sql.lengths import MAX_TEXT_LENGTH
    from dpcli.tasks.sql.query import resolve_query

    long = "é" * (MAX_TEXT_LENGTH + 5)
    rows = [("u1", long), ("u2", "ab")]
    query = resolve_query("SELECT ANON_COUNT(*) AS n FROM (SELECT user, g || '' AS a, UPPER(g) AS b, LENGTH(g) AS c "
                          "FROM t) s", {"t": TableDecl("t", "user", ("user", "g"))})
    rel = query.relation
    needed = needed_columns(rel, [])
    frame = compile_relation(rel, {"t": pl.LazyFrame(rows, schema=["user", "g"], orient="row")}, needed).collect()
    mine = sorted((u, len(a), len(b), c) for u, a, b, c in frame.select("c0", "c1", "c2", "c3").rows())
    theirs = relation(rel, {"t": spark.createDataFrame(rows, "user string, g string")}, needed)
    spark_rows = sorted((r["c0"], len(r["c1"]), len(r["c2"]), r["c3"]) for r in theirs.collect())
    assert mine == spark_rows == [("u1", MAX_TEXT_LENGTH, MAX_TEXT_LENGTH, MAX_TEXT_LENGTH), ("u2", 2, 2, 2)]


def test_spark_partials_are_polars_bit_for_bit_in_any_order_and_partitioning(spark, tmp_path):
    """Sums, means and variances of rows chosen so that double sums round by order (tests/test_sql_order.py): Spark,
    over the rows shuffled and split into several partitions, gives polars' totals exactly, for several bounds."""
    from test_sql_order import _orders, _table

    from dpcli.spark.sql import sql_engine

    table = _table()
    for lo, hi in ((0, 1000), (-10, 10), (-3.5, 100.25)):
        query = (f"SELECT k, ANON_SUM(x, {lo}, {hi}) s, ANON_AVG(x, {lo}, {hi}) a, ANON_VAR(x, {lo}, {hi}) v "
                 "FROM t GROUP BY k")
        task = SqlTask.from_text(query, {"t": TableDecl("t", "u", ("u", "k", "x"))},
                                 SqlOptions(Budget(epsilon=Fraction(1), delta=Fraction(1, 10**6)), max_partitions=2))
        plan = task.plan("approx", {})
        frame, layout = per_user_frame(task.query, plan, {"t": table.lazy()}, task.query.group_names)
        totals, _ = compute_totals(frame, layout, plan, SALT, "test")
        for i, order in enumerate(_orders(table)[:3]):
            data = spark.createDataFrame(order.to_arrow()).repartition(3 + i)
            spark_totals, _ = sql_engine(spark, data, {})(task, plan, layout, SALT, schema_of(frame))
            assert spark_totals.equals(totals), (lo, hi, i, spark_totals, totals)
