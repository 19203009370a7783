"""Reproduce the shape of Figure 3 of the LinkedIn paper (000): UnkGumb^{50, d̄, 1} results vs ε_per.

For a top-50 query on distinct-member counts (τ = 1, δ = 1e-10), the number
of groups UnkGumb returns for ε_per ∈ {0.01 … 0.2} and several d̄, with the
median and the 25th–75th percentiles over SEEDS independent keyed streams (the
data is fixed; only the noise changes, as in the paper). Writes a PNG and
prints the table.

Data: by default a synthetic Zipf histogram (20,000 articles, h_i = ⌊10,000 / i⌋);
``--sample`` uses the distinct users per page of ``sample_data/page_views.parquet``.

Run by hand (``make bench-fig3``): python bench/fig3_unkgumb.py [--seeds 200] [--out bench/fig3_unkgumb.png]
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


def histogram(sample: bool) -> np.ndarray:
    if sample:
        import polars as pl

        df = pl.read_parquet("sample_data/page_views.parquet")
        h = df.group_by("page").agg(pl.col("user_id").n_unique().alias("h"))["h"].to_numpy()
    else:
        h = 10_000 // np.arange(1, 20_001)
    return np.sort(h.astype(np.int64))[::-1]


def one(args: tuple[np.ndarray, str, int, int]) -> int:
    h, eps, dbar, seed = args
    stream = KeyedStream(hashlib.sha256(f"fig3/{eps}/{dbar}/{seed}".encode()).digest(), "fig3")
    return len(unknown_top_k(stream, h[: dbar + 1], K, dbar, Fraction(eps), 1, DELTA).positions)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--sample", action="store_true")
    ap.add_argument("--out", default="bench/fig3_unkgumb.png")
    args = ap.parse_args()
    h = histogram(args.sample)
    table: dict[int, list[tuple[float, float, float]]] = {}
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        for dbar in DBARS:
            rows = []
            for eps in EPSILONS:
                got = np.array(list(pool.map(one, [(h, eps, dbar, s) for s in range(args.seeds)], chunksize=8)))
                rows.append((np.percentile(got, 25), np.median(got), np.percentile(got, 75)))
            table[dbar] = rows
    print("returned groups (median [25%, 75%]) for a top-50 query, δ = 1e-10")
    print("ε_per   " + "".join(f"{'d̄=' + str(d):>18}" for d in DBARS))
    for i, eps in enumerate(EPSILONS):
        cells = "".join(f"{f'{table[d][i][1]:.0f} [{table[d][i][0]:.0f}, {table[d][i][2]:.0f}]':>18}" for d in DBARS)
        print(f"{eps:<8}{cells}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [float(e) for e in EPSILONS]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for dbar in DBARS:
        lo, med, hi = (np.array(c) for c in zip(*table[dbar]))
        ax.plot(xs, med, marker="o", label=f"d̄ = {dbar}")
        ax.fill_between(xs, lo, hi, alpha=0.2)
    ax.set_xlabel("ε_per")
    ax.set_ylabel("groups returned (of k = 50)")
    ax.set_title(f"UnkGumb, top-50, δ = 1e-10, {args.seeds} seeds (median, 25–75%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
