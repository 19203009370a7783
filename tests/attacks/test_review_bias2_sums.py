"""Review of the bias report 2 (``unit shares 2``), its exact sums (``_true_sums``) under adversarial inputs.

The report's privacy rests on three facts checked here: (1) the sums are a sum over units of a vector that depends
on that unit's rows alone (the kept groups are a keyed sample of *its* groups: no other unit moves them), (2) each
unit's vector is non-negative and adds up to exactly SCALE (ℓ1 and ℓ2 sensitivity SCALE), whatever it holds (null
units and groups, NaN, ±inf, text no number parses from, values exactly at the limits, duplicate rows), and (3) the
arithmetic stays exact at the largest caps the options allow. The kept groups are also the release's own.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from dpcli import bounding
from dpcli.tasks import auto_bounds as ab
from dpcli.tasks import bias_report as br

_VALUES = [None, math.nan, math.inf, -math.inf, 0.0, 10.0, -0.0, 5.0, 1e308, -1e308, 10.000000000000002, -1.0]


def _sums(frame: pl.DataFrame, shape: ab.DataShape, bounds: ab.ChosenBounds, rows: bool = True,
          salt: int = 7) -> dict[str, int]:
    parts = br.bias_parts(shape, bounds, rows)
    return br._true_sums(frame.lazy(), shape, bounds, parts, salt, "x")


def _weight(frame: pl.DataFrame, unit: object, shape: ab.DataShape) -> int:
    """SCALE for a unit with a usable row (a readable value where there is a value column), else 0."""
    own = frame.filter(pl.col("user").eq_missing(unit))
    if shape.value is not None:
        x = own["x"].cast(pl.Float64, strict=False) if own["x"].dtype == pl.String else own["x"]
        own = own.filter(x.is_not_null() & ~x.is_nan())
    return br.SCALE if own.height else 0


def test_the_sums_add_up_unit_by_unit_never_negative_each_scale():
    """Random adversarial inputs (30, seeded): the whole input's sums equal the sum of each unit's alone (no unit's
    presence changes another's kept groups or shares), and each unit's alone are ≥ 0 and add up to SCALE."""
    rng = np.random.default_rng(2026)
    for _ in range(30):
        n = int(rng.integers(1, 60))
        text = bool(rng.random() < 0.3)
        x: list[object] = [_VALUES[int(i)] for i in rng.integers(0, len(_VALUES), n)]
        if text:
            x = [None if v is None else ("nan" if isinstance(v, float) and math.isnan(v) else repr(v)) for v in x]
            x = [v if rng.random() > 0.1 else "abc" for v in x]
        frame = pl.DataFrame({"user": [None if rng.random() < 0.05 else int(u) for u in rng.integers(0, 5, n)],
                              "g": [None if rng.random() < 0.1 else str(int(g)) for g in rng.integers(0, 6, n)],
                              "x": x}, schema={"user": pl.Int64, "g": pl.String,
                                               "x": pl.String if text else pl.Float64})
        if rng.random() < 0.3:
            frame = pl.concat([frame, frame])  # every row twice
        k = None if rng.random() < 0.3 else int(rng.integers(1, 4))
        bounds = ab.ChosenBounds(k, int(rng.integers(1, 5)), None if rng.random() < 0.3 else (0.0, 10.0))
        shape = ab.DataShape("user", () if rng.random() < 0.2 else ("g",), "x" if rng.random() < 0.8 else None)
        rows = bool(rng.random() < 0.8)
        whole = _sums(frame, shape, bounds, rows)
        added = dict.fromkeys(whole, 0)
        for unit in frame["user"].drop_nulls().unique().to_list():
            alone = _sums(frame.filter(pl.col("user") == unit), shape, bounds, rows)
            assert min(alone.values()) >= 0 and sum(alone.values()) == _weight(frame, unit, shape)
            added = {p: added[p] + alone[p] for p in added}
        assert added == whole, (shape, bounds, rows)


def test_the_kept_groups_are_the_releases_own():
    """Five units, each with 10 groups of 1…10 rows, K = 4, C = 250 (no row cap reached): the rows the report counts as
    beyond K are the rows the release's bounding (dpcli.bounding.bound_contributions, the same salt) drops, unit by
    unit and salt by salt (each unit's share of its 55 rows, in thousandths rounded down)."""
    frame = pl.DataFrame([(u, f"g{g}") for u in range(5) for g in range(10) for _ in range(g + 1)],
                         schema=["user", "g"], orient="row")
    shape, bounds = ab.DataShape("user", ("g",)), ab.ChosenBounds(4, 250, None)
    for salt in (1, 2, 3, 2**127 + 5):
        spec = bounding.BoundingSpec("user", ("g",), max_partitions=4, max_contributions=250)
        kept = bounding.bound_contributions(frame.lazy(), spec, salt).collect()
        per_unit = kept.group_by("user").agg(pl.col(bounding.N_ROWS).sum())[bounding.N_ROWS].to_list()
        cut = sum((55 - k) * br.SCALE // 55 for k in per_unit)
        sums = _sums(frame, shape, bounds, salt=salt)
        assert sums["max_partitions"] == cut and sums["rest"] == 5 * br.SCALE - cut


def test_the_sums_stay_exact_at_the_largest_caps():
    """K = C = 10⁶ (the options' largest): a unit of 3·10⁶ rows in one group, 2·10⁶ of them beyond C, loses 666‰."""
    rows = 3_000_000
    frame = pl.DataFrame({"user": np.zeros(rows, dtype=np.int64), "g": np.zeros(rows, dtype=np.int64)})
    shape = ab.DataShape("user", ("g",))
    assert _sums(frame, shape, ab.ChosenBounds(10**6, 10**6, None)) == {"max_partitions": 0,
                                                                          "max_contributions": 666, "rest": 334}


def test_a_changed_unit_moves_the_vector_by_at_most_twice_scale():
    """sql's owned tables (dpcli.tasks.sql.owners): one more unit can change the rows of A others, and the report runs
    at ε/S, S = 1 + 2A, so each changed unit may move the vector by 2·SCALE in ℓ1 (√2·SCALE in ℓ2), no more. And it
    can come near it: a unit with 2 rows kept whole (all its share the rest) that gains 10⁴ rows in groups beyond
    K (K = 1, C = 2) moves almost all of its share from the rest to the K part."""
    shape, bounds = ab.DataShape("user", ("g",)), ab.ChosenBounds(1, 2, None)
    before = pl.DataFrame({"user": [0, 0], "g": ["a", "a"]})
    extra = pl.DataFrame({"user": [0] * 10_000, "g": [f"b{i}" for i in range(10_000)]})
    a, b = _sums(before, shape, bounds), _sums(pl.concat([before, extra]), shape, bounds)
    diff = [abs(a[k] - b[k]) for k in a]
    assert a == {"max_partitions": 0, "max_contributions": 0, "rest": br.SCALE}
    assert 1.99 * br.SCALE < sum(diff) <= 2 * br.SCALE and math.hypot(*diff) <= math.sqrt(2) * br.SCALE
