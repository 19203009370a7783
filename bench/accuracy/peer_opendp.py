"""OpenDP 0.16 (Polars Context API) on the workload: careful caps, ε = 1 per query, user-level.

Each query is its own Context (ε = 1, one query), the unit is the plane (``identifier="tailnum"``),
bounded by ``truncate_per_group(C, keep="sample")`` (a uniform row sample per unit and group) then
``truncate_num_groups``. OpenDP 0.16's ``truncate_num_groups(K)`` keeps K − 1 groups (its filter is
``dense rank < K`` with ranks from 1): it is run with K + 1, and ``keep="first"`` (its ``"sample"``
fails on this polars). Public keys via ``with_keys``; medians from integer candidates (a minute,
100 dollars); the top 10 is the 10 largest noisy counts (with the list: over ``dests.csv``; without:
OpenDP's own threshold at δ = 1e-6). Usage: see bench/accuracy/peer_common.py.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import opendp.prelude as dp
import polars as pl
from peer_common import group_map, main

from bench.accuracy.spec import DELTA_TOPK, EPSILON, TOP_K, UNIT, Query, group_key, input_path

dp.enable_features("contrib")
warnings.filterwarnings("ignore", category=FutureWarning)  # dp.len()'s coming change of default

NOTES = ["truncate_num_groups(K) keeps K − 1 groups in OpenDP 0.16: run with K + 1 and keep=\"first\" "
         "(a plane's first groups in sort order, not a random choice); rows: truncate_per_group(C, keep=\"sample\")"]


def _context(q: Query, lf: pl.LazyFrame, delta: float) -> Any:
    n = lf.select(pl.len()).collect().item()  # a public bound on the length, as OpenDP requires
    return dp.Context.compositor(
        data=lf, privacy_unit=dp.unit_of(contributions=1, identifier=UNIT[q.dataset]),
        privacy_loss=dp.loss_of(epsilon=EPSILON, delta=delta) if delta else dp.loss_of(epsilon=EPSILON),
        split_evenly_over=1, margins=[dp.polars.Margin(max_length=n)])


def _bounded(q: Query, ctx: Any, k: int, c: int) -> Any:
    return (ctx.query().truncate_per_group(c, by=list(q.by), keep="sample")
            .truncate_num_groups(k + 1, by=list(q.by), keep="first"))


def _agg(q: Query) -> Any:
    if q.stat == "count":
        return dp.len()
    col = pl.col(q.value or "")
    assert q.bounds is not None
    lo, hi = q.bounds
    if q.stat == "median":
        return col.cast(pl.Float64).fill_null(0.0).dp.median(list(np.arange(lo, hi + q.median_step / 2, q.median_step)))
    cast = col.cast(pl.Int64) if q.stat == "sum" else col.cast(pl.Float64)
    bounds = (int(lo), int(hi)) if q.stat == "sum" else (float(lo), float(hi))
    return getattr(cast.fill_null(0).dp, q.stat)(bounds)


def run_query(q: Query, work: Path) -> dict[str, Any]:
    lf = pl.scan_parquet(input_path(work, q.dataset)).select(UNIT[q.dataset], *q.by, *([q.value] if q.value else []))
    if q.stat == "topk":
        out: dict[str, Any] = {}
        for listed in (False, True):
            ctx = _context(q, lf, 0.0 if listed else DELTA_TOPK)
            query = _bounded(q, ctx, q.max_partitions, q.max_contributions).group_by(*q.by).agg(dp.len())
            if listed:
                query = query.with_keys(pl.read_csv(work / str(q.keys), schema_overrides=dict.fromkeys(q.by, pl.String)))
            res = query.release().collect().drop_nulls("len").sort("len", descending=True).head(TOP_K)
            out["listed" if listed else "unlisted"] = [group_key(list(r)) for r in res.select(q.by).iter_rows()]
        return out
    keys = pl.read_csv(work / str(q.keys), schema_overrides=dict.fromkeys(q.by, pl.String))
    schema = lf.collect_schema()
    keys = keys.select(pl.col(c).cast(schema[c]) for c in q.by)
    ctx = _context(q, lf, 0.0)
    query = _bounded(q, ctx, q.max_partitions, q.max_contributions).group_by(*q.by).agg(_agg(q).alias("v")).with_keys(keys)
    res = query.release().collect()
    return {"values": group_map(list(res.select(*q.by, "v").iter_rows()))}


if __name__ == "__main__":
    main("OpenDP", importlib.metadata.version("opendp"), NOTES, run_query)
