"""An exclusive inter-process lock on a dedicated lock file (``fcntl.flock``).

The lock file is never deleted, so two processes can never hold locks on two
different inodes of "the same" lock. The kernel drops the lock if the holder
dies, so a SIGKILL never leaves the ledger locked.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dpcli.errors import LockTimeoutError, StateError, os_reason


@contextmanager
def exclusive_lock(path: Path, timeout: float = 30.0) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the ``with`` block; wait at most ``timeout`` s."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StateError(f"cannot open lock file {path}: {os_reason(exc)}") from exc
    try:
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeoutError(
                        f"another dpcli process holds {path} (waited {timeout:g} s); retry later"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
