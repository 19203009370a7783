"""Selection v2: polars computes the keyed order exactly as its plain-Python definition, so any
engine that matches the definition (Spark's sha2) keeps the same rows."""

from __future__ import annotations

import datetime as dt
from fractions import Fraction

import polars as pl
import pytest

from dpcli import bounding
from dpcli.bounding.keyed_order import order_key, reference_order_key

SALT = 0x0123456789ABCDEF_FEDCBA9876543210


def test_every_type_encodes_as_the_reference_says():
    values = {
        "s": ["", "a", "héllo", "s5:x", None, "n;"],
        "i": [0, -42, 2**62, None, 7, 1],
        "b": [True, False, None, True, False, True],
        "d": [dt.date(1970, 1, 1), dt.date(2026, 11, 24), dt.date(1, 1, 1), None, dt.date(9999, 12, 31), None],
        "t": [dt.datetime(2026, 11, 24, 1, 2, 3, 456789), dt.datetime(1969, 12, 31, 23, 59, 59, 999999), None,
              dt.datetime(1970, 1, 1), dt.datetime(2000, 2, 29), dt.datetime(9999, 1, 1)],
        "u": [dt.timedelta(0), dt.timedelta(days=-1, microseconds=5), None, dt.timedelta(seconds=1),
              dt.timedelta(days=3), dt.timedelta(microseconds=1)],
    }
    df = pl.DataFrame(values, schema={"s": pl.String, "i": pl.Int64, "b": pl.Boolean, "d": pl.Date,
                                      "t": pl.Datetime("us"), "u": pl.Duration("us")})
    for purpose in ("rows", "groups"):
        got = df.select(order_key(list(df.schema.items()), SALT, purpose).alias("k"))["k"].to_list()
        want = [reference_order_key(list(row), SALT, purpose) for row in df.iter_rows()]
        assert got == want


def test_float_unit_or_group_columns_are_a_schema_error():
    from dpcli.errors import DataError

    with pytest.raises(DataError, match="'x' has type Float64: a privacy-unit or group column must hold text"):
        order_key([("x", pl.Float64)], SALT, "rows")


def test_the_encoding_is_injective_and_the_key_and_purpose_matter():
    assert reference_order_key(["ab", "c"], SALT, "rows") != reference_order_key(["a", "bc"], SALT, "rows")
    assert reference_order_key([None], SALT, "rows") != reference_order_key(["n;"], SALT, "rows")
    assert reference_order_key([1], SALT, "rows") != reference_order_key(["1"], SALT, "rows")
    assert reference_order_key([1], SALT, "rows") != reference_order_key([1], SALT + 1, "rows")
    assert reference_order_key([1], SALT, "rows") != reference_order_key([1], SALT, "groups")


@pytest.mark.parametrize("unit_type", [pl.String, pl.Int64])
def test_bounding_keeps_exactly_the_rows_and_groups_the_definition_picks(unit_type):
    """C = 2 rows per (unit, group) and K = 2 groups per unit, checked against a plain-Python bound."""
    rows = [(u, g, x) for u in range(6) for g in "abcd"[: 1 + u % 4] for x in range(5 - u % 3)]
    df = pl.DataFrame({"u": [r[0] for r in rows], "g": [r[1] for r in rows], "x": [float(r[2]) for r in rows]},
                      schema={"u": pl.Int64, "g": pl.String, "x": pl.Float64}).with_columns(pl.col("u").cast(unit_type))
    spec = bounding.BoundingSpec(unit="u", by=("g",), value="x", grid=bounding.ValueGrid(0.0, 8.0, Fraction(1)),
                                 max_contributions=2, max_partitions=2)
    partial = bounding.bound_contributions(df.lazy(), spec, SALT).collect().sort(["u", "g"])

    g = spec.grid
    cast = str if unit_type == pl.String else int
    kept: dict[tuple, list[int]] = {}
    for u, grp, x in rows:
        kept.setdefault((cast(u), grp), []).append(int(x) - g.mid_units)
    want = {}
    for (u, grp), vals in kept.items():
        vals.sort(key=lambda v: reference_order_key([u, grp, v], SALT, "rows"))
        want[(u, grp)] = vals[:2]
    by_unit: dict = {}
    for u, grp in want:
        by_unit.setdefault(u, []).append(grp)
    chosen = {(u, grp) for u, groups in by_unit.items()
              for grp in sorted(groups, key=lambda grp: reference_order_key([u, grp], SALT, "groups"))[:2]}
    expected = sorted((u, grp, len(want[(u, grp)]), sum(want[(u, grp)])) for u, grp in chosen)
    got = sorted(zip(partial["u"].to_list(), partial["g"].to_list(), partial[bounding.N_ROWS].to_list(),
                     partial[bounding.C_SUM].to_list()))
    assert got == expected
