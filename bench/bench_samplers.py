"""Sampler throughput (target: ≥ 1M discrete Laplace / discrete Gaussian samples per second at scales up to 10^6).

Run by hand: ``.venv/bin/python bench/bench_samplers.py``. Prints the median of 3 runs of 10^6 samples.
"""

from __future__ import annotations

import statistics
import time
from fractions import Fraction

from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import discrete_gaussian, discrete_laplace

N = 1_000_000


def rate(fn, scale) -> float:
    times = []
    for i in range(3):
        s = KeyedStream(bytes([i]) * 32, "bench")
        t = time.perf_counter()
        fn(s, scale, N)
        times.append(time.perf_counter() - t)
    return N / statistics.median(times)


def main() -> None:
    print(f"{'sampler':<18} {'scale':>10} {'samples/s':>12}")
    for b in (Fraction(1, 2), 1, 3, 1000, 10**6):
        print(f"{'discrete_laplace':<18} {str(b):>10} {rate(discrete_laplace, b):>12,.0f}")
    for sigma in (Fraction(1, 2), 1, 3, 10, 1000, 10**6):
        print(f"{'discrete_gaussian':<18} {str(sigma):>10} {rate(discrete_gaussian, Fraction(sigma) ** 2):>12,.0f}")


if __name__ == "__main__":
    main()
