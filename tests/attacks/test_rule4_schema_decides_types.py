"""Rule 4 in the bounding: a value no record could make fail, and types refused from the schema alone.

Selection v3 (the keyed XXH64 order) against crafted records: no record may make a run fail, and a
type with no word is refused while the plan is built, from the schema (an empty input exactly as a
full one). The finding: the UInt128 word compared the column with a negative bound, so one value
≥ 2^127 failed the run (and polars' message quoted the values). The caps themselves are rule 5's
(``test_rule5_contribution_caps.py``).
"""

from __future__ import annotations

import polars as pl
import pytest
from keyed_order_cases import SALT, _assert_caps, _partial, _spec

from dpcli import bounding
from dpcli.bounding import keyed_order as ko
from dpcli.errors import DataError

# --- findings (failed before the fix) ------------------------------------------------------------


def test_attack_uint128_values_at_or_above_2_127_never_fail_the_run():
    """FINDING: the UInt128 word compared the column with a negative bound, which makes polars
    cast it to Int128 strictly: one value ≥ 2^127 in a unit over its cap failed the run (a
    record-dependent exit code, and polars' message quoted the values)."""
    vals = [2**128 - 1, 2**127, 2**64, 2**64 - 1, 0, None]
    df = pl.DataFrame({"u": [1] * 6, "g": pl.Series(vals, dtype=pl.UInt128), "v": [1.0] * 6})
    spec = _spec("u", ("g",), 1, 2)
    partial = _partial(df.lazy(), spec)
    _assert_caps(partial, spec)
    words = df.select(ko.field_word("g", pl.UInt128)).to_series().to_list()
    assert words == [ko.reference_word(v) for v in vals]


@pytest.mark.parametrize("dtype", [pl.Float64, pl.Float32, pl.Decimal(10, 0), pl.List(pl.Int64), pl.Binary,
                                   pl.Time, pl.Null, pl.Struct({"a": pl.Int64}), pl.Object], ids=str)
def test_resisted_refused_types_are_refused_by_the_schema_alone(dtype):
    """A type with no word is refused while the plan is built, from the schema: an empty input is
    refused exactly as a full one (so the refusal says nothing about records)."""
    lf = pl.LazyFrame(schema={"u": pl.Int64, "x": dtype, "v": pl.Float64})
    with pytest.raises(DataError, match="'x' has type"):
        bounding.bound_contributions(lf, _spec("u", ("x",), 1, 1), SALT)
    with pytest.raises(DataError, match="'x' has type"):
        bounding.bound_contributions(lf, _spec("x", ("u",), 1, None), SALT)
