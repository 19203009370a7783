"""The released table of a ``dpcli sql`` query: each aggregate post-processed from its noisy measurements.

``ANON_COUNT`` and ``ANON_SUM`` are noisy totals (with ``--with-error``, their exact 95% noise
margins); ``ANON_AVG`` is the noisy centred sum over the noisy user count, moved back by the
centre and kept within [L, U] (paper 002's bounded mean, [LLSY16]); ``ANON_VAR`` is the noisy mean
of squared distances to the centre minus the squared noisy centred mean, within [0, ((U − L)/2)²],
and ``ANON_STDDEV`` its square root; NTILEs come from the exponential mechanism. Then HAVING,
ORDER BY and LIMIT act on the noisy table (post-processing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from dpcli.core import intervals
from dpcli.core.prf import KeyedStream
from dpcli.errors import DataError
from dpcli.tasks import quantile_interval
from dpcli.tasks.sql.ir import AnonAgg, PostStep, ResolvedQuery
from dpcli.tasks.sql.measures import IntervalCalibrated, SqlPlan, measures_for
from dpcli.tasks.sql.run import Layout, ntile_interval, ntile_values
from dpcli.tasks.sql.typed import Compiler


@dataclass(frozen=True)
class Noisy:
    """What the aggregates are post-processed from: the released partitions' totals, the noisy
    measurements, each NTILE's bins, and the stream its mechanism draws from."""

    totals: pl.DataFrame
    values: dict[str, np.ndarray]
    bins: dict[str, pl.DataFrame]
    layout: Layout
    plan: SqlPlan
    stream: KeyedStream
    default_cap: int


#: (values, 95% margin of every row (one for all, or one per row) or None)
Column = tuple[Any, Any]


def _count(agg: AnonAgg, n: Noisy) -> Column:
    (m,) = measures_for(agg, n.default_cap)
    noise = n.plan.get(m.key).noise
    assert noise is not None
    return n.values[m.key], float(noise.margin95())


def _sum(agg: AnonAgg, n: Noisy) -> Column:
    (m,) = measures_for(agg, n.default_cap)
    noise = n.plan.get(m.key).noise
    assert noise is not None
    g = float(m.grid.granularity)
    return n.values[m.key] * g, noise.margin95() * g


def _moments(agg: AnonAgg, n: Noisy) -> tuple[np.ndarray, np.ndarray, Any]:
    """(noisy user count ≥ 1, centred mean in grid units, the grid) of an AVG, VAR or STDDEV."""
    ms = measures_for(agg, n.default_cap)
    users = np.maximum(n.values[ms[0].key], 1).astype(np.float64)
    return users, n.values[ms[1].key] / users, ms[1].grid


def _avg(agg: AnonAgg, n: Noisy) -> Column:
    _, mean, grid = _moments(agg, n)
    return np.clip((grid.mid_units + mean) * float(grid.granularity), grid.lo, grid.hi), None


def _var(agg: AnonAgg, n: Noisy) -> Column:
    users, mean, grid = _moments(agg, n)
    squares = n.values[measures_for(agg, n.default_cap)[2].key] / users
    top = float(max(grid.half_width_units, 1)) ** 2
    return np.clip(squares - mean * mean, 0.0, top) * float(grid.granularity) ** 2, None


def _stddev(agg: AnonAgg, n: Noisy) -> Column:
    variance, _ = _var(agg, n)
    return np.sqrt(variance), None


def _ntile(agg: AnonAgg, n: Noisy) -> Column:
    (m,) = measures_for(agg, n.default_cap)
    c = n.plan.get(m.key)
    values = ntile_values(m, c.em_rate, n.totals, n.bins[m.key], n.layout, n.stream.child(m.key))
    if not isinstance(c, IntervalCalibrated):
        return values, None
    lo, hi = ntile_interval(m, c, n.totals, n.bins[m.key], n.layout, n.stream.child(f"interval:{m.key}"))
    return values, intervals.cover_margin(values, lo, hi)


_OUTPUTS: dict[str, Callable[[AnonAgg, Noisy], Column]] = {
    "count": _count, "count_units": _count, "sum": _sum, "avg": _avg, "var": _var, "stddev": _stddev,
    "ntile": _ntile,
}

#: How each aggregate's margin is meant (the ``margins`` field of the summary).
MARGINS = {"count": "exact 95% interval of the noise", "count_units": "exact 95% interval of the noise",
           "sum": "exact 95% interval of the noise", "avg": "not provided (ratio of noisy values)",
           "var": "not provided (ratio of noisy values)", "stddev": "not provided (ratio of noisy values)",
           "ntile": "not provided (exponential mechanism)"}


def output_table(query: ResolvedQuery, n: Noisy, with_error: bool) -> tuple[pl.DataFrame, dict[str, str]]:
    """The released columns in the SELECT list's order (margins after their columns with ``--with-error``)."""
    columns: list[pl.Series] = []
    margins: dict[str, str] = {}
    for o in query.outputs:
        if o.group is not None:
            columns.append(n.totals[n.layout.groups[o.group]].alias(o.name))
            continue
        assert o.aggregate is not None
        agg = query.aggregates[o.aggregate]
        values, margin = _OUTPUTS[agg.function](agg, n)
        columns.append(pl.Series(o.name, values))
        if with_error:
            margins[o.name] = MARGINS[agg.function]
            if agg.function == "ntile" and margin is not None:
                margins[o.name] = quantile_interval.describe()
            if margin is not None:
                per_row = margin if isinstance(margin, np.ndarray) else [margin] * n.totals.height
                columns.append(pl.Series(f"{o.name}_moe95", per_row))
    return pl.DataFrame(columns), margins


def apply_post(table: pl.DataFrame, post: PostStep) -> pl.DataFrame:
    """HAVING, ORDER BY and LIMIT on the released table (post-processing: no data involved)."""
    if post.having is not None:
        try:
            table = table.filter(Compiler(table.schema).condition(post.having, "HAVING"))
        except pl.exceptions.PolarsError as exc:
            raise DataError(f"HAVING does not fit the released columns ({type(exc).__name__})") from None
    if post.order:
        table = table.sort([c for c, _ in post.order], descending=[d for _, d in post.order], nulls_last=True,
                           maintain_order=True)
    return table.head(post.limit) if post.limit is not None else table
