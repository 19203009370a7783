"""An output written through its directory, opened once and checked on that descriptor.

For a caller whose outputs the catalog does not limit (personal mode, an operator), :meth:`dpcli.access.Gate.write`
opens the output's directory once (by path: symlinks followed, as the caller may) and checks that descriptor:
neither it nor an ancestor (by device and inode, through ``..``) is the state directory or one of the run's
input datasets, and the name in it is no input and none of dpcli's private files (:class:`OutputError`, exit 73).
The write is then made relative to it, so a directory on the path swapped after the check cannot lead it
elsewhere. These are the gate's steps; what they protect (``state_dir``, ``protected``) is the gate's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC
_UP_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC
#: How dpcli's own private files begin: the secret key, a ledger and its mark, and every checked
#: state document (stream states, schedules, the catalog). None is ever read as an input, nor replaced by an output.
_PRIVATE_HEADS = (b"dpcli-secret-key", b'{"schema_version": ', b'{"ledger_id": ', b'{"format": "dpcli-',
                  b'{\n "format": "dpcli-')


def is_private_file(head: bytes) -> bool:
    """Do these first bytes of a file look like one of dpcli's private files (key, ledger, state)?"""
    return head.lstrip(b"\xef\xbb\xbf").startswith(_PRIVATE_HEADS)

def checked_parent(target: Path, what: str, state_dir: Path | None, protected: set[tuple[int, int]]) -> int:
    """The directory of ``target`` opened once and checked on that descriptor (the module docstring): not in
    ``state_dir`` nor below a ``protected`` directory, and ``target``'s name in it no ``protected`` file and none
    of dpcli's private files (:class:`OutputError`, exit 73). The caller closes it."""
    fd = os.open(target.parent, _DIR_FLAGS)
    try:
        refuse_below_protected(fd, str(target), what, state_dir, protected)
        refuse_protected_entry(fd, target.name, str(target), what, protected)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_through(target: Path, data: bytes, what: str, state_dir: Path | None,
                  protected: set[tuple[int, int]]) -> None:
    """A device or a pipe (:func:`dpcli.state.atomic.writes_in_place`) written in place, through its directory
    opened once and checked as :func:`checked_parent` checks it. In ``/dev`` or a process's descriptors
    (what the descriptor's directory is now, not its path) the name is followed (``/dev/stdout``), and a
    regular file it leads to must be none of the run's inputs; anywhere else the name is not followed and
    must still be no regular file (one swapped in since the check is refused, never appended to)."""
    from dpcli.errors import OutputError
    from dpcli.state.atomic import in_stream_dir, write_in_place_at

    directory = os.open(target.parent, _DIR_FLAGS)
    try:
        refuse_below_protected(directory, str(target), what, state_dir, protected)
        stream = in_stream_dir(directory, target.parent)

        def check(st: os.stat_result) -> None:
            if stat.S_ISREG(st.st_mode) and (not stream or (st.st_dev, st.st_ino) in protected):
                raise OutputError(f"{what} {str(target)!r} is a regular file now (a device or a pipe when "
                                  "checked): write it elsewhere")

        write_in_place_at(directory, target.name, data, follow=stream, check=check)
    finally:
        os.close(directory)


def refuse_below_protected(fd: int, path: str, what: str, state_dir: Path | None,
                           protected: set[tuple[int, int]]) -> None:
    """Refuse when the open directory ``fd`` is, or lies below, the state directory or an input dataset."""
    from dpcli.errors import OutputError

    state = _identity(state_dir)
    for key in _ancestry(fd):
        if key == state:
            raise OutputError(f"{what} {path!r} lies inside the state directory; write it elsewhere")
        if key in protected:
            raise OutputError(f"{what} {path!r} lies inside one of the run's input datasets; write it elsewhere")


def refuse_protected_entry(fd: int, name: str, path: str, what: str, protected: set[tuple[int, int]]) -> None:
    """Refuse when the entry ``name`` of the open directory ``fd`` (not followed: it is what is replaced)
    is one of the run's inputs, or a key, ledger or state file."""
    from dpcli.errors import OutputError

    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if (st.st_dev, st.st_ino) in protected:
        raise OutputError(f"{what} {path!r} is one of the run's inputs; write it elsewhere")
    if not stat.S_ISREG(st.st_mode):
        return
    try:
        entry = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return  # (one dpcli cannot read is none of its private files, which it reads: replaced as before)
    try:
        head = os.pread(entry, 32, 0)
    finally:
        os.close(entry)
    if is_private_file(head):
        raise OutputError(f"{what} {path!r} is one of dpcli's private files (a key, ledger or state); "
                          "write it elsewhere")


def _identity(path: Path | None) -> tuple[int, int] | None:
    """(device, inode) of ``path`` (followed), None if there is none."""
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if st is not None else None


def _ancestry(fd: int) -> list[tuple[int, int]]:
    """(device, inode) of the open directory ``fd`` and of each of its ancestors up to ``/``, found through
    ``..`` from the descriptor (never by path), as they are now; a ``..`` that cannot be opened ends it."""
    chain: list[tuple[int, int]] = []
    current = os.dup(fd)
    try:
        while True:
            st = os.fstat(current)
            key = (st.st_dev, st.st_ino)
            if key in chain:
                return chain
            chain.append(key)
            try:
                up = os.open("..", _UP_FLAGS, dir_fd=current)
            except OSError:
                return chain
            os.close(current)
            current = up
    finally:
        os.close(current)

