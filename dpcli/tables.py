"""Reading inputs lazily, validating columns, fingerprinting, writing outputs atomically.

Inputs: CSV, Parquet or NDJSON chosen by extension or ``--input-format``;
``-`` reads standard input (``--input-format`` is then required). Every input
is fingerprinted with a streamed SHA-256 of its bytes: the fingerprint enters
the release seed, so a changed file gets fresh noise.

Outputs: CSV, Parquet or JSON to stdout or a file; a file is written to a
temporary name in the same directory and renamed, so a failed run never
leaves a partial file.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import polars as pl

from dpcli.errors import DataError, InputMissingError, OutputError, UsageError

InputFormat = Literal["csv", "parquet", "ndjson"]
OutputFormat = Literal["csv", "parquet", "json"]
INPUT_FORMATS: tuple[str, ...] = ("csv", "parquet", "ndjson")
OUTPUT_FORMATS: tuple[str, ...] = ("csv", "parquet", "json")

_INPUT_EXT = {
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".ndjson": "ndjson",
    ".jsonl": "ndjson",
}
_OUTPUT_EXT = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".json": "json"}


@dataclass(frozen=True)
class InputTable:
    """A validated-to-open input: a lazy frame plus the fingerprint of its bytes."""

    frame: pl.LazyFrame
    fingerprint: str
    name: str
    format: str


def input_format_for(path: str, explicit: str | None) -> str:
    """The input format from ``--input-format`` or the file extension."""
    if explicit:
        if explicit not in INPUT_FORMATS:
            raise UsageError(f"unknown input format {explicit!r} (choose from {', '.join(INPUT_FORMATS)})")
        return explicit
    if path == "-":
        raise UsageError("reading standard input ('-') needs --input-format csv|parquet|ndjson")
    fmt = _INPUT_EXT.get(Path(path).suffix.lower())
    if fmt is None:
        raise UsageError(f"cannot tell the format of {path!r} from its extension; give --input-format")
    return fmt


def fingerprint_file(path: Path, chunk: int = 1 << 20) -> str:
    """Streamed SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _scan(source: Path | io.BytesIO, fmt: str, text_columns: tuple[str, ...] = ()) -> pl.LazyFrame:
    if fmt == "csv":
        overrides = {c: pl.String for c in text_columns}
        if isinstance(source, io.BytesIO):
            return pl.read_csv(source, infer_schema_length=10000, schema_overrides=overrides).lazy()
        return pl.scan_csv(source, infer_schema_length=10000, schema_overrides=overrides)
    if fmt == "parquet":
        if isinstance(source, io.BytesIO):
            return pl.read_parquet(source).lazy()
        return pl.scan_parquet(source)
    if isinstance(source, io.BytesIO):
        return pl.read_ndjson(source).lazy()
    return pl.scan_ndjson(source)


def open_input(
    path: str, input_format: str | None = None, stdin: IO[bytes] | None = None, text_columns: tuple[str, ...] = ()
) -> InputTable:
    """Open ``path`` (or ``-`` for stdin) lazily and fingerprint it.

    ``text_columns`` are read as strings from CSV (codes such as block ids keep
    their leading zeros).

    Raises :class:`InputMissingError` for a missing/unreadable file and
    :class:`DataError` for one polars cannot parse or that has no columns.
    """
    fmt = input_format_for(path, input_format)
    if path == "-":
        data = (stdin or sys.stdin.buffer).read()
        if not data:
            raise DataError("standard input is empty")
        fingerprint = "sha256:" + hashlib.sha256(data).hexdigest()
        try:
            frame = _scan(io.BytesIO(data), fmt, text_columns)
        except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
            raise DataError(f"cannot parse standard input as {fmt}: {_first_line(exc)}") from None
        name = "<stdin>"
    else:
        p = Path(path)
        if not p.exists():
            raise InputMissingError(f"input file {path!r} does not exist")
        if p.is_dir():
            raise InputMissingError(f"input {path!r} is a directory, not a file")
        if not os.access(p, os.R_OK):
            raise InputMissingError(f"input file {path!r} is not readable")
        if p.stat().st_size == 0:
            raise DataError(f"input file {path!r} is empty")
        fingerprint = fingerprint_file(p)
        try:
            frame = _scan(p, fmt, text_columns)
            frame.collect_schema()
        except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
            raise DataError(f"cannot read {path!r} as {fmt}: {_first_line(exc)}") from None
        name = path
    return InputTable(frame=frame, fingerprint=fingerprint, name=name, format=fmt)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


ColumnKind = Literal["any", "numeric", "temporal", "key"]


def require_columns(table: InputTable, columns: dict[str, ColumnKind]) -> pl.Schema:
    """Check that each column exists with a usable type; name the offender otherwise."""
    try:
        schema = table.frame.collect_schema()
    except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
        raise DataError(f"cannot read {table.name}: {_first_line(exc)}") from None
    for col, kind in columns.items():
        if col not in schema:
            known = ", ".join(list(schema.names())[:12])
            raise DataError(f"column {col!r} not found in {table.name} (columns: {known})")
        dtype = schema[col]
        if kind == "numeric" and not dtype.is_numeric():
            raise DataError(f"column {col!r} must be numeric but is {dtype} in {table.name}")
        if kind == "temporal" and not (dtype.is_temporal() or dtype.is_numeric() or dtype == pl.String):
            raise DataError(f"column {col!r} must hold timestamps but is {dtype} in {table.name}")
        if kind == "key" and dtype.is_nested():
            raise DataError(f"column {col!r} is a nested {dtype} and cannot be grouped by in {table.name}")
    return schema


def read_group_list(table: InputTable, by: tuple[str, ...], data_schema: pl.Schema) -> pl.DataFrame:
    """A public list of groups (``--keys``/``--domain``): distinct rows of the ``by`` columns,
    cast to the data's column types, sorted."""
    schema = table.frame.collect_schema()
    missing = [c for c in by if c not in schema]
    if missing:
        raise DataError(f"{table.name} lacks column {missing[0]!r} (a list of groups needs: {', '.join(by)})")
    try:
        groups = table.frame.select([pl.col(c).cast(data_schema[c], strict=True) for c in by]).unique().collect()
    except pl.exceptions.PolarsError as exc:
        raise DataError(f"{table.name}: values do not match the data's column types ({_first_line(exc)})") from None
    if groups.height == 0:
        raise DataError(f"{table.name} lists no groups")
    return groups.sort(list(by), nulls_last=True)


def collect(frame: pl.LazyFrame, what: str, streaming: bool = True) -> pl.DataFrame:
    """Collect a lazy frame (streaming engine), turning polars errors into one-line DataErrors."""
    try:
        return frame.collect(engine="streaming" if streaming else "auto")
    except pl.exceptions.PolarsError as exc:
        raise DataError(f"{what}: {_first_line(exc)}") from None


def output_format_for(path: str | None, explicit: str | None) -> str:
    """The output format from ``--format``, the ``-o`` extension, or CSV."""
    if explicit:
        if explicit not in OUTPUT_FORMATS:
            raise UsageError(f"unknown output format {explicit!r} (choose from {', '.join(OUTPUT_FORMATS)})")
        return explicit
    if path and path != "-":
        fmt = _OUTPUT_EXT.get(Path(path).suffix.lower())
        if fmt is None:
            raise UsageError(f"cannot tell the output format of {path!r} from its extension; give --format")
        return fmt
    return "csv"


def check_output_path(path: str | None) -> None:
    """Fail early (before any budget is spent) if ``-o PATH`` cannot be written."""
    if not path or path == "-":
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise OutputError(f"output {path!r} is a directory")
    if not parent.is_dir():
        raise OutputError(f"output directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"output directory {str(parent)!r} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"output file {path!r} is not writable")


def render(df: pl.DataFrame, fmt: str) -> bytes:
    """Serialise a result table."""
    buf = io.BytesIO()
    if fmt == "csv":
        df.write_csv(buf)
    elif fmt == "parquet":
        df.write_parquet(buf)
    else:
        buf.write(df.write_json().encode())
        buf.write(b"\n")
    return buf.getvalue()


def write_output(df: pl.DataFrame, path: str | None, fmt: str, stdout: IO[bytes] | None = None) -> None:
    """Write a result to stdout or atomically to ``path``."""
    data = render(df, fmt)
    if not path or path == "-":
        out = stdout or sys.stdout.buffer
        if fmt == "parquet" and hasattr(out, "isatty") and out.isatty():
            raise OutputError("refusing to write Parquet to a terminal; use -o FILE or --format csv")
        out.write(data)
        out.flush()
        return
    p = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, p)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise OutputError(f"cannot write {path!r}: {exc.strerror}") from None
