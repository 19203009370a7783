"""Exact privacy checks of topk's threshold selection (partition selection on distinct units, then KnownGumb).

The output of a ranking-only release (``--no-counts``; the counts are independent Laplace draws audited
with the other counts) is an ordered tuple of groups. On small neighbouring inputs its distribution is
computed exactly here, from the mechanism's definition and not from dpcli's code: each non-empty group
passes stage 1 independently with probability P[c + Z ≥ T] (Z discrete Laplace of scale b:
P[Z ≥ m] = r^m/(1 + r), r = e^(−1/b), for m ≥ 1), and over the passing set S the ranking is the
exponential race (the next group is g with probability ∝ e^(rate·h_g)), of min(k, |S|) groups. From the
two exact distributions P, P' the hockey-stick divergence Σ_o max(0, P'(o) − e^ε P(o)) must be at most
the claimed δ in both directions at the claimed ε = ε_sel + kε_per, and where no group is new the
largest |ln P'(o)/P(o)| must be at most ε. The threshold T and the scale b are dpcli's
(:func:`dpcli.core.mechanisms.selection_threshold`, :func:`dpcli.core.mechanisms.laplace`): a T one lower,
or a scale calibrated as if a unit were in one group, must break the claim. Finally dpcli's own run
(:func:`dpcli.tasks.topk.run_topk`) is checked to draw from the exact distribution (χ² at fixed seeds).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import polars as pl
import pytest
from scipy.stats import chi2

from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.tasks import topk as tk

K_BAR, DELTA, K = 2, Fraction(1, 20), 2


def _pass_probability(count: int, threshold: int, scale: float) -> float:
    """P[count + Z ≥ T] for Z discrete Laplace of this scale (exact formula, by symmetry below 1)."""
    r = math.exp(-1.0 / scale)

    def at_least(m: int) -> float:  # P[Z ≥ m]
        return r ** m / (1.0 + r) if m >= 1 else 1.0 - r ** (1 - m) / (1.0 + r)

    return at_least(threshold - count)


def _ranking(order: tuple[str, ...], selected: tuple[str, ...], h: dict[str, int], rate: float) -> float:
    """P[the race over ``selected`` finishes ``order`` first, in this order] (k-fold peeling)."""
    left, p = list(selected), 1.0
    for g in order:
        weights = {x: math.exp(rate * h[x]) for x in left}
        p *= weights[g] / sum(weights.values())
        left.remove(g)
    return p


def _distribution(units: dict[str, int], h: dict[str, int], threshold: int, scale: float, rate: float,
                  k: int = K) -> dict[tuple[str, ...], float]:
    """The exact distribution of the released ordered tuple for bounded unit counts ``units`` (non-empty groups)
    and ranking counts ``h``."""
    groups = sorted(units)
    out: dict[tuple[str, ...], float] = {}
    for size in range(len(groups) + 1):
        for selected in itertools.combinations(groups, size):
            p_set = math.prod(_pass_probability(units[g], threshold, scale) if g in selected
                              else 1.0 - _pass_probability(units[g], threshold, scale) for g in groups)
            for order in itertools.permutations(selected, min(k, size)):
                out[order] = out.get(order, 0.0) + p_set * _ranking(order, selected, h, rate)
    return out


def _hockey_stick(p1: dict, p0: dict, epsilon: float) -> float:
    """Σ_o max(0, p1(o) − e^ε p0(o)): the smallest δ with P1[E] ≤ e^ε P0[E] + δ for every event E."""
    return sum(max(0.0, v - math.exp(epsilon) * p0.get(o, 0.0)) for o, v in p1.items())


def _plan(epsilon_per: Fraction, share: Fraction) -> tuple[tk.TopKQuery, tk.TopKPlan]:
    q = tk.TopKQuery(("g",), "u", K, with_counts=False, epsilon_per=epsilon_per, delta=DELTA, selection="threshold",
                     max_partitions=K_BAR, selection_share=share)
    return q, tk.plan_topk(q, "approx", {})


def _claim(plan: tk.TopKPlan) -> float:
    return float(plan.guarantee["epsilon"])


def test_a_unit_alone_in_its_groups_is_released_with_probability_at_most_delta_and_one_step_lower_is_not():
    """D empty, D' one unit alone in K̄ = 2 groups (each of count 1): everything D' can release beyond the
    empty list is δ's. With ε_sel = 1 (b = 2) dpcli's T is 8: 1 − (1 − P[1 + Z ≥ 8])² = 0.0372 ≤ δ = 0.05;
    T = 7 gives 0.0610 > δ (T is the least that holds, so any smaller one must fail)."""
    _q, plan = _plan(Fraction(1, 2), Fraction(1, 2))
    sp = plan.selection
    assert sp is not None and sp.epsilon == 1 and sp.noise.param == 2 and sp.threshold == 8
    alone = {"N1": 1, "N2": 1}
    for threshold, holds in ((sp.threshold, True), (sp.threshold - 1, False)):
        p1 = _distribution(alone, alone, threshold, float(sp.noise.param), float(plan.epsilon_per))
        released = _hockey_stick(p1, {(): 1.0}, _claim(plan))
        print(f"T = {threshold}: δ needed {released:.4f} (claim {float(DELTA)})")
        assert (released <= float(DELTA)) is holds
    # a threshold for one group per unit (p* = δ) lets a unit in two groups past it more often than δ
    single = mech.selection_threshold(mech.laplace(1, sp.epsilon), 1, float(DELTA))
    p1 = _distribution(alone, alone, single, float(sp.noise.param), float(plan.epsilon_per))
    assert _hockey_stick(p1, {(): 1.0}, _claim(plan)) > float(DELTA)


def test_neighbours_with_a_new_group_meet_epsilon_delta_both_ways():
    """D: A with 8 units, B with 7; D' adds a unit in A and in a new group N (K̄ = 2). At the claimed
    ε = ε_sel + kε_per = 1 + 1 the hockey-stick divergence is ≤ δ both ways."""
    _q, plan = _plan(Fraction(1, 2), Fraction(1, 2))
    sp = plan.selection
    assert sp is not None
    d0 = {"A": 8, "B": 7}
    d1 = {"A": 9, "B": 7, "N": 1}
    p0 = _distribution(d0, d0, sp.threshold, float(sp.noise.param), float(plan.epsilon_per))
    p1 = _distribution(d1, d1, sp.threshold, float(sp.noise.param), float(plan.epsilon_per))
    assert math.isclose(sum(p0.values()), 1.0) and math.isclose(sum(p1.values()), 1.0)
    eps = _claim(plan)
    assert eps == pytest.approx(2.0)
    forward, backward = _hockey_stick(p1, p0, eps), _hockey_stick(p0, p1, eps)
    print(f"δ needed at ε = {eps}: D'→D {forward:.2e}, D→D' {backward:.2e} (claim {float(DELTA)})")
    assert forward <= float(DELTA) and backward <= float(DELTA)


def test_without_a_new_group_the_log_ratio_stays_within_epsilon_and_a_one_group_scale_breaks_it():
    """D: A and B with 5 units each (below T, where the Laplace tail's ratio is exactly e^(1/b)); D' adds a unit
    in both. The outcome (A, B) has ln ratio exactly 2/b = ε_sel (the ranking's shift cancels): with
    ε_sel = 1, kε_per = 0.5 the claim 1.5 holds, and noise of scale 1/ε_sel (calibrated as if a unit were in
    one group) gives 2 > 1.5."""
    _q, plan = _plan(Fraction(1, 4), Fraction(2, 3))
    sp = plan.selection
    assert sp is not None and sp.epsilon == 1 and sp.noise.param == 2
    eps = _claim(plan)
    assert eps == pytest.approx(1.5)
    d0 = {"A": 5, "B": 5}
    d1 = {"A": 6, "B": 6}

    def worst(scale: float) -> float:
        p0 = _distribution(d0, d0, sp.threshold, scale, float(plan.epsilon_per))
        p1 = _distribution(d1, d1, sp.threshold, scale, float(plan.epsilon_per))
        return max(abs(math.log(p1[o] / p0[o])) for o in p0)

    ok, broken = worst(float(sp.noise.param)), worst(1.0 / float(sp.epsilon))
    print(f"largest |ln ratio| {ok:.4f} (claim {eps}), scale 1/ε_sel: {broken:.4f}")
    assert ok == pytest.approx(1.0, abs=1e-9) and ok <= eps < broken


def _frame(units: dict[str, list[int]]) -> pl.LazyFrame:
    rows = [(f"u{u}", g) for g, members in units.items() for u in members]
    return pl.DataFrame(rows, schema=["u", "g"], orient="row").lazy()


@pytest.mark.parametrize("n, p_refuse", [
    # make test: 500 runs. At 500 draws six bins keep ≥ 5 expected (69.9, 235.5, 42.4, 106.3, 39.1 and 6.8: the
    # rarer outcomes pooled into the last), but the smallest makes the χ² law's far tail too light: 2·10⁷
    # multinomial draws at the exact probabilities exceed χ²₅(1 − 10⁻⁶) = 35.9 with probability 6·10⁻⁶. Refused
    # at χ²₅(1 − 10⁻⁸) = 45.8 instead, which those draws exceed with probability 5·10⁻⁷: a correct sampler
    # fails this at a new seed about once in 2·10⁶ (the seeds are fixed: the run is deterministic, and the
    # tolerance is the honest one for its number of draws). Less power than the audit: it catches gross errors.
    (500, 1e-8),
    # make audit: the full 3,000 runs, refused at p < 10⁻⁴ (finer departures from the exact law).
    pytest.param(3000, 1e-4, marks=pytest.mark.audit),
])
def test_dpcli_draws_from_the_exact_distribution(n, p_refuse):
    """dpcli's run (stage 1 on the data's bounded counts, then the race) against the exact distribution on D'
    of the second test: ``n`` fixed-seed runs, χ² over the outcomes (those expected fewer than 5 times pooled);
    refused at p < ``p_refuse``, so a correct sampler fails this at a new seed with that probability."""
    q, plan = _plan(Fraction(1, 2), Fraction(1, 2))
    sp = plan.selection
    assert sp is not None
    # units 0–7 in A, 5–11 in B, the new unit 99 in A and N: bounded counts A 9, B 7, N 1 (nobody in > K̄ groups)
    frame = _frame({"A": [*range(8), 99], "B": list(range(5, 12)), "N": [99]})
    exact = _distribution({"A": 9, "B": 7, "N": 1}, {"A": 9, "B": 7, "N": 1}, sp.threshold, float(sp.noise.param),
                          float(plan.epsilon_per))
    seen: dict[tuple[str, ...], int] = {}
    for i in range(n):
        got = tuple(tk.run_topk(frame, q, plan, KeyedStream(b"\x05" * 32, f"exact/{i}")).table["g"].to_list())
        seen[got] = seen.get(got, 0) + 1
    assert set(seen) <= set(exact), "an outcome the mechanism cannot produce"
    big = [o for o in exact if exact[o] * n >= 5]
    observed = [seen.get(o, 0) for o in big] + [n - sum(seen.get(o, 0) for o in big)]
    expected = [exact[o] * n for o in big] + [n - sum(exact[o] * n for o in big)]
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1]
        observed[-1] += n - sum(observed)
        expected[-1] += n - sum(expected)
    stat = float(sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True)))
    limit = float(chi2.ppf(1 - p_refuse, len(expected) - 1))
    print(f"χ² = {stat:.1f} over {len(expected)} bins (limit {limit:.1f})")
    assert stat <= limit


@pytest.mark.audit
def test_dpcli_releases_a_lone_units_groups_at_most_delta_of_the_time():
    """dpcli's run on D' = one unit alone in K̄ = 2 groups: the release rate is 1 − (1 − P[1 + Z ≥ T])² =
    0.0372 ≤ δ = 0.05; over 20,000 runs its one-sided 99.5% Clopper–Pearson lower bound stays ≤ δ, and the
    rate must match the exact one within 4.5 standard errors (p ≈ 7·10⁻⁶)."""
    from auditstats import clopper_pearson

    q, plan = _plan(Fraction(1, 2), Fraction(1, 2))
    frame = _frame({"N1": [99], "N2": [99]})
    n = 20_000
    hits = sum(tk.run_topk(frame, q, plan, KeyedStream(b"\x06" * 32, f"lone/{i}")).table.height > 0
               for i in range(n))
    sp = plan.selection
    assert sp is not None
    rate = 1 - (1 - _pass_probability(1, sp.threshold, float(sp.noise.param))) ** 2
    lower = clopper_pearson(hits, n, "lower", 0.995)
    print(f"released {hits}/{n} (exact {rate:.4f}, lower bound {lower:.4f}, δ {float(DELTA)})")
    assert lower <= float(DELTA)
    assert abs(hits / n - rate) <= 4.5 * math.sqrt(rate * (1 - rate) / n)
