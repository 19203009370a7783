"""A year of daily snapshots: the schedules of ``--schedule`` under one privacy definition (paper 004).

365 daily snapshots grow geometrically from 10^4 to 10^6 rows (one row per privacy unit, 10
Zipf-distributed groups). Every day each schedule answers a known-domain histogram of counts
(sensitivity 1, dpcli's exact discrete Laplace noise). Every schedule is (ε = 1, δ = 10^-6)-DP over
the whole year (the pure ones are (1, 0)-DP, which is stronger):

* ``bbscheduler``: Algorithm 1 with δ > 0 (γ from Algorithm 1, ε_i with the CDP constants); a new
  release when the snapshot has grown by (1 + γ) since the epoch began, else the cached one, on the
  exact sizes (the paper's setting, which dpcli no longer uses: the reference);
* ``bbscheduler-noisy``: what ``--scheduler bbscheduler`` does (issue 29): the same on noisy sizes,
  with ñ, γ and the crossing tests of dpcli.core.schedules paid from ε/10, the releases from 9ε/10;
* ``bbscheduler-pure``: the same with δ = 0, what ``--schedule NAME --total-epsilon 1`` does by default
  (issue 31): (1, 0)-DP, its ε_i summed;
* ``bbimprover-rows``: Algorithm 2 as printed, t = the snapshot's rows, c = 0.1;
* ``bbimprover-runs``: dpcli's cron form, t = the run's number k, c = 0.1 (the default);
* ``fixed-365``: the same ε every day, chosen so that 365 runs compose (CDP, Theorem 4) to exactly
  (1, 10^-6): it lasts the year because it knows the year has 365 runs;
* ``fixed-pure``: what ``--scheduler fixed --epsilon 1/365 --total-epsilon 1`` does (dpcli's fixed
  composes pure runs by their sum): ε = 1/365 every day, (1, 0)-DP over the year;
* ``naive``: the baseline the paper argues against, a fixed ε = 0.05 per run (pure, summed), which
  runs out after 20 days; afterwards the last release is served, stale.

Per day: the mean absolute error of the released *fractions* (count / current size) against the
current snapshot, averaged over 20 noise seeds, the (ε, δ) spent so far (CDP composition of
the runs made for the δ > 0 schedules, the sum for the pure ones; plus the size estimates committed
for bbscheduler-noisy and -pure), and the 95% margin of a count in the release served that day (its
discrete Laplace noise at sensitivity 1, in units). Theorem 10's bound for
BBScheduler, α ≈ C·(ln(1/β)/(ε n))^{1/3} with C = 1, β = 0.05 and n = 10^4, is drawn for scale.
Writes ``bench/growing_schedules.png`` with dpcli's own plotting module (``dpcli.plot.figure``) and
prints the tables of ``bench/growing_schedules.md``.

Run by hand (``make bench-growing``).
"""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import numpy as np

from dpcli.core import mechanisms
from dpcli.core import schedules as sch
from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import discrete_laplace

DAYS = 365
TOTAL = Fraction(1)
DELTA = 1e-6
GROUPS = 10
TRIALS = 20
C = sch.DEFAULT_IMPROVER_C
NAIVE = Fraction(1, 20)
FIXED_PURE = Fraction(math.floor(10**15 / DAYS), 10**15)  # 1/365, rounded down as dpcli's per-run ε
BETA = 0.05
SHOW = (0, 6, 29, 89, 179, 364)


def fixed_cdp_epsilon(runs: int, total: float, delta: float) -> Fraction:
    """The largest per-run ε (rounded down) whose ``runs``-fold CDP composition is ≤ (total, δ)."""
    lo, hi = 0.0, total
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sch.cdp_total([Fraction(mid)] * runs, delta) <= total else (lo, mid)
    return Fraction(math.floor(lo * 10**15), 10**15)


def noisy_epochs(sizes: np.ndarray, delta: float = DELTA) -> tuple[list[int | None], list[Fraction], Fraction]:
    """bbscheduler with dpcli's noisy sizes (one row per unit): per day the epoch started (None: the
    cached release) and the size ε committed so far; and γ. One decision path, from a fixed stream."""
    def day_stream(day: int) -> KeyedStream:
        return KeyedStream(hashlib.sha256(f"growing/sizes/{day}".encode()).digest(), "bench")

    start = sch.noisy_start(day_stream(0).child("start"), int(sizes[0]), TOTAL)
    gamma = sch.default_gamma(float(sch.release_total(TOTAL)), start, delta, BETA)
    epochs: list[int | None] = [0]
    test_eps = sch.crossing_epsilon(1, gamma, TOTAL)
    rho = sch.threshold_noise(day_stream(0).child("threshold/1"), test_eps)
    committed = [sch.start_epsilon(TOTAL) + test_eps]
    k = 1
    for day in range(1, len(sizes)):
        units, s = int(sizes[day]), day_stream(day)
        epoch = None
        if sch.crossed(s.child(f"crossed/{k}"), units, sch.epoch_threshold(k, start, gamma), rho, test_eps):
            count = sch.crossing_count(s.child(f"count/{k}"), units, test_eps)
            epoch = max(k, sch.epoch_of(max(count, start), start, gamma))
            k = epoch + 1
            test_eps = sch.crossing_epsilon(k, gamma, TOTAL)
            rho = sch.threshold_noise(s.child(f"threshold/{k}"), test_eps)
            committed.append(committed[-1] + test_eps)
        else:
            committed.append(committed[-1])
        epochs.append(epoch)
    return epochs, committed, gamma


def main(out: str = "bench/growing_schedules.png") -> None:
    rng = np.random.default_rng(4)  # data generation only
    sizes = np.round(1e4 * 100 ** (np.arange(DAYS) / (DAYS - 1))).astype(np.int64)
    n_max = int(sizes[-1])
    w = 1.0 / np.arange(1, GROUPS + 1)
    rows = rng.choice(GROUPS, size=n_max, p=w / w.sum())
    onehot = np.zeros((n_max, GROUPS), dtype=np.int64)
    onehot[np.arange(n_max), rows] = 1
    cum = np.cumsum(onehot, axis=0)

    def release(eps: Fraction, size: int, label: str) -> np.ndarray:
        """TRIALS independent noisy histograms of the snapshot of ``size`` rows, as fractions."""
        stream = KeyedStream(hashlib.sha256(f"growing/{label}/{size}".encode()).digest(), "bench")
        noise = discrete_laplace(stream, 1 / eps, GROUPS * TRIALS).reshape(TRIALS, GROUPS)
        return (cum[size - 1] + noise) / size

    n0 = int(sizes[0])
    gamma = sch.default_gamma(float(TOTAL), n0, DELTA, BETA)
    fixed_eps = fixed_cdp_epsilon(DAYS, float(TOTAL), DELTA)
    names = ["bbscheduler", "bbscheduler-noisy", "bbscheduler-pure", "bbimprover-rows", "bbimprover-runs",
             "fixed-365", "fixed-pure", "naive"]
    noisy, committed, noisy_gamma = noisy_epochs(sizes)
    pure_epochs, pure_committed, pure_gamma = noisy_epochs(sizes, 0.0)
    margins: dict[str, list[int]] = {k: [] for k in names}
    errors: dict[str, list[float]] = {k: [] for k in names}
    spent: dict[str, list[float]] = {k: [] for k in names}
    runs: dict[str, list[Fraction]] = {k: [] for k in names}
    cached: dict[str, np.ndarray] = {}
    epoch_now = -1
    for day, size in enumerate(int(s) for s in sizes):
        now = cum[size - 1] / size
        epoch = sch.epoch_of(size, n0, gamma)
        todays = {
            "bbimprover-rows": sch.bbimprover_epsilon(size, TOTAL, DELTA, C),
            "bbimprover-runs": sch.bbimprover_epsilon(day + 1, TOTAL, DELTA, C),
            "fixed-365": fixed_eps,
            "fixed-pure": FIXED_PURE,
        }
        if epoch != epoch_now:
            todays["bbscheduler"] = sch.bbscheduler_epsilon(epoch, gamma, TOTAL, DELTA)
            epoch_now = epoch
        if noisy[day] is not None:
            todays["bbscheduler-noisy"] = sch.bbscheduler_epsilon(noisy[day], noisy_gamma, sch.release_total(TOTAL),
                                                                  DELTA)
        if pure_epochs[day] is not None:
            todays["bbscheduler-pure"] = sch.bbscheduler_epsilon(pure_epochs[day], pure_gamma,
                                                                 sch.release_total(TOTAL), 0.0)
        if sum(runs["naive"]) + NAIVE <= TOTAL:
            todays["naive"] = NAIVE
        for name in names:
            if name in todays:
                runs[name].append(todays[name])
                cached[name] = release(todays[name], size, name)
            errors[name].append(float(np.abs(cached[name] - now).mean()))
            margins[name].append(mechanisms.laplace(1, runs[name][-1]).margin95())
            pure = name in ("naive", "bbscheduler-pure", "fixed-pure")
            spent[name].append(float(sum(runs[name])) if pure else sch.cdp_total(runs[name], DELTA))
        spent["bbscheduler-noisy"][-1] += float(committed[day])
        spent["bbscheduler-pure"][-1] += float(pure_committed[day])
    bound = (math.log(1 / BETA) / (float(TOTAL) * n0)) ** (1 / 3)

    print(f"bbscheduler-noisy: γ = {float(noisy_gamma):.4f}, {sum(e is not None for e in noisy)} runs, last epoch "
          f"{max(e for e in noisy if e is not None)}")
    print(f"bbscheduler-pure: γ = {float(pure_gamma):.4f}, {sum(e is not None for e in pure_epochs)} runs, last epoch "
          f"{max(e for e in pure_epochs if e is not None)}")
    print(f"γ = {float(gamma):.4f}: {epoch_now + 1} bbscheduler epochs over {DAYS} days; fixed-365: "
          f"ε = {float(fixed_eps):.5f} per run; Theorem 10 bound (C = 1): α ≈ {bound:.3g}")
    print("\nMean |error| of the released fractions (20 noise seeds):\n")
    print("| day | rows | " + " | ".join(names) + " |")
    print("|---:|---:|" + "---:|" * len(names))
    for d in SHOW:
        print(f"| {d + 1} | {int(sizes[d]):,} | " + " | ".join(f"{errors[k][d]:.2e}" for k in names) + " |")
    print("\nε spent so far (CDP composition for δ = 10^-6; the sum for the pure ones), of ε = 1 reserved:\n")
    print("| day | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for d in SHOW:
        print(f"| {d + 1} | " + " | ".join(f"{spent[k][d]:.4f}" for k in names) + " |")
    print("\n95% margin of a count in the release served that day (discrete Laplace, sensitivity 1):\n")
    print("| day | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for d in SHOW:
        print(f"| {d + 1} | " + " | ".join(f"±{margins[k][d]:,}" for k in names) + " |")
    print("\nruns made: " + ", ".join(f"{k} {len(v)}" for k, v in runs.items()))

    from dpcli.plot.figure import _pyplot, save

    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    days = np.arange(1, DAYS + 1)
    for k in names:
        ax.plot(days, errors[k], label=k)
        bx.plot(days, spent[k], label=k)
    ax.axhline(bound, color="grey", linestyle=":", label="Theorem 10 bound (C = 1)")
    ax.set_yscale("log")
    ax.set_xlabel("day (snapshot grows 10^4 → 10^6 rows)")
    ax.set_ylabel("mean |error| of released fractions")
    ax.set_title("error, every schedule (1, 10^-6)-DP over the year")
    ax.legend(fontsize=8)
    bx.set_xlabel("day")
    bx.set_ylabel("ε spent so far (of 1 reserved)")
    bx.set_title("budget used")
    bx.set_ylim(0, 1.05)
    fig.tight_layout()
    save(fig, out)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
