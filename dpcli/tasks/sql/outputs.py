"""The released table of a ``dpcli sql`` query: each aggregate post-processed from its noisy measurements.

``ANON_COUNT`` and ``ANON_SUM`` are noisy totals (with ``--with-error``, their exact 95% noise
margins; a distinct-unit count that also decided which partitions appear gets the interval
conditional on passing that threshold, as ``histogram``'s does); ``ANON_AVG`` is the noisy centred
sum over the noisy user count, moved back by the centre and kept within [L, U] (paper 002's bounded
mean, [LLSY16]: a mean of per-person means); ``ANON_VAR`` is the noisy mean of squared distances to
the centre minus the squared noisy centred mean, within [0, ((U − L)/2)²], and ``ANON_STDDEV`` its
square root — their margins are union bounds over the measurements' own intervals
(:mod:`dpcli.core.intervals`); NTILEs come from the exponential mechanism. Then HAVING, ORDER BY and
LIMIT act on the noisy table (post-processing).
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
from dpcli.tasks.sql.plan import IntervalCalibrated, SqlPlan, measures_for
from dpcli.tasks.sql.run import UNITS, Layout, ntile_interval, ntile_values
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


#: (values, 95% margin: one for every row, one per row, or None)
Column = tuple[Any, Any]


def _count(agg: AnonAgg, n: Noisy) -> Column:
    (m,) = measures_for(agg, n.default_cap)
    noise = n.plan.get(m.key).noise
    assert noise is not None
    values = n.values[m.key]
    if m.key == UNITS and n.plan.domain == "threshold":
        # the same noisy count decided that the partition appears: its interval given that it passed
        assert n.plan.threshold is not None
        lo, hi = intervals.selected_interval(noise, values, n.plan.threshold)
        return values, intervals.cover_margin(values, lo, hi).astype(np.int64)
    return values, int(noise.margin95())  # an integer, as the count is (and as histogram's count margins are)


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


def _margin_of(n: Noisy, key: str, alpha: float) -> float:
    noise = n.plan.get(key).noise
    assert noise is not None  # the user count and the centred sums are noisy measurements
    return float(noise.margin(alpha))


def _avg(agg: AnonAgg, n: Noisy) -> Column:
    _, mean, grid = _moments(agg, n)
    g = float(grid.granularity)
    values = np.clip((grid.mid_units + mean) * g, grid.lo, grid.hi)
    ms = measures_for(agg, n.default_cap)
    alpha = intervals.ALPHA / 2  # union bound over the user count's and the centred sum's intervals
    lo, hi = intervals.mean_interval(n.values[ms[0].key], n.values[ms[1].key], _margin_of(n, ms[0].key, alpha),
                                     _margin_of(n, ms[1].key, alpha), *_centred(grid))
    return values, intervals.cover_margin(values, (grid.mid_units + lo) * g, (grid.mid_units + hi) * g)


def _centred(grid: Any) -> tuple[float, float]:
    """The grid's ends in grid units, relative to its centre (the centred sums' range per person)."""
    return float(grid.lo_units - grid.mid_units), float(grid.hi_units - grid.mid_units)


def _variance_range(agg: AnonAgg, n: Noisy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The released variance and its conservative 95% interval (union bound over three intervals)."""
    users, mean, grid = _moments(agg, n)
    ms = measures_for(agg, n.default_cap)
    squares = n.values[ms[2].key] / users
    top = float(max(grid.half_width_units, 1)) ** 2
    g2 = float(grid.granularity) ** 2
    values = np.clip(squares - mean * mean, 0.0, top) * g2
    alpha = intervals.ALPHA / 3
    margins = (_margin_of(n, ms[0].key, alpha), _margin_of(n, ms[1].key, alpha), _margin_of(n, ms[2].key, alpha))
    lo, hi = intervals.variance_interval(n.values[ms[0].key], n.values[ms[1].key], n.values[ms[2].key], margins,
                                         *_centred(grid))
    return values, lo * g2, hi * g2


def _var(agg: AnonAgg, n: Noisy) -> Column:
    values, lo, hi = _variance_range(agg, n)
    return values, intervals.cover_margin(values, lo, hi)


def _stddev(agg: AnonAgg, n: Noisy) -> Column:
    values, lo, hi = _variance_range(agg, n)
    root = np.sqrt(values)
    return root, intervals.cover_margin(root, np.sqrt(np.maximum(lo, 0.0)), np.sqrt(np.maximum(hi, 0.0)))


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
           "sum": "exact 95% interval of the noise",
           "avg": ("conservative 95%: the noisy user count's and centred sum's own 97.5% intervals (union bound), "
                   "through the ratio and the bounds, as a margin around the released value"),
           "var": ("conservative 95%: the noisy user count's, centred sum's and sum of squares' own 98.33% intervals "
                   "(union bound), through the ratios and the bounds, as a margin around the released value"),
           "stddev": ("conservative 95%: the variance's interval (the noisy user count's, centred sum's and sum of "
                      "squares' own 98.33% intervals, union bound), square-rooted, as a margin around the released "
                      "value"),
           "ntile": "not provided (exponential mechanism)"}
#: A distinct-unit count that also selected the partitions (no public list).
SELECTED_MARGIN = ("95% interval conditional on the partition passing its threshold (the noise truncated at the "
                   "threshold), as a margin around the released value")


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
            selected = isinstance(margin, np.ndarray) and agg.function == "count_units"
            margins[o.name] = SELECTED_MARGIN if selected else MARGINS[agg.function]
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
