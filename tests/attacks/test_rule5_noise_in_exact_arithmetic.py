"""Rule 5 for the noise: samples and selections are exactly what their definitions say, whatever the rounding.

Attacks on noise stream v2 and BBImprover for cron (review of 777aa64..4bd0d73):

* The exact fallback of a Bernoulli(exp(−γ)) trial (``noise_stream.exact_less``, and the older
  ``samplers._compare_exact`` of the selection mechanisms) bracketed exp(−γ) at growing precision,
  but added the bracket's half-width to γ with Python operators, i.e. in the thread's *ambient*
  ``decimal`` context (28 digits by default), not in the bracket's own context. So the bracket
  stopped shrinking at ~10^-27 relative and could miss the true exp(−γ): a uniform real V just above
  exp(−1/3) (its first 96 bits equal to those of exp(−1/3)) was accepted. With a smaller ambient
  precision (any code that sets ``decimal.getcontext().prec``) the wrong answers become frequent.
  The result depended on state outside (key, index): not the exact V < p the definition promises.
* The compiled path parsed the first sample index with ``K`` (no overflow check): index 2^64 + j
  read sample j's ChaCha20 stream (noise reuse), a range crossing 2^64 wrapped round to 0, 1, …,
  and a signed index array with negative entries was silently cast to huge indices; the reference
  raised OverflowError for the first and agreed on the others. All are refused now, in both.
* Resisted (kept as cheap regression tests): the runs index's total over 10^7 runs stays inside the
  reservation for c at the ends of (0, 1/4) and δ from 10^-100 to 1/2; the noise key of a draw never
  repeats across labels, draws, seeds or noise versions; worker-thread errors never return partial
  noise. (Its ``--improver-c`` finding is rule 7's; the rolled-back runs index rule 2's.)

The review of the early hash added the race's rewritten uniform proposals
(``selection._uniform_below_scalar``): they must consume the same words and return the same values as
``uniform_below`` in every case.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np
import pytest

from dpcli.core import noise_stream as ns
from dpcli.core import samplers
from dpcli.core import schedules as sch
from dpcli.core.prf import KeyedStream

KEY = bytes(range(32))


def _exp_bits(num: int, den: int, bits: int) -> int:
    """⌊exp(−num/den)·2^bits⌋, from a 200-digit bracket (asserted to be decisive)."""
    ctx = decimal.Context(prec=200)
    g = ctx.divide(decimal.Decimal(num), decimal.Decimal(den))
    lo = Fraction(ctx.exp(ctx.minus(ctx.add(g, decimal.Decimal(10) ** -195)))) * (1 << bits)
    hi = Fraction(ctx.exp(ctx.minus(ctx.subtract(g, decimal.Decimal(10) ** -195)))) * (1 << bits)
    assert math.floor(lo) == math.floor(hi)
    return math.floor(lo)


def _v_just_above(num: int, den: int) -> int:
    """A 128-bit V (as an integer over 2^128) with exp(−num/den) < V < exp(−num/den) + 2^-127."""
    return _exp_bits(num, den, 128) + 1


# ---- exact_less: the bracket of exp(−γ) must not depend on the ambient decimal context -------------


@pytest.mark.parametrize("ambient_prec", [28, 12])
def test_exact_less_decides_v_just_above_exp_minus_gamma(monkeypatch, ambient_prec):
    """V's first 96 bits are those of exp(−1/3) and V > exp(−1/3): the trial must fail.

    Before the fix, at the third extension word γ + width was rounded to 28 digits (just below 1/3),
    so the bracket sat above the true exp(−1/3) and V was accepted."""
    v = _v_just_above(1, 3)
    words = [(v >> (32 * (3 - w))) & 0xFFFFFFFF for w in range(4)]  # leading word, then 3 extension words

    def blocks(key, counter, n0, n1, n2):
        out = np.zeros((1, 16), dtype=np.uint32)
        if int(np.asarray(counter)) == 0:
            out[0, :3] = words[1:]
        return out

    monkeypatch.setattr(ns, "chacha20_blocks", blocks)
    with decimal.localcontext() as ctx:
        ctx.prec = ambient_prec
        assert ns.exact_less(KEY, 0, 0, words[0], 1, 3) is False
        # and just below it: accepted
        below = _exp_bits(1, 3, 128)
        words[:] = [(below >> (32 * (3 - w))) & 0xFFFFFFFF for w in range(4)]
        assert ns.exact_less(KEY, 0, 0, words[0], 1, 3) is True


class _Words:
    """A stand-in KeyedStream whose uint64 words are given."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)

    def uint64(self, n: int) -> np.ndarray:
        out, self.words = self.words[:n], self.words[n:]
        return np.array(out + [0] * (n - len(out)), dtype=np.uint64)


def test_compare_exact_of_the_selection_mechanisms_too():
    """The same bracket in samplers._compare_exact (Bernoulli(exp(−γ)) of the exponential mechanism)."""
    v = _exp_bits(1, 3, 192) + 1  # V > exp(−1/3), first 128 bits equal
    w = [(v >> (64 * (2 - k))) & (2**64 - 1) for k in range(3)]
    assert samplers._compare_exact(_Words(w[1:]), w[0], 1, 3) is False
    below = _exp_bits(1, 3, 192)
    w = [(below >> (64 * (2 - k))) & (2**64 - 1) for k in range(3)]
    assert samplers._compare_exact(_Words(w[1:]), w[0], 1, 3) is True


# ---- sample indices: never aliased, in either implementation ---------------------------------------


BACKENDS = ["reference"] + (["compiled"] if ns._compiled is not None else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("idx", [range(2**64, 2**64 + 3), range(2**64 - 2, 2**64 + 3),
                                 np.array([-1, 0], dtype=np.int64), np.array([0.5, 1.0]), [-1, 2]])
def test_sample_indices_beyond_uint64_are_refused(backend, idx):
    """Compiled: range(2^64, 2^64 + 3) gave samples 0, 1, 2 of the same key (the same noise)."""
    with pytest.raises(ValueError):
        ns.laplace(KEY, 10, 1, idx, backend=backend)
    with pytest.raises(ValueError):
        ns.gaussian(KEY, 10, 3, 2, idx, backend=backend)


@pytest.mark.skipif(ns._compiled is None, reason="no compiled path")
def test_the_compiled_entry_point_checks_the_first_index_itself():
    out = np.empty(3, dtype=np.int64)
    with pytest.raises(OverflowError):
        ns._compiled.laplace(KEY, 10, 1, 2**64, None, out, ns._exact(KEY))
    with pytest.raises(OverflowError):  # first + n − 1 ≥ 2^64
        ns._compiled.laplace(KEY, 10, 1, 2**64 - 2, None, out, ns._exact(KEY))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_last_indices_below_2_64_are_fine_and_agree(backend):
    last = ns.laplace(KEY, 1000, 1, range(2**64 - 3, 2**64), backend=backend)
    assert list(last) == list(ns.laplace(KEY, 1000, 1, np.array([2**64 - 3, 2**64 - 2, 2**64 - 1], dtype=np.uint64),
                                         backend="reference"))
    assert list(last) != list(ns.laplace(KEY, 1000, 1, range(3), backend=backend))


# ---- noise keys: distinct per draw, label, seed and noise version (resisted) ------------------------


def test_noise_keys_never_repeat():
    seeds = [bytes([s]) * 32 for s in range(3)]
    keys = set()
    n = 0
    for seed in seeds:
        for label in ("a", "ab", "a/b", "stream-replay"):
            st = KeyedStream(seed, label)
            for child in (st, st.child("b"), st.child("select/1"), st.child("select/11")):
                for _ in range(3):
                    keys.add(child.noise_key())
                    n += 1
    assert len(keys) == n


@pytest.mark.skipif(ns._compiled is None, reason="no compiled path")
def test_a_failing_worker_returns_no_partial_noise(monkeypatch):
    """An error (e.g. KeyboardInterrupt) in an exact comparison on any thread raises; no array comes back."""
    old = ns._compiled.set_threads(2, 50)
    old_margin = ns.set_margin(0.25)  # many exact comparisons
    calls = []

    def exact(j, i, u, num, den):
        calls.append(j)
        if len(calls) == 40:
            raise KeyboardInterrupt
        return ns.exact_less(KEY, j, i, u, num, den)

    monkeypatch.setattr(ns, "_exact", lambda key: exact)
    try:
        with pytest.raises(KeyboardInterrupt):
            ns.laplace(KEY, 7, 1, range(400))
    finally:
        ns._compiled.set_threads(old, 1 << 15)
        ns.set_margin(old_margin)


# ---- BBImprover, runs index ---------------------------------------------------------------------


@pytest.mark.parametrize("c", [1e-6, pytest.param(0.1, marks=pytest.mark.audit), 0.2499999])  # corners: make test
@pytest.mark.parametrize("delta", [1e-100, pytest.param(1e-6, marks=pytest.mark.audit), 0.5])
def test_runs_index_never_exceeds_the_reservation_over_ten_million_runs(c, delta):
    """Σ_{k ≤ 10^7} ε_k² (the per-run ε as dpcli rounds it, bounded above by the unrounded formula) plus
    the integral tail, through Theorem 4, stays ≤ the reserved ε at the largest ε allowed (3 ln(1/δ))."""
    total = 3 * math.log(1 / delta)
    unit = total**2 / (9 * math.log(1 / delta))
    k = np.arange(1, 10**7 + 1, dtype=np.float64)
    s2 = float(np.sum(c * unit / k ** (1 + 2 * c))) + c * unit * 1e7 ** (-2 * c) / (2 * c)
    assert 0.5 * s2 + math.sqrt(2 * s2 * math.log(1 / delta)) <= total
    for run in (1, 2, 999, 10**7):
        e = sch.bbimprover_epsilon(run, Fraction(total), delta, c)
        assert float(e) ** 2 <= c * unit / run ** (1 + 2 * c) * (1 + 1e-12)


# ---- a sample's words: never past 2^31 (the extension nonces would wrap onto its own stream) -------


def _outcome(backend, j, limit):
    old = ns.set_word_limit(limit)
    try:
        return int(ns.gaussian(KEY, 1, 8, 1, range(j, j + 1), backend=backend)[0])
    except RuntimeError:
        return "exhausted"
    finally:
        ns.set_word_limit(old)


@pytest.mark.skipif(ns._compiled is None, reason="no compiled path")
def test_a_sample_out_of_words_fails_alike_in_both_paths():
    """Proposal scale t = 1 for σ² = 8 (acceptance ~e^-3.5 per trial, a few words each): with the limit at
    256 words some samples run out. Before, the compiled path read on past word 2^31 (t = 1, p = 2^40 reached
    it in 20 s): extension nonce 2^31 + i wrapped to the sample's own stream at i = 2^31, and its block counter
    wrapped at 2^32 words, while the reference raised OverflowError. Now both raise RuntimeError, at the same
    samples (the limit is checked before each trial, at the same word positions)."""
    outcomes = {b: [_outcome(b, j, 256) for j in range(40)] for b in BACKENDS}
    assert outcomes["compiled"] == outcomes["reference"]
    assert "exhausted" in outcomes["compiled"] and any(o != "exhausted" for o in outcomes["compiled"])
    old = ns.set_word_limit(256)
    old_threads = ns._compiled.set_threads(2, 8)
    try:
        with pytest.raises(RuntimeError, match="more words"):
            ns.gaussian(KEY, 1, 2**40, 1, range(64))  # hopeless: every sample runs out, on both threads
    finally:
        ns._compiled.set_threads(old_threads, 1 << 15)
        ns.set_word_limit(old)
    assert ns.set_word_limit(ns.MAX_WORD_LIMIT) == ns.MAX_WORD_LIMIT


# ---- the race's uniform proposals (review of the early hash) -------------------------------------


class _CountedWords:
    def __init__(self, words: list[int]) -> None:
        self.words = list(words)
        self.calls: list[int] = []

    def uint64(self, n: int) -> np.ndarray:
        self.calls.append(n)
        if n > len(self.words):
            raise AssertionError("the stream ran out")
        out, self.words = self.words[:n], self.words[n:]
        return np.array(out, dtype=np.uint64)


BOUNDS = [1, 2, 3, 5, 6, 7, 8, 9, 15, 16, 17, 63, 64, 65, 100, 255, 256, 257, 1000, 1023, 1024, 1025]


@pytest.mark.parametrize("m", BOUNDS)
def test_the_proposals_consume_the_same_words_with_redraws_at_every_limit(m):
    """Words placed at limit − 1 (kept), limit and 2^64 − 1 (redrawn, several rounds), 0, and random:
    the same values, the same words consumed, the same calls that consume any."""
    from dpcli.core import selection as sel
    from dpcli.core.samplers import uniform_below

    limit = ((1 << 64) // m) * m
    rng = np.random.default_rng(m)
    special = [w for w in (limit - 1, limit, limit + 1, (1 << 64) - 1, 0, m, m - 1) if 0 <= w < 1 << 64]
    for trial in range(4):
        first = [int(x) for x in rng.integers(0, 1 << 63, size=m, dtype=np.uint64)]
        for i in range(min(m, 3 + trial)):
            first[int(rng.integers(0, m))] = special[(i + trial) % len(special)]
        tail = [(1 << 64) - 1] * trial + [int(x) for x in rng.integers(0, 1 << 63, size=m + 8, dtype=np.uint64)]
        a, b = _CountedWords(first + tail), _CountedWords(first + tail)
        assert sel._uniform_below_scalar(a, m).tolist() == uniform_below(b, np.full(m, m)).tolist()
        assert a.words == b.words
        assert [n for n in a.calls if n] == [n for n in b.calls if n]


def test_the_proposals_equal_uniform_below_on_the_keyed_stream():
    from dpcli.core import selection as sel
    from dpcli.core.prf import KeyedStream
    from dpcli.core.samplers import uniform_below

    a, b = KeyedStream(b"k" * 32, "t"), KeyedStream(b"k" * 32, "t")
    for m in [*range(1, 130), 4095, 4096, 4097]:
        assert np.array_equal(sel._uniform_below_scalar(a, m), uniform_below(b, np.full(m, m)))
    assert a.uint64(3).tolist() == b.uint64(3).tolist()
