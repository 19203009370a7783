"""Dataset directories: a directory of Parquet files read as one input, walked and opened through descriptors (no path
below it is followed by name), each file hashed as read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import weakref
from pathlib import Path
from typing import IO

import polars as pl

from dpcli.access import Source, gate
from dpcli.access.walk import HIDDEN_PREFIXES, Below, Found, files_below
from dpcli.errors import (
    DataError,
    InputMissingError,
    UsageError,
    os_reason,
    withheld,
)
from dpcli.io.opening import (
    FileIdentity,
)
from dpcli.io.tables import InputTable, Reading

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
