"""Bounded contributions (``dpcli.bounding``): caps, the value grid, bad records, stability, and selection v3.

Selection v3: polars computes the keyed order exactly as its plain-Python definition, so any engine that
matches the definition (Spark's xxhash64) keeps the same rows; ties are dropped the same way whatever
the row order.
"""

from __future__ import annotations

import datetime as dt
import random
import struct
from fractions import Fraction

import numpy as np
import polars as pl
import polars_hash  # noqa: F401
import pytest

from dpcli import bounding
from dpcli.bounding.keyed_order import (
    NULL_WORD,
    keep_first,
    mix,
    reference_keep,
    reference_keep_rows,
    reference_occurrences,
    reference_order_key,
    start_word,
    with_order_key,
    xxh64,
)
from dpcli.errors import DataError, UsageError


def test_cross_partition_bound_keeps_k_groups_uniformly():
    """4000 units each in the same 4 groups, K = 1: every unit keeps one group, each group is
    kept by Binomial(4000, 1/4) units (mean 1000, sd 27.4): 5 sd = 137 is the tolerance."""
    n = 4000
    df = pl.DataFrame({"user": np.repeat(np.arange(n), 4), "g": np.tile(["a", "b", "c", "d"], n)})
    spec = bounding.BoundingSpec("user", ("g",), max_partitions=1, max_contributions=1)
    part = bounding.bound_contributions(df.lazy(), spec, salt=12345 << 64).collect()
    assert part.height == n and part["user"].n_unique() == n
    counts = part.group_by("g").len()["len"].to_list()
    assert all(abs(c - 1000) < 137 for c in counts)
    other = bounding.bound_contributions(df.lazy(), spec, salt=999 << 64).collect()
    assert not part.sort("user").equals(other.sort("user"))  # the salt (seed) decides


def test_rows_per_unit_are_capped_and_values_clamped():
    df = pl.DataFrame({"user": [1] * 50 + [2], "g": ["a"] * 51, "x": [100.0] * 50 + [-5.0]})
    grid = bounding.ValueGrid(0.0, 10.0, Fraction(1, 4))
    spec = bounding.BoundingSpec("user", ("g",), 1, 4, value="x", grid=grid)
    part = bounding.bound_contributions(df.lazy(), spec, salt=1).collect().sort("user")
    assert part[bounding.N_ROWS].to_list() == [4, 1]
    # centred grid units: mid = 20; 10.0 → 40 - 20 = 20 per row; -5 → 0 - 20.
    assert part[bounding.C_SUM].to_list() == [80, -20]


def test_bad_records_are_dropped_or_clamped_never_refused():
    """Null units and null/NaN values are dropped, ±inf clamped to the bounds (bounding's module docstring)."""
    spec = bounding.BoundingSpec("user", ("g",), 1, 1, value="x", grid=bounding.ValueGrid(0, 1, Fraction(1, 8)))
    df = pl.DataFrame({"user": [1, 2, 3, 4, None, 6], "g": ["a"] * 6,
                       "x": [0.5, float("inf"), float("-inf"), float("nan"), 0.5, None]})
    part = bounding.bound_contributions(df.lazy(), spec, 1).collect().sort("user")
    assert part["user"].to_list() == [1, 2, 3]
    assert part[bounding.C_SUM].to_list() == [0, 4, -4]  # 0.5 → 4 − mid 4; +inf → 8 − 4; −inf → 0 − 4
    empty = bounding.group_totals(bounding.bound_contributions(df.clear().lazy(), spec, 1).collect(), spec)
    assert empty.height == 0 and empty.columns == ["g", "units", "rows", "csum", "csumsq"]


def test_text_values_are_parsed_per_record_and_unparsable_ones_dropped():
    """A text value column (every CSV/NDJSON one) bounds exactly like the numbers it spells; words are dropped."""
    spec = bounding.BoundingSpec("user", ("g",), 1, 1, value="x", grid=bounding.ValueGrid(0, 1, Fraction(1, 8)))
    text = pl.DataFrame({"user": ["1", "2", "3", "4", "5", "6", "7", "8"], "g": ["a"] * 8,
                         "x": [" 0.5 ", "inf", "-inf", "nan", "abc", "", "1e-1", "[1, 2]"]})
    part = bounding.bound_contributions(text.lazy(), spec, 1).collect().sort("user")
    assert part["user"].to_list() == ["1", "2", "3", "7"]
    assert part[bounding.C_SUM].to_list() == [0, 4, -4, -3]  # 0.1 → round(0.8) = 1 − mid 4
    with pytest.raises(DataError, match="must be numeric"):
        bounding.bounded_rows(text.with_columns(pl.col("x") == "1").lazy(), spec, 1)


def test_value_grid_is_exact_inside_the_bounds_and_refuses_what_it_cannot_honour():
    g = bounding.ValueGrid(0.0, 1.47, Fraction(49, 50))
    assert (g.lo_units, g.hi_units, g.max_abs_units) == (0, 1, 1)  # ⌊1.47 / 0.98⌋ = 1, not round(1.5) = 2
    g = bounding.ValueGrid(-1.3, 2.6, Fraction(1, 2))
    assert (g.lo_units, g.hi_units, g.mid_units, g.half_width_units) == (-2, 5, 1, 4)
    snapped = pl.select(bounding.grid_units(pl.lit(pl.Series([1.47, 1e300, -1e300, float("nan")])), g))
    assert snapped.to_series().to_list() == [3, 5, -2, None]
    refused = [(0, 1, Fraction(10) ** 300, "fewer than two"), (0, 1, Fraction(1, 10**300), "too fine"),
               (0, 9.2e18, Fraction(1), "too fine"), (0, 1, Fraction(5, 10**324), "below 2.2e-308"),
               (0, float("inf"), Fraction(1), "finite")]
    for lo, hi, gran, needle in refused:
        with pytest.raises(UsageError, match=needle):
            bounding.ValueGrid(lo, hi, gran)
    assert bounding.default_granularity(-1e308, 1e308) == Fraction(2) ** 1012  # no float overflow of the width
    assert bounding.default_granularity(0, 600) == Fraction(1, 8)
    with pytest.raises(UsageError, match="too narrow"):
        bounding.default_granularity(0, 5e-324)


def test_bounding_carries_its_stability_and_removing_a_unit_stays_within_it():
    """The stability a BoundingSpec reports holds: dropping any one unit moves each group total by at most
    linf(column), and touches at most max_groups groups (exact integers, so no tolerance)."""
    from dpcli import bounding

    grid = bounding.ValueGrid(Fraction(0), Fraction(10), Fraction(1, 2))
    spec = bounding.BoundingSpec("u", ("g",), max_partitions=2, max_contributions=3, value="v", grid=grid)
    st = spec.stability()
    assert (st.max_groups, st.linf("rows"), st.linf("units"), st.l1("rows")) == (2, 3, 1, 6)
    assert st.linf("csum") == 3 * grid.half_width_units and st.l2_squared("units") == 2
    n = 400
    frame = pl.DataFrame({"u": [f"u{i % 37}" for i in range(n)], "g": [f"g{i % 5}" for i in range(n)],
                          "v": [float(i % 23) for i in range(n)]}).lazy()
    bounded = spec.bound(frame, salt=12345)
    totals = bounding.group_totals(bounded.frame, spec).collect()
    for unit in ("u0", "u7", "u36"):
        without = bounding.group_totals(spec.bound(frame.filter(pl.col("u") != unit), salt=12345).frame, spec).collect()
        joined = totals.join(without, on="g", how="left", suffix="_w").fill_null(0)
        for col in ("rows", "units", "csum", "csumsq"):
            moved = (joined[col] - joined[f"{col}_w"]).abs()
            assert moved.max() <= bounded.stability.linf(col) and (moved > 0).sum() <= st.max_groups


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
    # duplicate values in most partitions (x // 2): identical records are told apart by their occurrence
    rows = [(u, g, x // 2) for u in range(6) for g in "abcd"[: 1 + u % 4] for x in range(5 - u % 3)]
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

    want = {(u, grp): [v for v, keep in zip(vals, reference_keep_rows([(u, grp, v) for v in vals], SALT, 2))
                       if keep]
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


ROWS_FIELDS = [("u", pl.Int64), ("g", pl.String), ("v", pl.Int64)]
ROWS_SCHEMA = {"u": pl.Int64, "g": pl.String, "v": pl.Int64}


def _kept_rows(rows: list[tuple], cap: int, salt: int = SALT) -> list[tuple]:
    lf = pl.DataFrame(rows, schema=ROWS_SCHEMA, orient="row").lazy()
    return sorted(keep_first(lf, ["u", "g"], ROWS_FIELDS, salt, "rows", cap).collect().iter_rows())


def _reference_kept_rows(rows: list[tuple], cap: int, salt: int = SALT) -> list[tuple]:
    parts: dict[tuple, list[tuple]] = {}
    for r in rows:
        parts.setdefault(r[:2], []).append(r)
    return sorted(r for part in parts.values() for r, keep in zip(part, reference_keep_rows(part, salt, cap)) if keep)


def test_occurrences_number_identical_records_only():
    assert reference_occurrences([(1, "a", 4), (1, "a", 5), (1, "a", 4), (1, "a", 4), (1, "a", 5)]) == [0, 0, 1, 2, 1]


def test_identical_rows_fill_the_row_cap_each_with_its_own_key():
    """Identical records of one (unit, group) get keys of their own (the occurrence number), so C of 10
    identical rows are kept, never none, and exactly the ones the plain-Python definition keeps."""
    rows = [(1, "a", 4)] * 10 + [(1, "a", 5)] * 2 + [(2, "a", 4)]
    for cap in (1, 3, 11, 12):
        for salt in (SALT, SALT + 1, SALT + 2):
            got = _kept_rows(rows, cap, salt)
            unit1 = [r for r in got if r[0] == 1]
            assert len(unit1) == min(cap, 12) and len(got) == len(unit1) + 1
            assert got == _reference_kept_rows(rows, cap, salt)


def test_the_row_sample_is_uniform_over_rows_not_over_values():
    """A unit's rows [a, a, a, b] under C = 1 keep a with probability 3/4 (each row equally likely), not 1/2
    (each distinct value equally likely, the semantics-4 bug). 200 units × 20 salts = 4000 trials, each
    keeping a with probability 3/4: the count is Binomial(4000, 3/4), mean 3000, sd √(4000·¾·¼) = 27.4;
    the tolerance is 5 sd = 137 (a false alarm about 6e-7; the value-uniform sample gives ≈ 2000, 36 sd off).
    Through the whole bound (grid values, bound_contributions), so every caller of the row cap is covered."""
    units = 200
    df = pl.DataFrame({"u": np.repeat(np.arange(units), 4), "g": ["x"] * (4 * units),
                       "v": np.tile([2.0, 2.0, 2.0, 5.0], units)})
    spec = bounding.BoundingSpec("u", ("g",), None, 1, value="v", grid=bounding.ValueGrid(0.0, 8.0, Fraction(1)))
    kept_a = 0
    for salt in range(20):
        part = bounding.bound_contributions(df.lazy(), spec, (salt + 1) << 80 | salt).collect()
        assert part.height == units and set(part[bounding.N_ROWS].to_list()) == {1}
        assert set(part[bounding.C_SUM].to_list()) <= {2 - 4, 5 - 4}  # centred on mid = 4
        kept_a += int((part[bounding.C_SUM] == -2).sum())
    assert abs(kept_a - 3000) <= 137, kept_a


def test_shuffling_the_file_does_not_change_the_rows_kept():
    """The kept rows depend on the records, not their order in the file: the occurrence numbers of a value
    held m times are 0 … m − 1 whatever the order, and the rows that get them are identical."""
    gen = np.random.default_rng(11)
    rows = [(int(u), str(g), int(v)) for u, g, v in zip(gen.integers(0, 8, 400), gen.choice(["a", "b"], 400),
                                                        gen.integers(0, 4, 400), strict=True)]
    for cap in (1, 2, 5):
        want = _reference_kept_rows(rows, cap)
        for seed in range(5):
            shuffled = rows[:]
            random.Random(seed).shuffle(shuffled)
            assert _kept_rows(shuffled, cap) == want, (cap, seed)


def test_another_units_rows_do_not_change_a_units_sample():
    """Unit 1's kept rows are the same with or without unit 2's rows, even when unit 2 holds the same
    (group, value) records and they come first in the file: the occurrence counts only a unit's own
    identical records (a file position, or a count across units, would shift unit 1's keys). 12 salts:
    an implementation that let unit 2 move unit 1's keys would change unit 1's 3-of-8 sample for most."""
    own = [(1, "a", 4)] * 5 + [(1, "a", 7)] * 3
    other = [(2, "a", 4)] * 6 + [(2, "a", 7)] * 2
    for salt in range(SALT, SALT + 12):
        alone = _kept_rows(own, 3, salt)
        together = [r for r in _kept_rows(other + own[:4] + other + own[4:], 3, salt) if r[0] == 1]
        assert together == alone, salt


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
