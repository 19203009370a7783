"""An input's column names, read before a query is resolved: a CSV's header line, a Parquet footer.

``dpcli sql`` resolves the names of a query (which table an unqualified column belongs to) before
its release reads any data, and a table's column names are its schema, which is public. They are
read here through the gate like every input (:func:`dpcli.io.opening.open_binary`), without
hashing or parsing the records: only a CSV's first line (decompressed as far as needed) or a
Parquet file's schema. NDJSON declares no columns (None: the query's names are taken as given).
The release then opens the inputs itself, hashes the bytes it parses, and checks that every
column the resolved query reads is there. A dry run checks a data input's schema the same way
(:func:`declared_schema`: names and, for Parquet, the declared types), without reading a record.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import zlib
from dataclasses import replace
from typing import IO, cast

import polars as pl

from dpcli.access import Source
from dpcli.errors import DataError, UsageError, withheld
from dpcli.io.datasets import list_dataset
from dpcli.io.inputs import _suffixes, csv_delimiter, input_format_for, pipe_reading, public_pipe
from dpcli.io.opening import open_binary, read_pipe, refuse_private

#: The longest header line read (bytes).
MAX_HEADER_BYTES = 1 << 24
_COMPRESSION_NAMES = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz"}


def column_names(source: Source, input_format: str | None = None) -> tuple[str, ...] | None:
    """The column names of ``source`` (a file or a dataset directory); None for NDJSON."""
    if source.location == "-":
        raise UsageError(f"table {source.name!r}: dpcli sql reads tables from files or catalog names, not "
                         "standard input")
    if os.path.isdir(source.location):
        return _dataset_columns(source)
    if public_pipe(source):
        return _pipe_columns(source)
    fmt = input_format_for(source.location, source.format or input_format, source.name)
    if fmt == "ndjson":
        return None
    fh, _ = open_binary(source)
    with fh:
        try:
            if fmt == "parquet":
                return tuple(pl.read_parquet_schema(fh).keys())
            return _csv_header(fh, source)
        except (pl.exceptions.PolarsError, OSError, ValueError, EOFError, lzma.LZMAError, zlib.error) as exc:
            raise DataError(f"cannot read the columns of {source.name!r} as {fmt}: {withheld(exc)}") from None


def _pipe_columns(source: Source) -> tuple[str, ...] | None:
    """A public table given as a pipe: its bytes read whole (kept for the release: :func:`dpcli.io.opening.read_pipe`),
    its format told by its name or first bytes (:func:`dpcli.io.inputs.pipe_reading`)."""
    data = read_pipe(source.location, "input file")
    if not data.strip():
        raise DataError(f"table {source.name!r} is empty")
    fmt = pipe_reading(source, data).format
    if fmt == "ndjson":
        return None
    try:
        if fmt == "parquet":
            return tuple(pl.read_parquet_schema(io.BytesIO(data)).keys())
        return _csv_header(io.BytesIO(data), replace(source, compression="none"))
    except (pl.exceptions.PolarsError, OSError, ValueError, EOFError) as exc:
        raise DataError(f"cannot read the columns of {source.name!r} as {fmt}: {withheld(exc)}") from None


def declared_schema(source: Source) -> tuple[pl.Schema, str] | None:
    """The schema of ``source`` as a release would read it, and its format, without reading a record: a
    Parquet file's or dataset's declared types, a CSV header's names (every column read as text); None when
    it declares none or cannot be looked at before the release (NDJSON, standard input, a device or a pipe,
    whose first bytes would be consumed, a URI Spark lists, a file that does not exist yet: a plan may be made
    before its data)."""
    if source.location == "-" or not (os.path.isfile(source.location) or os.path.isdir(source.location)):
        return None
    if os.path.isdir(source.location):
        listing = list_dataset(source)  # (through the gate, walked from the directory's descriptor)
        try:
            return pl.Schema(pl.read_parquet_schema(listing.handles[0])), "parquet"
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise DataError(f"cannot read the columns of dataset {source.name!r}: {withheld(exc)}") from None
        finally:
            listing.close()
    fmt = input_format_for(source.location, source.format, source.name)
    if fmt == "ndjson" or (fmt == "parquet" and _compression(source) is not None):
        return None  # (a compressed Parquet file's footer is at the end of its plaintext)
    fh, _ = open_binary(source)
    with fh:
        try:
            if fmt == "parquet":
                return pl.Schema(pl.read_parquet_schema(fh)), fmt
            return pl.Schema(dict.fromkeys(_csv_header(fh, source), pl.String())), fmt
        except (pl.exceptions.PolarsError, OSError, ValueError, EOFError, lzma.LZMAError, zlib.error) as exc:
            raise DataError(f"cannot read the columns of {source.name!r} as {fmt}: {withheld(exc)}") from None


def _compression(source: Source) -> str | None:
    if source.compression:
        return _COMPRESSION_NAMES.get(source.compression)
    return _suffixes(source.location)[1]


def _decompressed(fh: IO[bytes], suffix: str | None) -> IO[bytes]:
    """The file's bytes as the release will read them (decompressed as they are read)."""
    if suffix == ".gz":
        return cast(IO[bytes], gzip.GzipFile(fileobj=fh))
    if suffix == ".bz2":
        return cast(IO[bytes], bz2.BZ2File(fh))
    if suffix == ".xz":
        return cast(IO[bytes], lzma.LZMAFile(fh))
    return fh


def _csv_header(fh: IO[bytes], source: Source) -> tuple[str, ...]:
    """A CSV's column names, parsed by polars from its first line (as the release will parse it)."""
    line = _decompressed(fh, _compression(source)).readline(MAX_HEADER_BYTES)
    if not line.strip():
        raise DataError(f"table {source.name!r} is empty")
    refuse_private(line[:32], "input file", source.name)
    separator = csv_delimiter(source.delimiter, source.location)
    frame = pl.read_csv(line, separator=separator, n_rows=0, encoding="utf8-lossy", truncate_ragged_lines=True)
    return tuple(frame.columns)


def _dataset_columns(source: Source) -> tuple[str, ...]:
    """A dataset directory's columns: its first Parquet file's (the release reads them all as one)."""
    listing = list_dataset(source)  # (through the gate, walked from the directory's descriptor)
    try:
        return tuple(pl.read_parquet_schema(listing.handles[0]).keys())
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise DataError(f"cannot read the columns of dataset {source.name!r}: {withheld(exc)}") from None
    finally:
        listing.close()
