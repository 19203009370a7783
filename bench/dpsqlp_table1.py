"""Reproduce DP-SQLP's Table 1 (paper 001, Sec. 5.1) at reduced scale, and measure work per trigger.

Data: ``bench/synthetic.py`` with the paper's Zipf–Mandelbrot parameters
(records per user q = 26, s = 6.738 on [1, 10^5]; keys q = 1000, s = 1.4),
10^5 users and 10^5 keys by default (the paper: 10^7 users, 10^6 keys), one
"day" of 10^5 s so that 100 and 1,000 triggers have whole-second lengths.
Query: COUNT(*) GROUP BY key, ε = 6, δ = 1e-9, C = 32, one window = the day.

Compared on the final histogram of the day (the last released value of each
key; 0 for a key never released) against the true, unbounded count per key,
over every key with at least one record:

* **DP-SQLP**: ``dpcli.tasks.stream.run_stream`` (the library behind
  ``dpcli stream-replay``), with its exact discrete noise;
* **Baseline 1** (repeated one-shot query): at each of the T triggers a
  one-shot Gaussian query on all data so far, so the budget is split T ways;
  only the last query's output matters for the final histogram;
* **Baseline 2** (incremental one-shot): one one-shot query per micro-batch
  (also T-fold composition), with the same global cap of C records per user;
  the final value of a key is the sum of its released per-batch counts.

The one-shot query (Plume-style, Gaussian mechanism): the composition of the
T queries is done in zCDP (as tight as the optimal (ε, δ) composition for
Gaussians): total ρ from (ε, δ/2), each query ρ/T, half for partition
selection and half for the counts. Selection releases a key when its distinct
users plus N(0, C/ρ_q) exceed 1 + σ·Φ̄⁻¹(δ/(2TC)) (a user is in ≤ C keys, so
ℓ2 sensitivity √C, and the ≤ C keys it alone creates each pass with
probability ≤ δ/(2TC)); counts get N(0, C²/ρ_q) (ℓ2 sensitivity C). Baseline
noise is simulated with numpy (these are not releases).

Part 2, work per trigger: 100 triggers; triggers 1–10 bring 5,000 new keys
each (then go quiet), triggers 11–100 carry 200 keys each. Reported: keys seen
so far vs keys evaluated and wall time per trigger (Alg. 4 keeps the work with
the batch, not with all keys seen).

Run by hand: ``make bench-dpsqlp`` (about 12 minutes on 2 cores: 3 runs at 10^6 users; 1 run takes 4).
Last figures, with the paper's beside them: ``bench/dpsqlp_table1.md``.
Usage: python bench/dpsqlp_table1.py [--users N] [--keys N] [--runs R] [--triggers 100,1000]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
from fractions import Fraction
from pathlib import Path
from statistics import NormalDist

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).parent))
import synthetic

from dpcli.core.accounting import composition as acc
from dpcli.tasks import stream as sr

EPS, DELTA, C, SPAN = 6.0, 1e-9, 32, 100_000


def final_dpsqlp(df: pl.DataFrame, triggers: int, run: int) -> tuple[pl.DataFrame, float]:
    q = sr.StreamQuery(time="ts", keys=("key",), unit="user_id", window=SPAN, triggers=triggers, max_records=C,
                       epsilon=Fraction(EPS), delta=Fraction(1, round(1 / DELTA)))
    t0 = time.perf_counter()
    out = sr.run_stream(df.lazy(), q, sr.plan_stream(q),
                        hashlib.sha256(f"table1/{triggers}/{run}".encode()).digest()).table
    elapsed = time.perf_counter() - t0
    return out.sort("trigger").group_by("key").agg(pl.col("count").last().cast(pl.Float64).alias("est")), elapsed


def rr_composition_delta(eps0: float, k: int, eps: float) -> float:
    """Exact δ'(ε) of k-fold composition of ε0-DP (the optimal composition theorem, Kairouz et al.):
    Σ_l C(k,l)·max(0, e^{(k−l)ε0} − e^{ε+lε0}) / (1 + e^{ε0})^k, summed in log space."""
    log_norm = k * math.log1p(math.exp(eps0))
    total = 0.0
    for l in range(k + 1):  # noqa: E741 (the l of the formula above)
        a, b = (k - l) * eps0, eps + l * eps0
        if a <= b:
            break
        log_c = math.lgamma(k + 1) - math.lgamma(l + 1) - math.lgamma(k - l + 1)
        total += math.exp(log_c + a + math.log1p(-math.exp(b - a)) - log_norm)
    return total


def analytic_gaussian_sigma(sensitivity: float, eps: float, delta: float) -> float:
    """Smallest σ with Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) ≤ δ (Balle & Wang 2018), by bisection."""
    phi = NormalDist().cdf

    def delta_of(sigma: float) -> float:
        a, b = sensitivity / (2 * sigma), eps * sigma / sensitivity
        return phi(a - b) - math.exp(eps) * phi(-a - b)

    lo, hi = 1e-6 * sensitivity, 1e6 * sensitivity
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if delta_of(mid) <= delta else (mid, hi)
    return hi


def one_shot_scales(triggers: int, accounting: str) -> tuple[float, float, float]:
    """(σ_select, threshold, σ_count) of each one-shot query when T of them share (ε, δ).

    ``paper``: as Sec. 5: each query is (ε0, δ0)-DP and T of them compose by the
    optimal composition theorem to (ε, δ): δ0 = δ/(2T) and ε0 the largest with
    δ'(ε) ≤ δ/2; within a query, selection and counts get ε0/2 each, their
    Gaussians δ0/4 and δ0/2 (analytic calibration) and the threshold δ0/4.
    ``zcdp``: the T Gaussian queries compose in zCDP (stronger baselines).
    """
    if accounting == "zcdp":
        rho_q = acc.rho_for_epsilon(EPS, DELTA / 2) / triggers
        sigma_s = math.sqrt(C / rho_q)  # half of ρ_q at ℓ2 sensitivity √C: σ² = C / (2 · ρ_q/2)
        sigma_c = math.sqrt(C * C / rho_q)
        return sigma_s, 1 + sigma_s * NormalDist().inv_cdf(1 - DELTA / (2 * triggers * C)), sigma_c
    delta0 = DELTA / (2 * triggers)
    lo, hi = 1e-6, EPS
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rr_composition_delta(mid, triggers, EPS) <= DELTA / 2 else (lo, mid)
    eps0 = lo
    sigma_s = analytic_gaussian_sigma(math.sqrt(C), eps0 / 2, delta0 / 4)
    sigma_c = analytic_gaussian_sigma(C, eps0 / 2, delta0 / 2)
    return sigma_s, 1 + sigma_s * NormalDist().inv_cdf(1 - delta0 / (4 * C)), sigma_c


def bounded(df: pl.DataFrame, triggers: int) -> pl.DataFrame:
    """First C records per user in time order, with each record's micro-batch."""
    step = SPAN // triggers
    return (df.with_row_index("__row").sort(["ts", "__row"])
            .filter(pl.int_range(pl.len()).over("user_id") < C)
            .with_columns(((pl.col("ts") - synthetic.DAY_START) // step).alias("batch")))


def one_shot(agg: pl.DataFrame, triggers: int, rng: np.random.Generator, accounting: str) -> pl.DataFrame:
    """Gaussian thresholding + Gaussian counts on rows (key[, batch], users, records): the released rows."""
    sigma_s, threshold, sigma_c = one_shot_scales(triggers, accounting)
    noisy_users = agg["users"].to_numpy() + rng.normal(0, sigma_s, agg.height)
    noisy = agg["records"].to_numpy() + rng.normal(0, sigma_c, agg.height)
    return agg.with_columns(pl.Series("est", noisy)).filter(pl.Series(noisy_users > threshold))


def baseline1(b: pl.DataFrame, triggers: int, rng: np.random.Generator, accounting: str) -> pl.DataFrame:
    agg = b.group_by("key").agg(pl.col("user_id").n_unique().alias("users"), pl.len().alias("records")).sort("key")
    return one_shot(agg, triggers, rng, accounting).select("key", "est")


def baseline2(b: pl.DataFrame, triggers: int, rng: np.random.Generator, accounting: str) -> pl.DataFrame:
    agg = (b.group_by("key", "batch").agg(pl.col("user_id").n_unique().alias("users"), pl.len().alias("records"))
           .sort("key", "batch"))  # a fixed order: the seeded noise lands on the same rows every run
    return one_shot(agg, triggers, rng, accounting).group_by("key").agg(pl.col("est").sum())


def metrics(truth: pl.DataFrame, est: pl.DataFrame) -> dict[str, float]:
    j = truth.join(est, on="key", how="full", coalesce=True).fill_null(0.0)
    err = (j["est"] - j["true"]).abs().to_numpy()
    return {"keys": float(est.height), "linf": float(err.max()), "l1": float(err.sum()),
            "l2": float(np.sqrt((err**2).sum()))}


NAMES = ("DP-SQLP", "Baseline 1", "Baseline 2", "Baseline 1 (zCDP)", "Baseline 2 (zCDP)")


def table1(users: int, keys: int, runs: int, trigger_counts: list[int]) -> None:
    print(f"## Table 1 at reduced scale: {users:,} users, {keys:,} keys, ε = {EPS:g}, δ = {DELTA:g}, C = {C}; "
          f"mean of {runs} run(s)\n")
    print("Baselines 1-2 compose their T one-shot queries as the paper does (optimal composition of (ε0, δ0)-DP "
          "queries); the (zCDP) columns compose the same Gaussian queries in zCDP, which is tighter.\n")
    for triggers in trigger_counts:
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in NAMES}
        seconds = []
        for run in range(runs):
            df = synthetic.events(users, keys, seed=100 + run, span=SPAN)
            truth = df.group_by("key").agg(pl.len().cast(pl.Float64).alias("true"))
            est, elapsed = final_dpsqlp(df, triggers, run)
            seconds.append(elapsed)
            rows["DP-SQLP"].append(metrics(truth, est))
            rng = np.random.default_rng(run)  # baseline simulation only
            b = bounded(df, triggers)
            for mode, suffix in (("paper", ""), ("zcdp", " (zCDP)")):
                rows["Baseline 1" + suffix].append(metrics(truth, baseline1(b, triggers, rng, mode)))
                rows["Baseline 2" + suffix].append(metrics(truth, baseline2(b, triggers, rng, mode)))
        print(f"### {triggers} micro-batches ({df.height:,} records; DP-SQLP {np.mean(seconds):.1f} s per run, "
              f"{df.height / np.mean(seconds):,.0f} events/s)\n")
        print(f"| metric | {' | '.join(NAMES)} | DP-SQLP vs Baselines 1-2 |")
        print("|---|" + "---:|" * len(NAMES) + "---|")
        for m, label in (("keys", "keys retained"), ("linf", "ℓ∞"), ("l1", "ℓ1"), ("l2", "ℓ2")):
            vals = {name: float(np.mean([r[m] for r in rs])) for name, rs in rows.items()}
            pair = (vals["Baseline 1"], vals["Baseline 2"])
            best = max(pair) if m == "keys" else min(pair)
            if m == "keys":
                vs = f"{vals['DP-SQLP'] / best:.1f}×" if best else f"{vals['DP-SQLP']:,.0f} vs 0"
            else:
                vs = f"−{100 * (1 - vals['DP-SQLP'] / best):.1f}%"
            print(f"| {label} | " + " | ".join(f"{vals[n]:,.0f}" for n in NAMES) + f" | {vs} |")
        print()


def work_per_trigger() -> None:
    """Old keys go quiet: evaluations per trigger follow the batch, not the keys seen."""
    rows = []
    for t in range(100):
        n_keys = 5000 if t < 10 else 200
        base = t * 5000 if t < 10 else 10**6
        for k in range(n_keys):
            for u in range(3):  # 3 distinct users per key and trigger
                rows.append((t * 10 + 5, f"u{t}-{k}-{u}", base + k))
    df = pl.DataFrame(rows, schema=["ts", "user_id", "key"], orient="row")
    q = sr.StreamQuery(time="ts", keys=("key",), unit="user_id", window=1000, triggers=100, max_records=C,
                       epsilon=Fraction(EPS), delta=Fraction(1, round(1 / DELTA)))
    plan = sr.plan_stream(q)
    events = sr.prepare_events(df.lazy(), q)
    state = sr.StreamState(q, plan, hashlib.sha256(b"work").digest(), track_units=False)
    print("## Work per trigger (Alg. 4): keys seen vs keys evaluated\n")
    print("| trigger | keys in batch | keys seen so far | keys evaluated | ms |")
    print("|---:|---:|---:|---:|---:|")
    seen: set[int] = set()
    evaluated = [0]
    real_check = sr.WindowRun._check_selection  # Alg. 2's check of a trigger's keys: count the keys

    def counting(self, slots, t):  # type: ignore[no-untyped-def]
        evaluated[0] += len(slots)
        return real_check(self, slots, t)

    sr.WindowRun._check_selection = counting  # type: ignore[method-assign]
    try:
        for t in range(1, 101):
            batch = events.filter(pl.col("__trigger") == t)
            seen.update(batch["key"].unique().to_list())
            evaluated[0] = 0
            t0 = time.perf_counter()
            state.advance(batch, t)  # window 0: trigger t is global trigger t
            ms = 1000 * (time.perf_counter() - t0)
            if t in (1, 5, 10, 11, 12, 20, 50, 100):
                print(f"| {t} | {batch['key'].n_unique():,} | {len(seen):,} | {evaluated[0]:,} | {ms:.1f} |")
    finally:
        sr.WindowRun._check_selection = real_check  # type: ignore[method-assign]
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=10**5)
    ap.add_argument("--keys", type=int, default=10**5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--triggers", default="100,1000")
    a = ap.parse_args()
    table1(a.users, a.keys, a.runs, [int(x) for x in a.triggers.split(",")])
    work_per_trigger()


if __name__ == "__main__":
    main()
