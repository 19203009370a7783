"""The prepared inputs and the raw (unbounded, noiseless) truth every tool is judged against.

Rows without a privacy unit (2,512 flights without a ``tailnum``) cannot be protected per unit and are
dropped for every tool alike; the value queries read the rows that have their value (``dep_delay``
missing on cancelled flights, ``PINCP`` where ACS has 'N').
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from bench.accuracy.spec import QUERIES, TOP_K, Query, group_key, input_path

DATA = Path("/work/data")


def prepare(data: Path, work: Path) -> None:
    """Write flights.parquet, flights_delay.parquet and acs.parquet into WORK (once)."""
    work.mkdir(parents=True, exist_ok=True)
    flights = (pl.read_parquet(data / "flights.parquet")
               .filter(pl.col("tailnum").is_not_null())
               .select("tailnum", "carrier", "month", "origin", "dest", "distance", "dep_delay"))
    flights.write_parquet(input_path(work, "flights"))
    flights.filter(pl.col("dep_delay").is_not_null()).write_parquet(input_path(work, "flights_delay"))
    acs = pl.read_parquet(data / "acs.parquet").filter(pl.col("PINCP").is_not_null()).select("pid", "state", "PINCP")
    acs.write_parquet(input_path(work, "acs"))
    for q in QUERIES:  # key lists with the data's own types (states keep their leading zero)
        if q.keys:
            frame = pl.read_csv(data / q.keys, schema_overrides=dict.fromkeys(q.by, pl.String))
            src = pl.read_parquet(input_path(work, q.dataset), n_rows=1)
            frame.select(pl.col(c).cast(src.schema[c]) for c in q.by).write_csv(work / q.keys)


def truth(q: Query, work: Path) -> dict[str, float] | list[str]:
    """Group key -> exact statistic over all rows (top-k: the true top K destinations by flights)."""
    lf = pl.scan_parquet(input_path(work, q.dataset))
    if q.stat == "topk":
        counts = lf.group_by(*q.by).agg(pl.len().alias("n")).sort(["n", *q.by], descending=[True, False]).collect()
        return [group_key(list(r)) for r in counts.select(q.by).head(TOP_K).iter_rows()]
    agg = {"count": pl.len(), "sum": pl.col(q.value or "").sum(), "mean": pl.col(q.value or "").mean(),
           "median": pl.col(q.value or "").median()}[q.stat]
    frame = lf.group_by(*q.by).agg(agg.cast(pl.Float64).alias("v")).collect()
    return {group_key(list(r[:-1])): float(r[-1]) for r in frame.select(*q.by, "v").iter_rows()}
