"""Review (session 57) of the key-type schema check (:func:`dpcli.io.schemas.keyable`): found sound.

* The refusal is the schema's alone: two Parquet files of one schema, a float column holding whole numbers in one
  and NaN, ±inf, −0.0 and nulls in the other, are refused alike (exit 65, one line, nothing charged), as a dry run.
* A CSV's columns are text: the same column as digits in a CSV is accepted (no type is inferred from a record).
* A service-mode analyst is told that the column cannot be used as asked, never its type.
"""

from __future__ import annotations

import math

import polars as pl
import pytest
from dptest import cli, history, init_ledger
from service_checks import _add, _one_line


def _flights(path, delays):
    pl.DataFrame({"plane": [f"N{i % 40}" for i in range(len(delays))], "delay": delays}).write_parquet(path)
    return path


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "release"])
def test_the_refusal_reads_the_schema_not_the_values(tmp_path, dry):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    odd = [math.nan, math.inf, -math.inf, -0.0, None, 1e308]
    lines = []
    for name, delays in (("a", [float(i % 17) for i in range(300)]), ("b", [odd[i % 6] for i in range(300)])):
        path = _flights(tmp_path / f"{name}.parquet", delays)
        r = cli("histogram", path, "--by", "delay", "--privacy-unit", "plane", "--epsilon", "0.3", "--delta", "1e-7",
                *(["--dry-run"] if dry else []))
        assert r.exit_code == 65, r.stderr
        lines.append(r.stderr.replace(str(path), "PATH").replace(path.name, "NAME"))
    assert lines[0] == lines[1]
    assert history() == []


def test_a_csv_column_is_text_whatever_it_holds(tmp_path):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    path = tmp_path / "f.csv"
    path.write_text("plane,delay\n" + "".join(f"N{i % 40},{i % 17}.5\n" for i in range(300)))
    r = cli("histogram", path, "--by", "delay", "--privacy-unit", "plane", "--epsilon", "0.3", "--delta", "1e-7")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("column", ["--by", "--privacy-unit"])
def test_a_service_analyst_is_not_told_the_columns_type(svc, column):
    path = svc.data / "flights.parquet"
    pl.DataFrame({"user": [f"u{i % 40}" for i in range(300)], "page": ["p1", "p2", "p3"] * 100,
                  "delay": [float(i % 17) for i in range(300)]}).write_parquet(path)
    _add(svc, "datasets", "flights", path, unit="delay" if column == "--privacy-unit" else "user")
    by = "page" if column == "--privacy-unit" else "delay"
    r = svc.run("alice", "histogram", "flights", "--by", by, "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 65, r.stderr
    line = _one_line(r)
    assert "cannot be used as asked" in line
    assert "Float" not in line and "float" not in line and "f64" not in line, line
