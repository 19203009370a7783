"""Error metrics of the table (numpy only, unit-tested in tests/test_bench_accuracy.py).

* counts, sums, means: relative error |released − truth| / |truth| per group, a group the tool did not
  release counting as an error of 1 (100%);
* medians of ``dep_delay``: the absolute error in minutes (the table says "minutes off"); income medians
  relative, like the others; an unreleased group is left out and counted in ``missing``;
* top-k: the share of the true top K among the released groups.
Each figure is the median over all (group, draw) pairs: "median over groups and fresh keys".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def group_errors(released: Mapping[str, float | None], truth: Mapping[str, float], *, absolute: bool,
                 missing_error: float | None = 1.0) -> list[float]:
    """Per-group errors of one draw (groups of the truth only; extra released groups are ignored)."""
    out: list[float] = []
    for key, t in truth.items():
        v = released.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            if missing_error is not None:
                out.append(missing_error)
            continue
        err = abs(float(v) - t)
        out.append(err if absolute else (err / abs(t) if t != 0 else math.inf))
    return out


def pooled_median(per_draw: Sequence[Sequence[float]]) -> float:
    """The median over every (group, draw) error; NaN when there is none."""
    flat = [e for draw in per_draw for e in draw]
    return float(np.median(flat)) if flat else math.nan


def topk_share(released: Sequence[str], true_top: Sequence[str]) -> float:
    """Share of the true top K found among the released groups (order ignored)."""
    return len(set(released) & set(true_top)) / len(true_top)


def coverage(released: Mapping[str, float | None], moe: Mapping[str, float | None],
             truth: Mapping[str, float]) -> tuple[int, int]:
    """(groups whose 95% margin covers the raw truth, groups with a margin)."""
    hit = n = 0
    for key, t in truth.items():
        v, m = released.get(key), moe.get(key)
        if v is None or m is None:
            continue
        n += 1
        hit += abs(float(v) - t) <= float(m)
    return hit, n
