"""The secret seed key: 32 bytes from the OS, in a 0600 file, never printed.

Only its fingerprint (a hash) is ever shown. Rotation keeps the old key,
renamed with a timestamp, so earlier releases can still be audited.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import time
from pathlib import Path

from dpcli.errors import StateError
from dpcli.state.atomic import atomic_write_bytes, fsync_dir

KEY_FILE = "secret.key"
KEY_BYTES = 32
_HEADER = b"dpcli-secret-key-v1\n"


def key_path(root: Path) -> Path:
    return root / KEY_FILE


def _check_permissions(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise StateError(
            f"key file {path} is accessible by group or others (mode {mode:03o}); run: chmod 600 {path}"
        )


def _parse(path: Path) -> bytes:
    data = path.read_bytes()
    if not data.startswith(_HEADER):
        raise StateError(f"key file {path} is not a dpcli key (corrupt?)")
    body = data[len(_HEADER) :].strip()
    try:
        key = bytes.fromhex(body.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise StateError(f"key file {path} is corrupt") from None
    if len(key) != KEY_BYTES:
        raise StateError(f"key file {path} is corrupt (wrong length)")
    return key


def _key_bytes(key: bytes) -> bytes:
    return _HEADER + key.hex().encode("ascii") + b"\n"


def _create_if_absent(path: Path) -> None:
    """Create the key file without ever replacing an existing one (link(2) is atomic, no clobber)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(_key_bytes(secrets.token_bytes(KEY_BYTES)))
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileExistsError):  # another process created it first: use theirs
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)


def load_or_create_key(root: Path) -> bytes:
    """The state directory's key, created on first use (0600)."""
    path = key_path(root)
    if not path.exists():
        _create_if_absent(path)
    _check_permissions(path)
    return _parse(path)


def load_key(root: Path) -> bytes:
    """The state directory's existing key; never creates one (a missing key is an error, exit 78).

    Used to *check* state that was sealed with the key: a new key could never verify it.
    """
    path = key_path(root)
    if not path.exists():
        raise StateError(f"secret key {path} is missing: state sealed with it cannot be checked; restore it from a "
                         "backup")
    _check_permissions(path)
    return _parse(path)


def archived_keys(root: Path) -> list[bytes]:
    """Keys retired by :func:`rotate_key` (``secret.key.*.old``), newest first."""
    out = []
    for path in sorted(root.glob(f"{KEY_FILE}.*.old"), reverse=True):
        _check_permissions(path)
        out.append(_parse(path))
    return out


def derive_key(key: bytes, label: str) -> bytes:
    """A key for one purpose: ``HMAC-SHA256(key, "dpcli/derived-key/v1\\0" + label)``.

    The seed key itself only ever seeds releases (:mod:`dpcli.core.prf`); everything
    else (ledger seals, ...) uses a key derived here under its own label, so no two
    uses can be confused. Derived keys are never stored, printed or logged.
    """
    if len(key) != KEY_BYTES:
        raise ValueError("derive_key needs the 32-byte secret key")
    return hmac.new(key, b"dpcli/derived-key/v1\x00" + label.encode("ascii"), hashlib.sha256).digest()


def key_fingerprint(key: bytes) -> str:
    """A public fingerprint of the key (SHA-256 prefix); reveals nothing usable."""
    return "sha256:" + hashlib.sha256(b"dpcli/key-fingerprint/v1\x00" + key).hexdigest()[:32]


def rotate_key(root: Path) -> tuple[str, str, Path]:
    """Replace the key with a fresh one; returns (old fingerprint, new fingerprint, archive path)."""
    path = key_path(root)
    old = load_or_create_key(root)
    archive = root / f"{KEY_FILE}.{time.strftime('%Y%m%dT%H%M%S')}.{os.getpid()}.old"
    os.link(path, archive)
    fsync_dir(root)
    new = secrets.token_bytes(KEY_BYTES)
    atomic_write_bytes(path, _key_bytes(new), mode=0o600)
    return key_fingerprint(old), key_fingerprint(new), archive
