"""Audit of ``dpcli stream-replay`` end to end: key-selection thresholds and released counts.

Trials run in parallel: every key has its own trees and noise, and no unit
touches two keys, so one replay over N keys gives N independent samples of
one key's release (:func:`_events` builds the files). Tolerances are
Clopper–Pearson / binomial bounds at 99.9% (one-sided 99.5% per side for the
ε bound), at fixed seeds.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from auditstats import clopper_pearson, threshold_epsilon_bound, two_sample_violations
from scipy import stats

from dpcli.tasks import stream as sr


def _events(keys: int, units_per_key: int, records_per_unit: int = 1) -> pl.LazyFrame:
    """Every key held by its own units, all events at time 0 (the first trigger)."""
    per_key = units_per_key * records_per_unit
    key = np.repeat(np.arange(keys), per_key)
    unit = np.repeat(np.arange(keys * units_per_key), records_per_unit)
    df = pl.DataFrame({"ts": np.zeros(key.size, dtype=np.int64), "user": unit, "key": key})
    return df.lazy()


def _query(epsilon: Fraction, delta: Fraction, max_records: int = 1) -> sr.StreamQuery:
    return sr.StreamQuery(time="ts", keys=("key",), unit="user", window=10, triggers=1,
                          max_records=max_records, epsilon=epsilon, delta=delta)


def _dg_tail(sigma2: float, m: int) -> float:
    """P[Z ≥ m] for the discrete Gaussian N_Z(0, σ²), summed directly (independent of dpcli)."""
    z = np.arange(-int(60 * math.sqrt(sigma2)) - 60, int(60 * math.sqrt(sigma2)) + 61)
    w = np.exp(-(z.astype(np.float64) ** 2) / (2 * sigma2))
    return float(w[z >= m].sum() / w.sum())


@pytest.mark.parametrize("keys", [pytest.param(10_000, id="fast", marks=pytest.mark.audit), pytest.param(200_000, marks=pytest.mark.audit, id="full")])
def test_single_unit_keys_are_released_as_often_as_the_thresholds_say_and_within_delta(monkeypatch, keys):
    """N keys held by one unit each (they exist only in D', so P[released] ≤ δ must hold; δ/3 is the
    share the thresholds' failure term gets, checked here). ε = 1, δ = 0.6 (large, so releases are
    frequent enough to measure); one trigger, so a key is released when its one-node tree's discrete
    Gaussian noise is ≥ ⌊τ − 1⌋ + 1. The observed rate must match that exact tail (two-sided 99.9%
    binomial interval) — thresholds computed for a σ 1.2× too small must not — and its 99.9% upper
    bound must stay ≤ δ/3."""
    q = _query(Fraction(1), Fraction(3, 5))
    plan = sr.plan_stream(q)
    tau = float(plan.selection_threshold(1, 1)[0])
    sigma2 = float(plan.sigma2_select)
    exact = _dg_tail(sigma2, math.floor(tau - 1) + 1)

    def released(label: bytes) -> int:  # a fresh plan: thresholds are cached per plan
        return sr.run_stream(_events(keys, 1), q, sr.plan_stream(q), label * 32).table["key"].n_unique()

    def consistent(hits: int) -> bool:
        lo, hi = stats.binom.ppf([0.0005, 0.9995], keys, exact)
        return lo <= hits <= hi

    ok = released(b"o")
    thresholds = sr.tree.selection_thresholds
    monkeypatch.setattr(sr.tree, "selection_thresholds", lambda s2, n, b, h: thresholds(s2 / 1.44, n, b, h))
    bad = released(b"b")
    print(f"released {ok}/{keys} (exact tail {exact:.4f}, bound δ/3 = {float(q.delta) / 3:.2f}); broken {bad}/{keys}")
    assert consistent(ok) and not consistent(bad)
    assert clopper_pearson(ok, keys, "upper", 0.999) <= float(q.delta) / 3


@pytest.mark.parametrize("keys", [pytest.param(25_000, id="fast", marks=pytest.mark.audit), pytest.param(400_000, marks=pytest.mark.audit, id="full")])
def test_released_counts_never_beat_their_epsilon_and_a_broken_one_is_caught(monkeypatch, keys):
    """Keys of 20 units (always selected) vs the same with one more unit adding C = 2 records; the
    count at the first trigger is compared. The perturbation part must satisfy (ε/2, δ/3) = (2, 0.05)
    (ε = 4, δ = 0.15: ρ ≈ 0.49 for the count tree). That claim comes from the zCDP conversion, which is
    looser than the exact Gaussian curve, so the broken variant doubles ρ (σ² halved), whose exact
    ε at δ = 0.05 (≈ 2.6) exceeds the claim. A two-sample (2, 0.05) test over the count values
    (clipped to 10…32) must find no violation."""
    q = _query(Fraction(4), Fraction(15, 100), max_records=2)
    plan = sr.plan_stream(q)
    eps_m, delta_m = float(q.epsilon) / 2, float(q.delta) / 3

    def counts(plan: sr.StreamPlan, label: str) -> tuple[np.ndarray, np.ndarray]:
        base = _events(keys, 20)
        plus = pl.concat([base, _events(keys, 1, 2).with_columns(pl.col("user") + keys * 20)])
        x0 = sr.run_stream(base, q, plan, f"{label}/D".encode().ljust(32, b"."))
        x1 = sr.run_stream(plus, q, plan, f"{label}/D'".encode().ljust(32, b"."))
        assert x0.table.height == x1.table.height == keys  # every key released once
        return x0.table.sort("key")["count"].to_numpy(), x1.table.sort("key")["count"].to_numpy()

    x0, x1 = counts(plan, "ok")
    ok = threshold_epsilon_bound(x0, x1, delta_m)
    violations = two_sample_violations(np.clip(x0, 10, 32), np.clip(x1, 10, 32), eps_m, delta_m)
    broken_plan = sr.StreamPlan(plan.beta, plan.sigma2_select, plan.sigma2_count / 2, None, {}, plan.events)
    bad = threshold_epsilon_bound(*counts(broken_plan, "bad"), delta_m)
    print(f"ε lower bound {ok:.3f} (claim {eps_m}, δ = {delta_m:.3g}), broken {bad:.3f}; "
          f"two-sample violations {len(violations)}")
    assert ok <= eps_m < bad
    assert violations == []


@pytest.mark.audit
def test_released_values_are_within_their_95_percent_margins_at_the_worst_trigger():
    """Coverage of ``--with-error``'s margins (docs/commands/stream-replay.md): N keys, each with U units at
    trigger 1 (its first release starts the perturbation trees) and U more at trigger 7, where the trees
    have 7 leaves: λ²(7) is the largest variance a window of 7 triggers can hold, so the margin is at its
    tightest. Each unit has one record with value 1 (clamped to ±2): the bounded count is 2U and the
    bounded sum 2U. Among the keys released at trigger 7 (every one, as U is far above the threshold), a
    one-sided binomial test at the 1% level must not find the coverage of count and sum below 95%, and
    must find it below 95% for margins 10% smaller (power)."""
    keys = 15_000
    q = sr.StreamQuery(time="ts", keys=("key",), unit="user", window=70, triggers=7, max_records=16,
                       epsilon=Fraction(8), delta=Fraction(1, 10**6), value="v", clamp=2.0)
    plan = sr.plan_stream(q)
    units = int(math.ceil(float(max(plan.selection_threshold(7, 7))) + 8 * math.sqrt(float(plan.sigma2_select))))
    per_key = np.repeat([0, 60], units)  # trigger 1 and trigger 7 of the window [0, 70)
    frame = pl.DataFrame({"ts": np.tile(per_key, keys), "user": np.arange(keys * 2 * units),
                          "key": np.repeat(np.arange(keys), 2 * units), "v": 1.0}).lazy()
    released = sr.run_stream(frame, q, plan, b"coverage".ljust(32, b".")).table.filter(pl.col("trigger") == 7)
    assert released.height == keys
    margins = sr.margins95_by_trigger(q, plan)
    for column in ("count", "sum_v"):
        errors = (released[column] - 2 * units).abs().to_numpy()
        covered = int((errors <= margins[column][6]).sum())
        narrow = int((errors <= 0.9 * margins[column][6]).sum())
        p, p_narrow = stats.binom.cdf(covered, keys, 0.95), stats.binom.cdf(narrow, keys, 0.95)
        print(f"{column}: margin ±{margins[column][6]:.4g}, coverage {covered / keys:.4f} (p = {p:.3g}); "
              f"10% narrower {narrow / keys:.4f} (p = {p_narrow:.3g})")
        assert p >= 0.01 and p_narrow < 0.01
