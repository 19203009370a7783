"""Selection v3: polars computes the keyed order exactly as its plain-Python definition, so any
engine that matches the definition (Spark's xxhash64) keeps the same rows; ties are dropped the
same way whatever the row order."""

from __future__ import annotations

import datetime as dt
import random
import struct
from fractions import Fraction

import polars as pl
import polars_hash  # noqa: F401
import pytest

from dpcli import bounding
from dpcli.bounding.keyed_order import (
    NULL_WORD,
    keep_first,
    mix,
    reference_keep,
    reference_order_key,
    start_word,
    with_order_key,
    xxh64,
)

SALT = 0x0123456789ABCDEF_FEDCBA9876543210


def test_the_reference_xxh64_is_the_published_one():
    # Published XXH64 values (xxHash's sanity checks) for seed 0, then polars-hash on every code
    # path of the algorithm (< 4, < 8, < 32, ≥ 32 bytes and a tail after the 32-byte stripes).
    assert xxh64(b"", 0) == 0xEF46DB3751D8E999
    assert xxh64(b"abc", 0) == 0x44BC2CF5AD770999
    for data in [b"", b"a", b"abc", b"abcd", b"abcdefgh", b"x" * 31, b"y" * 32, b"z" * 33, bytes(range(100))]:
        assert pl.DataFrame({"b": [data]}).select(pl.col("b").nchash.xxhash64(seed=42)).item() == xxh64(data)


def test_one_step_is_xxh64_of_eight_little_endian_bytes_and_a_bijection():
    words = [0, 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF]
    assert [mix(w) for w in words] == [xxh64(struct.pack("<Q", w)) for w in words]
    lf = pl.DataFrame({"w": words}, schema={"w": pl.UInt64}).lazy()
    got = with_order_key(lf, [("w", pl.UInt64)], SALT, "rows", "k").collect()["k"].to_list()
    assert got == [reference_order_key([w], SALT, "rows") for w in words]
    # 10^5 distinct integers of one unit never tie (the step is a bijection of 64-bit words)
    n = 100_000
    keys = with_order_key(pl.DataFrame({"u": [7] * n, "g": range(n)}).lazy(), [("u", pl.Int64), ("g", pl.Int64)],
                          SALT, "groups", "k").collect()["k"]
    assert keys.n_unique() == n


def test_every_type_gives_the_reference_word():
    values = {
        "s": ["", "a", "héllo", "s5:x", None, "n;"],
        "i": [0, -42, 2**62, None, 7, -2**63],
        "b": [True, False, None, True, False, True],
        "d": [dt.date(1970, 1, 1), dt.date(2026, 11, 24), dt.date(1, 1, 1), None, dt.date(9999, 12, 31), None],
        "t": [dt.datetime(2026, 11, 24, 1, 2, 3, 456789), dt.datetime(1969, 12, 31, 23, 59, 59, 999999), None,
              dt.datetime(1970, 1, 1), dt.datetime(2000, 2, 29), dt.datetime(9999, 1, 1)],
        "u": [dt.timedelta(0), dt.timedelta(days=-1, microseconds=5), None, dt.timedelta(seconds=1),
              dt.timedelta(days=3), dt.timedelta(microseconds=1)],
        "q": [0, -1, 2**64 - 1, 2**100, -2**120, None],
        "w": [0, 1, 2**64 - 1, 2**63, None, 5],
        "c": ["x", "y", None, "x", "héllo", ""],
    }
    df = pl.DataFrame(values, schema={"s": pl.String, "i": pl.Int64, "b": pl.Boolean, "d": pl.Date,
                                      "t": pl.Datetime("us"), "u": pl.Duration("us"), "q": pl.Int128,
                                      "w": pl.UInt64, "c": pl.Categorical})
    df = df.with_columns(pl.col("i").cast(pl.Int8, strict=False).alias("i8"), pl.col("d").alias("d2"),
                         pl.col("t").dt.replace_time_zone("Europe/Paris").alias("tz"))
    for purpose in ("rows", "groups"):
        got = with_order_key(df.lazy(), list(df.schema.items()), SALT, purpose, "k").collect()["k"].to_list()
        assert got == [reference_order_key(list(row), SALT, purpose) for row in df.iter_rows()]
        for c in df.columns:
            got = with_order_key(df.lazy(), [(c, df.schema[c])], SALT, purpose, "k").collect()["k"].to_list()
            assert got == [reference_order_key([v], SALT, purpose) for v in df[c]], c


def test_float_unit_or_group_columns_are_a_schema_error():
    from dpcli.errors import DataError

    with pytest.raises(DataError, match="'x' has type Float64: a privacy-unit or group column must hold text"):
        with_order_key(pl.LazyFrame({"x": [1.0]}), [("x", pl.Float64)], SALT, "rows", "k")


def test_the_key_the_purpose_and_the_field_order_matter():
    assert reference_order_key([1], SALT, "rows") != reference_order_key([1], SALT + 1, "rows")
    assert reference_order_key([1], SALT, "rows") != reference_order_key([1], SALT, "groups")
    assert reference_order_key([1, 2], SALT, "rows") != reference_order_key([2, 1], SALT, "rows")
    assert reference_order_key([None], SALT, "rows") != reference_order_key([0], SALT, "rows")
    assert start_word(SALT, "rows") != start_word(SALT + (1 << 127), "rows")  # all 128 salt bits count


def test_ties_at_the_cap_are_all_dropped_whatever_the_row_order():
    """A null and the integer whose word is the null word tie; so do identical records. Tied
    records at the cap are dropped together, so the kept set never depends on row order."""
    rows = [(1, g) for g in (None, NULL_WORD, 5, 6, 7)] + [(2, g) for g in (None, NULL_WORD)]
    keys = {g: reference_order_key([1, g], SALT, "groups") for _, g in rows[:5]}
    assert keys[None] == keys[NULL_WORD]
    seen = set()
    for cap in range(1, 6):
        want_keep = reference_keep(list(keys.values()), cap, "groups")
        want = sorted(((1, g) for (g, keep) in zip(keys, want_keep) if keep), key=str)
        want += [(2, g) for g in (None, NULL_WORD)] if cap >= 2 else []
        for seed in range(6):
            shuffled = rows[:]
            random.Random(seed).shuffle(shuffled)
            lf = pl.DataFrame(shuffled, schema={"u": pl.Int64, "g": pl.UInt64}, orient="row").lazy()
            got = keep_first(lf, ["u"], [("u", pl.Int64), ("g", pl.UInt64)], SALT, "groups", cap).collect()
            assert got.height <= 2 * cap
            assert sorted(got.rows(), key=str) == sorted(want, key=str)
        seen.add(len(want))
    assert len(seen) > 2  # the caps exercised keep different sets
    # the tied pair straddles some cap: neither record is kept there, and never just one of them
    straddle = [cap for cap in range(1, 6) if reference_keep(list(keys.values()), cap, "groups").count(True) not in (cap, 5)]
    assert straddle


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

    def first(items: list, key, purpose: str) -> list:
        keys = [key(i) for i in items]
        return [i for i, keep in zip(items, reference_keep(keys, 2, purpose)) if keep]

    want = {(u, grp): first(vals, lambda v, u=u, grp=grp: reference_order_key([u, grp, v], SALT, "rows"), "rows")
            for (u, grp), vals in kept.items()}
    by_unit: dict = {}
    for u, grp in want:
        by_unit.setdefault(u, []).append(grp)
    chosen = {(u, grp) for u, groups in by_unit.items()
              for grp in first(groups, lambda grp, u=u: reference_order_key([u, grp], SALT, "groups"), "groups")}
    expected = sorted((u, grp, len(want[(u, grp)]), sum(want[(u, grp)])) for u, grp in chosen)
    got = sorted(zip(partial["u"].to_list(), partial["g"].to_list(), partial[bounding.N_ROWS].to_list(),
                     partial[bounding.C_SUM].to_list()))
    assert got == expected
    assert len(expected) == sum(min(2, len(v)) for v in by_unit.values())  # no ties here: every cap is filled


def test_identical_rows_fill_the_row_cap_whatever_their_order():
    """Rows of one (unit, group) tie only when they are identical records (the grid value is the
    last link of the chain, a bijection), so those ties are broken by row order: C of 10 identical
    rows are kept, never none."""
    rows = [(1, "a", 4)] * 10 + [(1, "a", 5)] * 2 + [(2, "a", 4)]
    for cap in (1, 3, 11, 12):
        for seed in range(4):
            shuffled = rows[:]
            random.Random(seed).shuffle(shuffled)
            lf = pl.DataFrame(shuffled, schema={"u": pl.Int64, "g": pl.String, "v": pl.Int64}, orient="row").lazy()
            fields = [("u", pl.Int64), ("g", pl.String), ("v", pl.Int64)]
            got = keep_first(lf, ["u", "g"], fields, SALT, "rows", cap).collect()
            unit1 = got.filter(pl.col("u") == 1)
            assert unit1.height == min(cap, 12) and got.height == unit1.height + 1
            keys = {v: reference_order_key([1, "a", v], SALT, "rows") for v in (4, 5)}
            first = min(keys, key=keys.get)
            want = sorted(([first] * min(cap, 10 if first == 4 else 2)
                           + [9 - first] * max(0, cap - (10 if first == 4 else 2)))[:cap])
            assert sorted(unit1["v"].to_list()) == want


@pytest.mark.parametrize("engine", ["in-memory", "streaming"])
def test_every_integer_type_and_extreme_value_gives_the_reference_word(engine):
    """Each integer type at its extremes (a 128-bit value beyond 64 bits is hashed as text): never an
    error, whatever the values (a failing cast would make the run depend on the data)."""
    columns = {
        "u128": ([0, 5, 2**64 - 1, 2**64, 2**127 + 3, 2**128 - 1, None], pl.UInt128),
        "i128": ([0, -1, -2**63, -2**63 - 1, 2**64 - 1, 2**64, -2**127], pl.Int128),
        "u64": ([0, 2**64 - 1, 2**63, None, 1, 2, 3], pl.UInt64),
        "i8": ([-128, 0, 127, None, 1, 2, 3], pl.Int8),
        "u8": ([0, 255, None, 1, 2, 3, 4], pl.UInt8),
        "i16": ([-2**15, 2**15 - 1, None, 0, 1, 2, 3], pl.Int16),
        "u32": ([0, 2**32 - 1, None, 1, 2, 3, 4], pl.UInt32),
        "i32": ([-2**31, 2**31 - 1, None, 0, 1, 2, 3], pl.Int32),
        "e": (["a", "b", None, "a", "b", "a", "b"], pl.Enum(["b", "a"])),
    }
    df = pl.DataFrame({n: v for n, (v, _) in columns.items()}, schema={n: t for n, (_, t) in columns.items()})
    for name, dtype in df.schema.items():
        got = with_order_key(df.lazy(), [(name, dtype)], SALT, "groups", "k").collect(engine=engine)["k"].to_list()
        assert got == [reference_order_key([v], SALT, "groups") for v in df[name]], name
