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
import contextlib
import errno
import gzip
import hashlib
import json
import lzma
import os
import secrets
import sys
import weakref
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal

import polars as pl

from dpcli.access import Source, gate
from dpcli.access.walk import Below, Found, files_below
from dpcli.errors import (
    DataError,
    InputMissingError,
    UsageError,
    os_reason,
    type_text,
    withheld,
)
from dpcli.io.ndjson import NDJSON_NEEDS_COLUMNS, scan_ndjson
from dpcli.io.opening import (
    EarlyInput,
    FileIdentity,
    fingerprint_fileobj,
    is_pipe,
    open_binary,
    read_pipe,
    refuse_private,
)

InputFormat = Literal["csv", "parquet", "ndjson"]
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


@dataclass(frozen=True)
class Reading:
    """How an input's bytes are parsed: everything besides the bytes that shapes its frame.

    It is all the parser gets (:func:`_parse` takes a Reading), and all of it enters the release
    seed with the bytes' fingerprint (:meth:`InputTable.seed_material`): the same bytes read
    another way (a file valid as CSV and as NDJSON, another delimiter, a ``.gz`` name) are another
    input, with other noise. Build it with :meth:`of`, which keeps only what the format uses.
    """

    format: str
    #: The compression suffix dpcli decompresses (``.gz``, ``.bz2``, ``.xz``), or None.
    compression: str | None = None
    #: The CSV field separator (None for other formats).
    delimiter: str | None = None
    #: Columns read as text from CSV and NDJSON (see :func:`open_input`); () for Parquet.
    text_columns: tuple[str, ...] = ()

    @classmethod
    def of(cls, fmt: str, compression: str | None = None, delimiter: str = ",",
           text_columns: tuple[str, ...] = ()) -> Reading:
        """The reading of a ``fmt`` input: the delimiter for CSV only, text columns for CSV and NDJSON only."""
        return cls(fmt, compression, delimiter if fmt == "csv" else None,
                   tuple(text_columns) if fmt in ("csv", "ndjson") else ())


@dataclass(frozen=True)
class InputTable:
    """A validated-to-open input: a lazy frame plus the fingerprint of its bytes and how they were read.

    For a file, ``source`` is the one open file object that was both hashed and handed to polars
    (every scan of ``frame`` reads that open file, never the path again), and ``identity`` its
    ``fstat`` at open; :meth:`verify_unchanged` checks it before a release is charged.
    :meth:`seed_material` is what of it enters a release seed.
    """

    frame: pl.LazyFrame
    fingerprint: str
    #: What messages, summaries and ledger lines call it: a catalog name, or the path as given.
    name: str
    format: str
    #: How the bytes were parsed; None: by ``format`` alone (a Parquet dataset, a URI Spark listed).
    reading: Reading | None = None
    #: The catalog entry (dataset name, location, format, delimiter, compression, privacy unit) when
    #: the input was opened by a catalog name; it enters the seed with the bytes.
    origin: dict[str, Any] | None = None
    source: IO[bytes] | None = field(default=None, compare=False, repr=False)
    identity: FileIdentity | None = field(default=None, compare=False, repr=False)
    #: A dataset directory: its Parquet files (sorted) and their identities when listed.
    files: tuple[Path, ...] = field(default=(), compare=False, repr=False)
    file_identities: tuple[FileIdentity, ...] = field(default=(), compare=False, repr=False)
    #: A dataset directory: the directory and its files, held open (what is read: see :func:`open_dataset`).
    listing: DatasetListing | None = field(default=None, compare=False, repr=False)
    #: A URI listed by Spark (:func:`dpcli.spark.inputs.open_uri`): the files Spark reads, as Spark names them.
    uris: tuple[str, ...] = field(default=(), compare=False, repr=False)
    #: Where it was read: the path, dataset directory or URI (``name`` when empty).
    location: str = field(default="", compare=False)

    @property
    def where(self) -> str:
        """The path, directory or URI read (never shown to a service-mode analyst: see ``name``)."""
        return self.location or self.name

    def __post_init__(self) -> None:
        if self.reading is not None and self.reading.format != self.format:
            raise ValueError(f"input {self.name!r}: read as {self.reading.format}, labelled {self.format}")

    def reading_material(self) -> dict[str, Any]:
        """How the bytes were read: every field of its :class:`Reading` and, when the input came
        from a catalog, its entry (``origin``). Plain JSON data (lists, not tuples): a stream's
        state stores it and compares it with a later run's."""
        reading = asdict(self.reading or Reading(self.format))
        material: dict[str, Any] = {"reading": {**reading, "text_columns": list(reading["text_columns"])}}
        if self.origin is not None:
            material["origin"] = dict(self.origin)
        return material

    def seed_material(self) -> dict[str, Any]:
        """What of this input enters a release seed: its bytes' fingerprint and :meth:`reading_material`."""
        return {"fingerprint": self.fingerprint, **self.reading_material()}

    @property
    def is_dataset(self) -> bool:
        """A directory of Parquet files, fingerprinted by a manifest (see :func:`open_dataset`)."""
        return bool(self.files)

    def verify_unchanged(self) -> None:
        """Refuse (exit 66) if the open input was modified since it was opened and hashed.

        Call after every read of ``frame`` and before the ledger is charged. A symlink swapped or a
        file renamed over the path changes nothing that is read (the file is held open); a rename
        over it still unlinks the open file, which moves its ctime, and is refused too. The same
        inode rewritten in place would change what is read; its size, mtime or ctime then differ
        (a same-size rewrite within one tick of a coarse file-system clock could go unnoticed; on
        Linux 6.13+ ext4/xfs/btrfs/tmpfs the times are fine-grained once queried, as here at open).
        """
        if self.listing is not None:
            if not self.listing.unchanged():
                raise InputMissingError(f"dataset {self.name!r} changed while it was read; rerun")
            return
        if self.source is None or self.identity is None:
            return
        try:
            now = FileIdentity.of(os.fstat(self.source.fileno()))
        except (OSError, ValueError):
            now = None
        if now != self.identity:
            raise InputMissingError(f"input {self.name!r} changed while it was read; rerun")


def verify_unchanged(*inputs: InputTable | None) -> None:
    """:meth:`InputTable.verify_unchanged` for each input given (None entries are skipped)."""
    for table in inputs:
        if table is not None:
            table.verify_unchanged()


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


def fingerprint_bytes(data: bytes) -> str:
    """The fingerprint of bytes held in memory (standard input, a spec)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


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
    early: EarlyInput | None = None,
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


def _same_file(early: EarlyInput | None, path: str) -> EarlyInput | None:
    """``early`` if it is ``path`` opened early (else the path is opened now)."""
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


#: Names below a dataset directory that hold no data, and are not looked into (Hadoop's rule: ``_SUCCESS``,
#: ``.crc``, ``_temporary/``).
HIDDEN_PREFIXES = (".", "_")
#: Descriptors a process may hold open, raised towards this (or its hard limit) before a dataset is walked:
#: each of its files is held open twice (dpcli's descriptor and polars' duplicate).
_OPEN_FILES_WANTED = 1 << 16


class DatasetListing:
    """A dataset directory opened once (through the gate, :meth:`dpcli.access.Gate.open_directory`) and
    walked from that descriptor (:func:`dpcli.access.walk.files_below`): no symlink anywhere below, and in
    service mode every sub-directory and file owned and writable by root and the service account only.
    Its data files are held open (``handles``, sorted by their path below the directory): they, never
    their paths, are what is read. Descriptors are closed with the listing (or by :meth:`close`)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        _allow_open_files()
        self.root, self.trusted = _open_dataset_dir(source)
        self._closer = weakref.finalize(self, os.close, self.root)
        found = self._walk(open_files=True)
        self.relative = tuple(f.relative for f in found)
        self.identities = tuple(FileIdentity.of(f.st) for f in found)
        self.handles: tuple[IO[bytes], ...] = tuple(os.fdopen(f.fd, "rb") for f in found if f.fd is not None)
        self._files_closer = weakref.finalize(self, _close_handles, self.handles)

    def _walk(self, open_files: bool) -> list[Found]:
        """The walk of the open directory; a refusal in one line (the gate's) for what lies below."""
        name = self.source.name
        try:
            return files_below(self.root, self.trusted, HIDDEN_PREFIXES, open_files)
        except Below as below:
            raise gate().below_refusal("dataset", self.source, below.why) from None
        except OSError as exc:
            if exc.errno == errno.EMFILE:
                raise InputMissingError(f"dataset {name!r} holds more files than dpcli may hold open at once "
                                        "(ulimit -n): compact it into fewer, larger files") from None
            raise InputMissingError(f"dataset {name!r} is not readable ({os_reason(exc)})") from None

    @property
    def paths(self) -> tuple[Path, ...]:
        """The files' paths (for Spark, which reads by path: see :func:`dpcli.spark.engine.spark_paths`)."""
        return tuple(Path(self.source.location) / r for r in self.relative)

    def unchanged(self) -> bool:
        """Does a walk of the directory now (from the same descriptor, files not opened) find the same files,
        with the same identities?"""
        try:
            now = files_below(self.root, self.trusted, HIDDEN_PREFIXES, open_files=False)
        except (Below, OSError):
            return False
        return (tuple(f.relative for f in now) == self.relative
                and tuple(FileIdentity.of(f.st) for f in now) == self.identities)

    def close(self) -> None:
        self._files_closer()
        self._closer()


def _close_handles(handles: tuple[IO[bytes], ...]) -> None:
    for fh in handles:
        fh.close()


def _open_dataset_dir(source: Source) -> tuple[int, frozenset[int] | None]:
    """The dataset directory opened through the gate, and who may own what lies below it (None: unchecked)."""
    try:
        return gate().open_directory(source, "dataset")
    except FileNotFoundError:
        raise InputMissingError(f"dataset {source.name!r} does not exist") from None
    except OSError as exc:
        raise InputMissingError(f"dataset {source.name!r} is not readable ({os_reason(exc)})") from None


def _allow_open_files() -> None:
    """Raise this process's limit of open descriptors (its soft limit, up to the hard one) so that a dataset's
    files can be held open; a limit that cannot be raised is left (a dataset too large for it is refused)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, _OPEN_FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _footer_digest(fh: IO[bytes], size: int, name: str) -> str:
    """SHA-256 of a Parquet file's footer (its schema, row groups and statistics), read from its end through
    the open file that polars reads (``pread``: its offset is left alone)."""
    fd = fh.fileno()
    tail = os.pread(fd, 8, max(0, size - 8))
    length = int.from_bytes(tail[:4], "little")
    if size < 12 or tail[4:] != b"PAR1" or length > size - 12:
        raise DataError(f"dataset {name!r} holds a file that is not Parquet")
    return hashlib.sha256(os.pread(fd, length, size - 8 - length)).hexdigest()


def list_dataset(source: Source) -> DatasetListing:
    """The dataset's data files (:class:`DatasetListing`), every one named as Parquet (names below the
    directory can be data, hive partitions such as diagnosis=…: messages never quote them)."""
    listing = DatasetListing(source)
    if not listing.relative:
        listing.close()
        raise InputMissingError(f"dataset {source.name!r} holds no data files")
    if any(r.suffix.lower() not in (".parquet", ".pq") for r in listing.relative):
        listing.close()
        raise UsageError(f"dataset {source.name!r} holds a file without a .parquet name: a dataset holds Parquet "
                         "files only")
    return listing


def open_dataset(directory: str | Source, input_format: str | None = None) -> InputTable:
    """A directory of Parquet files (a partitioned dataset) as one input: a path, or a
    :class:`dpcli.access.Source` (a catalog name: messages call it so, never by its location).

    The directory is opened once and walked from that descriptor (:func:`list_dataset`): a symlink
    anywhere below it is refused (in both modes: a dataset is read from its own files), and in service
    mode so is a sub-directory or file someone but root and the service account could change. Its files
    are read through the descriptors opened in the walk, never by path (no hive-partition columns are
    added). Hashing every byte of a large dataset is not possible, so its fingerprint is a manifest:
    each file's relative path, size, modification time and the SHA-256 of its Parquet footer, read
    through the same open file polars reads. A manifest does not prove the content (a file rewritten
    with the same size, time and footer would not show), so a release over a dataset never replays an
    earlier one: the fingerprint ends with a fresh random nonce, so every run, of every command, is new
    noise and a new charge. The listing and each file's identity are checked again, from the same
    directory descriptor, before the charge (:meth:`InputTable.verify_unchanged`).
    """
    source = directory if isinstance(directory, Source) else Source(directory, directory)
    name = source.name
    if (source.format or input_format) not in (None, "parquet"):
        raise UsageError("a dataset directory is read as Parquet files", field="input_format")
    listing = list_dataset(source)
    try:
        manifest = [[str(r), i.size, i.mtime_ns, _footer_digest(fh, i.size, name)]
                    for r, i, fh in zip(listing.relative, listing.identities, listing.handles, strict=True)]
        digest = hashlib.sha256(json.dumps(manifest, separators=(",", ":")).encode()).hexdigest()
        fingerprint = f"manifest:{digest}; run {secrets.token_hex(16)}"  # never a replay: see above
        try:
            frame = pl.scan_parquet(list(listing.handles), glob=False, hive_partitioning=False)
            frame.collect_schema()
        except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
            raise DataError(f"cannot read {name!r} as Parquet: {withheld(exc)}") from None
    except BaseException:
        listing.close()
        raise
    return InputTable(frame=frame, fingerprint=fingerprint, name=name, format="parquet",
                      reading=Reading.of("parquet"), origin=source.entry, files=listing.paths,
                      file_identities=listing.identities, listing=listing, location=source.location)


ColumnKind = Literal["any", "numeric", "value", "temporal", "key"]


def header_is_text(names: Sequence[str]) -> bool:
    """Do these column names look like a written header (printable text, not raw bytes)?

    A Parquet or compressed file read as CSV yields a "header" of binary bytes from its first
    line, which can hold encoded records: such names are never printed.
    """
    return all(len(n) <= 256 and "\ufffd" not in n and n.isprintable() for n in names)


#: Formats whose columns carry declared types: a Parquet file or dataset, Parquet files Spark read. A column's
#: type there is schema (public, the same for every dataset of that schema); CSV and NDJSON declare none (every
#: column a query reads is read as text, and parsed per record).
TYPED_FORMATS = frozenset({"parquet", "spark-parquet"})


def require_columns(table: InputTable, columns: dict[str, ColumnKind]) -> pl.Schema:
    """Check that each column exists with a usable type (:func:`check_schema`); the table's schema.

    Only the schema is looked at (a Parquet footer, a CSV header), before anything is charged.
    """
    try:
        schema = table.frame.collect_schema()
    except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
        raise DataError(f"cannot read {table.name}: {withheld(exc)}") from None
    delimiter = table.reading.delimiter if table.reading else None
    check_schema(schema, columns, SchemaOf(table.name, table.format, delimiter))
    return schema


@dataclass(frozen=True)
class SchemaOf:
    """Whose schema :func:`check_schema` checks: the name messages use, its format, and a CSV's delimiter."""

    name: str
    format: str
    delimiter: str | None = None

    @property
    def typed(self) -> bool:
        """Are its column types schema (:data:`TYPED_FORMATS`)?"""
        return self.format in TYPED_FORMATS


def check_schema(schema: pl.Schema, columns: dict[str, ColumnKind], of: SchemaOf) -> None:
    """Each of ``columns`` must be in ``schema`` with a type its kind can use; name the offender otherwise.

    Kinds: ``numeric`` (a numeric type), ``value`` (a column aggregated: in a typed format such as Parquet
    a numeric type, since the type is schema and :func:`dpcli.bounding.numeric_value` aggregates no other:
    text, booleans, dates, times, durations, binary, categorical and nested columns are refused; in CSV
    and NDJSON, whose columns are read as text, text parsed per record), ``temporal`` (timestamps, numbers
    or text), ``key`` (anything but nested types), ``any``. The same rule for a release (the opened input's
    schema) and a dry run (the schema read without the records: :func:`dpcli.io.columns.declared_schema`).
    In service mode the message names neither the column's type nor any other column.
    """
    for col, kind in columns.items():
        if col not in schema:
            raise _missing_column(of, list(schema.names()), col)
        dtype = schema[col]
        usable, refusal = _COLUMN_KINDS.get("numeric" if kind == "value" and of.typed else kind, (None, ""))
        if usable is not None and not usable(dtype):
            if gate().restricted:  # a service-mode analyst: the column's type is not theirs to read
                raise DataError(f"column {col!r} of {of.name} cannot be used as asked (a {kind} column)")
            raise DataError(refusal.format(col=col, type=type_text(dtype), name=of.name))


#: Column kind → (is a column of this type usable?, the error otherwise). ``any`` takes every type.
_COLUMN_KINDS: dict[str, tuple[Callable[[pl.DataType], bool], str]] = {
    "numeric": (lambda t: t.is_numeric(), "column {col!r} must be numeric but is {type} in {name}"),
    "value": (lambda t: t.is_numeric() or t == pl.String,
              "column {col!r} must be numeric (or text holding numbers) but is {type} in {name}"),
    "temporal": (lambda t: t.is_temporal() or t.is_numeric() or t == pl.String,
                 "column {col!r} must hold timestamps but is {type} in {name}"),
    "key": (lambda t: not t.is_nested(), "column {col!r} is a nested {type} and cannot be grouped by in {name}"),
}


def _missing_column(of: SchemaOf, names: list[str], col: str) -> DataError:
    """The error for a column the input lacks: its other columns named, the closest one suggested, and a
    header that another delimiter would split pointed out, unless the names are binary bytes read as a
    header (never echoed) or private (a service-mode analyst's: nothing about them is said)."""
    restricted = gate().restricted  # a service-mode analyst: no hint from the header (it would pick the message)
    sep = None if restricted else _splitting_delimiter(of, names)
    if not header_is_text(names) and sep is None:
        return DataError(f"{of.name} does not look like {of.format}: its first line is not a header of "
                         "column names (Parquet or compressed data? give --input-format, or a .gz/.bz2/.xz "
                         "name)")
    if restricted:
        return DataError(f"column {col!r} not found in {of.name}")
    if sep is not None:
        shown = "tab" if sep == "\t" else repr(sep)
        return DataError(f"{shown} is probably needed: column {col!r} not found in {of.name}, whose header is "
                         f"one column that {shown} splits into {len(names[0].split(sep))}", field="delimiter")
    return DataError(f"column {col!r} not found in {of.name}{did_you_mean(col, names)} "
                     f"(columns: {listed(names)})")


def listed(names: Sequence[str], shown: int = 12) -> str:
    """``names`` joined by commas, the first ``shown`` of them and then how many more there are
    (``a, b, … and 7 more``): a long header in one line, saying it is cut."""
    head = ", ".join(names[:shown])
    return head if len(names) <= shown else f"{head}, … and {len(names) - shown} more"


#: Field separators a CSV header read as one column is tried with (:func:`_splitting_delimiter`).
_LIKELY_DELIMITERS = (";", "\t", "|", ",")


def _splitting_delimiter(of: SchemaOf, names: list[str]) -> str | None:
    """The separator that splits a CSV header read as one column into the most columns of text, if another
    one does (a file separated by ';' read with ','). The header is the schema: public in personal mode."""
    if of.format != "csv" or len(names) != 1:
        return None
    used = of.delimiter or ","
    splits = {sep: parts for sep in _LIKELY_DELIMITERS
              if sep != used and len(parts := names[0].split(sep)) > 1 and header_is_text(parts)}
    return max(splits, key=lambda sep: len(splits[sep])) if splits else None


def did_you_mean(col: str, names: Sequence[str]) -> str:
    """`` (did you mean 'country'?)`` for the name in ``names`` closest to ``col``, or nothing: for messages
    that may show the input's column names (never to a service-mode analyst: the caller checks)."""
    import difflib

    close = difflib.get_close_matches(col, list(names), n=1, cutoff=0.6)
    if not close:
        folded = {n.casefold(): n for n in names}
        close = [folded[col.casefold()]] if col.casefold() in folded else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_group_list(table: InputTable, by: tuple[str, ...], data_schema: pl.Schema) -> pl.DataFrame:
    """A public list of groups (``--keys``/``--domain``): distinct rows of the ``by`` columns,
    cast to the data's column types, sorted.

    Open the list with ``text_columns=by`` so that its codes are read as written: against a CSV or
    NDJSON input (whose group columns are text) values then match as text, exactly (``01`` is not
    ``1``); against a Parquet input they are cast to its declared types (``01`` → 1 for an integer
    column), and a value that does not cast is an error naming the list (the list is public).
    """
    schema = table.frame.collect_schema()
    missing = [c for c in by if c not in schema]
    if missing:
        raise DataError(f"{table.name} lacks column {missing[0]!r} (a list of groups needs: {', '.join(by)})")
    try:
        groups = table.frame.select([pl.col(c).cast(data_schema[c], strict=True) for c in by]).unique().collect()
    except pl.exceptions.PolarsError as exc:
        raise DataError(f"{table.name}: values do not match the data's column types ({type(exc).__name__}; "
                        "the parser's message is withheld)") from None
    if groups.height == 0:
        raise DataError(f"{table.name} lists no groups")
    table.verify_unchanged()  # the whole list has been read: it is the list that was hashed
    return groups.sort(list(by), nulls_last=True)
