"""Crash-safe file replacement: temp file in the same directory, fsync, rename, fsync dir.

An output that is not a file to replace (a device such as ``/dev/null``, a pipe, ``/dev/stdout``) is
written in place instead (:func:`writes_in_place`): renaming over it would put a regular file where the
device or the pipe was.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file
    (:func:`atomic_write_at` in ``path``'s directory)."""
    path = Path(path)
    fd = os.open(path.parent, _DIR_FLAGS)
    try:
        atomic_write_at(fd, path.name, data, mode)
    finally:
        os.close(fd)


def atomic_write_at(directory_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Replace the file ``name`` of the open directory ``directory_fd`` with ``data``, crash-safely.

    Steps: create a temp file (``mode``) next to it, write, fsync, rename over ``name``, fsync the
    directory; every step is relative to the descriptor, so the directory is never looked up by
    path again. The temp file is removed if anything fails before the rename.
    """
    tmp, fd = _new_temp(directory_fd, name)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=directory_fd)
        raise
    os.fsync(directory_fd)


def _new_temp(directory_fd: int, name: str) -> tuple[str, int]:
    """A new, empty temp file ``.NAME.RANDOM.tmp`` in the directory (0600 until the caller sets its mode)."""
    for _ in range(100):
        tmp = f".{name}.{os.urandom(4).hex()}.tmp"  # (not secrets.token_hex: the golden tests count its calls)
        try:
            return tmp, os.open(tmp, _NEW_FILE, 0o600, dir_fd=directory_fd)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {name}")


#: Directories whose entries are streams dpcli must write through, never replace: ``/dev`` (``/dev/stdout``
#: leads to whatever standard output is, a file too) and a process's descriptors.
_STREAM_DIRS = re.compile(r"/dev|/proc/(self|[0-9]+)/fd")


def writes_in_place(path: str | os.PathLike[str]) -> bool:
    """Is ``path`` written in place rather than replaced: an existing file that is not a regular one (a device,
    a FIFO, a socket), or any other entry of ``/dev`` or of a process's descriptors (``/dev/fd/3``), even one
    that does not exist (it is then refused as not writable, never created)? A directory never is (it is
    refused as one)."""
    try:
        mode: int | None = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        return False
    if mode is not None and not stat.S_ISREG(mode):
        return True
    return bool(_STREAM_DIRS.fullmatch(os.path.realpath(os.path.dirname(os.path.abspath(path)))))


def in_stream_dir(directory_fd: int, path: str | os.PathLike[str]) -> bool:
    """Is the open directory ``/dev`` or a process's descriptors (whose entries are streams, followed)? Asked of
    the descriptor (its path as the kernel has it now) where ``/proc`` says, else of ``path`` resolved."""
    try:
        where = os.readlink(f"/proc/self/fd/{directory_fd}")
    except OSError:
        where = os.path.realpath(path)
    return bool(_STREAM_DIRS.fullmatch(where))


def write_in_place_at(directory_fd: int, name: str, data: bytes, follow: bool,
                      check: Callable[[os.stat_result], None]) -> None:
    """Write ``data`` through the entry ``name`` of the open directory ``directory_fd`` (see
    :func:`writes_in_place`): opened for appending, never created or truncated (a pipe is written when a reader
    opens it); followed when ``follow`` (else a symlink there fails the open), and ``check`` given the opened
    file's ``fstat`` before a byte is written (it raises to refuse it)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(name, flags, dir_fd=directory_fd)
    with os.fdopen(fd, "wb") as fh:
        check(os.fstat(fd))
        fh.write(data)
