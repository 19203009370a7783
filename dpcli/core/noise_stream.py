"""Noise stream v2: exact discrete Laplace and Gaussian samples addressed by (key, sample index).

Each sample j of a draw reads 32-bit words from its own ChaCha20 stream (the RFC 8439 block
function, key = the draw's 32-byte key, nonce = (j mod 2^32, j div 2^32, 0), block counter
0, 1, 2, …). No word is shared between samples, so sample j is a pure function of (key, j): a
tree node's noise can be drawn when it is needed, in any order, by any code path, and is always
the same number. The operations on a sample's words are, in order:

* ``uniform_below(m)``: for m ≤ 2^32 one word u, x = u·m, accepted when x mod 2^32 ≥ 2^32 mod m,
  then x div 2^32 (Lemire's method: exactly uniform, no division per word); for larger m two
  words (low first), accepted below the largest multiple of m that fits in 2^64, then u mod m;
* ``Bernoulli(exp(−num/den))``: the word u is the leading 32 bits of a uniform real V ∈ [0, 1),
  and the trial succeeds when V < exp(−num/den). Floats decide only when V's whole interval
  [u, u + 1)/2^32 lies clearly (relative margin 2^-36) on one side; otherwise V's later bits come
  from the word's *extension stream* (nonce (j mod 2^32, j div 2^32, 2^31 + i), i = the word's
  index in the sample's stream; a sample reads at most :data:`MAX_WORD_LIMIT` < 2^31 words, so these
  never wrap onto its own stream) and :func:`exact_less` decides with exact arithmetic. So every
  outcome is the exact V < p, a function of the bits alone: the float arithmetic of a platform
  never changes a sample;
* the discrete Laplace with scale t/s (Canonne, Kamath & Steinke 2020, Algorithm 2): repeat
  U = uniform_below(t); if Bernoulli(exp(−U/t)) (for t = 1 neither is drawn: U = 0 and the
  trial always succeeds): V = ⌊−ln W⌋ for a uniform real W read like V
  above from one word (the number of k ≥ 1 with W < e^{−k}, so P[V ≥ k] = e^{−k}: the
  algorithm's geometric variable, from one word instead of one per Bernoulli(e^{−1}) trial),
  Y = ⌊(U + tV)/s⌋, B = the next word's top bit; return (−1)^B·Y unless B = 1 and Y = 0;
* the discrete Gaussian (Algorithm 3) with σ² = t·p/q: repeat Y = Laplace(t/1); accept Y with
  Bernoulli(exp(−(q|Y| − p)²/(2tpq))).

Two implementations compute this function: the numpy reference in this module (vectorised over
samples, each keeping its own word cursor) and the compiled ``dpcli.core._noise`` (one sample at
a time, about 15–25× faster on one core; draws of more than 2^15 samples per thread are split
over one thread per CPU, ``DPCLI_NOISE_THREADS`` to change it), built by pip from
``dpcli/core/_noise.c``.
They are tested equal sample for sample; :data:`BACKEND` says which one runs
(``DPCLI_NOISE_BACKEND=reference`` forces the reference).
"""

from __future__ import annotations

import decimal
import os
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Protocol

import numpy as np

from dpcli.core.prf import NOISE_VERSION


class _Sampler(Protocol):
    """What this module calls of the compiled sampler (its types: ``_noise.pyi``)."""

    def set_threads(self, threads: int, min_per_thread: int = ..., /) -> int: ...
    def set_word_limit(self, limit: int, /) -> int: ...
    def set_margin(self, margin: float, /) -> float: ...
    def laplace(self, key: bytes, t: int, s: int, first: int, idx: np.ndarray | None, out: np.ndarray,
                exact: Callable[[int, int, int, int, int], bool], /) -> None: ...
    def gaussian(self, key: bytes, t: int, p: int, q: int, first: int, idx: np.ndarray | None, out: np.ndarray,
                 exact: Callable[[int, int, int, int, int], bool], /) -> None: ...


def _load_compiled() -> _Sampler | None:
    """The compiled path; None when the machine that installed dpcli had no C compiler."""
    try:
        from dpcli.core import _noise
    except ImportError:  # pragma: no cover - exercised by DPCLI_NOISE_BACKEND=reference
        return None
    return _noise


_compiled = _load_compiled()

if _compiled is not None and os.environ.get("DPCLI_NOISE_THREADS", "").isdigit():  # default: one per CPU
    _compiled.set_threads(max(1, min(16, int(os.environ["DPCLI_NOISE_THREADS"]))))

#: ``compiled`` or ``reference``: which implementation draws noise in this process.
BACKEND = "compiled" if _compiled is not None and os.environ.get("DPCLI_NOISE_BACKEND") != "reference" else "reference"

#: The version of this definition (:data:`dpcli.core.prf.NOISE_VERSION`, part of every release seed).
VERSION = NOISE_VERSION

_U32 = np.uint32
_CONSTANTS = np.array([0x61707865, 0x3320646E, 0x79622D32, 0x6B206574], dtype=_U32)
_EXTENSION = 1 << 31  # third nonce word of a Bernoulli word's extension stream: 2^31 + word index
_TWO_M32 = 2.0**-32
_margin = 2.0**-36  # relative margin of the float decisions (tests widen it with set_margin)
#: Words one sample may read: word indices stay below 2^31, so an extension nonce 2^31 + i never wraps
#: round onto the sample's own stream. Checked before each trial (a trial reads < 64 words); a sample
#: that needs more (parameters with a hopeless acceptance rate) raises RuntimeError in both paths.
MAX_WORD_LIMIT = (1 << 31) - 64
_word_limit = MAX_WORD_LIMIT


def set_word_limit(limit: int) -> int:
    """Set the words one sample may read in both implementations (tests lower it); returns the old one."""
    global _word_limit
    if not 64 <= limit <= MAX_WORD_LIMIT:
        raise ValueError("the word limit must be in [64, 2^31 - 64]")
    old, _word_limit = _word_limit, limit
    if _compiled is not None:
        _compiled.set_word_limit(limit)
    return old


def _check_words(w: _Words, sel: np.ndarray) -> None:
    if sel.size and int(w.pos[sel].max()) >= _word_limit:
        raise RuntimeError("a noise sample needs more words than its stream has "
                           "(parameters with a hopeless acceptance rate)")


def set_margin(margin: float) -> float:
    """Set the float decisions' relative margin in both implementations; returns the old one.

    Only tests call this: a wide margin sends many comparisons down the exact path, which must
    give the same samples (the margin never changes a sample, only how it is computed).
    """
    global _margin
    if not 2.0**-36 <= margin < 0.5:
        raise ValueError("margin must be in [2^-36, 1/2)")
    old, _margin = _margin, margin
    if _compiled is not None:
        _compiled.set_margin(margin)
    return old


def _key_words(key: bytes) -> np.ndarray:
    if len(key) != 32:
        raise ValueError("a noise key is 32 bytes")
    return np.frombuffer(key, dtype="<u4").astype(_U32)


def _rotl(x: np.ndarray, n: int) -> np.ndarray:
    return (x << _U32(n)) | (x >> _U32(32 - n))


#: One ChaCha20 double round: four column rounds, then four diagonal rounds (RFC 8439, 2.3).
_DOUBLE_ROUND = ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15),
                 (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14))


def chacha20_blocks(key: bytes, counter: np.ndarray | int, n0: np.ndarray | int, n1: np.ndarray | int,
                    n2: np.ndarray | int) -> np.ndarray:
    """RFC 8439 ChaCha20 blocks as (m, 16) uint32 words, one per element of the (broadcast) inputs."""
    counter, n0, n1, n2 = np.broadcast_arrays(*(np.asarray(a, dtype=_U32) for a in (counter, n0, n1, n2)))
    m = counter.size
    kw = _key_words(key)
    s = np.empty((16, m), dtype=_U32)
    s[0:4] = _CONSTANTS[:, None]
    s[4:12] = kw[:, None]
    s[12], s[13], s[14], s[15] = counter.ravel(), n0.ravel(), n1.ravel(), n2.ravel()
    x = [s[w].copy() for w in range(16)]

    def qr(a: int, b: int, c: int, d: int) -> None:
        x[a] += x[b]
        x[d] = _rotl(x[d] ^ x[a], 16)
        x[c] += x[d]
        x[b] = _rotl(x[b] ^ x[c], 12)
        x[a] += x[b]
        x[d] = _rotl(x[d] ^ x[a], 8)
        x[c] += x[d]
        x[b] = _rotl(x[b] ^ x[c], 7)

    for _ in range(10):
        for a, b, c, d in _DOUBLE_ROUND:
            qr(a, b, c, d)
    blocks: np.ndarray = (np.stack(x) + s).T.copy()
    return blocks


def _nonce(j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    j = np.asarray(j, dtype=np.uint64)
    return (j & np.uint64(0xFFFFFFFF)).astype(_U32), (j >> np.uint64(32)).astype(_U32)


def exact_less(key: bytes, j: int, i: int, u: int, num: int, den: int) -> bool:
    """Is V < exp(−num/den), where V's leading 32 bits are ``u`` and the rest is word i's extension stream?

    exp(−γ) is bracketed with Python's correctly rounded ``decimal`` at growing precision while
    V's interval shrinks by 2^-32 per extension word; terminates with probability 1 (exp(−γ) is
    irrational for γ ≠ 0, and γ = 0 is decided at once).
    """
    if num == 0:
        return True
    n0, n1 = int(j) & 0xFFFFFFFF, int(j) >> 32
    words: list[int] = []
    used, bits, prec, v = 0, 32, 40, int(u)
    while True:
        ctx = decimal.Context(prec=prec, Emin=-(10**9), Emax=10**9)
        g = ctx.divide(decimal.Decimal(num), decimal.Decimal(den))
        slack = decimal.Decimal(10) ** (-prec + 3)  # exact
        # every operation in ctx: Python's operators would round to the thread's ambient context (28
        # digits by default), and the bracket would stop shrinking there and could miss exp(−γ)
        width = ctx.multiply(ctx.abs(g), slack)
        p_lo = Fraction(ctx.exp(ctx.minus(ctx.add(g, width)))) * (1 - Fraction(slack))
        p_hi = Fraction(ctx.exp(ctx.minus(ctx.subtract(g, width)))) * (1 + Fraction(slack))
        if Fraction(v + 1, 1 << bits) <= p_lo:
            return True
        if Fraction(v, 1 << bits) >= p_hi:
            return False
        if used % 16 == 0:  # the next block of the extension stream
            words = [int(x) for x in chacha20_blocks(key, used // 16, n0, n1, _EXTENSION + int(i))[0]]
        v = (v << 32) | words[used % 16]
        used += 1
        bits += 32
        prec += 10


class _Words:
    """Per-sample word cursors over the samples' ChaCha20 streams (the reference's bookkeeping)."""

    def __init__(self, key: bytes, idx: np.ndarray) -> None:
        self.key = key
        self.j = np.asarray(idx, dtype=np.uint64)
        self.n0, self.n1 = _nonce(self.j)
        self.pos = np.zeros(self.j.size, dtype=np.int64)
        self.blocks = np.zeros(self.j.size, dtype=np.int64)  # blocks computed; the cached one is blocks − 1
        self.block = np.empty((self.j.size, 16), dtype=_U32)

    def take(self, sel: np.ndarray) -> np.ndarray:
        """The next word of each sample in ``sel`` (distinct positions), as uint64."""
        pos = self.pos[sel]
        need = pos >= 16 * self.blocks[sel]
        if need.any():
            s = sel[need]
            self.block[s] = chacha20_blocks(self.key, self.blocks[s], self.n0[s], self.n1[s], 0)
            self.blocks[s] += 1
        self.pos[sel] = pos + 1
        words: np.ndarray = self.block[sel, pos & 15].astype(np.uint64)
        return words


def _uniform_below(w: _Words, sel: np.ndarray, m: int) -> np.ndarray:
    out = np.empty(sel.size, dtype=np.int64)
    pending = np.arange(sel.size)
    if m <= 1 << 32:  # Lemire: x = u·m < 2^64, accepted when its low word ≥ 2^32 mod m
        threshold, mm = np.uint64((1 << 32) % m), np.uint64(m)
        while pending.size:
            _check_words(w, sel[pending])
            x = w.take(sel[pending]) * mm
            ok = (x & np.uint64(0xFFFFFFFF)) >= threshold
            out[pending[ok]] = (x[ok] >> np.uint64(32)).astype(np.int64)
            pending = pending[~ok]
        return out
    rem = ((1 << 64) - m) % m
    while pending.size:
        s = sel[pending]
        _check_words(w, s)
        lo = w.take(s)
        u = lo | (w.take(s) << np.uint64(32))
        ok = np.ones(u.size, dtype=bool) if rem == 0 else u < np.uint64((1 << 64) - rem)
        out[pending[ok]] = (u[ok] % np.uint64(m)).astype(np.int64)
        pending = pending[~ok]
    return out


def _less_than_exp(w: _Words, sel: np.ndarray, u: np.ndarray, i: np.ndarray, gamma: np.ndarray,
                   num: Callable[[int], int], den: int) -> np.ndarray:
    """V < exp(−num/den) per sample in ``sel``, V's leading word ``u`` read at index ``i``.

    ``gamma`` ≈ num/den in floats; ``num(k)`` is element k's exact numerator.
    """
    v_lo = u.astype(np.float64) * _TWO_M32
    v_hi = (u.astype(np.float64) + 1.0) * _TWO_M32
    big = gamma > 700.0
    with np.errstate(under="ignore"):
        f = np.exp(-np.where(big, 0.0, gamma))
    accept = ~big & (v_hi <= f * (1.0 - _margin))
    reject = np.where(big, u >= 1, v_lo >= f * (1.0 + _margin))
    for k in np.flatnonzero(~accept & ~reject):
        accept[k] = exact_less(w.key, int(w.j[sel[k]]), int(i[k]), int(u[k]), num(int(k)), den)
    return accept


def _bernoulli_exp(w: _Words, sel: np.ndarray, gamma: np.ndarray, num: Callable[[int], int], den: int) -> np.ndarray:
    """Bernoulli(exp(−num/den)) per sample in ``sel``: one word each."""
    i = w.pos[sel].copy()
    return _less_than_exp(w, sel, w.take(sel), i, gamma, num, den)


def _constant(value: int) -> Callable[[int], int]:
    """The exact numerator ``value`` for every element."""
    return lambda _k: value


def _element(values: np.ndarray) -> Callable[[int], int]:
    """Element k's exact numerator ``values[k]``."""
    return lambda k: int(values[k])


def _gaussian_numerator(y: np.ndarray, p: int, q: int) -> Callable[[int], int]:
    """Element k's exact numerator (q·|y_k| − p)² of the Gaussian's acceptance test."""
    return lambda k: (q * abs(int(y[k])) - p) ** 2


def _geometric_e(w: _Words, sel: np.ndarray) -> np.ndarray:
    """⌊−ln W⌋ per sample in ``sel`` for one uniform real W each (one word): the k ≥ 1 with W < e^{−k}."""
    i = w.pos[sel].copy()
    u = w.take(sel)
    v = np.zeros(sel.size, dtype=np.int64)
    alive = np.arange(sel.size)
    k = 1
    while alive.size:
        ok = _less_than_exp(w, sel[alive], u[alive], i[alive], np.full(alive.size, float(k)), _constant(k), 1)
        alive = alive[ok]
        v[alive] = k
        k += 1
    return v


def _laplace(w: _Words, sel: np.ndarray, t: int, s: int) -> np.ndarray:
    out = np.empty(sel.size, dtype=np.int64)
    pending = np.arange(sel.size)
    while pending.size:
        ss = sel[pending]
        _check_words(w, ss)
        if t == 1:  # U = 0 and the trial always succeeds: nothing drawn
            u = np.zeros(ss.size, dtype=np.int64)
            first = np.ones(ss.size, dtype=bool)
        else:
            u = _uniform_below(w, ss, t)
            first = _bernoulli_exp(w, ss, u.astype(np.float64) / float(t), _element(u), t)
        keep = pending[first]
        uk = u[first]
        sk = sel[keep]
        v = _geometric_e(w, sk)
        if v.size and int(v.max()) >= (1 << 62) // t:
            raise OverflowError("geometric part out of range")  # probability below exp(−2^18)
        y = (uk + t * v) // s
        b = (w.take(sk) >> np.uint64(31)).astype(bool)
        ok = ~(b & (y == 0))
        out[keep[ok]] = np.where(b[ok], -y[ok], y[ok])
        done = np.zeros(sel.size, dtype=bool)
        done[keep[ok]] = True
        pending = pending[~done[pending]]
    return out


def _gaussian(w: _Words, sel: np.ndarray, t: int, p: int, q: int) -> np.ndarray:
    den = 2 * t * p * q
    out = np.empty(sel.size, dtype=np.int64)
    pending = np.arange(sel.size)
    while pending.size:
        ss = sel[pending]
        _check_words(w, ss)
        y = _laplace(w, ss, t, 1)
        d = q * np.abs(y).astype(np.float64) - p  # floats for the fast decision; exact integers below
        acc = _bernoulli_exp(w, ss, d * d / float(den), _gaussian_numerator(y, p, q), den)
        out[pending[acc]] = y[acc]
        pending = pending[~acc]
    return out


def _indices(key: bytes, idx: np.ndarray | range | Sequence[int]) -> tuple[int, np.ndarray | None, int]:
    """(first, index array or None for a step-1 range, count) of the samples asked for.

    Every index is an integer in [0, 2^64): the nonce holds 64 bits, so a larger index (or a
    negative one cast to uint64) would read another sample's stream, i.e. reuse its noise.
    """
    _key_words(key)
    if isinstance(idx, range):
        if idx.step != 1 or idx.start < 0 or max(idx.start, idx.stop) > 1 << 64:
            raise ValueError("a range of sample indices must have step 1 and lie in [0, 2^64)")
        return idx.start, None, len(idx)
    raw = idx if isinstance(idx, np.ndarray) else np.asarray(idx if len(idx) else [], dtype=object)
    if not _valid_indices(raw):
        raise ValueError("sample indices must be integers in [0, 2^64)")
    arr = np.ascontiguousarray(raw, dtype=np.uint64)
    return 0, arr, arr.size


def _valid_indices(raw: np.ndarray) -> bool:
    """Are these integers in [0, 2^64)? Python ints (object arrays) are checked exactly."""
    if raw.dtype.kind == "O":
        return all(isinstance(v, (int, np.integer)) and 0 <= v < 1 << 64 for v in raw.ravel())
    return not (raw.dtype.kind not in "ui" or (raw.dtype.kind == "i" and raw.size and int(raw.min()) < 0))


def _built() -> _Sampler:
    assert _compiled is not None, "the compiled sampler was not built"  # BACKEND is compiled only if it was
    return _compiled


def _exact(key: bytes) -> Callable[[int, int, int, int, int], bool]:
    return lambda j, i, u, num, den: exact_less(key, j, i, u, num, den)


def laplace(key: bytes, t: int, s: int, idx: np.ndarray | range | Sequence[int],
            backend: str | None = None) -> np.ndarray:
    """Discrete Laplace samples with scale t/s (1 ≤ t ≤ 2^44, s ≥ 1) for the sample indices ``idx``, as int64."""
    first, arr, n = _indices(key, idx)
    if not (1 <= t <= 1 << 44 and s >= 1):
        raise ValueError("need 1 ≤ t ≤ 2^44 and s ≥ 1")
    if (backend or BACKEND) == "compiled":
        out = np.empty(n, dtype=np.int64)
        _built().laplace(key, t, s, first, arr, out, _exact(key))
        return out
    j = np.arange(first, first + n, dtype=np.uint64) if arr is None else arr
    return _laplace(_Words(key, j), np.arange(n), t, s)


def gaussian(key: bytes, t: int, p: int, q: int, idx: np.ndarray | range | Sequence[int],
             backend: str | None = None) -> np.ndarray:
    """Discrete Gaussian samples with σ² = t·p/q (proposal scale 1 ≤ t ≤ 2^44) for the sample indices ``idx``."""
    first, arr, n = _indices(key, idx)
    if not (1 <= t <= 1 << 44 and p >= 1 and q >= 1 and 2 * t * p * q < 1 << 62):
        raise ValueError("need 1 ≤ t ≤ 2^44, p ≥ 1, q ≥ 1 and 2tpq < 2^62")
    if (backend or BACKEND) == "compiled":
        out = np.empty(n, dtype=np.int64)
        _built().gaussian(key, t, p, q, first, arr, out, _exact(key))
        return out
    j = np.arange(first, first + n, dtype=np.uint64) if arr is None else arr
    return _gaussian(_Words(key, j), np.arange(n), t, p, q)
