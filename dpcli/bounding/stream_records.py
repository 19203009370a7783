"""The per-unit record cap of a stream: at most C records per privacy unit over the whole stream.

Which records count is decided per unit and by content only: a unit's
records are ordered by the given columns (time first, ties broken by the
record's content, never by its position in the file) and the first C count,
minus those the unit already used in earlier runs of a persisted stream. So
one unit's records never change which records of another unit count.

The stability (:func:`record_cap_stability`) counts each kept record as one
group: a unit touches at most C records, each adds one row, at most one
distinct unit and at most ``max_abs_units`` grid units to the cell
(key, trigger) it falls in. Whatever cells a unit's records fall in, its
total change is ``l1`` (a count tree, a sum tree) and it joins at most C
selection rounds with one unit each (``l2_squared("units")``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from dpcli.bounding import ValueGrid
from dpcli.bounding.stability import Bounded, Stability


def record_cap_stability(max_records: int, grid: ValueGrid | None) -> Stability:
    """What one unit can change after :func:`cap_records` with cap ``max_records`` (C).

    Per record: ``rows`` 1, ``units`` 1 and, with a value grid, ``value``
    ``grid.max_abs_units``; at most C records.
    """
    per_record: dict[str, int] = {"rows": 1, "units": 1}
    if grid is not None:
        per_record["value"] = grid.max_abs_units
    return Stability(max_groups=max_records, per_group=per_record)


def cap_records(
    frame: pl.LazyFrame,
    unit: str,
    order: Sequence[str],
    max_records: int,
    grid: ValueGrid | None = None,
    used: Mapping[Any, int] | None = None,
) -> Bounded:
    """Keep each unit's first ``max_records`` records in ``order`` (over the whole stream).

    ``frame`` holds one row per record, with a non-null ``unit`` column and
    the ``order`` columns (sorted on, nulls last; rows tied on every column
    are equal, so which of them is kept does not matter). ``used`` maps units
    to the records they used in earlier runs: those count towards the cap.
    The result is sorted by ``order``.
    """
    lf = frame.sort(list(order), nulls_last=True)
    rank = pl.int_range(pl.len()).over(unit)
    if used:
        unit_type = lf.collect_schema()[unit]
        prior = pl.LazyFrame({unit: pl.Series(list(used), dtype=unit_type),
                              "__used": pl.Series(list(used.values()), dtype=pl.Int64)})
        lf = lf.join(prior, on=unit, how="left", maintain_order="left")
        lf = lf.filter(rank + pl.col("__used").fill_null(0) < max_records).drop("__used")
    else:
        lf = lf.filter(rank < max_records)
    return Bounded(lf, record_cap_stability(max_records, grid))
