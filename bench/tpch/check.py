"""The hand pipelines compute what dpcli bounds: ``python check.py DIR [Q…]`` runs dpcli's per-user stage (the
release's own functions, at one salt) and :mod:`bench.tpch.hand`'s pipeline at that salt, and compares their
per-partition totals (every column of dpcli's totals is one of the hand pipeline's, row for row: exactly, as both
sum the values' fixed-point integers exactly, :mod:`dpcli.tasks.sql.fixed`)."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import polars as pl

from dpcli.tasks.sql import Budget, SqlOptions, SqlTask, TableDecl
from dpcli.tasks.sql.run import compute_totals, per_user_frame
from dpcli.tasks.sql.scope import OwnedTable, OwnerLink

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hand import HAND, SALT
from queries import DPCLI, MAX_KEYS, MAX_ROWS, QUERIES, SHAPE

PUBLIC = ("part", "supplier", "nation", "region")


def dpcli_task(query: str, data: str) -> tuple[SqlTask, dict[str, pl.LazyFrame]]:
    """The release's task for ``query`` as the CLI declares its tables, and the tables it reads (by path)."""
    k = SHAPE[query][2]
    frames = {t: pl.scan_parquet(f"{data}/{t}.parquet") for t in ("lineitem", "orders", "customer", *PUBLIC)}
    cols = {t: tuple(f.collect_schema().names()) for t, f in frames.items()}
    tables = {"lineitem": OwnedTable("lineitem", None, cols["lineitem"],
                                     OwnerLink("l_orderkey", "orders", "o_orderkey", MAX_KEYS)),
              "orders": TableDecl("orders", "o_custkey", cols["orders"]),
              "customer": TableDecl("customer", "c_custkey", cols["customer"]),
              **{t: TableDecl(t, None, cols[t]) for t in PUBLIC}}
    options = SqlOptions(Budget(epsilon=Fraction(1), delta=Fraction(1, 10**7)), max_partitions=k or 1,
                         max_rows_per_table=MAX_ROWS)
    task = SqlTask.from_text(DPCLI[query], tables, options)
    return task, {t.name: frames[t.name] for t in task.tables}


def dpcli_totals(query: str, data: str) -> pl.DataFrame:
    """dpcli's bounded per-partition totals (its own functions: :meth:`SqlTask.capped_tables`, ``per_user_frame``,
    ``compute_totals``) at the salt :data:`hand.SALT`, without the group columns."""
    task, frames = dpcli_task(query, data)
    plan = task.plan("approx", {})
    capped = task.capped_tables(frames, SALT)
    frame, layout = per_user_frame(task.query, plan, capped, task.query.group_names)
    totals, _ = compute_totals(frame, layout, plan, SALT, query)
    return totals.drop(layout.groups)


def main() -> None:
    data, queries = sys.argv[1], sys.argv[2:] or list(QUERIES)
    for query in queries:
        ours = dpcli_totals(query, data)
        hand = HAND[query](data, SALT).collect(engine="streaming")
        theirs = [hand[c].cast(pl.Int128).to_list() for c in hand.columns if hand[c].dtype.is_integer()]
        worst = 0
        for c in ours.columns:
            mine = ours[c].cast(pl.Int128).to_list()
            worst = max(worst, min(max(abs(a - b) for a, b in zip(mine, t, strict=True)) for t in theirs))
        # both sum each unit's fixed-point integers exactly (dpcli.tasks.sql.fixed): no order of a float sum moves a
        # partial any more, so anything but "the same" is a difference between the two pipelines
        print(f"{query}: {len(ours.columns)} totals of {ours.height} partition(s): "
              f"{'the same' if worst == 0 else f'DIFFERENT: up to {worst} grid unit(s)'}")


if __name__ == "__main__":
    main()
