"""Crafted inputs for selection v3 (the keyed XXH64 order, ``dpcli/bounding/keyed_order.py``).

A data subject chooses their own values and may know the algorithm, not the salt: :func:`_orders`
gives a frame in several row orders and chunkings, :func:`_assert_caps` checks the contribution
bounds (≤ C rows per (unit, group), ≤ K groups per unit) and that the order key never leaves.
"""

from __future__ import annotations

import random
from fractions import Fraction

import polars as pl

from dpcli import bounding

SALT = 0x5EC_0DE5_A17_0000_1111_2222_3333_4444
MASK = (1 << 64) - 1
GRID = bounding.ValueGrid(0.0, 16.0, Fraction(1))


def _spec(unit: str, by: tuple[str, ...], c: int, k: int | None, value: str | None = "v") -> bounding.BoundingSpec:
    return bounding.BoundingSpec(unit=unit, by=by, max_partitions=k, max_contributions=c, value=value,
                                 grid=GRID if value else None)


def _partial(frame: pl.LazyFrame, spec: bounding.BoundingSpec, engine: str = "streaming") -> pl.DataFrame:
    out = bounding.bound_contributions(frame, spec, SALT).collect(engine=engine)
    return out.sort(out.columns, nulls_last=True)


def _orders(df: pl.DataFrame, n: int = 3):
    """The frame in several row orders and chunkings (one chunk per few rows, then reversed)."""
    yield df
    for seed in range(n):
        idx = list(range(df.height))
        random.Random(seed).shuffle(idx)
        shuffled = df[idx]
        parts = [shuffled.slice(i, 3) for i in range(0, shuffled.height, 3)]
        yield pl.concat(parts, rechunk=False) if parts else shuffled
    yield df.reverse()


def _assert_caps(partial: pl.DataFrame, spec: bounding.BoundingSpec) -> None:
    assert partial[bounding.N_ROWS].max() is None or partial[bounding.N_ROWS].max() <= spec.max_contributions
    if spec.max_partitions is not None and partial.height:
        per_unit = partial.group_by(spec.unit).len()["len"].max()
        assert per_unit <= spec.max_partitions
    assert all(not c.startswith("__dp_order") and c != "__dp_rank" for c in partial.columns)  # the key never leaves
