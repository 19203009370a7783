"""``dpcli sql --max-rows-per-table``: the keyed choice of a unit's rows of one private table
(:func:`dpcli.bounding.keyed_order.cap_rows`), held to its plain-Python reference."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter

import polars as pl
import pytest

from dpcli.bounding import keyed_order as ko

SALT = 0x0123_4567_89AB_CDEF_FEDC_BA98_7654_3210
ROWS = [("a", 1.5, None, True, dt.date(2020, 1, 2)), ("a", -0.0, 2, False, None), ("a", 0.0, 2, False, None),
        ("a", math.nan, 3, None, dt.date(1969, 12, 31)), ("a", 1.5, None, True, dt.date(2020, 1, 2)),
        ("a", 2.0, 7, True, dt.date(2021, 5, 5)), ("a", None, 7, True, dt.date(2021, 5, 5)),
        ("a", float("inf"), -1, False, dt.date(2000, 1, 1)), ("a", 1.5, None, True, dt.date(2020, 1, 2)),
        ("b", 1.0, 1, True, None)]
SCHEMA = {"u": pl.String, "x": pl.Float64, "i": pl.Int64, "b": pl.Boolean, "d": pl.Date}


def _kept(rows: list[tuple[object, ...]], cap: int, salt: int = SALT, table: str = "t") -> Counter[str]:
    df = pl.DataFrame(rows, schema=SCHEMA, orient="row")
    out = ko.cap_rows(df.lazy(), "u", list(df.schema.items()), salt, table, cap).collect()
    return Counter(repr(r) for r in out.rows())


def _reference(rows: list[tuple[object, ...]], cap: int, salt: int = SALT, table: str = "t") -> Counter[str]:
    out: Counter[str] = Counter()
    for unit in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == unit]
        out.update(repr(tuple(r)) for r, keep in zip(mine, ko.reference_cap_rows(mine, salt, table, cap),
                                                     strict=True) if keep)
    return out


def _canon(c: Counter[str]) -> Counter[str]:
    return Counter({k.replace("-0.0", "0.0"): v for k, v in c.items()})


@pytest.mark.parametrize("cap", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("salt", [SALT, 7, 2**127 + 5])
def test_polars_keeps_the_rows_the_reference_keeps(cap, salt):
    kept = _kept(ROWS, cap, salt)
    assert sum(kept.values()) == min(cap, 9) + 1  # unit a has 9 rows, b one (ties: none among these)
    # −0.0 and 0.0 have one word: the two rows are equal for the cap, either may be the one kept
    assert _canon(kept) == _canon(_reference(ROWS, cap, salt))


def test_the_float_word_is_xxh64_of_the_canonical_ieee_bits():
    df = pl.DataFrame({"x": [1.5, -0.0, 0.0, math.nan, -math.nan, None, float("-inf")]})
    words = df.select(ko.row_word("x", pl.Float64)).to_series().to_list()
    assert words == [ko.reference_word(v) for v in df["x"].to_list()]
    assert words[1] == words[2] == ko.mix(0) and words[3] == words[4] == ko.mix(0x7FF8000000000000)
    assert words[5] == ko.NULL_WORD


def test_the_choice_depends_on_neither_row_order_nor_other_units_rows():
    base = _canon(_kept(ROWS, 3))  # −0.0 and 0.0 are one value to the cap (equal in every aggregate)
    assert _canon(_kept(list(reversed(ROWS)), 3)) == base
    others = [("c", float(i), i, True, None) for i in range(50)]
    with_others = _canon(_kept(others + ROWS, 3))
    assert Counter({k: v for k, v in with_others.items() if not k.startswith("('c'")}) == base
    assert _canon(_kept(ROWS, 3, table="other")) != base  # the table's name is in the key


@pytest.mark.parametrize("salts, limit", [
    # make test: 100 salts, limit 50.3. Each salt keeps 5 of the 20 rows, so the counts' covariance is
    # n·p(1 − p)·20/19·(I − J/20) with p = 1/4: the Pearson statistic Σ (c − np)²/(np) is (1 − p)·20/19 = 0.789
    # times a χ² with 19 degrees of freedom, at any n; 0.789 · χ²₁₉(1 − 10⁻⁶) = 50.3, so a uniform choice
    # exceeds it with probability ≈ 10⁻⁶ (the χ² law is an approximation at 25 expected per row: 10⁵ simulated
    # runs of 100 uniform choices matched its 0.99, 0.999 and 0.9999 quantiles within 3%, on the safe side;
    # the salts are fixed, so the test is deterministic).
    (100, 50.3),
    # make audit: 400 salts, limit 43.8 (p ≈ 2·10⁻⁵ by the same law): 100 expected per row, four times the power.
    pytest.param(400, 43.8, marks=pytest.mark.audit),
])
def test_each_distinct_row_is_kept_about_equally_often(salts, limit):
    """20 distinct rows, cap 5, ``salts`` salts: each row is kept salts/4 times in expectation, and the
    chi-square over the 20 counts stays under ``limit`` (see the parameters; its statistic is ~ 15 here)."""
    rows = [("a", float(i) / 3, i % 4, i % 2 == 0, None) for i in range(20)]
    counts: Counter[str] = Counter()
    for s in range(salts):
        counts.update(_kept(rows, 5, salt=s * 7919 + 1))
    expected = salts * 5 / 20
    chi2 = sum((counts[repr(r)] - expected) ** 2 / expected for r in rows)
    assert chi2 < limit, chi2


def test_identical_rows_count_by_occurrence():
    rows = [("a", 1.0, 1, True, None)] * 7 + [("a", 2.0, 1, True, None)] * 3
    kept = _kept(rows, 4)
    assert sum(kept.values()) == 4 and kept == _reference(rows, 4)


def test_a_decimal_is_hashed_as_its_unscaled_integer():
    from decimal import Decimal

    values = [Decimal("1.50"), Decimal("-0.07"), Decimal("123456789012345678901234.5"), None]
    df = pl.DataFrame({"u": ["a"] * 4, "m": pl.Series(values, dtype=pl.Decimal(38, 2))})
    unscaled = [150, -7, 12345678901234567890123450, None]
    mine = ko.cap_rows(df.lazy(), "u", list(df.schema.items()), SALT, "t", 2).collect()
    ref = ko.reference_cap_rows([("a", v) for v in unscaled], SALT, "t", 2)
    assert sorted(mine["m"].to_list(), key=str) == sorted([v for v, k in zip(values, ref, strict=True) if k], key=str)
