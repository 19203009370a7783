"""Reading, validation and atomic writing.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import polars as pl
import pytest
from dptest import PAGES, SAMPLE, cli, history, init_ledger

from dpcli.errors import DataError, InputMissingError, OutputError, UsageError
from dpcli.io import inputs, outputs
from dpcli.io import schemas
from dpcli.io import tables


def test_formats_and_fingerprint(tmp_path):
    df = pl.DataFrame({"u": ["a", "b"], "x": [1.5, 2.0]})
    for name, writer in (("d.csv", df.write_csv), ("d.parquet", df.write_parquet), ("d.ndjson", df.write_ndjson)):
        writer(tmp_path / name)
        t = inputs.open_input(str(tmp_path / name), text_columns=("u", "x") if name.endswith("ndjson") else ())
        assert t.frame.collect().shape == (2, 2)
        assert t.fingerprint.startswith("sha256:")
    t1 = inputs.open_input(str(tmp_path / "d.csv"))
    (tmp_path / "d.csv").write_text("u,x\na,1.5\nb,2.5\n")
    assert inputs.open_input(str(tmp_path / "d.csv")).fingerprint != t1.fingerprint


def test_stdin_reads_csv_by_default_and_other_formats_when_told():
    """`cat events.csv | dpcli histogram - …` works without --input-format (issue 17)."""
    t = inputs.open_input("-", stdin=io.BytesIO(b"u,x\na,1\n"))
    assert t.format == "csv" and t.frame.collect()["x"].to_list() == ["1"]  # a CSV's columns are text
    t = inputs.open_input("-", "ndjson", stdin=io.BytesIO(b'{"u": "a", "x": 2}\n'), text_columns=("x",))
    assert t.frame.collect()["x"].to_list() == ["2"]


@pytest.mark.parametrize("suffix, compress", [(".csv.gz", "gzip"), (".csv.bz2", "bz2"), (".csv.xz", "lzma")])
def test_compressed_inputs_are_hashed_as_stored_and_parsed_decompressed(tmp_path, suffix, compress):
    import importlib

    raw = b"u;x\na;1\nb;2\n"
    packed = importlib.import_module(compress).compress(raw)
    f = tmp_path / f"in{suffix}"
    f.write_bytes(packed)
    t = inputs.open_input(str(f), delimiter=";")
    assert t.frame.collect()["x"].to_list() == ["1", "2"]  # a CSV's columns are text (nothing inferred)
    assert t.fingerprint == tables.fingerprint_bytes(packed)  # the bytes on disk, which are the bytes parsed
    f.write_bytes(packed[: len(packed) // 2])  # a truncated archive: one line, no traceback
    with pytest.raises(DataError, match="does not parse"):
        inputs.open_input(str(f), delimiter=";")


@pytest.mark.parametrize("text, sep", [(None, ","), (";", ";"), ("tab", "\t"), ("\\t", "\t"), ("|", "|")])
def test_csv_delimiter(text, sep):
    assert inputs.csv_delimiter(text) == sep


@pytest.mark.parametrize("text", ["", ";;", '"', "\n", "é"])
def test_csv_delimiter_refuses_what_cannot_split_fields(text):
    with pytest.raises(UsageError, match="delimiter must be one ASCII character"):
        inputs.csv_delimiter(text)


def test_errors(tmp_path):
    with pytest.raises(InputMissingError):
        inputs.open_input(str(tmp_path / "missing.csv"))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match="empty"):
        inputs.open_input(str(tmp_path / "empty.csv"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError):
        inputs.open_input(str(tmp_path / "bad.parquet"))
    pl.DataFrame({"u": ["a"], "x": ["text"]}).write_csv(tmp_path / "t.csv")
    t = inputs.open_input(str(tmp_path / "t.csv"))
    with pytest.raises(DataError, match="'nope' not found"):
        schemas.require_columns(t, {"nope": "any"})
    with pytest.raises(DataError, match="must be numeric"):
        schemas.require_columns(t, {"x": "numeric"})
    with pytest.raises(UsageError):
        inputs.open_input(str(tmp_path / "t.xyz"))


def test_atomic_output(tmp_path):
    df = pl.DataFrame({"k": [1, 2]})
    out = tmp_path / "o.parquet"
    outputs.write_output(df, str(out), outputs.output_format_for(str(out), None))
    assert pl.read_parquet(out).equals(df)
    assert [p.name for p in tmp_path.iterdir()] == ["o.parquet"]
    with pytest.raises(OutputError):
        outputs.check_output_path(str(tmp_path / "nodir" / "x.csv"))
    buf = io.BytesIO()
    outputs.write_output(df, None, "json", stdout=buf)
    assert b'"k"' in buf.getvalue()


# ---- one open file: the bytes hashed are the bytes parsed (issue 15, finding 1) ----------------------


def test_fingerprint_is_of_the_bytes_and_stdin_parquet_reads(tmp_path):
    import hashlib

    df = pl.DataFrame({"u": ["a", "b"], "x": [1, 2]})
    for name, writer in (("d.csv", df.write_csv), ("d.parquet", df.write_parquet), ("d.ndjson", df.write_ndjson)):
        writer(tmp_path / name)
        raw = (tmp_path / name).read_bytes()
        cols = ("u", "x") if name.endswith("ndjson") else ()
        t = inputs.open_input(str(tmp_path / name), text_columns=cols)
        assert t.fingerprint == "sha256:" + hashlib.sha256(raw).hexdigest() == tables.fingerprint_bytes(raw)
        s = inputs.open_input("-", name.split(".")[1], stdin=io.BytesIO(raw), text_columns=cols)
        assert s.fingerprint == t.fingerprint and s.frame.collect().equals(t.frame.collect())
        t.verify_unchanged()
        s.verify_unchanged()  # stdin: held in memory, nothing to check


def test_paths_are_literal_no_glob_no_tilde(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "r1.csv").write_text("u\nother\n")
    (tmp_path / "x.csv").write_text("u\nhome\n")
    with pytest.raises(InputMissingError, match="does not exist"):
        inputs.open_input("r[1].csv")
    with pytest.raises(InputMissingError, match="does not exist"):
        inputs.open_input("~/x.csv")
    (tmp_path / "r[1].csv").write_text("u\nliteral\n")
    (tmp_path / "~").mkdir()
    (tmp_path / "~" / "x.csv").write_text("u\ntilde\n")
    assert inputs.open_input("r[1].csv").frame.collect()["u"].to_list() == ["literal"]
    assert inputs.open_input("~/x.csv").frame.collect()["u"].to_list() == ["tilde"]


def test_every_scan_reads_the_open_file_not_the_path(tmp_path, monkeypatch):
    """Swapping the path after the open changes nothing the table reads (each collect, each filter)."""
    df = pl.DataFrame({"u": [f"u{i}" for i in range(100)], "x": list(range(100))})
    df.write_parquet(tmp_path / "a.parquet")
    pl.DataFrame({"u": ["z"], "x": [-1]}).write_parquet(tmp_path / "b.parquet")
    (tmp_path / "cur.parquet").symlink_to(tmp_path / "a.parquet")

    def swap(path: str) -> None:
        (tmp_path / "tmp").symlink_to(tmp_path / "b.parquet")
        (tmp_path / "tmp").replace(tmp_path / "cur.parquet")

    monkeypatch.setattr(inputs, "after_fingerprint_hook", swap)
    t = inputs.open_input(str(tmp_path / "cur.parquet"))
    assert t.fingerprint == tables.fingerprint_bytes((tmp_path / "a.parquet").read_bytes())
    for _ in range(2):
        assert t.frame.select(pl.col("x").sum()).collect(engine="streaming").item() == 4950
        parts = [t.frame.filter(pl.col("u").hash(7) % 3 == b).select(pl.len()).collect().item() for b in range(3)]
        assert sum(parts) == 100
    t.verify_unchanged()


def test_rewrite_in_place_is_caught_by_verify_unchanged(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("u,x\na,1\nb,2\n")
    t = inputs.open_input(str(p))
    t.verify_unchanged()
    with open(p, "r+") as fh:
        fh.write("u,x\na,9\n")
    with pytest.raises(InputMissingError, match="changed while it was read; rerun"):
        t.verify_unchanged()
    with pytest.raises(InputMissingError):
        tables.verify_unchanged(None, t)


def test_fifos_are_refused_without_blocking_and_empty_directories_hold_no_data(tmp_path):
    with pytest.raises(InputMissingError, match="holds no data files"):
        inputs.open_input(str(tmp_path))
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    with pytest.raises(InputMissingError, match="is a pipe: pipe data in with '-'"):
        inputs.open_input(str(fifo))  # no writer: a blocking open would hang here


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
            outputs.check_output_path(str(out), state, [str(data)])
    (tmp_path / "alias.csv").symlink_to(data)
    for out in (data, tmp_path / "alias.csv", tmp_path / "sub" / ".." / "d.csv"):
        with pytest.raises(OutputError, match="is the input"):
            outputs.check_output_path(str(out), state, [None, "-", str(data)])
    outputs.check_output_path(str(tmp_path / "fine.csv"), state, [str(data), None, "-"])
    outputs.check_output_path("-", state, [str(data)])
    outputs.check_output_path(None, state, [str(data)])


# ---- column types from the query, not the records (issue 15: a record must not flip a column's type) --------


def test_text_columns_fix_the_schema_of_csv_and_ndjson(tmp_path):
    """CSV: every column is a string whatever the records hold (no type is inferred: inferring reads
    records before the debit). NDJSON (no header): exactly the named columns, all strings; a missing key is
    null, a JSON number or list is kept as its text."""
    (tmp_path / "d.csv").write_text("u,g,x,other\n1,01,2,5\n2,1,abc,6\n")
    t = inputs.open_input(str(tmp_path / "d.csv"), text_columns=("u", "g", "x"))
    assert dict(t.frame.collect_schema()) == {"u": pl.String, "g": pl.String, "x": pl.String, "other": pl.String}
    assert t.frame.collect()["g"].to_list() == ["01", "1"]
    (tmp_path / "d.ndjson").write_text('{"u":1,"g":"01","x":2.5,"other":[1]}\n{"u":2,"x":[1,2]}\n{"u":"3","g":1.5}\n')
    t = inputs.open_input(str(tmp_path / "d.ndjson"), text_columns=("u", "g", "x"))
    assert dict(t.frame.collect_schema()) == {"u": pl.String, "g": pl.String, "x": pl.String}
    assert t.frame.collect().rows() == [("1", "01", "2.5"), ("2", None, "[1,2]"), ("3", "1.5", None)]
    s = inputs.open_input("-", "ndjson", stdin=io.BytesIO(b'{"u":7}\n'), text_columns=("u",))
    assert s.frame.collect()["u"].to_list() == ["7"]


# ---- NDJSON is read record by record (issue 29): a line that is not a JSON object is a record of nulls --------


def _ndjson_rows(raw: bytes, columns: tuple[str, ...] = ("u", "g"), tmp_path: Path | None = None) -> list[tuple]:
    """The rows of ``raw`` read as NDJSON with ``columns``: from stdin and, given ``tmp_path``, from a file
    and a .jsonl.gz file too (asserted equal)."""
    import gzip

    rows = inputs.open_input("-", "ndjson", stdin=io.BytesIO(raw), text_columns=columns).frame.collect().rows()
    if tmp_path is not None:
        (tmp_path / "d.ndjson").write_bytes(raw)
        (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(raw))
        for name in ("d.ndjson", "d.jsonl.gz"):
            t = inputs.open_input(str(tmp_path / name), text_columns=columns)
            assert t.frame.collect().rows() == rows, name
            assert t.frame.select(pl.len()).collect().item() == len(rows)
    return rows


GOOD_LINE = b'{"u":"a","g":"x"}\n'

#: One line each, between two good records: the rows read for it (a record of nulls when it is no JSON object).
NDJSON_LINES = {
    "number beyond the double range": (b'{"u":"b","g":1e999}\n', [(None, None)]),
    "negative number beyond the range": (b'{"u":"b","g":-1E+400}\n', [(None, None)]),
    "1100 levels of nesting": (b'{"u":"b","g":' + b"[" * 1100 + b"]" * 1100 + b"}\n", [(None, None)]),
    "128 levels": (b'{"u":"b","g":' + b"[" * 127 + b"]" * 127 + b"}\n", [(None, None)]),
    "127 levels": (b'{"u":"b","g":' + b"[" * 126 + b"]" * 126 + b"}\n", [("b", "[" * 126 + "]" * 126)]),
    "top-level array": (b'[{"u":"b","g":"y"}]\n', [(None, None)]),
    "top-level null": (b"null\n", [(None, None)]),
    "top-level number": (b"42\n", [(None, None)]),
    "top-level string": (b'"u"\n', [(None, None)]),
    "invalid UTF-8": (b'{"u":"b\xff","g":"y\xc3"}\n', [("b\ufffd", "y\ufffd")]),
    "not JSON": (b"u=b, g=y\n", [(None, None)]),
    "cut short": (b'{"u":"b","g":"y\n', [(None, None)]),
    "trailing garbage": (b'{"u":"b","g":"y"} x\n', [(None, None)]),
    "two objects": (b'{"u":"b","g":"y"}{"u":"c"}\n', [(None, None)]),
    "CRLF": (b'{"u":"b","g":"y"}\r\n', [("b", "y")]),
    "spaces around": (b' \t{"u" : "b" , "g":"y"} \n', [("b", "y")]),
    "blank lines": (b"\n   \n\t\r\n\n", []),
    "NUL inside a string": (b'{"u":"b","g":"y\x00z"}\n', [(None, None)]),
    "NUL after the object": (b'{"u":"b","g":"y"}\x00tail\n', [("b", "y")]),  # read up to the NUL
    "escaped NUL": (b'{"u":"b","g":"y\\u0000z"}\n', [("b", "y\x00z")]),
    "escapes": (b'{"u":"\\u00e9\\ud83d\\ude00","g":"\\"\\\\\\/\\t"}\n', [("\u00e9\U0001F600", '"\\/\t')]),
    "lone surrogate": (b'{"u":"b","g":"\\ud800"}\n', [(None, None)]),
    "duplicate keys": (b'{"u":"b","g":"y","u":"c"}\n', [("c", "y")]),
    "missing key": (b'{"u":"b"}\n', [("b", None)]),
    "JSON null value": (b'{"u":null,"g":"y"}\n', [(None, "y")]),
    "empty object": (b"{}\n", [(None, None)]),
    "other values": (b'{"u":true,"g":{"k":[1, 2.50,"s",null]}}\n', [("true", '{"k":[1,2.5,"s",null]}')]),
    "huge integer": (b'{"u":123456789012345678901234567890,"g":18446744073709551615}\n',
                     [("1.2345678901234568e+29", "18446744073709551615")]),
    "whole floats": (b'{"u":1.0,"g":-1e2}\n', [("1", "-100")]),
    "whole float text": (b'{"u":"1.0","g":"1e2"}\n', [("1.0", "1e2")]),
    "other floats": (b'{"u":2.50,"g":0.00000015}\n', [("2.5", "1.5e-7")]),
    "BOM": (b'\xef\xbb\xbf{"u":"b","g":"y"}\n', [(None, None)]),  # mid-file: not JSON
}


@pytest.mark.parametrize("case", list(NDJSON_LINES))
def test_ndjson_is_read_record_by_record(tmp_path, case):
    """Each line is read alone: whatever it holds, it never fails the scan, and the records around it
    are read as they are without it (from a file, a .jsonl.gz and stdin alike)."""
    line, rows = NDJSON_LINES[case]
    assert _ndjson_rows(GOOD_LINE + line + GOOD_LINE, tmp_path=tmp_path) == [("a", "x"), *rows, ("a", "x")]


def test_ndjson_first_and_last_lines(tmp_path):
    """The first line (where inference used to look), a BOM before it, and a last line without a newline."""
    assert _ndjson_rows(b'\xef\xbb\xbf{"u":"a","g":"x"}\n{"u":"b"}', tmp_path=tmp_path) == [("a", "x"), ("b", None)]
    assert _ndjson_rows(b'1e999\n[1]\n{"u":"b","g":"y"}', tmp_path=tmp_path) == [(None, None), (None, None),
                                                                                   ("b", "y")]
    assert _ndjson_rows(b'\x00{"u":"a"}\n{"u":"b"}\x00\n', tmp_path=tmp_path) == [("b", None)]  # a NUL first: blank


def test_ndjson_whose_every_line_is_broken_reads_as_records_of_nulls(tmp_path):
    assert _ndjson_rows(b'1e999\n[1]\nnull\n{"u":\n', tmp_path=tmp_path) == [(None, None)] * 4
    assert _ndjson_rows(b"\n\n  \n", tmp_path=tmp_path) == []


def test_empty_ndjson_is_the_empty_error(tmp_path):
    """Only the file's size (public) decides it: a file of blank lines is read, as no records."""
    (tmp_path / "e.ndjson").write_bytes(b"")
    with pytest.raises(DataError, match="is empty"):
        inputs.open_input(str(tmp_path / "e.ndjson"), text_columns=("u",))
    with pytest.raises(DataError, match="standard input is empty"):
        inputs.open_input("-", "ndjson", stdin=io.BytesIO(b""), text_columns=("u",))


@pytest.mark.parametrize("name", ["a.b", "it's", 'say "hi"', "[x]", "a b", " ", "", "é", "日本", "a\\b", "x'y\"z",
                                  "$", "@", "*", "..", "?(@.x)", "a,b", "a','b", "a\nb", "\U0001F600", "0", "-1",
                                  "'", '"', "\\", "user_id", "nested", "outer", "x", "line", "__dp_line"])
def test_ndjson_key_names_are_read_exactly(tmp_path, name):
    """A column name is a key, not a path: dots, quotes, brackets, spaces, JSONPath's own characters are
    read literally, among keys made of its pieces and a nested copy of it; a name JSONPath cannot spell
    is refused whatever the file holds (DataError), never read from another key."""
    import re

    decoys = {p: "piece" for p in re.split(r"[^0-9A-Za-z]+", name) if p and p != name}
    recs = [{**decoys, name: "v", "n": {name: "nested"}}, {**decoys, name: 1.0}, {**decoys, "n": {name: 2}}]
    raw = "".join(json.dumps(r) + "\n" for r in recs).encode()
    try:
        rows = _ndjson_rows(raw, (name,), tmp_path)
    except DataError as exc:
        assert f"column {name!r} cannot be read from NDJSON" in str(exc)
        for content in (b"", b"{}\n", raw):  # the name alone decides
            with pytest.raises(DataError, match="cannot be read from NDJSON"):
                inputs._parse(content, tables.Reading.of("ndjson", text_columns=(name,)))
        assert "\\" in name  # only a name with a backslash and other special characters is refused
        return
    assert rows == [("v",), ("1",), (None,)]


def test_ndjson_key_names_refused_are_few():
    for name in ("a\\b", "\\", "a\\'", 'x\\"'):
        inputs._parse(b"", tables.Reading.of("ndjson", text_columns=(name,)))  # dot notation spells these
    for name in ("a\\ b", "'\\a", "a.\\", "\\[0]"):
        with pytest.raises(DataError, match="cannot be read from NDJSON"):
            inputs._parse(b"", tables.Reading.of("ndjson", text_columns=(name,)))


def test_ndjson_needs_the_columns_a_query_reads(tmp_path):
    """No schema is ever inferred from NDJSON records: without columns an NDJSON is not opened at all."""
    (tmp_path / "d.ndjson").write_text('{"u": 1}\n')
    with pytest.raises(UsageError, match="read by the columns a query names"):
        inputs.open_input(str(tmp_path / "d.ndjson"))
    with pytest.raises(UsageError, match="read by the columns a query names"):
        inputs.open_input("-", "ndjson", stdin=io.BytesIO(b'{"u": 1}\n'))


def test_ndjson_scan_stays_lazy_and_reads_the_open_file(tmp_path):
    """The NDJSON frame is a lazy scan of the open file (no rows in Python): a later collect sees the
    same open file, and a filter on a column is evaluated per record."""
    f = tmp_path / "d.ndjson"
    f.write_bytes(b'{"u":"a"}\n1e999\n{"u":"b"}\n')
    t = inputs.open_input(str(f), text_columns=("u",))
    assert isinstance(t.frame, pl.LazyFrame)
    assert t.frame.filter(pl.col("u").is_not_null()).collect()["u"].to_list() == ["a", "b"]
    assert t.frame.collect(engine="streaming")["u"].to_list() == ["a", None, "b"]


def test_group_lists_read_as_text_match_text_exactly_and_cast_to_declared_types(tmp_path):
    (tmp_path / "keys.csv").write_text("g\n01\n1\n10\n")
    keys = inputs.open_input(str(tmp_path / "keys.csv"), text_columns=("g",))
    text = schemas.read_group_list(keys, ("g",), pl.Schema({"g": pl.String}))
    assert text["g"].to_list() == ["01", "1", "10"]  # text order; "01" and "1" are two groups
    ints = schemas.read_group_list(keys, ("g",), pl.Schema({"g": pl.Int64}))  # a Parquet input's declared type
    assert ints["g"].to_list() == [1, 10]
    (tmp_path / "bad.csv").write_text("g\n1\nzz\n")
    with pytest.raises(DataError, match="do not match the data's column types"):
        schemas.read_group_list(inputs.open_input(str(tmp_path / "bad.csv"), text_columns=("g",)), ("g",),
                               pl.Schema({"g": pl.Int64}))


def test_value_kind_accepts_numbers_and_text_only_where_text_is_the_format(tmp_path):
    """A value column: a number in a typed format (Parquet: its type is schema, so text is refused like a
    boolean, issue 39 item 1); numbers or text parsed per record in CSV and NDJSON, where every column is text."""
    p = tmp_path / "d.parquet"
    pl.DataFrame({"n": [1.5], "t": ["2"], "b": [True]}).write_parquet(p)
    t = inputs.open_input(str(p))
    schemas.require_columns(t, {"n": "value"})
    for column in ("t", "b"):
        with pytest.raises(DataError, match=f"'{column}' must be numeric"):
            schemas.require_columns(t, {column: "value"})
    c = tmp_path / "d.csv"
    c.write_text("n,t\n1.5,2\n")
    schemas.require_columns(inputs.open_input(str(c)), {"n": "value", "t": "value"})


def _dataset(root: Path, parts: int = 3) -> Path:
    d = root / "views"
    (d / "day=1").mkdir(parents=True)
    rows = pl.DataFrame({"u": [f"u{i % 7}" for i in range(60)], "g": [f"g{i % 3}" for i in range(60)]})
    for i in range(parts):
        rows.slice(i * 20, 20).write_parquet(d / ("day=1" if i else "") / f"part-{i}.parquet")
    (d / "_SUCCESS").write_text("")
    (d / ".part-0.parquet.crc").write_text("x")
    return d


def test_a_dataset_directory_is_its_parquet_files_with_a_fresh_manifest_fingerprint(tmp_path):
    d = _dataset(tmp_path)
    a, b = inputs.open_input(str(d)), inputs.open_input(str(d))
    assert [str(f.relative_to(d)) for f in a.files] == ["day=1/part-1.parquet", "day=1/part-2.parquet",
                                                        "part-0.parquet"]  # sorted; _SUCCESS and .crc skipped
    assert a.frame.collect().height == 60 and "day" not in a.frame.collect_schema()  # no partition columns
    assert a.fingerprint.startswith("manifest:") and a.fingerprint != b.fingerprint  # a nonce: never a replay
    assert a.fingerprint.split(";")[0] == b.fingerprint.split(";")[0]  # the manifest itself is stable
    a.verify_unchanged()
    (d / "day=1" / "part-3.parquet").write_bytes((d / "part-0.parquet").read_bytes())
    with pytest.raises(InputMissingError, match="changed while it was read"):
        a.verify_unchanged()


def test_a_dataset_holds_parquet_files_only(tmp_path):
    d = _dataset(tmp_path)
    (d / "notes.csv").write_text("a\n1\n")
    with pytest.raises(UsageError, match="Parquet files only") as err:
        inputs.open_input(str(d))
    assert "notes" not in str(err.value)  # names below the directory can be data: never quoted
    (d / "notes.csv").unlink()
    (d / "day=1" / "diagnosis=x.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="holds a file that is not Parquet") as err:
        inputs.open_input(str(d))
    assert "diagnosis" not in str(err.value) and "day=1" not in str(err.value)
    with pytest.raises(UsageError, match="read as Parquet"):
        inputs.open_input(str(d), "csv")


def test_no_output_inside_an_input_dataset(tmp_path):
    from dpcli.errors import OutputError

    d = _dataset(tmp_path)
    with pytest.raises(OutputError, match="inside the input dataset"):
        outputs.check_output_path(str(d / "out.csv"), tmp_path / "state", [str(d)])


# ---- early inputs: opened once, hashed on a thread while the rest of dpcli loads -------------------


def test_an_early_input_is_the_file_opened_once_and_hashed(tmp_path):
    """The early handle is the file parsed: a file renamed over the path after the early open
    changes neither the bytes hashed nor the bytes read, and the release is refused before any
    charge (the open file was unlinked)."""
    import hashlib

    from dpcli.io.opening import hash_early

    path = tmp_path / "d.csv"
    first = b"u,x\na,1\nb,2\n"
    path.write_bytes(first)
    early = hash_early(str(path))
    assert early is not None
    (tmp_path / "new.csv").write_bytes(b"u,x\nz,9\n")
    os.replace(tmp_path / "new.csv", path)
    t = inputs.open_input(str(path), early=early)
    assert t.fingerprint == "sha256:" + hashlib.sha256(first).hexdigest()
    assert t.frame.collect()["u"].to_list() == ["a", "b"]
    with pytest.raises(InputMissingError, match="changed while it was read"):
        t.verify_unchanged()


def test_an_early_input_of_another_path_is_not_taken(tmp_path):
    from dpcli.io.opening import hash_early

    (tmp_path / "a.csv").write_text("u\na\n")
    (tmp_path / "b.csv").write_text("u\nb\n")
    early = hash_early(str(tmp_path / "a.csv"))
    assert inputs.open_input(str(tmp_path / "b.csv"), early=early).frame.collect()["u"].to_list() == ["b"]


def test_only_regular_files_are_hashed_early(tmp_path):
    """Standard input, URIs, directories, missing, empty and special files, and runs that read no
    data, get no early handle: the normal open reports each in its usual order."""
    from dpcli.io.opening import hash_early

    (tmp_path / "d.csv").write_text("u\na\n")
    (tmp_path / "empty.csv").write_text("")
    os.mkfifo(tmp_path / "fifo.csv")
    for path in ("-", "s3a://bucket/x.parquet", str(tmp_path), str(tmp_path / "missing.csv"),
                 str(tmp_path / "empty.csv"), str(tmp_path / "fifo.csv"), None):
        assert hash_early(path) is None, path
    assert hash_early(str(tmp_path / "d.csv"), read=False) is None
    assert hash_early(str(tmp_path / "d.csv")) is not None


def test_an_early_read_error_is_the_usual_error(tmp_path, monkeypatch):
    import errno

    from dpcli.io import opening

    def broken(fh):
        raise OSError(errno.EIO, "input/output error")

    (tmp_path / "d.csv").write_text("u\na\n")
    monkeypatch.setattr(opening, "fingerprint_fileobj", broken)
    early = opening.hash_early(str(tmp_path / "d.csv"))
    with pytest.raises(InputMissingError, match=r"'.*d.csv' is not readable \(input/output error\)"):
        inputs.open_input(str(tmp_path / "d.csv"), early=early)


def test_output_onto_the_input_by_a_relative_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    (tmp_path / "copy.csv").write_bytes((SAMPLE / "page_views.csv").read_bytes())
    before = (tmp_path / "copy.csv").read_bytes()
    r = cli("histogram", "copy.csv", "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "1",
            "-o", "copy.csv")
    assert r.exit_code == 73 and "is the input" in r.stderr
    assert (tmp_path / "copy.csv").read_bytes() == before and history() == []
