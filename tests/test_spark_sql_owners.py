"""``dpcli sql --engine spark`` over owned tables (issue 41, item 2; ``make test-spark``): the same units.

Spark resolves every owned table's unit through its links (:mod:`dpcli.spark.sql_owners`) as polars does
(:mod:`dpcli.tasks.sql.owners`): on data with duplicated keys across units, dangling keys, nulls and units with
more keys than their claims, the bounded totals of each query are equal, value for value, under one salt, for a
chain of depth one (CSV, and a Parquet parent against a CSV child: keys compared as text) and of depth three; and
the CLI's release over a chain runs on Spark.
"""

from __future__ import annotations

import json
import random
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
from dpcli.tasks.sql.scope import OwnedTable, OwnerLink  # noqa: E402
from dpcli.tasks.sql.typed import schema_of  # noqa: E402

pytestmark = pytest.mark.spark
SALT = 0x0F0F_1234_5678_9ABC_DEF0_0FED_CBA9_8765


def _data(tmp: Path, parquet_parent: bool = False) -> dict[str, Path]:
    """orders (keys duplicated across customers, some customers with more orders than their claims), lineitem
    (dangling and null keys), t2 below lineitem (its key ``l_id``) and t3 below t2."""
    rng = random.Random(7)
    orders = pl.DataFrame({"o_orderkey": [rng.randrange(300) for _ in range(400)],
                           "o_custkey": [f"c{rng.randrange(90)}" for _ in range(400)]})
    lineitem = pl.DataFrame({"l_id": list(range(1200)),
                             "l_orderkey": [None if i % 97 == 0 else rng.randrange(320) for i in range(1200)],
                             "flag": [rng.choice("ANR") for _ in range(1200)],
                             "price": [round(rng.uniform(0, 100), 2) for _ in range(1200)]})
    t2 = pl.DataFrame({"k2": [rng.randrange(900) for _ in range(1500)], "f2": [rng.randrange(1250) for _ in range(1500)]})
    t3 = pl.DataFrame({"f3": [rng.randrange(950) for _ in range(2000)], "v": [rng.randrange(50) for _ in range(2000)]})
    paths = {}
    for name, frame in {"orders": orders, "lineitem": lineitem, "t2": t2, "t3": t3}.items():
        if name == "orders" and parquet_parent:
            paths[name] = tmp / "orders.parquet"
            frame.write_parquet(paths[name])
        else:
            paths[name] = tmp / f"{name}.csv"
            frame.write_csv(paths[name])
    return paths


def _columns(path: Path) -> tuple[str, ...]:
    return tuple(pl.read_csv(path, n_rows=0).columns if path.suffix == ".csv" else pl.read_parquet_schema(path))


def _decls(paths: dict[str, Path]) -> dict[str, TableDecl]:
    return {"orders": TableDecl("orders", "o_custkey", _columns(paths["orders"])),
            "lineitem": OwnedTable("lineitem", None, _columns(paths["lineitem"]),
                                   OwnerLink("l_orderkey", "orders", "o_orderkey", 3)),
            "t2": OwnedTable("t2", None, _columns(paths["t2"]), OwnerLink("f2", "lineitem", "l_id", 2)),
            "t3": OwnedTable("t3", None, _columns(paths["t3"]), OwnerLink("f3", "t2", "k2", 2))}


QUERIES = [
    "SELECT flag, ANON_COUNT(*, 4) AS n, ANON_SUM(price, 0, 300) AS s FROM lineitem GROUP BY flag",
    "SELECT flag, ANON_AVG(price, 0, 100) AS a, ANON_COUNT(DISTINCT o_custkey) AS u FROM lineitem l JOIN orders o "
    "ON l.l_orderkey = o.o_orderkey GROUP BY flag",
    "SELECT v, ANON_COUNT(*, 3) AS n FROM t3 GROUP BY v",
]


def _compare(spark, paths: dict[str, Path], query: str) -> None:
    from dpcli.spark.bounding import read_input
    from dpcli.spark.sql import sql_engine

    task = SqlTask.from_text(query, _decls(paths), SqlOptions(Budget(epsilon=Fraction(1), delta=Fraction(1, 10**6)),
                                                              max_partitions=2, max_rows_per_table=5))
    plan = task.plan("approx", {})
    columns = task.table_columns()
    frames = {t.name: open_input(str(paths[t.name]), text_columns=columns[t.name]).frame.lazy() for t in task.tables}
    capped = task.capped_tables(frames, SALT)
    frame, layout = per_user_frame(task.query, plan, capped, task.query.group_names)
    totals, _ = compute_totals(frame, layout, plan, SALT, "test")
    assert totals.height > 0 and totals["units"].sum() > 20
    roles = task.roles()
    fmt = {name: paths[name].suffix.lstrip(".") for name in roles}
    spark_frames = {role: read_input(spark, str(paths[name]), fmt[name]) for name, role in roles.items()}
    others = {role: ([str(paths[name])], open_input(str(paths[name]), text_columns=columns[name]))
              for name, role in roles.items() if role != "data"}
    spark_totals, _ = sql_engine(spark, spark_frames["data"], others)(task, plan, layout, SALT, schema_of(frame))
    assert spark_totals.equals(totals), (spark_totals, totals)


@pytest.mark.parametrize("query", QUERIES, ids=range(len(QUERIES)))
def test_spark_resolves_owners_like_polars(spark, tmp_path, query):
    _compare(spark, _data(tmp_path), query)


def test_spark_compares_a_typed_parents_keys_with_text_ones_like_polars(spark, tmp_path):
    _compare(spark, _data(tmp_path, parquet_parent=True), QUERIES[0])


def test_the_cli_runs_a_chain_on_spark(tmp_path):
    paths = _data(tmp_path)
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    r = runner.invoke(app, ["sql", QUERIES[0], "--table", f"lineitem={paths['lineitem']}", "--table",
                            f"orders={paths['orders']}", "--privacy-unit", "orders.o_custkey", "--owned-by",
                            "lineitem.l_orderkey=orders.o_orderkey", "--max-partitions", "3", "--epsilon", "5",
                            "--delta", "1e-6", "--json", "--engine", "spark", "--master", "local[2]"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["stability"] == 1 + 2 * 16
