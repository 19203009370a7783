"""Crash-safe file replacement: temp file in the same directory, fsync, rename, fsync dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file.

    Steps: create a temp file (``mode``) next to ``path``, write, fsync, ``os.replace``,
    fsync the directory. The temp file is removed if anything fails before the rename.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)
