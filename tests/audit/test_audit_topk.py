"""Audit of topk's selections: KnownGumb's race, UnkGumb's k̄ and ⊥ steps, and UnkGumb's δ.

Each test fixes a worst-case pair of neighbouring histograms (the sorted counts
topk's bounding step feeds the selection; one unit moves each count by at most
τ = 1) and an event chosen in advance where the mechanism's privacy loss is
largest, then bounds ε from below with Clopper–Pearson at 99.5% per side
(:mod:`auditstats`). The claim is each step's ε_per (every Gumbel selection
is ε_per-bounded-range, paper 000), or δ for a group that only D' has. A
deliberately broken variant (rate 1.2 × ε_per/τ, or a threshold computed for
1.5·δ) must be caught at the same fixed seeds.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from auditstats import clopper_pearson, event_epsilon_bound, two_sample_violations

from dpcli.core import selection as sel
from dpcli.core.prf import KeyedStream


def _outcomes(fn, n: int, label: str) -> np.ndarray:
    """The integer outcomes of n independently seeded runs of ``fn(stream)``."""
    return np.fromiter((fn(KeyedStream(b"\x03" * 32, f"{label}/{i}")) for i in range(n)), dtype=np.int64, count=n)


def _audit(outcome_d1, outcome_d, event: int, eps: Fraction, n: int, label: str) -> tuple[float, list]:
    """ε lower bound of the event "outcome = event" (P[E | D'] / P[E | D]), n runs per side, and the
    two-sample (ε, 0) test over all outcomes."""
    d1, d = _outcomes(outcome_d1, n, f"{label}/d1"), _outcomes(outcome_d, n, f"{label}/d")
    bound = event_epsilon_bound(int((d1 == event).sum()), n, int((d == event).sum()), n)
    return bound, two_sample_violations(d1, d, float(eps))


def _check(eps: Fraction, audit) -> None:
    """The claim holds at rate ε_per; rate 1.2·ε_per is caught."""
    (ok, ok_violations), (bad, _) = audit(eps, "ok"), audit(eps * Fraction(6, 5), "bad")
    print(f"ε lower bound {ok:.3f} (claim {float(eps)}), broken variant {bad:.3f}; "
          f"two-sample violations {len(ok_violations)}")
    assert ok <= float(eps) < bad
    assert ok_violations == []


@pytest.mark.audit
def test_known_domain_selection_never_beats_its_epsilon_and_a_broken_one_is_caught():
    """KnownGumb (an exponential race at rate ε/τ): 50 candidates with equal counts vs the neighbour
    where one more unit counts towards candidate 0. The event "candidate 0 is picked" has ratio
    50·e^ε/(e^ε + 49) (ln = 0.966 at ε = 1); 2·10⁵ runs per side. Rate 1.2·ε (ln ratio 1.155) is caught."""
    n, eps = 200_000, Fraction(1)
    base = np.full(50, 100, dtype=np.int64)
    plus = base.copy()
    plus[0] += 1

    _check(eps, lambda rate, label: _audit(lambda s: sel.known_top_k(s, plus, 1, rate, 1)[0],
                                           lambda s: sel.known_top_k(s, base, 1, rate, 1)[0], 0, rate, n, label))


def _unknown(counts: list[int], k: int, dbar: int, eps: Fraction, delta: Fraction):
    h = np.asarray(counts, dtype=np.int64)
    return lambda s: sel.unknown_top_k(s, h, k, dbar, eps, 1, delta)


def _first(result: sel.UnknownTopK) -> int:
    """The first released position, or −1 for ⊥ first."""
    return result.positions[0] if result.positions else -1


@pytest.mark.audit
def test_unknown_domain_bottom_step_never_beats_its_epsilon_and_a_broken_one_is_caught():
    """UnkGumb's last step, the race of the groups against ⊥, with k = d̄ = 1 (so k̄ = 1 is fixed):
    counts (4, 0) vs (5, 0), δ = 10⁻³. Group 0 beats ⊥ with probability e^{c−1}/(e^{c−1} + 1/δ):
    1.97% vs 5.18%, ln ratio 0.966 at ε_per = 1; at rate 1.2 the ln ratio is 1.12. 2·10⁵ runs per side."""
    n, eps, delta = 200_000, Fraction(1), Fraction(1, 1000)

    _check(eps, lambda rate, label: _audit(lambda s: _first(_unknown([5, 0], 1, 1, rate, delta)(s)),
                                           lambda s: _first(_unknown([4, 0], 1, 1, rate, delta)(s)), 0, rate, n, label))


@pytest.mark.audit
def test_unknown_domain_kbar_step_never_beats_its_epsilon_and_a_broken_one_is_caught():
    """UnkGumb's first step, k̄ = the noisy argmin over i ∈ {1, 2} of h_(i+1) + ln(i/δ)/ε: neighbours
    (10, 4, 1) and (10, 5, 1). P[k̄ = 1] = w2/(w1 + w2) with w1 = e^{h2}, w2 = 2e^{h3}: 9.06% and 3.54%
    (ln ratio 0.94 at ε_per = 1; 1.16 at rate 1.2). k̄ itself is internal; the audit checks the step's
    own ε_per, which the accounting composes. 10⁵ runs per side."""
    n, eps, delta = 100_000, Fraction(1), Fraction(1, 1000)

    _check(eps, lambda rate, label: _audit(lambda s: _unknown([10, 4, 1], 1, 2, rate, delta)(s).k_bar,
                                           lambda s: _unknown([10, 5, 1], 1, 2, rate, delta)(s).k_bar, 1, rate, n, label))


@pytest.mark.parametrize("n, delta", [pytest.param(5_000, Fraction(1, 50), id="fast", marks=pytest.mark.audit),
                                      pytest.param(100_000, Fraction(1, 500), marks=pytest.mark.audit, id="full")])
def test_unknown_domain_releases_a_new_group_with_probability_at_most_delta(n, delta):
    """The δ of UnkGumb: D has no group, D' one group of count 1 (one unit), k = d̄ = 1. The group can
    only be released under D', so P[released | D'] ≤ δ must hold; here it is δ/(1 + δ), the tightest
    case (d̄ = 1 makes m = 1). The one-sided 99.5% lower bound on the release rate must stay ≤ δ;
    a threshold computed for 1.5·δ (rate 1.5·δ/(1 + 1.5δ)) must push it above δ."""
    eps = Fraction(1)
    ok = int(_outcomes(lambda s: _first(_unknown([1, 0], 1, 1, eps, delta)(s)) == 0, n, f"new/{delta}").sum())
    bad = int(_outcomes(lambda s: _first(_unknown([1, 0], 1, 1, eps, delta * Fraction(3, 2))(s)) == 0, n,
                        f"newbad/{delta}").sum())
    assert _unknown([0, 0], 1, 1, eps, delta)(KeyedStream(b"\x03" * 32, "empty")).positions == []
    lo_ok, lo_bad = clopper_pearson(ok, n, "lower", 0.995), clopper_pearson(bad, n, "lower", 0.995)
    print(f"released {ok}/{n} (lower bound {lo_ok:.2e} ≤ δ = {float(delta):.0e}), broken {bad}/{n} ({lo_bad:.2e})")
    assert lo_ok <= float(delta) < lo_bad
    assert math.isclose(ok / n, float(delta / (1 + delta)), rel_tol=0.25)
