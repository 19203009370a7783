"""Opening an input file once, and hashing it while the rest of dpcli loads.

Every input is opened once, by its literal path, and the open file is both hashed (the
fingerprint that enters the release seed) and handed to the parser (:mod:`dpcli.files`). This
module holds that first step without importing polars or numpy, so a command can start it
before they load: :func:`hash_early` opens the data file and hashes it on a background thread
(``hashlib`` releases the interpreter lock while it hashes), and the 0.1 s or so of imports
that follow run alongside; :func:`dpcli.io.inputs.open_input` then takes the same open file and
waits for its digest. Nothing about the file is reported before then: a path that cannot be
opened here is simply opened again, and reported, by ``open_input`` in its usual order.
"""

from __future__ import annotations

import hashlib
import os
import select
import stat
import threading
import weakref
from dataclasses import dataclass
from typing import IO

from dpcli.access import Source
from dpcli.access.writes import is_private_file
from dpcli.errors import DpcliError, InputMissingError, UsageError, os_reason


@dataclass(frozen=True)
class FileIdentity:
    """What ``fstat`` says about an open input: enough to notice a rewrite of the same inode."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def refuse_private(head: bytes, what: str, path: str) -> None:
    """Refuse (exit 66) an input whose first bytes are those of a key, ledger or state file."""
    if is_private_file(head):
        raise InputMissingError(f"{what} {path!r} is one of dpcli's private files (a key, ledger or state): "
                                "dpcli never reads them as input")


def open_binary(path: str | Source, what: str = "input file") -> tuple[IO[bytes], FileIdentity]:
    """Open ``path`` exactly as written (no ``~`` or glob expansion) for reading, once.

    Every open of a path dpcli reads for its caller passes here, so here the caller's rights are
    asked first (:meth:`dpcli.access.Gate.open`: in service mode only what a catalog name resolved
    to, as a :class:`dpcli.access.Source`, or a release in an output directory; in personal mode
    nothing in the state directory), and a file that begins like a key, ledger or state file is
    refused wherever it lies (a copy or a hard link of one). Messages call a Source by its name
    (a catalog location is private), a path as given.

    Refuses, as :class:`InputMissingError`, a missing or unreadable path, a directory and anything
    that is not a regular file (a FIFO would block or be consumed by the hash: use ``-``); opening
    with ``O_NONBLOCK`` keeps a FIFO from blocking before it can be refused. Returns the file (an
    exact ``io.BufferedReader`` at offset 0) and its identity at open.
    """
    from dpcli.access import gate

    shown = path.name if isinstance(path, Source) else path
    try:
        fd = gate().open(path, what, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputMissingError(f"{what} {shown!r} does not exist") from None
    except IsADirectoryError:
        raise InputMissingError(f"{what} {shown!r} is a directory, not a file") from None
    except OSError as exc:
        raise InputMissingError(f"{what} {shown!r} is not readable ({os_reason(exc)})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputMissingError(f"{what} {shown!r} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise InputMissingError(f"{what} {shown!r} is not a regular file (pipe data in with '-')")
        refuse_private(os.pread(fd, 32, 0), what, shown)
        os.set_blocking(fd, True)
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return fh, FileIdentity.of(st)


#: The most bytes read from a pipe (it is held in memory): a public list or a query file larger than this is a file.
PIPE_LIMIT = 1 << 30


def is_pipe(path: str) -> bool:
    """Is ``path`` a pipe or FIFO (``<(…)``'s ``/dev/fd/63``, a ``mkfifo`` name)? (Followed; False when absent.)"""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_pipe(path: str, what: str, limit: int = PIPE_LIMIT) -> bytes:
    """The bytes of the pipe ``path`` (through the gate, as :func:`open_binary` opens a file), read to its end
    once per run: read again, the same bytes (:attr:`dpcli.access.Gate.pipes`). For public inputs only (a list,
    a query file: never a data input, which is read from a file or ``-``). A pipe with no writer yet is waited
    for; one of more than ``limit`` bytes, or one that begins like a key, ledger or state file, is refused."""
    from dpcli.access import gate

    g = gate()
    if path in g.pipes:
        return g.pipes[path]
    try:
        fd = g.open(path, what, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputMissingError(f"{what} {path!r} is not readable ({os_reason(exc)})") from None
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise InputMissingError(f"{what} {path!r} is not a regular file or a pipe")
        poller = select.poll()  # (a FIFO no writer has opened yet reads as its end: wait for one)
        poller.register(fd, select.POLLIN | select.POLLHUP)
        poller.poll()
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UsageError(f"{what} {path!r}: a pipe of more than {limit >> 20} MiB; write it to a file first")
    except OSError as exc:
        raise InputMissingError(f"{what} {path!r} is not readable ({os_reason(exc)})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    refuse_private(data[:32], what, path)
    g.pipes[path] = data
    return data


#: Bytes read and hashed at a time. Large, because a hashing thread takes the interpreter lock
#: back after each read and each update, and waits up to a switch interval (5 ms) each time while
#: the main thread runs Python; at 8 MiB a 100 MB file takes about 25 such waits, not 800.
CHUNK = 8 << 20


def fingerprint_fileobj(fh: IO[bytes]) -> str:
    """Streamed SHA-256 of an open binary file from its start; leaves it at offset 0."""
    fh.seek(0)
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while n := fh.readinto(buffer):  # type: ignore[attr-defined]
        digest.update(view[:n])
    fh.seek(0)
    return "sha256:" + digest.hexdigest()


class EarlyInput:
    """A regular file opened by :func:`hash_early`, being hashed on a background thread.

    :func:`dpcli.io.inputs.open_input` takes it (:meth:`take`): the same open file, its identity at
    open, and its fingerprint once the thread is done. A file never taken is closed when this
    object is collected.
    """

    def __init__(self, path: str, fh: IO[bytes], identity: FileIdentity) -> None:
        self.path = path
        self.fh = fh
        self.identity = identity
        self._digest: str | None = None
        self._error: Exception | None = None
        self._taken = False
        self._thread = threading.Thread(target=self._hash, name="dpcli-hash", daemon=True)
        self._closer = weakref.finalize(self, fh.close)
        self._thread.start()

    def _hash(self) -> None:
        try:
            self._digest = fingerprint_fileobj(self.fh)
        except Exception as exc:  # noqa: BLE001 (kept for the taker; a thread must not print it)
            self._error = exc

    def take(self) -> tuple[IO[bytes], FileIdentity, str]:
        """The open file (at offset 0), its identity at open and its fingerprint; once.

        Raises the exception the hash met, if any (an ``OSError`` the caller reports as it would its own).
        """
        if self._taken:
            raise RuntimeError("an early input is taken once")
        self._taken = True
        self._thread.join()
        self._closer.detach()  # the caller owns the file now
        if self._error is not None:
            raise self._error
        assert self._digest is not None
        return self.fh, self.identity, self._digest


class EarlyInputs:
    """Several inputs opened by :func:`hash_early`, each hashed on a thread of its own (``sql``'s tables, hashed
    side by side while dpcli loads and resolves the query): :func:`dpcli.io.inputs.open_input` takes each by its
    path, once; one never taken is closed when collected."""

    def __init__(self, inputs: list[EarlyInput]) -> None:
        self._by_path = {e.path: e for e in inputs}

    def get(self, path: str) -> EarlyInput | None:
        """The input opened early at ``path`` (given once; None after, or for a path not opened early)."""
        return self._by_path.pop(path, None)


def hash_early(path: str | Source | None, read: bool = True) -> EarlyInput | None:
    """Open ``path`` (a resolved :class:`dpcli.access.Source`, or a path) and start hashing it in the
    background, or None when that is not for now.

    None for standard input (``-``), a URI, a directory (a dataset), when ``read`` is false (a
    dry run reads no data; another engine reads the input itself), for any path
    :func:`open_binary` refuses (the normal open reports it then, in its usual order) and when no
    thread can be started (the hash is only early, never required).
    """
    if not read or path is None:
        return None
    location = path.location if isinstance(path, Source) else path
    if location == "-" or "://" in location:
        return None
    try:
        fh, identity = open_binary(path)
    except DpcliError:  # refused or unreadable: the normal open reports it, in its order
        return None
    if identity.size == 0:
        fh.close()
        return None
    try:
        return EarlyInput(location, fh, identity)
    except RuntimeError:  # no thread to be had (a pids limit): the normal open hashes it, as before
        fh.close()
        return None
