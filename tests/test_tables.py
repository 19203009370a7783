"""Reading, validation and atomic writing."""

from __future__ import annotations

import io

import polars as pl
import pytest

from dpcli import tables
from dpcli.errors import DataError, InputMissingError, OutputError, UsageError


def test_formats_and_fingerprint(tmp_path):
    df = pl.DataFrame({"u": ["a", "b"], "x": [1.5, 2.0]})
    for name, writer in (("d.csv", df.write_csv), ("d.parquet", df.write_parquet), ("d.ndjson", df.write_ndjson)):
        writer(tmp_path / name)
        t = tables.open_input(str(tmp_path / name))
        assert t.frame.collect().shape == (2, 2)
        assert t.fingerprint.startswith("sha256:")
    t1 = tables.open_input(str(tmp_path / "d.csv"))
    (tmp_path / "d.csv").write_text("u,x\na,1.5\nb,2.5\n")
    assert tables.open_input(str(tmp_path / "d.csv")).fingerprint != t1.fingerprint


def test_stdin_needs_format_and_reads():
    with pytest.raises(UsageError, match="input-format"):
        tables.open_input("-")
    t = tables.open_input("-", "csv", stdin=io.BytesIO(b"u,x\na,1\n"))
    assert t.frame.collect()["x"].to_list() == [1]


def test_errors(tmp_path):
    with pytest.raises(InputMissingError):
        tables.open_input(str(tmp_path / "missing.csv"))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match="empty"):
        tables.open_input(str(tmp_path / "empty.csv"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError):
        tables.open_input(str(tmp_path / "bad.parquet"))
    pl.DataFrame({"u": ["a"], "x": ["text"]}).write_csv(tmp_path / "t.csv")
    t = tables.open_input(str(tmp_path / "t.csv"))
    with pytest.raises(DataError, match="'nope' not found"):
        tables.require_columns(t, {"nope": "any"})
    with pytest.raises(DataError, match="must be numeric"):
        tables.require_columns(t, {"x": "numeric"})
    with pytest.raises(UsageError):
        tables.open_input(str(tmp_path / "t.xyz"))


def test_atomic_output(tmp_path):
    df = pl.DataFrame({"k": [1, 2]})
    out = tmp_path / "o.parquet"
    tables.write_output(df, str(out), tables.output_format_for(str(out), None))
    assert pl.read_parquet(out).equals(df)
    assert [p.name for p in tmp_path.iterdir()] == ["o.parquet"]
    with pytest.raises(OutputError):
        tables.check_output_path(str(tmp_path / "nodir" / "x.csv"))
    buf = io.BytesIO()
    tables.write_output(df, None, "json", stdout=buf)
    assert b'"k"' in buf.getvalue()
