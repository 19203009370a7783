import subprocess
import sys

import numpy as np

from dpcli.core.prf import KeyedStream, canonical_json, derive_seed, seed_id

KEY = bytes(range(32))


def test_canonical_json_ignores_key_order_and_float_spelling():
    a = canonical_json({"b": 1.0, "a": [1, 2], "eps": 0.1})
    b = canonical_json({"eps": 0.1, "a": (1, 2), "b": 1})
    assert a == b


def test_seed_changes_with_any_query_field():
    base = {"command": "histogram", "data": "sha256:aa", "epsilon": "1"}
    s0 = derive_seed(KEY, base)
    assert derive_seed(KEY, dict(base)) == s0
    for field, value in [("data", "sha256:ab"), ("epsilon", "1.5"), ("command", "topk")]:
        assert derive_seed(KEY, {**base, field: value}) != s0
    assert derive_seed(bytes(32), base) != s0
    assert len(seed_id(s0)) == 24


def test_stream_is_independent_of_call_batching():
    s1, s2 = KeyedStream(b"\x07" * 32, "x"), KeyedStream(b"\x07" * 32, "x")
    whole = s1.uint64(20000)  # crosses a 64 KiB chunk boundary
    parts = np.concatenate([s2.uint64(n) for n in (1, 7, 8191, 11801)])
    assert np.array_equal(whole, parts)


def test_labels_and_children_are_domain_separated():
    seed = b"\x09" * 32
    a = KeyedStream(seed, "a").uint64(4)
    b = KeyedStream(seed, "b").uint64(4)
    c = KeyedStream(seed, "a").child("c").uint64(4)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


def test_stream_is_identical_in_a_fresh_process():
    code = (
        "from dpcli.core.prf import KeyedStream;"
        "print(','.join(map(str, KeyedStream(bytes(range(32)), 'det').uint64(5))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    here = ",".join(map(str, KeyedStream(bytes(range(32)), "det").uint64(5)))
    assert out == here


def test_non_finite_numbers_are_rejected():
    import pytest

    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="non-finite"):
            canonical_json({"epsilon": bad})
