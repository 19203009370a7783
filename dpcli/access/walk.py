"""Opening a directory below another without following a symlink planted on the way.

Analysts may be able to write into their output directories (when the operator made them
group-writable). Between dpcli's check of a path there (:meth:`dpcli.access.Gate.check_write`,
which resolves symlinks and ``..``) and its write or open, they could swap a directory on the way
for a symlink to anywhere the service account may read or write. So the path as the check resolved
it is opened one name at a time from the output directory itself, each name with ``O_NOFOLLOW``:
a name that has become a symlink (or is no longer a directory) fails the open instead of leading
out (:class:`Escape`). The caller then opens or replaces the last name relative to the descriptor.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
#: What ``open`` says when ``O_NOFOLLOW`` met a symlink, or a name on the way is no directory.
SWAPPED = (errno.ELOOP, errno.ENOTDIR)
#: Names below a dataset directory that hold no data, and are not looked into (Hadoop's rule: ``_SUCCESS``,
#: ``.crc``, ``_temporary/``).
HIDDEN_PREFIXES = (".", "_")


class Escape(Exception):
    """The path does not lie below the directory, or no longer does (a name on the way was swapped)."""


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _walk(root_st: os.stat_result, directory: str) -> tuple[Path, tuple[str, ...]]:
    """Where to start (the root, of status ``root_st``, as it appears in ``directory``: by its own name or
    by a second one, such as a bind mount) and the names from there down to ``directory``."""
    target = Path(directory)
    for ancestor in (target, *target.parents):
        try:
            if _same(os.stat(ancestor), root_st):
                return ancestor, target.relative_to(ancestor).parts
        except OSError:
            continue
    raise Escape(directory)


def open_dir_below(root: str | int, directory: str) -> int:
    """A descriptor of ``directory`` (a resolved path: no symlink, no ``..``), opened from ``root`` (a
    path, or a descriptor of it, e.g. from :func:`open_nofollow`) one name at a time without following
    symlinks. :class:`Escape` if it does not lie in ``root`` or a name on the way has been swapped for
    a symlink or a file; other ``OSError`` as the OS raises it."""
    try:
        root_st = os.fstat(root) if isinstance(root, int) else os.stat(root)
    except OSError:
        raise Escape(str(root)) from None
    start, names = _walk(root_st, directory)
    fd = os.open(start, _DIR_FLAGS)
    try:
        if not _same(os.fstat(fd), root_st):
            raise Escape(str(root))
        for name in names:
            below = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
    except OSError as exc:
        os.close(fd)
        if exc.errno in SWAPPED:
            raise Escape(directory) from None
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- paths no one else can swap ---------------------------------------------------------------
#
# A path is only as safe as whoever can rename its ancestors: write permission on a directory lets
# its writer rename or replace any entry in it (a sticky bit narrows that to the entries' owners,
# but anyone may still create a name there once it is gone). So the operator's locations are
# resolved once (``catalog set``), every component from ``/`` down is checked to be owned by root
# or the service account and writable by neither group nor others (:func:`unsafe_component`), and at
# use the stored path is opened one name at a time without following any symlink (:func:`open_nofollow`)
# and the opened file checked again (:func:`unsafe_stat`).

_PATH_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def trusted_uids() -> frozenset[int]:
    """Who may own a component of a catalog location: root and this process (the service account)."""
    return frozenset({0, os.geteuid()})


def unsafe_stat(st: os.stat_result, trusted: frozenset[int]) -> str | None:
    """Why a file or directory with this status could be changed, renamed or replaced by someone else
    (owned by another user; writable by its group, or by others, sticky or not); None if it cannot."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in trusted:
        return f"owned by uid {st.st_uid}, not root or the service account"
    if mode & 0o002:
        return f"writable by others (mode {mode:o}{', sticky' if mode & 0o1000 else ''})"
    if mode & 0o020:
        return f"writable by its group (mode {mode:o})"
    return None


def unsafe_component(path: str, trusted: frozenset[int]) -> tuple[str, str] | None:
    """The first component of ``path`` (absolute, resolved) that someone but ``trusted`` could rename,
    replace or write, and why; None when there is none. ``OSError`` if a component cannot be examined."""
    parts = Path(path).parts
    current = Path(parts[0])
    for name in (None, *parts[1:]):
        if name is not None:
            current = current / name
        st = os.lstat(current)
        if stat.S_ISLNK(st.st_mode):
            return str(current), "a symlink"
        why = unsafe_stat(st, trusted)
        if why is not None:
            return str(current), why
    return None


def open_nofollow(path: str, flags: int) -> int:
    """Open the absolute ``path`` one name at a time from ``/``, following no symlink on the way or at
    its end (the Linux ``openat2(RESOLVE_NO_SYMLINKS)`` walk, done portably); ``OSError`` as the OS
    raises it, ``ELOOP``/``ENOTDIR`` (:data:`SWAPPED`) when a name on the way is a symlink or no
    directory. ``..`` and ``.`` are refused like a symlink (a stored path holds neither)."""
    parts = Path(path).parts
    if not parts or parts[0] != "/" or any(p in (".", "..") for p in parts):
        raise OSError(errno.ELOOP, "not a resolved absolute path")
    fd = os.open("/", _PATH_FLAGS)
    try:
        for name in parts[1:-1]:
            below = os.open(name, _PATH_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
        if len(parts) == 1:
            return os.open("/", flags)
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


# --- what lies below a directory ----------------------------------------------------------------
#
# A directory opened safely says nothing of what lies below it: a file there may be a symlink to
# anywhere the service account reads, and a sub-directory someone else can write lets them plant one
# (or a hard link) later. So a dataset directory is walked from its open descriptor, one name at a
# time without following any symlink (:func:`files_below`): a symlink anywhere below is refused, every
# sub-directory and file is checked as its location was (:func:`unsafe_stat`, service mode), and the
# files are read through the descriptors opened in the walk, never by path.

_ENTRY_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class Below(Exception):
    """An entry below a walked directory that is refused: a symlink, or (when checked) one that someone
    else could change. ``relative`` is its path below the directory (data: callers never show it to an
    analyst)."""

    def __init__(self, relative: PurePosixPath, why: str) -> None:
        super().__init__(f"{relative}: {why}")
        self.relative = relative
        self.why = why


@dataclass(frozen=True)
class Found:
    """A regular file below a walked directory: its path below it, its status, and its descriptor (read-only,
    opened in the walk; None when the walk only looked)."""

    relative: PurePosixPath
    st: os.stat_result
    fd: int | None


def files_below(root_fd: int, trusted: frozenset[int] | None, hidden: tuple[str, ...],
                open_files: bool = True) -> list[Found]:
    """Every regular file below the open directory ``root_fd``, sorted by its path below it, found one name
    at a time relative to descriptors (``O_NOFOLLOW``): names starting with one of ``hidden`` are skipped
    (and not looked into), as are FIFOs, sockets and devices. :class:`Below` for a symlink anywhere below
    and, when ``trusted`` is given, for a sub-directory or file :func:`unsafe_stat` refuses. With
    ``open_files`` each file is opened (the caller closes the descriptors); else only its ``lstat`` is
    taken. ``OSError`` as the OS raises it (every descriptor opened is then closed)."""
    found: list[Found] = []
    try:
        _walk_into(root_fd, PurePosixPath(), trusted, hidden, open_files, found)
    except BaseException:
        close_found(found)
        raise
    return sorted(found, key=lambda f: f.relative)


def close_found(found: list[Found]) -> None:
    """Close the descriptors of a walk's files."""
    for f in found:
        if f.fd is not None:
            os.close(f.fd)


def _walk_into(dir_fd: int, relative: PurePosixPath, trusted: frozenset[int] | None, hidden: tuple[str, ...],
               open_files: bool, found: list[Found]) -> None:
    with os.scandir(dir_fd) as it:  # (a duplicate of the descriptor, rewound when closed)
        entries = [(e.name, e.is_symlink(), e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                   for e in it if not e.name.startswith(hidden)]
    for name, link, is_dir, is_file in sorted(entries):
        if link:
            raise Below(relative / name, "a symlink")
        if is_dir or is_file:
            _visit(dir_fd, name, relative / name, trusted, hidden, open_files, found)


def _visit(dir_fd: int, name: str, relative: PurePosixPath, trusted: frozenset[int] | None, hidden: tuple[str, ...],
           open_files: bool, found: list[Found]) -> None:
    """One directory or file of a walk: opened without following a symlink (one swapped in since it was
    listed fails the open), checked on its own status, then walked into or kept."""
    if not open_files:
        _look(dir_fd, name, relative, trusted, hidden, found)
        return
    try:
        fd = os.open(name, _ENTRY_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Below(relative, "a symlink") from None
        raise
    kept = False
    try:
        st = os.fstat(fd)
        _check(st, relative, trusted)
        if stat.S_ISREG(st.st_mode):
            found.append(Found(relative, st, fd))
            kept = True
        elif stat.S_ISDIR(st.st_mode):
            _walk_into(fd, relative, trusted, hidden, open_files, found)
    finally:
        if not kept:
            os.close(fd)


def _look(dir_fd: int, name: str, relative: PurePosixPath, trusted: frozenset[int] | None, hidden: tuple[str, ...],
          found: list[Found]) -> None:
    """:func:`_visit` without opening files: their ``lstat`` is kept (a directory is still opened to be walked)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise Below(relative, "a symlink")
    _check(st, relative, trusted)
    if stat.S_ISREG(st.st_mode):
        found.append(Found(relative, st, None))
    elif stat.S_ISDIR(st.st_mode):
        fd = os.open(name, _ENTRY_FLAGS | getattr(os, "O_DIRECTORY", 0), dir_fd=dir_fd)
        try:
            _walk_into(fd, relative, trusted, hidden, False, found)
        finally:
            os.close(fd)


def _check(st: os.stat_result, relative: PurePosixPath, trusted: frozenset[int] | None) -> None:
    why = unsafe_stat(st, trusted) if trusted is not None else None
    if why is not None:
        raise Below(relative, why)


def inside(path: str | os.PathLike[str], directory: str | os.PathLike[str]) -> bool:
    """Is ``path`` (resolved: symlinks, ``..``) ``directory`` or below it? (By resolved text and,
    for existing ancestors, by device and inode, so a bind mount or second name is caught.)"""
    real = Path(os.path.realpath(path))
    root = Path(os.path.realpath(directory))
    if real == root or root in real.parents:
        return True
    try:
        root_st = os.stat(root)
    except OSError:
        return False
    for ancestor in (real, *real.parents):
        try:
            st = os.stat(ancestor)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (root_st.st_dev, root_st.st_ino):
            return True
    return False
