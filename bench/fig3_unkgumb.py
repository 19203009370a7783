"""Reproduce Figure 3 of the LinkedIn paper (000): UnkGumb^{50, d̄, 1} results vs ε_per.

For a top-50 query on distinct-member counts (τ = 1, δ = 1e-10), the number of groups UnkGumb
returns for ε_per ∈ {0.01 … 0.2} and several d̄, with the mean and the 25th–75th percentiles over
SEEDS independent keyed streams (the data is fixed; only the noise changes, as in the paper).
Writes a PNG and prints the table; bench/fig3.md records the figures and the verdict.

Data (``--law``):

* ``mandelbrot`` (default): h_i = ⌊A / (i + q)^s⌋ with A = 40,000, q = 50, s = 1 over 20,000
  articles: a Zipf–Mandelbrot engagement law, whose head is flatter than Zipf's (the most-read
  articles of a day reach a few hundred distinct members each, h_1 = 784, h_50 = 400,
  h_400 = 88). Why this shape: see bench/fig3.md ("Which count shapes double").
* ``zipf``: h_i = ⌊10,000 / i⌋ (the earlier synthetic data);
* ``sample``: the distinct users per page of ``sample_data/page_views.parquet`` (400 pages, so
  only the d̄ below 400 are run).

Run by hand (``make bench-fig3``): python bench/fig3_unkgumb.py [--seeds 1000] [--law mandelbrot] [--out PNG]
"""

from __future__ import annotations

import argparse
import hashlib
import os
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction

import numpy as np

from dpcli.core.prf import KeyedStream
from dpcli.core.selection import unknown_top_k

EPSILONS = ["0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.12", "0.15", "0.2"]
DBARS = [100, 200, 400, 800]
K = 50
DELTA = Fraction(1, 10**10)


def histogram(law: str) -> np.ndarray:
    """The fixed true counts, largest first (see the module docstring)."""
    if law == "sample":
        import polars as pl

        df = pl.read_parquet("sample_data/page_views.parquet")
        h = df.group_by("page").agg(pl.col("user_id").n_unique().alias("h"))["h"].to_numpy()
    elif law == "zipf":
        h = 10_000 // np.arange(1, 20_001)
    else:
        h = np.floor(40_000 / (np.arange(1, 20_001) + 50.0)).astype(np.int64)
    return np.sort(h.astype(np.int64))[::-1]


def one(args: tuple[np.ndarray, str, int, int]) -> int:
    h, eps, dbar, seed = args
    stream = KeyedStream(hashlib.sha256(f"fig3/{eps}/{dbar}/{seed}".encode()).digest(), "fig3")
    return len(unknown_top_k(stream, h[: dbar + 1], K, dbar, Fraction(eps), 1, DELTA).positions)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--law", choices=["mandelbrot", "zipf", "sample"], default="mandelbrot")
    ap.add_argument("--out", default="bench/fig3_unkgumb.png")
    args = ap.parse_args()
    h = histogram(args.law)
    dbars = [d for d in DBARS if d < len(h)]  # d̄ must stay inside the data (d̄ + 1 counts are read)
    table: dict[int, list[tuple[float, float, float]]] = {}
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        for dbar in dbars:
            rows = []
            for eps in EPSILONS:
                got = np.array(list(pool.map(one, [(h, eps, dbar, s) for s in range(args.seeds)], chunksize=25)))
                rows.append((np.percentile(got, 25), got.mean(), np.percentile(got, 75)))
            table[dbar] = rows
    print(f"returned groups (mean [25%, 75%]) for a top-50 query, δ = 1e-10, {args.law} data, {args.seeds} seeds")
    print("ε_per   " + "".join(f"{'d̄=' + str(d):>18}" for d in dbars))
    for i, eps in enumerate(EPSILONS):
        cells = "".join(f"{f'{table[d][i][1]:.1f} [{table[d][i][0]:.0f}, {table[d][i][2]:.0f}]':>18}" for d in dbars)
        print(f"{eps:<8}{cells}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [float(e) for e in EPSILONS]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for dbar in dbars:
        lo, mean, hi = (np.array(c) for c in zip(*table[dbar], strict=True))
        ax.plot(xs, mean, marker="o", label=f"d̄ = {dbar}")
        ax.fill_between(xs, lo, hi, alpha=0.2)
    ax.set_xlabel("ε_per")
    ax.set_ylabel("groups returned (of k = 50)")
    ax.set_title(f"UnkGumb, top-50, δ = 1e-10, {args.law} data, {args.seeds} seeds (mean, 25–75%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
