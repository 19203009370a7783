"""Attack: `-v` tracebacks (issue 17 made -v print them) must not become a side door for records.

A library's message can quote the value of a record (polars names the field it could not parse;
``float()`` echoes its text). With -v the stack is printed, but only messages dpcli wrote itself.
"""

from __future__ import annotations

import polars as pl
import pytest
from typer.testing import CliRunner

from dpcli.tasks.histogram import HistogramTask
from dpcli.cli.app import app
from dpcli.errors import DataError

runner = CliRunner()
SECRET = "SECRET-RECORD-7431"


def _polars_quoting_a_record() -> None:
    pl.Series([SECRET]).cast(pl.Int64, strict=True)  # polars' message quotes the value


def _float_quoting_a_record() -> None:
    float(SECRET)


def _dpcli_error_chained_from_polars() -> None:
    try:
        _polars_quoting_a_record()
    except pl.exceptions.PolarsError as exc:
        raise DataError("cannot read the value column") from exc


@pytest.mark.parametrize("fail", [_polars_quoting_a_record, _float_quoting_a_record, _dpcli_error_chained_from_polars])
@pytest.mark.parametrize("verbose", [[], ["-v"]])
def test_no_record_reaches_stderr_through_a_traceback(tmp_path, monkeypatch, fail, verbose):
    data = tmp_path / "d.csv"
    data.write_text(f"u,g\nu1,{SECRET}\n")
    assert runner.invoke(app, ["budget", "init", "default", "--epsilon", "5"]).exit_code == 0

    monkeypatch.setattr(HistogramTask, "run", lambda *args, **kwargs: fail())
    r = runner.invoke(app, [*verbose, "histogram", str(data), "--by", "g", "--privacy-unit", "u", "--epsilon", "1",
                            "--keys", str(data)])
    assert r.exit_code in (1, 65), r.stderr
    assert SECRET not in r.stderr and SECRET not in r.stdout
    assert ("Traceback (most recent call last)" in r.stderr) == bool(verbose)
    assert r.stderr.rstrip().splitlines()[-1].startswith(("dpcli: error:", "dpcli: internal error"))
