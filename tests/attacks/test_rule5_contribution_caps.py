"""Rule 5 in the bounding: every contribution cap holds for every value a data subject may choose.

Attack: selection v3 (keyed XXH64 chain, ``dpcli/bounding/keyed_order.py``) against crafted records. A
data subject chooses their own values (text, extreme integers, 128-bit integers, nulls, times of any
unit and zone) and may know the algorithm, not the salt. For every such input the contribution bounds
must hold (≤ C rows per (unit, group), ≤ K groups per unit), and the kept set must not depend on row
order, chunking or engine. Findings of this review fail on the code before the fix; the others are
regression tests of attacks the code resists. (Its findings that a record made a run fail are rule
4's, ``test_rule4_schema_decides_types.py``; the internal column name is rule 7's.)
"""

from __future__ import annotations

import datetime as dt
import random

import polars as pl
import pytest
from keyed_order_cases import MASK, SALT, _assert_caps, _orders, _partial, _spec

from dpcli import bounding
from dpcli.bounding import keyed_order as ko


@pytest.mark.parametrize("unit", ["ns", "us", "ms"])
def test_attack_duration_words_are_the_stored_integer(unit):
    """FINDING: a Duration's word was its µs count, but Spark reads a Parquet duration as its stored
    bigint: ms and ns columns were ranked differently by the two engines (and ns durations were
    truncated, so 1 ns and −1 ns shared a word). The word is now the stored integer."""
    stored = [1, -1, 999, -1001, 2**62, -2**63, 0, None]
    s = pl.Series(stored, dtype=pl.Int64).cast(pl.Duration(unit))
    words = pl.DataFrame({"d": s}).select(ko.field_word("d", s.dtype)).to_series().to_list()
    assert words == [ko.NULL_WORD if x is None else x & MASK for x in stored]


# --- resisted: ties ------------------------------------------------------------------------------


def _h2(u: int, a: int) -> int:
    """The chain after (unit, a) for purpose ``groups`` (all fields Int64)."""
    return ko.mix(ko.mix(ko.start_word(SALT, "groups") ^ (u & MASK)) ^ (a & MASK))


def _tied_groups(u: int, n: int) -> list[tuple[int, int]]:
    """n different two-column groups (a, b) of unit u whose order keys are all equal (built with the
    salt, which an attacker does not have: the worst case of chance collisions)."""
    return [(a, ko.signed(_h2(u, 0) ^ _h2(u, a))) for a in range(n)]


def test_resisted_crafted_two_column_ties_are_dropped_together_in_any_order():
    tied = _tied_groups(1, 3)
    keys = {ko.reference_order_key([1, a, b], SALT, "groups") for a, b in tied}
    assert len(keys) == 1
    others = [(100 + i, i) for i in range(4)]
    rows = [(1, a, b, 3.0) for a, b in tied + others] + [(2, a, b, 1.0) for a, b in _tied_groups(2, 5)]
    df = pl.DataFrame(rows, schema={"u": pl.Int64, "a": pl.Int64, "b": pl.Int64, "v": pl.Float64}, orient="row")
    kept_sizes = set()
    for k in range(1, 8):
        spec = _spec("u", ("a", "b"), 1, k)
        results = {_partial(f.lazy(), spec).to_init_repr() for f in _orders(df)}
        assert len(results) == 1
        partial = _partial(df.lazy(), spec, engine="in-memory")
        assert partial.equals(_partial(df.lazy(), spec))
        _assert_caps(partial, spec)
        unit1 = set(partial.filter(pl.col("u") == 1).select("a", "b").rows())
        tied_kept = unit1 & set(tied)
        assert tied_kept in (set(), set(tied))  # never one of a tie by row order
        assert partial.filter(pl.col("u") == 2).height in (0, 5)  # all of unit 2's groups tie
        kept_sizes.add(len(unit1))
    assert len(kept_sizes) > 2


def test_resisted_128_bit_and_null_word_collisions_only_drop_the_unit_own_groups():
    """Int128 −1 and 2^64 − 1 share a word by design, as do a null and the integer NULL_WORD: the
    tied groups are kept or dropped together, in every row order."""
    g = [-1, 2**64 - 1, None, 5, 6, 2**100, -(2**100)]
    df = pl.DataFrame({"u": ["x"] * len(g), "g": pl.Series(g, dtype=pl.Int128), "v": [2.0] * len(g)})
    for k in range(1, len(g) + 1):
        spec = _spec("u", ("g",), 1, k)
        results = {_partial(f.lazy(), spec).to_init_repr() for f in _orders(df)}
        assert len(results) == 1
        kept = set(_partial(df.lazy(), spec)["g"].to_list())
        assert len(kept) <= k and ({-1, 2**64 - 1} <= kept or not ({-1, 2**64 - 1} & kept))
    df2 = pl.DataFrame({"u": [1] * 4, "g": pl.Series([None, ko.signed(ko.NULL_WORD), 1, 2], dtype=pl.Int64),
                        "v": [1.0] * 4})
    for k in range(1, 5):
        kept = set(_partial(df2.lazy(), _spec("u", ("g",), 1, k))["g"].to_list())
        assert len(kept) <= k and (None in kept) == (ko.signed(ko.NULL_WORD) in kept)


def test_resisted_rows_of_one_unit_and_group_tie_only_when_identical():
    """The grid value is the chain's last link: 2·10^4 distinct grid values of one (unit, group)
    never share a key; identical rows share one. The C kept rows are the same multiset in every
    order (and as the definition picks)."""
    n = 20_000
    lf = pl.LazyFrame({"u": ["p"] * n, "g": [None] * n, bounding.GRID: range(-n // 2, n // 2)},
                      schema={"u": pl.String, "g": pl.String, bounding.GRID: pl.Int64})
    fields = [("u", pl.String), ("g", pl.String), (bounding.GRID, pl.Int64)]
    keys = ko.with_order_key(lf, fields, SALT, "rows", "k").collect()["k"]
    assert keys.n_unique() == n
    rows = [("p", "a", float(x)) for x in (1, 1, 1, 2, 2, 3, 9, 9, 9, 9)]
    df = pl.DataFrame(rows, schema={"u": pl.String, "g": pl.String, "v": pl.Float64}, orient="row")
    for c in range(1, 11):
        spec = _spec("u", ("g",), c, None)
        results = {_partial(f.lazy(), spec).to_init_repr() for f in _orders(df)}
        assert len(results) == 1
        assert _partial(df.lazy(), spec)[bounding.N_ROWS].to_list() == [c]


def _column(dtype: pl.DataType) -> pl.Series:
    """Eight values of ``dtype`` with a null, extremes and, where the type allows, word collisions."""
    ints = {pl.Int8: (-128, 127), pl.Int16: (-2**15, 2**15 - 1), pl.Int32: (-2**31, 2**31 - 1),
            pl.Int64: (-2**63, 2**63 - 1), pl.UInt8: (0, 255), pl.UInt16: (0, 2**16 - 1),
            pl.UInt32: (0, 2**32 - 1), pl.UInt64: (0, 2**64 - 1), pl.Int128: (-2**127, 2**127 - 1),
            pl.UInt128: (0, 2**128 - 1)}
    if dtype in ints:
        lo, hi = ints[dtype]
        return pl.Series([lo, hi, None, lo + 1, hi - 1, 0, 1, hi], dtype=dtype)
    if dtype == pl.Boolean:
        return pl.Series([True, False, None, True, False, None, True, True])
    if dtype == pl.Date:
        return pl.Series([-2**31, 2**31 - 1, None, 0, -1, 1, 719162, -719162], dtype=pl.Int32).cast(pl.Date)
    if isinstance(dtype, (pl.Datetime, pl.Duration)):
        return pl.Series([-2**63 + 1, 2**63 - 1, None, 0, -1, 1, 2**62, -1001], dtype=pl.Int64).cast(dtype)
    text = ["", "héllo", None, "a", "b\x00", "🙂" * 20, "NULL", "n;"]
    return pl.Series(text, dtype=dtype)


TYPES = [pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64, pl.Int128, pl.UInt128,
         pl.Boolean, pl.Date, pl.Datetime("ns"), pl.Datetime("ms"), pl.Datetime("us", "Asia/Kathmandu"),
         pl.Duration("ns"), pl.Duration("ms"), pl.String, pl.Categorical, pl.Enum(["n;", "NULL", "a", "héllo", "",
                                                                                   "b\x00", "🙂" * 20])]

#: Types ``make test`` leaves to ``make audit``: a wider or narrower twin of one it runs.
AUDIT_TYPES = (pl.Int16, pl.Int32, pl.UInt8, pl.UInt16, pl.UInt32, pl.Datetime("ms"), pl.Duration("ns"))


@pytest.mark.parametrize("dtype", [pytest.param(t, marks=pytest.mark.audit) if t in AUDIT_TYPES else t for t in TYPES],
                         ids=str)
def test_resisted_every_type_as_unit_and_group_keeps_the_caps_in_every_order(dtype):
    """Every accepted type, with nulls and extremes (datetimes beyond the µs range, the largest
    128-bit values), as the group and as the unit: no failure, caps hold, and the bounded partials
    are the same in every row order and chunking and on both polars engines."""
    col = _column(dtype)
    n = col.len()
    rows = pl.DataFrame({"u": pl.Series([i % 2 for i in range(n)] * 3, dtype=pl.Int64),
                         "x": pl.concat([col, col, col]),
                         "v": [float(i % 7) for i in range(3 * n)]})
    for spec in (_spec("u", ("x",), 1, 2), _spec("x", ("u",), 2, 1), _spec("u", ("x",), 2, None),
                 _spec("x", ("u",), 1, 1, value=None)):
        first = _partial(rows.lazy(), spec)
        _assert_caps(first, spec)
        assert first.equals(_partial(rows.lazy(), spec, engine="in-memory"))
        for f in _orders(rows, 2):
            assert _partial(f.lazy(), spec).equals(first)


def test_resisted_a_unit_whose_every_group_ties_keeps_none_and_never_more_than_k():
    tied = _tied_groups(7, 40)
    df = pl.DataFrame([(7, a, b) for a, b in tied], schema={"u": pl.Int64, "a": pl.Int64, "b": pl.Int64},
                      orient="row")
    for k in (1, 39):
        partial = _partial(df.lazy(), _spec("u", ("a", "b"), 1, k, value=None))
        assert partial.height == 0
    assert _partial(df.lazy(), _spec("u", ("a", "b"), 1, 40, value=None)).height == 40


def test_resisted_unit_buckets_and_row_order_give_the_same_totals():
    """Large Parquet inputs are bounded in buckets of units (polars' hash of the unit): every bound
    is per unit, so any bucketing and any row order give the same totals (categorical units too)."""
    rng = random.Random(5)
    n = 3000
    df = pl.DataFrame({"u": [f"p{rng.randrange(60)}" for _ in range(n)],
                       "g": [rng.choice(["a", "b", "c", "d", None]) for _ in range(n)],
                       "h": [rng.randrange(3) for _ in range(n)], "v": [float(rng.randrange(17)) for _ in range(n)]})
    for unit_type in (pl.String, pl.Categorical):
        frame = df.with_columns(pl.col("u").cast(unit_type))
        spec = _spec("u", ("g", "h"), 2, 3)
        want = bounding.bounded_totals(frame.lazy(), spec, SALT)
        for buckets, f in zip((1, 2, 3, 7), _orders(frame)):
            assert bounding.bounded_totals(f.lazy(), spec, SALT, buckets).equals(want)


# --- Spark: the same keys and the same kept sets -------------------------------------------------


def _spark_totals(spark, path, spec, parts: int):
    from dpcli.spark.bounding import bounded_totals, read_input

    return bounded_totals(read_input(spark, str(path), "parquet").repartition(parts), spec, SALT)


@pytest.mark.spark
def test_spark_durations_of_every_unit_rank_like_polars(spark, tmp_path):
    """FINDING (see test_attack_duration_words_are_the_stored_integer): Spark reads a Parquet
    duration as its stored bigint; polars now takes the same word, so both keep the same groups."""
    from dpcli.spark.bounding import order_key, read_input

    for unit in ("ms", "us", "ns"):
        path = tmp_path / f"d_{unit}.parquet"
        d = pl.Series([1, -1, 1500, -1001, 2**62, None, 7, 8], dtype=pl.Int64).cast(pl.Duration(unit))
        pl.DataFrame({"u": [1] * 8, "d": d, "v": [1.0] * 8}).write_parquet(path)
        sdf = read_input(spark, str(path), "parquet")
        lf = pl.scan_parquet(path)
        mine = ko.with_order_key(lf, [("d", lf.collect_schema()["d"])], SALT, "groups", "k").collect()["k"].to_list()
        assert [r[0] for r in sdf.select(order_key(sdf, ["d"], SALT, "groups")).collect()] == mine, unit
        spec = _spec("u", ("d",), 1, 3)
        assert bounding.bounded_totals(lf, spec, SALT).equals(_spark_totals(spark, path, spec, 2)), unit


@pytest.mark.spark
def test_spark_crafted_ties_and_every_readable_type_bound_like_polars(spark, tmp_path):
    """Crafted two-column ties, null-word ties and every type Spark reads (small integers, booleans,
    old dates and times, zones, categoricals, nulls) give polars' totals under any partitioning."""
    tied = _tied_groups(1, 3) + [(100 + i, i) for i in range(4)]
    rows = [(1, a, b, float(i)) for i, (a, b) in enumerate(tied)] + [(2, a, b, 1.0) for a, b in _tied_groups(2, 5)]
    rows += [(3, None, None, 2.0), (3, None, ko.signed(ko.NULL_WORD), 2.0), (3, 0, 0, 2.0)]
    path = tmp_path / "ties.parquet"
    pl.DataFrame(rows, schema={"u": pl.Int64, "a": pl.Int64, "b": pl.Int64, "v": pl.Float64},
                 orient="row").write_parquet(path)
    for k in (1, 2, 3, 5, 8):
        spec = _spec("u", ("a", "b"), 1, k)
        mine = bounding.bounded_totals(pl.scan_parquet(path), spec, SALT)
        for parts in (1, 3):
            assert mine.equals(_spark_totals(spark, path, spec, parts)), (k, parts)

    columns = {
        "i8": pl.Series([-128, 127, None, 0, 1, -1, 5, 6], dtype=pl.Int8),
        "u8": pl.Series([0, 255, None, 1, 2, 3, 128, 127], dtype=pl.UInt8),
        "u32": pl.Series([0, 2**32 - 1, None, 1, 2, 3, 2**31, 7], dtype=pl.UInt32),
        "b": pl.Series([True, False, None, True, False, None, True, False]),
        "d": pl.Series([dt.date(1, 1, 1), dt.date(1000, 1, 1), dt.date(1582, 10, 4), None, dt.date(1970, 1, 1),
                        dt.date(9999, 12, 31), dt.date(1582, 10, 15), dt.date(2026, 1, 1)]),
        "t": pl.Series([dt.datetime(1, 1, 1), dt.datetime(1850, 1, 1), None, dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
                        dt.datetime(9999, 12, 31), dt.datetime(1970, 1, 1), dt.datetime(2026, 1, 1), dt.datetime(1900, 1, 1)]),
        "tms": pl.Series([-2**40, 2**40, None, -1, 1, 0, 5, 6], dtype=pl.Int64).cast(pl.Datetime("ms")),
        "tz": pl.Series([0, -1, None, 10**15, 5, 7, 8, 9], dtype=pl.Int64).cast(pl.Datetime("us", "America/Caracas")),
        "s": pl.Series(["", "héllo", None, "a", "b\x00", "🙂" * 20, "NULL", "n;"]),
        "c": pl.Series(["", "héllo", None, "a", "a", "z", "NULL", "n;"], dtype=pl.Categorical),
    }
    frame = pl.DataFrame({"u": [1, 1, 1, 1, 2, 2, 2, 2], **columns, "v": [float(i) for i in range(8)]})
    path = tmp_path / "types.parquet"
    pl.concat([frame, frame]).write_parquet(path)
    for name in columns:
        other = "s" if name != "s" else "c"
        for spec in (_spec("u", (name,), 1, 2), _spec(name, ("u",), 1, 1), _spec("u", (other, name), 2, 3)):
            mine = bounding.bounded_totals(pl.scan_parquet(path), spec, SALT)
            if "tz" in mine.columns:  # Spark returns the same instants labelled UTC (a rendering difference, no other)
                mine = mine.with_columns(pl.col("tz").dt.convert_time_zone("UTC"))
            assert mine.equals(_spark_totals(spark, path, spec, 3)), (name, spec.unit, spec.by)


@pytest.mark.spark
@pytest.mark.xfail(strict=True, reason="open finding: Spark's Parquet reader overflows converting a millisecond "
                                       "timestamp beyond ±2^63 µs to µs and fails the job (polars gives null)")
def test_attack_spark_a_millisecond_timestamp_beyond_the_microsecond_range_fails_the_run(spark, tmp_path):
    path = tmp_path / "ms.parquet"
    t = pl.Series([0, 2**62], dtype=pl.Int64).cast(pl.Datetime("ms"))
    pl.DataFrame({"u": [1, 1], "t": t, "v": [1.0, 2.0]}).write_parquet(path)
    spec = _spec("u", ("t",), 1, 1)
    assert bounding.bounded_totals(pl.scan_parquet(path), spec, SALT).height == 1  # polars: fine
    _spark_totals(spark, path, spec, 1)  # Spark: SparkException (FAILED_READ_FILE), a record-dependent failure
