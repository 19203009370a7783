"""PipelineDP 0.3 (local backend) on the workload: careful caps, ε = 1 per query, user-level, Laplace noise.

One DPEngine and accountant per query; ``max_partitions_contributed`` = K and
``max_contributions_per_partition`` = C (PipelineDP samples both uniformly); public partitions from
the key lists; the median is ``Metrics.PERCENTILE(50)``; the top 10 is the 10 largest noisy counts
(with the list: over ``dests.csv``; without: PipelineDP's private partition selection at δ = 1e-6).
Usage: see bench/accuracy/peer_common.py.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import pipeline_dp
import pyarrow.parquet as pq
from peer_common import main

from bench.accuracy.spec import DELTA_TOPK, EPSILON, TOP_K, UNIT, Query, group_key, input_path

METRIC = {"count": "COUNT", "sum": "SUM", "mean": "MEAN", "topk": "COUNT"}


def _keys(work: Path, q: Query) -> list[Any]:
    import csv

    with open(work / str(q.keys), newline="") as f:
        rows = list(csv.DictReader(f))
    return [r[q.by[0]] if len(q.by) == 1 else tuple(r[c] for c in q.by) for r in rows]


def _aggregate(q: Query, rows: list[tuple[Any, ...]], public: list[Any] | None, delta: float) -> dict[str, float]:
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=delta)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    metric = pipeline_dp.Metrics.PERCENTILE(50) if q.stat == "median" else getattr(pipeline_dp.Metrics, METRIC[q.stat])
    extra = {} if q.bounds is None else {"min_value": float(q.bounds[0]), "max_value": float(q.bounds[1])}
    params = pipeline_dp.AggregateParams(noise_kind=pipeline_dp.NoiseKind.LAPLACE, metrics=[metric],
                                         max_partitions_contributed=q.max_partitions,
                                         max_contributions_per_partition=q.max_contributions, **extra)
    extractors = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
                                            value_extractor=lambda r: r[2])
    result = engine.aggregate(rows, params, extractors, public_partitions=public)
    accountant.compute_budgets()
    out = {}
    for key, metrics in result:
        parts = key if isinstance(key, tuple) else (key,)
        out[group_key(list(parts))] = float(metrics[0])
    return out


def run_query(q: Query, work: Path) -> dict[str, Any]:
    cols = [UNIT[q.dataset], *q.by, *([q.value] if q.value else [])]
    table = pq.read_table(input_path(work, q.dataset), columns=cols)
    by = [[str(v) for v in table.column(c).to_pylist()] for c in q.by]
    part = by[0] if len(by) == 1 else list(zip(*by, strict=True))
    vals = table.column(q.value).to_pylist() if q.value else [0] * table.num_rows
    rows = list(zip(table.column(cols[0]).to_pylist(), part, vals, strict=True))
    if q.stat == "topk":
        out: dict[str, Any] = {}
        for listed in (False, True):
            counts = _aggregate(q, rows, _keys(work, q) if listed else None, 0.0 if listed else DELTA_TOPK)
            out["listed" if listed else "unlisted"] = sorted(counts, key=lambda k: -counts[k])[:TOP_K]
        return out
    return {"values": _aggregate(q, rows, _keys(work, q), 0.0)}


if __name__ == "__main__":
    main("PipelineDP", importlib.metadata.version("pipeline-dp"), [], run_query)
