"""An opened input (:class:`InputTable`) and how its bytes were read (:class:`Reading`): the bytes hashed are the
bytes parsed, and both enter the seed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import polars as pl

from dpcli.errors import (
    InputMissingError,
)
from dpcli.io.opening import (
    FileIdentity,
)

if TYPE_CHECKING:
    from dpcli.io.datasets import DatasetListing


InputFormat = Literal["csv", "parquet", "ndjson"]


@dataclass(frozen=True)
class Reading:
    """How an input's bytes are parsed: everything besides the bytes that shapes its frame.

    It is all the parser gets (:func:`dpcli.io.inputs.open_input`'s parser takes a Reading), and all of it
    enters the release seed with the bytes' fingerprint (:meth:`InputTable.seed_material`): the same bytes read
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
    #: A dataset directory: the directory and its files, held open (what is read:
    #: :func:`dpcli.io.datasets.open_dataset`).
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
        """A directory of Parquet files, fingerprinted by a manifest (see :func:`dpcli.io.datasets.open_dataset`)."""
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


def fingerprint_bytes(data: bytes) -> str:
    """The fingerprint of bytes held in memory (standard input, a spec)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()
