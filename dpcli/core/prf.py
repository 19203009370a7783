"""Keyed randomness: the only place random bits are derived from a secret key.

Construction (documented in docs/accounting.md, "Randomness and noise"):

* ``seed = HMAC-SHA256(key, b"dpcli/seed/v1\\x00" + canonical_json(material))``, where the
  material (:func:`dpcli.release.seed_material`) binds everything that shapes a release: the
  query, every input's fingerprint with how it was read, the calibration (accounting mode and
  plan) and the engine versions.
* A :class:`KeyedStream` for a *label* (domain separation between mechanisms of
  one release) is the SHAKE-256 extendable output function in counter mode:
  chunk ``i`` is ``SHAKE256(b"dpcli/stream/v1" || seed || len(label) || label || i)``
  truncated to 64 KiB. SHAKE-256 is a cryptographic XOF, so without the key the
  bits are indistinguishable from uniform; with the key they are reproducible
  bit for bit on any machine (the byte order is fixed little-endian).

* Discrete Laplace and Gaussian noise (noise stream v2, :mod:`dpcli.core.noise_stream`): draw
  number ``c`` on a stream gets the 32-byte ChaCha20 key
  ``SHA256(b"dpcli/stream/v1" || seed || len(label) || label || b"/noise/v2/" || c)``, and sample j
  of the draw is a function of (that key, j) alone.

Whoever holds the key file can recompute every noise value dpcli has released.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where words are drawn: seeds and ids need none (fast start)
    import numpy as np

_SEED_DOMAIN = b"dpcli/seed/v1\x00"
_STREAM_DOMAIN = b"dpcli/stream/v1\x00"
_CHUNK_BYTES = 1 << 16  # fixed: changing it changes every stream

#: The noise definition's version (:mod:`dpcli.core.noise_stream`), part of every release seed's
#: material: a release drawn under another definition is never a free replay of one drawn under this.
NOISE_VERSION = 2


def _canonical(value: Any) -> Any:
    if isinstance(value, Fraction):
        return f"{value.numerator}/{value.denominator}"
    if isinstance(value, Decimal):
        return str(value.normalize())
    if isinstance(value, float):
        return _canonical_float(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _canonical_float(value: float) -> int | str:
    """A finite float exactly: an integral one (below 2^53) as that integer, -0.0 as 0, any other by its
    repr (which round-trips)."""
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {value!r} in a query")
    if value == int(value) and abs(value) < 2**53:
        return int(value)
    return repr(value)


def canonical_json(query: dict[str, Any]) -> bytes:
    """Serialise a query deterministically: sorted keys, no whitespace, exact numbers."""
    return json.dumps(
        _canonical(query), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    ).encode("ascii")


def derive_seed(key: bytes, material: dict[str, Any]) -> bytes:
    """The 32-byte seed of one release: HMAC-SHA256 of its canonical seed material."""
    if len(key) < 32:
        raise ValueError("secret key must be at least 32 bytes")
    return hmac.new(key, _SEED_DOMAIN + canonical_json(material), hashlib.sha256).digest()


def seed_id(seed: bytes) -> str:
    """A public identifier of a seed (recorded in ledgers; reveals nothing of the noise)."""
    return hashlib.sha256(b"dpcli/seed-id/v1\x00" + seed).hexdigest()[:24]


class KeyedStream:
    """A reproducible cryptographic bit stream for one (seed, label) pair.

    Values are consumed in order; the same sequence of calls always returns the
    same values. Draws never reuse bytes, so every value in one stream is
    independent of every other.
    """

    def __init__(self, seed: bytes, label: str) -> None:
        if len(seed) != 32:
            raise ValueError("seed must be 32 bytes")
        label_bytes = label.encode("utf-8")
        self._prefix = _STREAM_DOMAIN + seed + len(label_bytes).to_bytes(4, "little") + label_bytes
        self._label = label
        self._chunk_index = 0
        self._buffer = b""
        self._offset = 0
        self._noise_draws = 0

    @property
    def label(self) -> str:
        return self._label

    def child(self, label: str) -> KeyedStream:
        """An independent stream for a sub-mechanism (domain separation by label)."""
        seed = hashlib.sha256(self._prefix + b"/child/" + label.encode("utf-8")).digest()
        return KeyedStream(seed, f"{self._label}/{label}")

    def noise_key(self) -> bytes:
        """The ChaCha20 key of this stream's next noise draw (independent of its SHAKE-256 words)."""
        counter = self._noise_draws.to_bytes(8, "little")
        self._noise_draws += 1
        return hashlib.sha256(self._prefix + b"/noise/v%d/" % NOISE_VERSION + counter).digest()

    def _bytes(self, n: int) -> bytes:
        parts: list[bytes] = []
        need = n
        while need > 0:
            if self._offset >= len(self._buffer):
                counter = self._chunk_index.to_bytes(8, "little")
                self._buffer = hashlib.shake_256(self._prefix + counter).digest(_CHUNK_BYTES)
                self._chunk_index += 1
                self._offset = 0
            take = min(need, len(self._buffer) - self._offset)
            parts.append(self._buffer[self._offset : self._offset + take])
            self._offset += take
            need -= take
        return b"".join(parts)

    def uint64(self, n: int) -> np.ndarray:
        """``n`` independent uniform 64-bit unsigned integers."""
        import numpy as np

        if n <= 0:
            return np.empty(0, dtype=np.uint64)
        return np.frombuffer(self._bytes(8 * n), dtype="<u8").astype(np.uint64, copy=True)
