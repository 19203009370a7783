"""A top-k release computed: the bounded counts of every group (or of the largest, in one streaming query), the
selection and the ranking (:func:`run_topk`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from dpcli import bounding
from dpcli.core import selection as sel
from dpcli.core.events import PrivacyEvent
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.frames import collect
from dpcli.tasks.reports import TopKReport
from dpcli.tasks.topk.plan import TopKPlan, br_units, stage_events
from dpcli.tasks.topk.query import TopKQuery
from dpcli.tasks.topk.threshold import select_groups

if TYPE_CHECKING:

    pass


@dataclass
class TopKRelease:
    table: pl.DataFrame
    bottom: bool
    actual: list[PrivacyEvent]
    metadata: TopKReport


def group_counts(frame: pl.LazyFrame, q: TopKQuery, *, name: str = "the input", rows: int | None = None,
                 engine: bounding.TotalsEngine | None = None, top: int | None = None) -> pl.DataFrame:
    """Per-group counts after bounding (τ rows per unit per group, or distinct units): all groups, or
    with ``top`` only the ``top`` largest (ties: the smaller group first), in no particular order.

    With ``top`` and one pass over the input (:func:`dpcli.bounding.unit_buckets`), the largest are
    taken by ``top_k`` inside the one streaming query: no table of every group's counts is built or
    sorted. The counts are those of :func:`dpcli.bounding.group_totals` (``units`` or ``rows``).
    """
    spec = q.bounding_spec()
    by = list(q.by)
    if engine is None and top is not None and bounding.unit_buckets(rows) == 1:
        partial = bounding.bound_contributions(frame, spec, 0)
        count = pl.len() if q.count == "units" else pl.col(bounding.N_ROWS).sum()
        largest = partial.group_by(by).agg(count.cast(pl.Int64).alias("h")).top_k(
            top, by=["h", *by], reverse=[False] + [True] * len(by))
        return collect(largest, f"cannot read {name}")
    if engine is not None:
        totals = engine(spec, 0)
    else:
        totals = bounding.bounded_totals(frame, spec, 0, bounding.unit_buckets(rows), name=name)
    counts = totals.select([*by, pl.col("units" if q.count == "units" else "rows").alias("h")])
    if top is not None:
        counts = counts.top_k(top, by=["h", *by], reverse=[False] + [True] * len(by))
    return counts


def run_topk(
    frame: pl.LazyFrame, q: TopKQuery, plan: TopKPlan, stream: KeyedStream, domain: pl.DataFrame | None = None,
    *, name: str = "the input", rows: int | None = None, engine: bounding.TotalsEngine | None = None,
) -> TopKRelease:
    """Count, select (KnownGumb or UnkGumb), add count noise; the cost actually incurred.

    ``name`` names the input in error messages; ``rows``: its row count if known without a pass;
    ``engine``: bound on another engine (Spark) instead of polars.
    """
    by = list(q.by)
    q = q.resolved(plan.ledger_mode)
    top = q.groups_considered + 1 if q.method == "unkgumb" else None  # UnkGumb looks at the d̄ + 1 largest only
    if plan.selection is not None:  # stage 1: the groups the thresholding releases become the list
        domain = select_groups(frame, q, plan.selection, stream, name=name, rows=rows, engine=engine)
    counts = group_counts(frame, q, name=name, rows=rows, engine=engine, top=top)
    meta: TopKReport = {"tau": q.count_sensitivity, "selection": q.method}
    if plan.selection is not None:
        assert domain is not None
        # stage 2: KnownGumb over the selected groups, at most k (all of them, ranked, when fewer pass)
        cand = domain.join(counts, on=by, how="left", nulls_equal=True).with_columns(pl.col("h").fill_null(0))
        cand = cand.sort(by, nulls_last=True)  # the race's order: the group keys' (a join keeps no order)
        picks = (sel.known_top_k(stream, cand["h"].to_numpy(), min(q.k, cand.height), plan.epsilon_per,
                                 q.count_sensitivity) if cand.height else [])
        chosen = cand[picks]
        bottom = cand.height < q.k
        # T and K̄ are public parameters; how many groups passed is a function of stage 1's output.
        meta.update({"threshold": plan.selection.threshold, "max_partitions": plan.selection.max_partitions,
                     "selected": cand.height})
    elif q.known_domain:
        assert domain is not None
        if q.k > domain.height:
            raise UsageError(f"-k {q.k} is larger than the domain ({domain.height} candidates)")
        cand = domain.join(counts, on=by, how="left", nulls_equal=True).with_columns(pl.col("h").fill_null(0))
        cand = cand.sort(by, nulls_last=True)
        picks = sel.known_top_k(stream, cand["h"].to_numpy(), q.k, plan.epsilon_per, q.count_sensitivity)
        chosen = cand[picks]
        bottom = False
    else:
        # counts holds the d̄ + 1 largest groups (ties: smaller key first)
        ranked = counts.sort(["h", *by], descending=[True] + [False] * len(by), nulls_last=True)
        res = sel.unknown_top_k(stream, ranked["h"].to_numpy(), q.k, q.groups_considered, plan.epsilon_per,
                                q.count_sensitivity, plan.delta)
        chosen = ranked[res.positions]
        bottom = res.bottom
        # k̄ is the output of an exponential mechanism (paid by the '+1' of Theorem 1), so it may be
        # shown, and with it ⊥'s offset over h_(k̄+1) (public parameters); h_⊥ itself is an exact count plus
        # that offset and is not.
        offset = sel.bottom_offset(res.k_bar, q.groups_considered, plan.epsilon_per, q.count_sensitivity,
                                   plan.delta)
        meta.update({"k_bar": res.k_bar, "dbar": q.groups_considered, "bottom_offset": round(offset, 1)})
    out = chosen.select(by).with_row_index("rank", offset=1).with_columns(pl.col("rank").cast(pl.Int64))
    if q.with_counts:
        assert plan.count_noise is not None
        noisy = chosen["h"].to_numpy() + plan.count_noise.sample(stream.child("counts"), chosen.height)
        out = out.with_columns(pl.Series("count", noisy, dtype=pl.Int64))
        if q.with_error:
            out = out.with_columns(pl.lit(plan.count_noise.margin95(), dtype=pl.Int64).alias("count_moe95"))
        meta["count_noise"] = plan.count_noise.describe()
    units = br_units(q, out.height, bottom)
    actual = (stage_events(q, plan.ledger_mode, plan.epsilon_per, plan.delta, units) if plan.ledger_mode == "br"
              else plan.reserve)
    # found, bottom and br_units are functions of the released list alone (post-processing).
    meta.update({"found": out.height, "k": q.k, "bottom": bottom, "br_units": units})
    return TopKRelease(out, bottom, actual, meta)
