"""Noise stream v2 (dpcli/core/noise_stream.py and its compiled twin dpcli/core/_noise.c).

The goodness of fit of the samplers is tested in test_samplers.py (they draw through this
module); here: the ChaCha20 block function against RFC 8439, the compiled path equal to the
numpy reference sample for sample, samples addressed by index, the exact path (a wide float
margin must change no sample), and the noise version bound to seeds and state digests.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from dpcli.core import noise_stream as ns
from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import _discrete_gaussian_parameters

KEY = bytes(range(32))
COMPILED = ns._compiled is not None

needs_compiled = pytest.mark.skipif(not COMPILED, reason="dpcli.core._noise was not built")


def test_the_compiled_path_is_built():
    """CI builds the extension (pip, setup.py); only an explicit opt-out accepts the reference alone."""
    if os.environ.get("DPCLI_NOISE_BACKEND") == "reference":
        assert ns.BACKEND == "reference"
        return
    assert COMPILED and ns.BACKEND == "compiled", "dpcli/core/_noise.c was not compiled (no C compiler?)"


# RFC 8439 §2.3.2 (key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, counter 1) and
# Appendix A.1 test vector #1 (zero key and nonce, counter 0).
RFC_VECTORS = [
    (bytes(range(32)), 1, bytes.fromhex("000000090000004a00000000"),
     "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
     "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"),
    (bytes(32), 0, bytes(12),
     "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
     "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"),
]


@pytest.mark.parametrize("key,counter,nonce,expected", RFC_VECTORS)
def test_chacha20_block_matches_rfc_8439(key, counter, nonce, expected):
    n0, n1, n2 = (int.from_bytes(nonce[i:i + 4], "little") for i in (0, 4, 8))
    words = ns.chacha20_blocks(key, counter, n0, n1, n2)
    assert words.shape == (1, 16)
    assert words[0].astype("<u4").tobytes().hex() == expected
    if COMPILED:
        assert ns._compiled.block(key, counter, n0, n1, n2).hex() == expected


LAPLACE = [(1, 1), (1, 2), (3, 1), (1000, 1), (10**6, 1), (2**32, 1), (2**32 + 1, 1), (2**40, 3)]
GAUSS = [Fraction(1, 4), Fraction(1), Fraction(10), Fraction(10**6), Fraction(10**12)]


def _lane_widths() -> list[int]:
    """The compiled path's lane widths this CPU can run: 8 everywhere, 16 with AVX-512."""
    if not COMPILED:
        return []
    old = ns._compiled.set_lanes(8)
    widths = [8]
    try:
        ns._compiled.set_lanes(16)
        widths.append(16)
    except ValueError:
        pass
    ns._compiled.set_lanes(old)
    return widths


@pytest.fixture(params=[8, 16])
def lanes(request):
    """Run a test with each lane width of the compiled path (the CPU's own choice is restored after)."""
    if request.param not in _lane_widths():
        pytest.skip(f"{request.param} lanes need a compiled path (and AVX-512 for 16)")
    old = ns._compiled.set_lanes(request.param)
    yield request.param
    ns._compiled.set_lanes(old)


@needs_compiled
@pytest.mark.parametrize("t,s", LAPLACE)
def test_compiled_laplace_equals_the_reference(t, s):
    ref = ns.laplace(KEY, t, s, np.arange(5_000, 25_000), backend="reference")
    assert np.unique(ref).size > 2  # not a constant: the comparison means something
    for width in _lane_widths():
        old = ns._compiled.set_lanes(width)
        try:
            assert np.array_equal(ns.laplace(KEY, t, s, range(5_000, 25_000), backend="compiled"), ref), width
        finally:
            ns._compiled.set_lanes(old)


@needs_compiled
@pytest.mark.parametrize("sigma2", GAUSS)
def test_compiled_gaussian_equals_the_reference(sigma2):
    t, p, q = _discrete_gaussian_parameters(sigma2)
    ref = ns.gaussian(KEY, t, p, q, np.arange(20_000), backend="reference")
    assert np.unique(ref).size > 2
    for width in _lane_widths():
        old = ns._compiled.set_lanes(width)
        try:
            assert np.array_equal(ns.gaussian(KEY, t, p, q, range(20_000), backend="compiled"), ref), width
        finally:
            ns._compiled.set_lanes(old)


@pytest.mark.parametrize("backend", ["reference", "compiled"])
def test_a_sample_is_a_function_of_key_and_index(backend):
    if backend == "compiled" and not COMPILED:
        pytest.skip("not built")
    t, p, q = _discrete_gaussian_parameters(Fraction(25))
    whole = ns.gaussian(KEY, t, p, q, range(3_000), backend=backend)
    rng = np.random.default_rng(7)  # test-only shuffling of indices, not noise
    order = rng.permutation(3_000)[:500]
    assert np.array_equal(ns.gaussian(KEY, t, p, q, order, backend=backend), whole[order])
    # odd lengths and single samples (the compiled path's scalar blocks), out of order
    assert np.array_equal(ns.gaussian(KEY, t, p, q, np.array([2_999, 5, 6, 7]), backend=backend), whole[[2_999, 5, 6, 7]])
    assert np.array_equal(ns.gaussian(KEY, t, p, q, range(1_000, 1_013), backend=backend), whole[1_000:1_013])
    other = ns.gaussian(bytes(32), t, p, q, range(3_000), backend=backend)
    assert not np.array_equal(other, whole)


def test_keyed_stream_draws_get_independent_keys():
    """Each draw on a KeyedStream has its own key: the same stream's two draws differ, a new stream repeats."""
    from dpcli.core.samplers import discrete_laplace

    a, b = KeyedStream(b"\x01" * 32, "x"), KeyedStream(b"\x01" * 32, "x")
    first, second = discrete_laplace(a, 10, 1_000), discrete_laplace(a, 10, 1_000)
    assert not np.array_equal(first, second)
    assert np.array_equal(discrete_laplace(b, 10, 1_000), first)
    assert a.noise_key() != KeyedStream(b"\x01" * 32, "y").noise_key()


@pytest.fixture
def wide_margin():
    old = ns.set_margin(1 / 8)
    yield
    ns.set_margin(old)


@pytest.mark.parametrize("t,s", [(1, 1), (3, 1), (1000, 1), (2**40, 3)])
def test_the_float_margin_changes_no_laplace_sample(t, s):
    """With margin 1/8 about a quarter of all comparisons go to the exact path (exact_less); every
    sample must stay what it was with the margin 2^-36, in both implementations."""
    narrow = ns.laplace(KEY, t, s, range(1_500), backend="reference")
    old = ns.set_margin(1 / 8)
    try:
        wide = ns.laplace(KEY, t, s, range(1_500), backend="reference")
        assert np.array_equal(narrow, wide)
        if COMPILED:
            assert np.array_equal(ns.laplace(KEY, t, s, range(1_500), backend="compiled"), narrow)
    finally:
        ns.set_margin(old)


@pytest.mark.parametrize("sigma2", [Fraction(1, 4), Fraction(10), Fraction(10**6)])
def test_the_float_margin_changes_no_gaussian_sample(sigma2):
    t, p, q = _discrete_gaussian_parameters(sigma2)
    narrow = ns.gaussian(KEY, t, p, q, range(1_000), backend="reference")
    old = ns.set_margin(1 / 8)
    try:
        assert np.array_equal(ns.gaussian(KEY, t, p, q, range(1_000), backend="reference"), narrow)
        if COMPILED:
            assert np.array_equal(ns.gaussian(KEY, t, p, q, range(1_000), backend="compiled"), narrow)
    finally:
        ns.set_margin(old)


@pytest.fixture(params=[0, 2])
def tables(request):
    """Run a test with the compiled path's threshold tables never built (0) and always built (2): by
    default (1) only large draws at small scales get them, so small tests would see one path only."""
    if not COMPILED:
        pytest.skip("dpcli.core._noise was not built")
    old = ns._compiled.set_tables(request.param)
    yield request.param
    ns._compiled.set_tables(old)


@pytest.mark.parametrize("t,s", [(2, 1), (3, 1), (7, 3), (1000, 1), (4096, 1), (4097, 1)])
def test_tables_change_no_laplace_sample(t, s, tables, lanes):
    ref = ns.laplace(KEY, t, s, np.arange(3_000), backend="reference")
    assert np.array_equal(ns.laplace(KEY, t, s, range(3_000), backend="compiled"), ref)


@pytest.mark.parametrize("sigma2", [Fraction(1, 4), Fraction(1), Fraction(10), Fraction(10**5), Fraction(10**12)])
def test_tables_change_no_gaussian_sample(sigma2, tables, lanes):
    """σ² = 10^5: |Y| both inside the acceptance table (|Y| < 4096) and beyond it."""
    t, p, q = _discrete_gaussian_parameters(sigma2)
    ref = ns.gaussian(KEY, t, p, q, np.arange(3_000), backend="reference")
    assert np.array_equal(ns.gaussian(KEY, t, p, q, range(3_000), backend="compiled"), ref)


@pytest.mark.parametrize("kind,param", [("laplace", (3, 1)), ("laplace", (1000, 1)), ("gaussian", Fraction(1)),
                                        ("gaussian", Fraction(10**5))])
def test_tables_with_a_wide_margin_change_no_sample(kind, param, tables, wide_margin):
    """The tables' integer thresholds follow the margin: with 1/8 many trials go to exact_less."""
    if kind == "laplace":
        ref = ns.laplace(KEY, *param, np.arange(600), backend="reference")
        assert np.array_equal(ns.laplace(KEY, *param, range(600), backend="compiled"), ref)
    else:
        t, p, q = _discrete_gaussian_parameters(param)
        ref = ns.gaussian(KEY, t, p, q, np.arange(600), backend="reference")
        assert np.array_equal(ns.gaussian(KEY, t, p, q, range(600), backend="compiled"), ref)


def test_the_margin_is_used():
    """The wide margin really sends comparisons down the exact path (else the tests above prove nothing)."""
    calls = []
    real = ns.exact_less

    def counting(*args):
        calls.append(args)
        return real(*args)

    old = ns.set_margin(1 / 8)
    try:
        ns.exact_less = counting
        ns.laplace(KEY, 1000, 1, range(200), backend="reference")
        n_ref = len(calls)
        if COMPILED:
            ns.laplace(KEY, 1000, 1, range(200), backend="compiled")
            # fewer than the reference: the compiled path decides most of Algorithm 2's first
            # trials from bounds on exp (1 − g ≤ e^{−g} ≤ 1 − g + g²/2) before the margin applies
            assert len(calls) > n_ref + 20
    finally:
        ns.exact_less = real
        ns.set_margin(old)
    assert n_ref > 50


def test_exact_less_against_exact_rationals():
    """V < exp(−num/den) decided from V's words: compare with a direct high-precision computation."""
    import decimal

    ctx = decimal.Context(prec=60)
    for num, den in [(1, 1), (3, 2), (1, 1000), (999, 1000), (40, 1), (5, 7)]:
        p = ctx.exp(ctx.divide(-decimal.Decimal(num), decimal.Decimal(den)))
        u_star = int(p * (1 << 32))  # V's leading word straddling p: needs the extension stream
        for j, i in [(0, 0), (5, 3), (2**40, 17)]:
            words = ns.chacha20_blocks(KEY, 0, j & 0xFFFFFFFF, j >> 32, (1 << 31) + i)[0]
            v = decimal.Decimal(u_star) / (1 << 32)
            for k, w in enumerate(words[:4]):
                v += decimal.Decimal(int(w)) / decimal.Decimal(2) ** (32 * (k + 2))
            assert ns.exact_less(KEY, j, i, u_star, num, den) == (v < p)
            assert ns.exact_less(KEY, j, i, u_star - 1, num, den) is True
            assert ns.exact_less(KEY, j, i, u_star + 1, num, den) is False
    assert ns.exact_less(KEY, 0, 0, 2**32 - 1, 0, 1) is True


def test_the_same_samples_in_another_process():
    """Determinism across processes (and backends): a fresh interpreter draws the same numbers."""
    code = ("import numpy as np; from dpcli.core import noise_stream as ns; "
            "print(ns.gaussian(bytes(range(32)), 4, 3, 5, range(64)).tolist())")
    env = {**os.environ, "DPCLI_NOISE_BACKEND": "reference"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert eval(out) == ns.gaussian(KEY, 4, 3, 5, range(64)).tolist()


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        ns.laplace(KEY, 0, 1, range(3))
    with pytest.raises(ValueError):
        ns.laplace(KEY, 2**45, 1, range(3))
    with pytest.raises(ValueError):
        ns.gaussian(KEY[:16], 1, 1, 1, range(3))
    with pytest.raises(ValueError):  # 2tpq must fit the compiled path's exact arithmetic
        ns.gaussian(KEY, 2**40, 2**30, 2**10, range(3))
    with pytest.raises(ValueError):
        ns.laplace(KEY, 3, 1, range(0, 10, 2))
    with pytest.raises(ValueError):
        ns.set_margin(0.75)


def test_the_noise_version_is_part_of_the_seed(tmp_path, monkeypatch):
    """A release drawn under another noise definition is never a free replay of this one."""
    from dpcli.release import seeds as release

    monkeypatch.setenv("DPCLI_STATE_DIR", str(tmp_path))
    doc = release.DocumentInput("sha256:x", "toml")
    calibration = release.Calibration("pure", {"scale": 1})
    a = release.release_seed(tmp_path, {"q": 1}, {"input": doc}, calibration)
    assert release.release_seed(tmp_path, {"q": 1}, {"input": doc}, calibration).id == a.id
    monkeypatch.setattr(release, "NOISE_VERSION", 3)
    assert release.release_seed(tmp_path, {"q": 1}, {"input": doc}, calibration).id != a.id


def test_stream_step_digests_keep_v1_runs_and_bind_the_noise_version():
    from dpcli.state import ledger
    from dpcli.release import streams as statefile

    seed = b"\x07" * 32
    v1 = ledger.step_digest(seed, {"input": "fp", "through": 42})
    assert statefile._step_digest(seed, "fp", 42, 1, None) == v1  # runs recorded before v2 still match
    assert statefile._step_digest(seed, "fp", 42, 2, None) != v1


def test_laplace_tail_is_geometric_via_one_word():
    """The geometric part ⌊−ln W⌋ from one word: P[V ≥ k] = e^{−k}. With scale t = 1 a sample is
    ±V exactly when accepted, so |X| has P[|X| ≥ k | X ≠ 0] = e^{−(k−1)}; 10^5 draws, 5σ binomial
    tolerance per k."""
    x = np.abs(ns.laplace(KEY, 1, 1, range(100_000)))
    nz = x[x > 0]
    for k in range(1, 8):
        p = math.exp(-(k - 1))
        observed = (nz >= k).mean()
        assert abs(observed - p) <= 5 * math.sqrt(p * (1 - p) / nz.size) + 1e-12, k


# -- `make audit`: the issue-20 acceptance checks at full size ------------------------------------


@pytest.mark.audit
@needs_compiled
@pytest.mark.parametrize("kind,param", [("laplace", (1, 2)), ("laplace", (1, 1)), ("laplace", (3, 1)),
                                        ("laplace", (1000, 1)), ("laplace", (10**6, 1)),
                                        ("gaussian", Fraction(1, 4)), ("gaussian", Fraction(1)),
                                        ("gaussian", Fraction(100)), ("gaussian", Fraction(10**6)),
                                        ("gaussian", Fraction(10**12))])
def test_reference_and_compiled_identical_on_a_million_draws(kind, param, lanes):
    """10^6 samples per scale: the two implementations give the same stream, value for value."""
    n = 1_000_000
    if kind == "laplace":
        t, s = param
        ref = ns.laplace(KEY, t, s, range(n), backend="reference")
        fast = ns.laplace(KEY, t, s, range(n), backend="compiled")
    else:
        t, p, q = _discrete_gaussian_parameters(param)
        ref = ns.gaussian(KEY, t, p, q, range(n), backend="reference")
        fast = ns.gaussian(KEY, t, p, q, range(n), backend="compiled")
    assert np.array_equal(ref, fast)


@pytest.mark.audit
@pytest.mark.parametrize("kind,scale", [("laplace", Fraction(1, 2)), ("laplace", Fraction(3)),
                                        ("gaussian", Fraction(1, 2)), ("gaussian", Fraction(10))])
def test_reference_path_goodness_of_fit(kind, scale, monkeypatch):
    """The goodness-of-fit audit of test_samplers.py, run through the numpy reference (the path used
    where the extension was not built): 2·10^5 samples, p > 1e-4, ±30% scales rejected."""
    from test_samplers import _chi2_p, _gauss_pmf, _laplace_pmf

    from dpcli.core.samplers import (
        discrete_gaussian,
        discrete_laplace,
        effective_sigma2,
    )

    monkeypatch.setattr(ns, "BACKEND", "reference")
    stream = KeyedStream(b"\x43" * 32, f"ref-{kind}-{scale}")
    if kind == "laplace":
        x = discrete_laplace(stream, scale, 200_000)
        pmf = lambda v, f=1.0: _laplace_pmf(v, float(scale) * f)  # noqa: E731
    else:
        eff = float(effective_sigma2(scale**2))
        x = discrete_gaussian(stream, scale**2, 200_000)
        pmf = lambda v, f=1.0: _gauss_pmf(v, eff * f * f)  # noqa: E731
    assert _chi2_p(x, pmf) > 1e-4
    for wrong in (0.7, 1.3):
        assert _chi2_p(x, lambda v: pmf(v, wrong)) < 1e-6


@needs_compiled
def test_threads_change_no_sample():
    """Large draws are split over threads (disjoint ranges of samples): 1, 2 and 3 threads, with a
    share as small as 7 samples, give the same values, also for index arrays."""
    t, p, q = _discrete_gaussian_parameters(Fraction(10**4))
    old = ns._compiled.set_threads(1)
    try:
        one = ns.gaussian(KEY, t, p, q, range(5_000))
        picked = np.arange(4_999, -1, -3)
        for threads in (2, 3):
            ns._compiled.set_threads(threads, 7)
            assert np.array_equal(ns.gaussian(KEY, t, p, q, range(5_000)), one), threads
            assert np.array_equal(ns.gaussian(KEY, t, p, q, picked), one[picked]), threads
    finally:
        ns._compiled.set_threads(old, 1 << 15)  # the defaults


@needs_compiled
def test_exact_decisions_and_errors_from_worker_threads(monkeypatch):
    """Worker threads take the GIL for the rare exact comparison (here made frequent by a wide margin),
    and an error raised there reaches the caller, with nothing returned."""
    old_threads = ns._compiled.set_threads(2, 50)
    old_margin = ns.set_margin(1 / 8)
    try:
        ref = ns.laplace(KEY, 1000, 1, range(1_000), backend="reference")
        assert np.array_equal(ns.laplace(KEY, 1000, 1, range(1_000), backend="compiled"), ref)

        def broken(*args):
            raise ZeroDivisionError("from a worker")

        monkeypatch.setattr(ns, "exact_less", broken)
        with pytest.raises(ZeroDivisionError, match="from a worker"):
            ns.laplace(KEY, 1000, 1, range(1_000), backend="compiled")
    finally:
        ns._compiled.set_threads(old_threads, 1 << 15)
        ns.set_margin(old_margin)
