"""Inputs: opened once, fingerprinted from the bytes parsed, read as their :class:`Reading` says.

CSV, Parquet or NDJSON chosen by extension or ``--input-format`` (or a catalog entry),
optionally compressed (``.gz``, ``.bz2``, ``.xz``: decompressed into memory);
``-`` reads standard input, CSV unless ``--input-format`` says otherwise
(uncompressed). CSV fields are split on ``--delimiter`` (default ``,``; a ``.tsv`` or ``.tab``
file is CSV split on tabs). Every input
is fingerprinted with a streamed SHA-256 of its bytes, and how they are read (its
:class:`Reading`: format, compression, delimiter, text columns) is all the parser
is given: both enter the release seed (:meth:`InputTable.seed_material`), so a
changed file, or the same bytes read another way, gets fresh noise. A file is opened once,
by its literal path (no ``~`` or glob expansion), hashed through that open
file and parsed from it, so the fingerprint is of the bytes parsed; a rewrite
of the open file in place is caught before the ledger is charged
(:meth:`InputTable.verify_unchanged`, exit 66). NDJSON is read record by record
(:mod:`dpcli.io.ndjson`). Column checks and public group lists are here too.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import sys
import weakref
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import IO

import polars as pl

from dpcli.access import Source
from dpcli.errors import (
    DataError,
    InputMissingError,
    UsageError,
    os_reason,
    withheld,
)
from dpcli.io.datasets import open_dataset
from dpcli.io.ndjson import NDJSON_NEEDS_COLUMNS, scan_ndjson
from dpcli.io.opening import (
    EarlyInput,
    EarlyInputs,
    fingerprint_fileobj,
    is_pipe,
    open_binary,
    read_pipe,
    refuse_private,
)
from dpcli.io.tables import InputTable, Reading, fingerprint_bytes

INPUT_FORMATS: tuple[str, ...] = ("csv", "parquet", "ndjson")


_INPUT_EXT = {
    ".csv": "csv",
    ".tsv": "csv",  # split on tabs unless --delimiter says otherwise (TAB_SUFFIXES)
    ".tab": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".ndjson": "ndjson",
    ".jsonl": "ndjson",
}


#: Suffixes of CSV files whose fields are split on tabs by default.
TAB_SUFFIXES = frozenset({".tsv", ".tab"})


#: Compressed inputs by suffix (after it comes the format's own: ``events.csv.gz``).
_COMPRESSION: dict[str, Callable[[bytes], bytes]] = {
    ".gz": gzip.decompress, ".bz2": bz2.decompress, ".xz": lzma.decompress,
}


#: Test hook: called with the input's path right after its fingerprint is taken and before the parser
#: is given the file, so tests can swap or rewrite the file in between. None (the default) in real runs.
after_fingerprint_hook: Callable[[str], None] | None = None


#: ``compression`` names of a catalog entry → the suffix that implies them.
_COMPRESSION_NAMES = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz"}


def _suffixes(path: str) -> tuple[str, str | None]:
    """The format suffix of ``path`` and its compression suffix (or None): ``a.csv.gz`` → (``.csv``, ``.gz``)."""
    p = Path(path)
    comp = p.suffix.lower()
    if comp in _COMPRESSION:
        return Path(p.stem).suffix.lower(), comp
    return comp, None


def input_format_for(path: str, explicit: str | None, name: str | None = None) -> str:
    """The input format from ``--input-format``, else the file extension (``-``: CSV); messages call the
    input ``name`` (a catalog name) when given."""
    if explicit:
        if explicit not in INPUT_FORMATS:
            raise UsageError(f"unknown input format {explicit!r} (choose from {', '.join(INPUT_FORMATS)})")
        return explicit
    if path == "-":
        return "csv"
    fmt = _INPUT_EXT.get(_suffixes(path)[0])
    if fmt is None:
        raise UsageError(f"is needed: the format of {name or path!r} is not clear from its extension",
                         field="input_format")
    return fmt


def csv_delimiter(text: str | None, path: str = "") -> str:
    """A CSV field separator: one ASCII character other than a quote or line break (``tab`` or ``\\t``: a tab).

    None: the default of ``path``, a tab for a ``.tsv`` or ``.tab`` name (``x.tsv.gz`` too), else a comma.
    """
    if text is None:
        return "\t" if path != "-" and _suffixes(path)[0] in TAB_SUFFIXES else ","
    sep = "\t" if text in ("tab", "\\t") else text
    if len(sep) != 1 or not sep.isascii() or sep in "\"\r\n":
        raise UsageError(f"must be one ASCII character (or 'tab'), not a quote or line break; got {text!r}",
                         field="delimiter")
    return sep


def _parse(source: IO[bytes] | bytes, reading: Reading) -> pl.LazyFrame:
    """A lazy scan of an open file or of bytes in memory, as ``reading`` says (and nothing else):
    never a path, so polars expands no glob or ``~``.

    Compressed bytes are decompressed into memory first. Given an exact ``io.BufferedReader``
    (uncompressed), polars (unix) duplicates its descriptor and reads that open file at every
    collect (memory-mapped, as for a path); the bytes are not copied into memory.

    ``text_columns`` (see :func:`open_input`): in a CSV they are read as strings (so are the other
    columns: no type is inferred from the records, and a query reads only text columns). An
    NDJSON is read with exactly those columns as its schema, all strings, record by record
    (:func:`dpcli.io.ndjson.scan_ndjson`): nothing is inferred, a record without one of the keys has null there,
    any other JSON value in them is kept as its JSON text, and a line that is not a JSON object is
    a record of nulls. An NDJSON has no header to take a schema from, so it needs ``text_columns``.
    """
    if reading.compression is not None:
        raw = source if isinstance(source, bytes) else source.read()
        source = _COMPRESSION[reading.compression](raw)
        refuse_private(source[:32], "compressed input", "(its content)")
    if reading.format == "csv":
        overrides = dict.fromkeys(reading.text_columns, pl.String)
        # Per-record damage is not an error (control flow must not depend on one record): a record with
        # too many fields is truncated, one with too few gets nulls, bytes that are not UTF-8 are replaced.
        # No column's type is inferred (every column a query reads is text): inferring reads records, before
        # the debit, and its time would depend on them.
        return pl.scan_csv(source, separator=reading.delimiter or ",", infer_schema_length=0,
                           schema_overrides=overrides, truncate_ragged_lines=True, encoding="utf8-lossy")
    if reading.format == "parquet":
        return pl.scan_parquet(source)
    if not reading.text_columns:
        raise UsageError(NDJSON_NEEDS_COLUMNS)
    return scan_ndjson(source, tuple(dict.fromkeys(reading.text_columns)))


def open_input(
    path: str | Source,
    input_format: str | None = None,
    stdin: IO[bytes] | None = None,
    text_columns: tuple[str, ...] = (),
    delimiter: str | None = None,
    early: EarlyInput | EarlyInputs | None = None,
) -> InputTable:
    """Open ``path`` (or ``-`` for stdin) lazily and fingerprint it.

    The file is opened once: its bytes are hashed through that open file, which is then what polars
    scans (every later scan too), so the fingerprint is of the bytes parsed whatever happens to the
    path meanwhile; the path is taken literally (``r[1].csv``, ``~/x.csv``). A rewrite of the same
    file in place is caught by :meth:`InputTable.verify_unchanged`. Standard input is read into
    memory, hashed and parsed from those bytes.

    ``text_columns`` are read as strings from CSV and NDJSON, whatever the records hold, so their
    type is fixed by the query and never inferred from the data (one record could otherwise flip
    it, and with it an error or the output's types and order); codes such as block ids keep their
    leading zeros. Commands name every column they use; values are parsed per record afterwards
    (:func:`dpcli.bounding.numeric_value`), and those that do not parse are dropped. An NDJSON then
    has exactly these columns (it has no header, so it needs them: UsageError without) and is read
    record by record: a line that is not a JSON object (not JSON, an array, a number beyond the
    double range, nesting 128 levels deep, …) is a record of nulls that the per-record rules drop,
    never an error (:func:`dpcli.io.ndjson.scan_ndjson`). Parquet keeps its declared types (they are in the
    file's metadata, not inferred).

    A compressed file (``.gz``, ``.bz2``, ``.xz``) is hashed as it is on disk and decompressed in
    memory from those same bytes. ``delimiter`` splits CSV fields (None: the default of the file's name,
    see :func:`csv_delimiter`). The format, compression, delimiter and text columns are the table's
    :class:`Reading`, which enters the release seed with the fingerprint (:meth:`InputTable.seed_material`).
    ``early``: the same path
    already opened and being hashed (:func:`dpcli.io.opening.hash_early`), taken instead of opening
    it again.

    ``path`` may be a :class:`dpcli.access.Source` (a catalog entry resolved by name): its location is
    read, with the entry's format, delimiter and compression, and messages call it by its name.

    Raises :class:`InputMissingError` for a missing/unreadable file and :class:`DataError` for an
    empty one, one polars cannot parse as a whole (a CSV with an unterminated quote, a file that is
    not Parquet, a compressed file that does not decompress) or an NDJSON column name JSONPath
    cannot spell (the name alone decides; no NDJSON record can fail the run).
    """
    source = path if isinstance(path, Source) else Source(path, path)
    path, name = source.location, source.name
    input_format = source.format or input_format
    delimiter = source.delimiter or delimiter
    if path != "-" and os.path.isdir(path):
        return open_dataset(source, input_format)
    if public_pipe(source):
        return _open_public_pipe(source, input_format, text_columns, delimiter)
    if path != "-" and not source.public and source.entry is None and is_pipe(path):
        raise InputMissingError(f"input file {name!r} is a pipe: pipe data in with '-' (and --input-format unless "
                                "it is CSV)")
    fmt = input_format_for(path, input_format, name)
    if fmt == "ndjson" and not text_columns:
        raise UsageError(NDJSON_NEEDS_COLUMNS)
    reading = Reading.of(fmt, _compression_of(source), csv_delimiter(delimiter, path), text_columns)
    if path == "-":
        return _open_stdin(stdin or sys.stdin.buffer, reading)
    return _open_file(source, reading, _same_file(early, path))


def _same_file(early: EarlyInput | EarlyInputs | None, path: str) -> EarlyInput | None:
    """``early`` if it is ``path`` opened early, or the one of ``early`` that is (else the path is opened now)."""
    if isinstance(early, EarlyInputs):
        return early.get(path)
    return early if early is not None and early.path == path else None


def _compression_of(source: Source) -> str | None:
    """How the input's bytes are compressed: a catalog entry's declaration (``none``: not compressed,
    whatever the name), else the file name's suffix; standard input never is."""
    if source.location == "-":
        return None
    if source.compression:
        return _COMPRESSION_NAMES.get(source.compression)
    return _suffixes(source.location)[1]


def _open_stdin(stdin: IO[bytes], reading: Reading) -> InputTable:
    """Standard input, read into memory, hashed and parsed from those bytes."""
    data = stdin.read()
    if not data:
        raise DataError("standard input is empty")
    refuse_private(data[:32], "standard input", "-")
    return _open_bytes(data, reading, "<stdin>", "standard input")


def _open_bytes(data: bytes, reading: Reading, name: str, shown: str) -> InputTable:
    """Bytes held in memory (standard input, a pipe), hashed and parsed as ``reading`` says."""
    fingerprint = fingerprint_bytes(data)
    try:
        frame = _parse(data, reading)
        frame.collect_schema()
    except (pl.exceptions.PolarsError, OSError, ValueError, EOFError, lzma.LZMAError, zlib.error) as exc:
        raise DataError(f"cannot parse {shown} as {reading.format}: {withheld(exc)}") from None
    return InputTable(frame=frame, fingerprint=fingerprint, name=name, format=reading.format, reading=reading)


def public_pipe(source: Source) -> bool:
    """Is ``source`` a public list given as a pipe (``--keys <(…)``, a FIFO)? Read whole then, its format told by
    its first bytes (:func:`pipe_reading`). Never a data input, whose first record must not choose its parser,
    nor a catalog entry (the operator's locations are files)."""
    return source.public and source.entry is None and source.location != "-" and is_pipe(source.location)


#: How compressed bytes begin (a pipe's compression is not told by its name).
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


def pipe_reading(source: Source, data: bytes, delimiter: str | None = None,
                 text_columns: tuple[str, ...] = ()) -> Reading:
    """How a public pipe's bytes are read: as its name says (a FIFO named ``keys.csv``), else by its first bytes:
    Parquet's magic ``PAR1``, a JSON object (``{``) for NDJSON, else CSV. A list is public, so letting its bytes
    choose its parser tells nothing private. Compressed bytes are refused (decompress them in the pipe)."""
    suffix, compression = _suffixes(source.location)
    fmt = source.format or _INPUT_EXT.get(suffix)
    if fmt is None:
        if data.startswith(_COMPRESSED_MAGIC):
            raise UsageError(f"{source.name!r} is a pipe of compressed bytes: decompress them in the pipe "
                             "(zcat, bzcat, xzcat), or give the list as a file named .gz, .bz2 or .xz")
        head = data[:64].lstrip(b"\xef\xbb\xbf \t\r\n")
        fmt = "parquet" if data.startswith(b"PAR1") else "ndjson" if head.startswith(b"{") else "csv"
        compression = None
    return Reading.of(fmt, compression, csv_delimiter(delimiter, source.location), text_columns)


def _open_public_pipe(source: Source, input_format: str | None, text_columns: tuple[str, ...],
                      delimiter: str | None) -> InputTable:
    """A public list given as a pipe: read whole (once a run: :func:`dpcli.io.opening.read_pipe`), its format
    told by its name or its first bytes (:func:`pipe_reading`), hashed and parsed from those bytes."""
    data = read_pipe(source.location, "input file")
    if not data:
        raise DataError(f"input file {source.name!r} is empty")
    given = replace(source, format=source.format or input_format) if input_format else source
    reading = pipe_reading(given, data, delimiter, text_columns)
    if reading.format == "ndjson" and not text_columns:
        raise UsageError(NDJSON_NEEDS_COLUMNS)
    return replace(_open_bytes(data, reading, source.name, repr(source.name)), location=source.location)


def _open_file(source: Source, reading: Reading, early: EarlyInput | None) -> InputTable:
    """A file opened once (or taken from ``early``, already opened and being hashed): hashed through
    that open file, which is then what polars scans; closed with the table."""
    path, name = source.location, source.name
    fh, identity = (early.fh, early.identity) if early is not None else open_binary(source)
    try:
        if identity.size == 0:
            raise DataError(f"input file {name!r} is empty")
        try:
            fingerprint = fingerprint_fileobj(fh) if early is None else early.take()[2]
        except OSError as exc:
            raise InputMissingError(f"input file {name!r} is not readable ({os_reason(exc)})") from None
        if after_fingerprint_hook is not None:
            after_fingerprint_hook(path)
        try:
            frame = _parse(fh, reading)
            frame.collect_schema()
        except (pl.exceptions.PolarsError, OSError, ValueError, EOFError, lzma.LZMAError, zlib.error) as exc:
            raise DataError(f"cannot read {name!r} as {reading.format}: {withheld(exc)}") from None
    except BaseException:
        fh.close()
        raise
    table = InputTable(frame=frame, fingerprint=fingerprint, name=name, format=reading.format, reading=reading,
                       origin=source.entry, source=fh, identity=identity, location=path)
    weakref.finalize(table, fh.close)  # closed with the table (polars holds its own duplicate)
    return table
