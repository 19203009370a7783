"""Where ``dpcli sql``'s per-user stage spends its time on a TPC-H query: ``python profile.py DIR Q…``.

Cumulative stages of the release's own plan (:func:`check.dpcli_task`: the owners of ``lineitem``, the tables
resolved, capped, the per-user frame, the bounded partials, the totals), each collected once on its own and
timed (wall and CPU seconds of this process: the stages overlap, so each line includes the ones above it), then
the whole hand pipeline for comparison, and the number of ``collect`` calls the release's plan makes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import polars as pl

from dpcli.tasks.sql import owners
from dpcli.tasks.sql.run import bounded_partials, per_user_frame, totals_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check import dpcli_task
from hand import HAND, SALT


def timed(name: str, frame: pl.LazyFrame) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    out = frame.collect(engine="streaming")
    print(f"  {name:34s} {time.perf_counter() - wall:6.2f} s wall {time.process_time() - cpu:6.2f} s CPU "
          f"({out.height:,} rows)", flush=True)


def stages(query: str, data: str) -> None:
    task, frames = dpcli_task(query, data)
    plan = task.plan("approx", {})
    tables = task.table_map
    for name, decl in tables.items():
        link = owners.owner_of(decl)
        if link is not None:
            timed(f"owned keys of {name}", owners.owned_keys(tables, frames, link))
    resolved = owners.resolve(tables, frames)
    capped = task.capped_tables(frames, SALT)
    for name, decl in tables.items():
        if owners.owner_of(decl) is not None:
            timed(f"{name} resolved (rows)", resolved[name].select(pl.len()))
        if decl.unit is not None:
            timed(f"{name} capped (rows)", capped[name].select(pl.len()))
    frame, layout = per_user_frame(task.query, plan, capped, task.query.group_names)
    timed("per-user frame (rows)", frame.select(pl.len()))
    partial = bounded_partials(frame, layout, plan, SALT)
    timed("bounded partials", partial)
    timed("totals (the release's collect)", totals_of(partial, layout, plan))
    timed("the hand pipeline, whole", HAND[query](data, SALT))


def main() -> None:
    data = sys.argv[1]
    for query in sys.argv[2:]:
        print(f"{query} ({data}):")
        stages(query, data)


if __name__ == "__main__":
    main()
