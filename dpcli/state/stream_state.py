"""The ``stream-replay --state FILE`` file: a stream's trees, buffers and counters between cron runs.

The file holds unreleased per-key data, the open trees' noise and the
stream's seed, so it is as secret as the key file: created 0600,
refused when group or others can read it, replaced atomically (temp file,
fsync, rename, fsync dir) under an exclusive lock on ``FILE.lock``. Its body is
covered by a SHA-256 checksum, so a truncated or edited file is refused
rather than silently resetting the stream.

Layout (JSON)::

    {"format": "dpcli-stream-state", "version": 1, "sha256": "<hex of canonical body>",
     "body": {"query": {...}, "analyst": "...", "seed": "<hex>", "seed_id": "...",
              "created": "...", "key_schema": {...}, "stream": {...}, "last": {...} | null}}
"""

from __future__ import annotations

import hashlib
import json
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dpcli.errors import StateError
from dpcli.state.atomic import atomic_write_bytes
from dpcli.state.lock import exclusive_lock

FORMAT = "dpcli-stream-state"
VERSION = 1


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@contextmanager
def locked(path: Path, timeout: float) -> Iterator[None]:
    """Hold the state file's lock (``FILE.lock``, never deleted) for the ``with`` block."""
    if not path.parent.is_dir():
        raise StateError(f"directory of state file {path} does not exist")
    with exclusive_lock(path.with_name(path.name + ".lock"), timeout):
        yield


def read(path: Path) -> dict[str, Any] | None:
    """The verified body of the state file, or None when it does not exist yet."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise StateError(f"state file {path} is not a regular file")
    if st.st_mode & 0o077:
        raise StateError(f"state file {path} is readable by others (mode {st.st_mode & 0o777:o}); chmod 600 it")
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"state file {path} is corrupt ({type(exc).__name__}); restore it from a backup") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("body"), dict):
        raise StateError(f"{path} is not a dpcli stream state file")
    if doc.get("version") != VERSION:
        raise StateError(f"state file {path} has version {doc.get('version')!r}; this dpcli reads version {VERSION}")
    if hashlib.sha256(_canonical(doc["body"])).hexdigest() != doc.get("sha256"):
        raise StateError(f"state file {path} fails its checksum (edited or damaged); restore it from a backup")
    return doc["body"]


def write(path: Path, body: dict[str, Any]) -> None:
    """Replace the state file with ``body`` (0600, atomic, durable)."""
    doc = {"format": FORMAT, "version": VERSION, "sha256": hashlib.sha256(_canonical(body)).hexdigest(), "body": body}
    try:
        atomic_write_bytes(path, json.dumps(doc, ensure_ascii=False).encode("utf-8"), mode=0o600)
    except OSError as exc:
        raise StateError(f"cannot write state file {path}: {exc.strerror or exc}") from None
