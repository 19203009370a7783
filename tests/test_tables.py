"""Reading, validation and atomic writing."""

from __future__ import annotations

import io
import os

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


# ---- one open file: the bytes hashed are the bytes parsed (issue 15, finding 1) ----------------------


def test_fingerprint_is_of_the_bytes_and_stdin_parquet_reads(tmp_path):
    import hashlib

    df = pl.DataFrame({"u": ["a", "b"], "x": [1, 2]})
    for name, writer in (("d.csv", df.write_csv), ("d.parquet", df.write_parquet), ("d.ndjson", df.write_ndjson)):
        writer(tmp_path / name)
        raw = (tmp_path / name).read_bytes()
        t = tables.open_input(str(tmp_path / name))
        assert t.fingerprint == "sha256:" + hashlib.sha256(raw).hexdigest() == tables.fingerprint_bytes(raw)
        s = tables.open_input("-", name.split(".")[1], stdin=io.BytesIO(raw))
        assert s.fingerprint == t.fingerprint and s.frame.collect().equals(t.frame.collect())
        t.verify_unchanged()
        s.verify_unchanged()  # stdin: held in memory, nothing to check


def test_paths_are_literal_no_glob_no_tilde(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "r1.csv").write_text("u\nother\n")
    (tmp_path / "x.csv").write_text("u\nhome\n")
    with pytest.raises(InputMissingError, match="does not exist"):
        tables.open_input("r[1].csv")
    with pytest.raises(InputMissingError, match="does not exist"):
        tables.open_input("~/x.csv")
    (tmp_path / "r[1].csv").write_text("u\nliteral\n")
    (tmp_path / "~").mkdir()
    (tmp_path / "~" / "x.csv").write_text("u\ntilde\n")
    assert tables.open_input("r[1].csv").frame.collect()["u"].to_list() == ["literal"]
    assert tables.open_input("~/x.csv").frame.collect()["u"].to_list() == ["tilde"]


def test_every_scan_reads_the_open_file_not_the_path(tmp_path, monkeypatch):
    """Swapping the path after the open changes nothing the table reads (each collect, each filter)."""
    df = pl.DataFrame({"u": [f"u{i}" for i in range(100)], "x": list(range(100))})
    df.write_parquet(tmp_path / "a.parquet")
    pl.DataFrame({"u": ["z"], "x": [-1]}).write_parquet(tmp_path / "b.parquet")
    (tmp_path / "cur.parquet").symlink_to(tmp_path / "a.parquet")

    def swap(path: str) -> None:
        (tmp_path / "tmp").symlink_to(tmp_path / "b.parquet")
        (tmp_path / "tmp").replace(tmp_path / "cur.parquet")

    monkeypatch.setattr(tables, "after_fingerprint_hook", swap)
    t = tables.open_input(str(tmp_path / "cur.parquet"))
    assert t.fingerprint == tables.fingerprint_bytes((tmp_path / "a.parquet").read_bytes())
    for _ in range(2):
        assert t.frame.select(pl.col("x").sum()).collect(engine="streaming").item() == 4950
        parts = [t.frame.filter(pl.col("u").hash(7) % 3 == b).select(pl.len()).collect().item() for b in range(3)]
        assert sum(parts) == 100
    t.verify_unchanged()


def test_rewrite_in_place_is_caught_by_verify_unchanged(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("u,x\na,1\nb,2\n")
    t = tables.open_input(str(p))
    t.verify_unchanged()
    with open(p, "r+") as fh:
        fh.write("u,x\na,9\n")
    with pytest.raises(InputMissingError, match="changed while it was read; rerun"):
        t.verify_unchanged()
    with pytest.raises(InputMissingError):
        tables.verify_unchanged(None, t)


def test_directories_and_fifos_are_refused_without_blocking(tmp_path):
    with pytest.raises(InputMissingError, match="is a directory"):
        tables.open_input(str(tmp_path), "csv")
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    with pytest.raises(InputMissingError, match="not a regular file"):
        tables.open_input(str(fifo))  # no writer: a blocking open would hang here


def test_output_path_refuses_state_dir_and_inputs(tmp_path):
    state = tmp_path / "state"
    (state / "ledgers").mkdir(parents=True)
    (state / "ledgers" / "a.json").write_text("{}")
    data = tmp_path / "d.csv"
    data.write_text("u\na\n")
    (tmp_path / "link").symlink_to(state)
    bad = [state / "ledgers" / "a.json", state / "new.csv", tmp_path / "link" / "x.csv",
           tmp_path / "link" / ".." / "state" / "y.csv", state]
    for out in bad:
        with pytest.raises(OutputError, match="inside the state directory"):
            tables.check_output_path(str(out), state, [str(data)])
    (tmp_path / "alias.csv").symlink_to(data)
    for out in (data, tmp_path / "alias.csv", tmp_path / "sub" / ".." / "d.csv"):
        with pytest.raises(OutputError, match="is the input"):
            tables.check_output_path(str(out), state, [None, "-", str(data)])
    tables.check_output_path(str(tmp_path / "fine.csv"), state, [str(data), None, "-"])
    tables.check_output_path("-", state, [str(data)])
    tables.check_output_path(None, state, [str(data)])
