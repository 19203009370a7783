"""Simulate a year of daily snapshots and compare the three schedules of ``--schedule`` (paper 004).

365 daily snapshots grow geometrically from 10^4 to 10^6 rows (one row per
privacy unit, 10 Zipf-distributed groups). Every day each schedule answers a
known-domain histogram of counts (sensitivity 1, discrete Laplace noise from
dpcli's exact sampler):

* ``bbscheduler`` (δ = 0): a new release when the snapshot has grown by (1 + γ)
  since the current epoch began, ε_i from Algorithm 1; otherwise the cached one;
* ``bbimprover`` (δ = 1e-6): a fresh release every day with ε_t ∝ t^-(1/2+c);
* ``fixed``: total/365 per day (so it lasts exactly the year).

All at the same total ε = 1. The error of a day is the mean absolute error of
the released *fractions* (count / current size) against the current
snapshot's truth, so a stale cached answer is charged for its staleness.
Writes ``bench/growing_schedules.png`` and prints the error at a few days.

Run by hand (``make bench-growing``).
"""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np

from dpcli.core import schedules as sch
from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import discrete_laplace

DAYS = 365
TOTAL = Fraction(1)
DELTA = 1e-6
GROUPS = 10


def main(out: str = "bench/growing_schedules.png") -> None:
    rng = np.random.default_rng(4)  # data generation only
    sizes = np.unique(np.round(1e4 * 100 ** (np.arange(DAYS) / (DAYS - 1))).astype(np.int64))
    n_max = int(sizes[-1])
    w = 1.0 / np.arange(1, GROUPS + 1)
    rows = rng.choice(GROUPS, size=n_max, p=w / w.sum())
    onehot = np.zeros((n_max, GROUPS), dtype=np.int64)
    onehot[np.arange(n_max), rows] = 1
    cum = np.cumsum(onehot, axis=0)

    def truth(size: int) -> np.ndarray:
        return cum[size - 1]

    def release(eps: Fraction, size: int, label: str) -> np.ndarray:
        stream = KeyedStream(hashlib.sha256(f"growing/{label}/{size}".encode()).digest(), "bench")
        return truth(size) + discrete_laplace(stream, 1 / eps, GROUPS)

    n0 = int(sizes[0])
    gamma = sch.default_gamma(float(TOTAL), n0, 0.0)
    errors: dict[str, list[float]] = {"bbscheduler": [], "bbimprover": [], "fixed": []}
    spent = {k: Fraction(0) for k in errors}
    current_epoch, cached = -1, None
    for day, size in enumerate(sizes):
        size = int(size)
        now = truth(size) / size
        epoch = sch.epoch_of(size, n0, gamma)
        if epoch != current_epoch:
            eps = sch.bbscheduler_epsilon(epoch, gamma, TOTAL, 0.0)
            cached = release(eps, size, "bbs") / size
            current_epoch = epoch
            spent["bbscheduler"] += eps
        errors["bbscheduler"].append(float(np.abs(cached - now).mean()))
        eps_t = sch.bbimprover_epsilon(size, TOTAL, DELTA, 0.25)
        spent["bbimprover"] += eps_t
        errors["bbimprover"].append(float(np.abs(release(eps_t, size, "bbi") / size - now).mean()))
        eps_f = TOTAL / DAYS
        spent["fixed"] += eps_f
        errors["fixed"].append(float(np.abs(release(eps_f, size, "fix") / size - now).mean()))
    print(f"γ = {float(gamma):.4f}; {current_epoch + 1} bbscheduler epochs over {len(sizes)} days")
    print(f"{'day':>5} {'rows':>9} " + " ".join(f"{k:>12}" for k in errors))
    for d in (0, 30, 90, 180, 270, len(sizes) - 1):
        print(f"{d:>5} {int(sizes[d]):>9} " + " ".join(f"{errors[k][d]:>12.2e}" for k in errors))
    print("ε spent: " + ", ".join(f"{k} {float(v):.4f}" for k, v in spent.items()))
    print("CDP loss of bbimprover's runs:", round(sch.cdp_total([sch.bbimprover_epsilon(int(s), TOTAL, DELTA, 0.25) for s in sizes], DELTA), 4))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, v in errors.items():
        ax.plot(np.arange(len(sizes)), v, label=k)
    ax.set_yscale("log")
    ax.set_xlabel("day (snapshot grows 10^4 → 10^6 rows)")
    ax.set_ylabel("mean |error| of released fractions")
    ax.set_title("Histogram over a growing database, total ε = 1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
