"""Audit of the noise primitives (empirical ε lower bounds) and histogram partition selection at scale.

Statistical tolerances: the ε lower bound uses one-sided Clopper–Pearson
bounds at 99.5% on each side (the pair holds with ≥ 99%, stricter than the 90%
DP auditing usually uses), on samples not used to choose the event, at fixed
seeds, so a pass is deterministic; the broken variant (noise scale under-calibrated by
1.2×, i.e. a true ε of 1.2·claimed) must produce a lower bound above the
claimed ε, which shows the test has the power to catch that bug.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from auditstats import threshold_epsilon_bound
from scipy import stats

from dpcli.core import mechanisms as mech
from dpcli.core.accounting import composition as acc
from dpcli.core.prf import KeyedStream
from dpcli.tasks import histogram as hist


def epsilon_lower_bound(noise: mech.Noise, sensitivity: int, n: int, delta: float = 0.0, label: str = "a") -> float:
    """The DP-Sniper bound of :func:`auditstats.threshold_epsilon_bound` for output = true value + noise,
    true ∈ {0, sensitivity}, n samples per side."""
    x0 = noise.sample(KeyedStream(b"\x01" * 32, f"{label}/0"), n)
    x1 = noise.sample(KeyedStream(b"\x02" * 32, f"{label}/1"), n) + sensitivity
    return threshold_epsilon_bound(x0, x1, delta)


@pytest.mark.parametrize("eps", [Fraction(1, 2), Fraction(1)])
def test_discrete_laplace_count_never_beats_its_epsilon_and_a_broken_one_is_caught(eps):
    """The count noise of histogram/topk/tabulate: discrete Laplace at scale Δ/ε, Δ = 1. 400k samples/side."""
    n = 400_000
    assert epsilon_lower_bound(mech.laplace(1, eps), 1, n, label=f"ok{eps}") <= float(eps)
    broken = epsilon_lower_bound(mech.laplace(1, eps * Fraction(6, 5)), 1, n, label=f"bad{eps}")
    assert broken > float(eps)


@pytest.mark.audit
@pytest.mark.parametrize("eps", [Fraction(1, 4), Fraction(1), Fraction(2)])
def test_discrete_laplace_audit_full(eps):
    """The same with 10^6 samples per side and sensitivity 3 (a count with C = 3)."""
    n = 1_000_000
    assert epsilon_lower_bound(mech.laplace(3, eps), 3, n, label=f"full{eps}") <= float(eps)
    assert epsilon_lower_bound(mech.laplace(3, eps * Fraction(6, 5)), 3, n, label=f"fbad{eps}") > float(eps)


@pytest.mark.audit
def test_discrete_gaussian_audit_full():
    """Gaussian counts (zCDP/approx ledgers): Δ = 10, ρ = 1/2 (σ = 10), claimed (ε, 0.05) by the optimal
    zCDP conversion (2.04). The conversion holds for every ρ-zCDP mechanism, so it is looser than the
    exact Gaussian curve (ε = 1.55 at this δ): a 1.2× under-scaled σ still fits inside the claim, and the
    power check uses σ/√2 (ρ doubled), whose exact ε (2.6) exceeds the claim."""
    rho, delta, n = Fraction(1, 2), 0.05, 1_000_000
    eps = acc.zcdp_to_approx(float(rho), delta)
    assert epsilon_lower_bound(mech.gaussian(100, rho), 10, n, delta, "g") <= eps
    assert epsilon_lower_bound(mech.gaussian(100, 2 * rho), 10, n, delta, "gbad") > eps


# ---- partition selection ----------------------------------------------------------------------


def test_partition_selection_with_100k_single_unit_keys_stays_within_delta():
    """100,000 keys held by one unit each: each is released with probability ≤ δ, so the released count
    must not exceed the 99.9% quantile of Binomial(100000, δ) (δ = 1e-4: mean 10, bound 21)."""
    n, delta = 100_000, Fraction(1, 10_000)
    df = pl.DataFrame({"user": np.arange(n), "g": np.arange(n)})
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("count-units",), epsilon=Fraction(1),
                            delta=delta)
    plan = hist.plan_histogram(q, "approx", {})
    out = hist.run_histogram(df.lazy(), q, plan, KeyedStream(b"p" * 32, "histogram")).table
    bound = int(stats.binom.ppf(0.999, n, float(delta)))
    assert out.height <= bound, (out.height, bound)
