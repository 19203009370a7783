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
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
#: What ``open`` says when ``O_NOFOLLOW`` met a symlink, or a name on the way is no directory.
SWAPPED = (errno.ELOOP, errno.ENOTDIR)


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
