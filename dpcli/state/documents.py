"""Checked state documents: the JSON files that carry state from one cron run to the next.

Used by ``stream-replay --state`` (a stream's trees, buffers and counters) and
by ``--schedule`` (which epochs ran, and their cached releases). Such a file
must never be silently reset, since that would hand back spent budget. So
every document is:

* replaced atomically (temp file, fsync, rename, fsync dir), created 0600;
* read under an exclusive lock on ``FILE.lock`` (never deleted), held for the
  whole read–compute–write of a run;
* refused when group or others can read it (stream state holds unreleased data
  and noise), when its kind or version differ, or when its body fails the
  SHA-256 checksum (a truncated or edited file), all with exit 78.

Layout::

    {"format": "<kind>", "version": 1, "sha256": "<hex of the canonical body>", "body": {...}}
"""

from __future__ import annotations

import hashlib
import json
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dpcli.errors import StateError, os_reason
from dpcli.state.atomic import atomic_write_bytes
from dpcli.state.lock import exclusive_lock

VERSION = 1


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@contextmanager
def locked(path: Path, timeout: float) -> Iterator[None]:
    """Hold the document's lock (``FILE.lock``, never deleted) for the ``with`` block."""
    if not path.parent.is_dir():
        raise StateError(f"directory of state file {path} does not exist")
    with exclusive_lock(path.with_name(path.name + ".lock"), timeout):
        yield


def read(path: Path, kind: str) -> dict[str, Any] | None:
    """The verified body of the document at ``path``, or None when it does not exist yet."""
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
    if not isinstance(doc, dict) or doc.get("format") != kind or not isinstance(doc.get("body"), dict):
        raise StateError(f"{path} is not a {kind} file")
    if doc.get("version") != VERSION:
        raise StateError(f"state file {path} has version {doc.get('version')!r}; this dpcli reads version {VERSION}")
    if hashlib.sha256(_canonical(doc["body"])).hexdigest() != doc.get("sha256"):
        raise StateError(f"state file {path} fails its checksum (edited or damaged); restore it from a backup")
    body: dict[str, Any] = doc["body"]
    return body


def write(path: Path, kind: str, body: dict[str, Any]) -> None:
    """Replace the document at ``path`` with ``body`` (0600, atomic, durable)."""
    doc = {"format": kind, "version": VERSION, "sha256": hashlib.sha256(_canonical(body)).hexdigest(), "body": body}
    try:
        atomic_write_bytes(path, json.dumps(doc, ensure_ascii=False).encode("utf-8"), mode=0o600)
    except OSError as exc:
        raise StateError(f"cannot write state file {path}: {os_reason(exc)}") from None
