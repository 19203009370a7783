"""Tumult Analytics 0.21 (Spark, local[2]) on the workload: careful caps, ε = 1 per query, user-level.

One Session per query (PureDPBudget(1); the top-k without a list ApproxDPBudget(1, 1e-6)), each unit
protected as a whole (``AddRowsWithID``), bounded by ``MaxGroupsPerID(K)`` and
``MaxRowsPerGroupPerID(C)`` (a multi-column group is one joined column, as these constraints take one
column); public keys as a KeySet; ``median(low, high)``; the top 10 is the 10 largest noisy counts
(without the list: Tumult's experimental automatic partition selection). Needs Java (17 here).
Usage: see bench/accuracy/peer_common.py.
"""

from __future__ import annotations

import csv
import importlib.metadata
import os
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from peer_common import main

from bench.accuracy.spec import DELTA_TOPK, EPSILON, TOP_K, UNIT, Query, input_path

warnings.filterwarnings("ignore")
os.environ["PYSPARK_PYTHON"] = sys.executable  # Tumult's UDFs run on the executors: this venv's python

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from tmlt.analytics import (  # noqa: E402
    AddRowsWithID,
    ApproxDPBudget,
    KeySet,
    MaxGroupsPerID,
    MaxRowsPerGroupPerID,
    MaxRowsPerID,
    PureDPBudget,
    QueryBuilder,
    Session,
)
from tmlt.analytics.config import config  # noqa: E402

SPARK = (SparkSession.builder.master("local[2]").appName("tumult-accuracy")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.memory", "2g").config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.warehouse.dir", tempfile.mkdtemp(prefix="tumult-warehouse-")).getOrCreate())
SPARK.sparkContext.setLogLevel("ERROR")
config.features.auto_partition_selection.enable()
_FRAMES: dict[str, Any] = {}
# --get-bounds: the value bounds of means and medians from Tumult's own `get_bounds` (ε 0.1 of the query's 1,
# on the whole column, each unit truncated to K·C rows), the aggregation at ε 0.9 within them.
GET_BOUNDS = "--get-bounds" in sys.argv
if GET_BOUNDS:
    sys.argv.remove("--get-bounds")
BOUNDS_SHARE = 0.1


def _frame(q: Query, work: Path) -> Any:
    """The input with the group as one string column ``g`` (cached per dataset and grouping)."""
    tag = f"{q.dataset}:{','.join(q.by)}"
    if tag not in _FRAMES:
        df = SPARK.read.parquet(str(input_path(work, q.dataset)))
        g = F.concat_ws("|", *[F.col(c).cast("string") for c in q.by])
        cols = [F.col(UNIT[q.dataset]), g.alias("g")] + [F.col(c) for c in ("dep_delay", "distance", "PINCP") if c in df.columns]
        _FRAMES[tag] = df.select(*cols).cache()
    return _FRAMES[tag]


def _keys(work: Path, q: Query) -> list[str]:
    with open(work / str(q.keys), newline="") as f:
        return ["|".join(r[c] for c in q.by) for r in csv.DictReader(f)]


def _session(q: Query, work: Path, budget: Any) -> Any:
    return Session.from_dataframe(privacy_budget=budget, source_id="t", dataframe=_frame(q, work),
                                  protected_change=AddRowsWithID(id_column=UNIT[q.dataset]))


def _bounded(q: Query) -> Any:
    return (QueryBuilder("t").enforce(MaxGroupsPerID("g", q.max_partitions))
            .enforce(MaxRowsPerGroupPerID("g", q.max_contributions)))


def run_query(q: Query, work: Path) -> dict[str, Any]:
    if q.stat == "topk":
        out: dict[str, Any] = {}
        for listed in (False, True):
            budget = PureDPBudget(EPSILON) if listed else ApproxDPBudget(EPSILON, DELTA_TOPK)
            session = _session(q, work, budget)
            groups = KeySet.from_dict({"g": _keys(work, q)}) if listed else ["g"]
            res = session.evaluate(_bounded(q).groupby(groups).count(name="n"), budget).toPandas()
            out["listed" if listed else "unlisted"] = list(res.sort_values("n", ascending=False)["g"].head(TOP_K))
        return out
    session = _session(q, work, PureDPBudget(EPSILON))
    spend = EPSILON
    if GET_BOUNDS:
        if q.stat not in ("mean", "median"):
            return {"error": "not run (--get-bounds: means and medians only)"}
        assert q.value is not None
        found = session.evaluate(QueryBuilder("t").enforce(MaxRowsPerID(q.max_partitions * q.max_contributions))
                                 .get_bounds(q.value), PureDPBudget(BOUNDS_SHARE * EPSILON)).toPandas()
        ends = sorted(float(v) for v in found.iloc[0])  # the lower and upper bound columns
        q = replace(q, bounds=(ends[0], ends[-1]))
        spend = (1 - BOUNDS_SHARE) * EPSILON
    grouped = _bounded(q).groupby(KeySet.from_dict({"g": _keys(work, q)}))
    if q.stat == "count":
        query = grouped.count(name="v")
    else:
        assert q.bounds is not None and q.value is not None
        lo, hi = q.bounds
        if q.value == "distance":
            lo, hi = int(lo), int(hi)
        method = {"sum": grouped.sum, "mean": grouped.average, "median": grouped.median}[q.stat]
        query = method(q.value, low=lo, high=hi, name="v")
    res = session.evaluate(query, PureDPBudget(spend)).toPandas()
    out = {"values": {str(g): float(v) for g, v in zip(res["g"], res["v"], strict=True)}}
    return {**out, "bounds": list(q.bounds or ())} if GET_BOUNDS else out


if __name__ == "__main__":
    try:
        name = "Tumult Analytics (get_bounds)" if GET_BOUNDS else "Tumult Analytics"
        main(name, importlib.metadata.version("tmlt.analytics"), [], run_query)
    finally:
        SPARK.stop()
