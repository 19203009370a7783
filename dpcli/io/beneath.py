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
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
#: What ``open`` says when ``O_NOFOLLOW`` met a symlink, or a name on the way is no directory.
SWAPPED = (errno.ELOOP, errno.ENOTDIR)


class Escape(Exception):
    """The path does not lie below the directory, or no longer does (a name on the way was swapped)."""


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _walk(root: str, directory: str) -> tuple[Path, tuple[str, ...]]:
    """Where to start (``root`` as it appears in ``directory``: by its own name or by a second one, such
    as a bind mount) and the names from there down to ``directory``."""
    try:
        root_st = os.stat(root)
    except OSError:
        raise Escape(root) from None
    target = Path(directory)
    for ancestor in (target, *target.parents):
        try:
            if _same(os.stat(ancestor), root_st):
                return ancestor, target.relative_to(ancestor).parts
        except OSError:
            continue
    raise Escape(directory)


def open_dir_below(root: str, directory: str) -> int:
    """A descriptor of ``directory`` (a resolved path: no symlink, no ``..``), opened from ``root`` one
    name at a time without following symlinks. :class:`Escape` if it does not lie in ``root`` or a
    name on the way has been swapped for a symlink or a file; other ``OSError`` as the OS raises it."""
    start, names = _walk(root, directory)
    fd = os.open(start, _DIR_FLAGS)
    try:
        if not _same(os.fstat(fd), os.stat(root)):
            raise Escape(root)
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
