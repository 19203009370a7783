"""pld accounting (issue 42, item 2), the library: each event's dominating PLD, a block's (ε, δ), cross-checked
against Google's dp_accounting on mixed sequences and against exact compositions where one is known.

Tolerances: dp_accounting and dpcli both discretise pessimistically, so a block's ε may exceed the exact ε by the
grid's rounding (≤ a thousandth of the block's ε per event, and 0 on an exact lattice) and the final rounding up
(10 digits, plus a relative 10⁻⁹); it may never be below the exact ε beyond float error (10⁻⁹ relative)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as dpl

from dpcli.core.accounting import composition as acc
from dpcli.core.accounting import pld
from dpcli.core.accounting.accountants import PldAccountant
from dpcli.core.accounting.budget import ChargeRefused, Limits, Spend
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_at_least, fraction_text

F = Fraction


def pure(eps: str) -> PrivacyEvent:
    return PrivacyEvent("pure", "histogram/laplace", epsilon=F(eps))


def gauss(rho: str, delta: str = "0") -> PrivacyEvent:
    return PrivacyEvent("zcdp", "histogram/gaussian", rho=F(rho), delta=F(delta), rdp_curve="discrete_gaussian")


# --- exact compositions -----------------------------------------------------------------------------------------

def rr_exact_delta(eps: float, k: int, at: float) -> mpmath.mpf:
    """δ(at) of k-fold randomized response at ε, exactly (50 digits): i of the k losses are −ε, the rest +ε."""
    mpmath.mp.dps = 50
    e, a = mpmath.mpf(eps), mpmath.mpf(at)
    p = mpmath.exp(e) / (1 + mpmath.exp(e))
    total = mpmath.mpf(0)
    for i in range(k + 1):
        loss = (k - 2 * i) * e
        if loss > a:
            total += mpmath.binomial(k, i) * p ** (k - i) * (1 - p) ** i * (1 - mpmath.exp(a - loss))
    return total


def dg_exact_delta(sigma2: float, k: int, at: float) -> float:
    """δ(at) of k-fold discrete Gaussian N_Z(0, σ²) against N_Z(1, σ²): the losses (k − 2S)/(2σ²), S the sum of k
    draws, by direct convolution (mass beyond 40σ is below 10⁻³⁰⁰)."""
    t = int(40 * math.sqrt(sigma2)) + 2
    xs = np.arange(-t, t + 1)
    w = np.exp(-(xs.astype(float) ** 2) / (2 * sigma2))
    w /= w.sum()
    dist = w
    for _ in range(k - 1):
        dist = np.convolve(dist, w)
    sums = np.arange(-k * t, k * t + 1)
    loss = (k - 2 * sums) / (2 * sigma2)
    keep = loss > at
    return float(np.sum(dist[keep] * -np.expm1(at - loss[keep])))


@pytest.mark.parametrize(("eps", "k", "delta"), [("0.1", 1, "1e-6"), ("0.1", 10, "1e-6"), ("0.05", 40, "1e-6"),
                                                 ("0.3", 25, "1e-9"), ("0.01243", 365, "1e-6"), ("1", 3, "0.01")])
def test_a_laplace_series_is_never_below_its_exact_composition_and_close_to_it(eps, k, delta):
    """k-fold randomized response is the exact composition of k discrete Laplace counts (next test): dpcli's ε at δ
    leaves δ(ε) ≤ δ exactly, and is within 10⁻⁶ of the exact ε (a series of one ε sits on its own lattice)."""
    got, at = pld.block_cost([pure(eps)], k, F(delta))
    assert at == F(delta)
    assert rr_exact_delta(float(eps), k, float(got)) <= float(delta) * (1 + 1e-9)
    assert rr_exact_delta(float(eps), k, float(got) * (1 - 1e-6)) > float(delta)  # tight: a hair less is not enough


def test_the_discrete_laplace_of_a_count_is_randomized_response():
    """Why every pure event takes randomized response's PLD: for DLap(0) against DLap(1) the loss is ±ε, with the
    probabilities of randomized response (dp_accounting's own discrete Laplace PLD gives the same δ everywhere)."""
    for eps in (0.01, 0.3, 2.0):
        lap = dpl.from_discrete_laplace_mechanism(eps, sensitivity=1, value_discretization_interval=1e-4)
        rr = dpl.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, 0), value_discretization_interval=1e-4)
        for at in (0.0, eps / 2, eps * 0.99):
            assert lap.get_delta_for_epsilon(at) == pytest.approx(rr.get_delta_for_epsilon(at), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize(("rho", "k", "delta"), [("0.005", 1, "1e-6"), ("0.01", 3, "1e-7"), ("0.5", 2, "1e-5"),
                                                 ("0.0001", 4, "1e-9")])
def test_a_discrete_gaussian_series_is_never_below_its_exact_composition(rho, k, delta):
    """The discrete Gaussian's own PLD at the σ² the sampler uses: ε never below the exact ε of k draws, and close
    (the thousandth grid: within 0.2%)."""
    sigma2 = float(pld.gaussian_sigma2(F(rho)))
    got, _ = pld.block_cost([gauss(rho)], k, F(delta))
    assert dg_exact_delta(sigma2, k, float(got)) <= float(delta) * (1 + 1e-9)
    assert dg_exact_delta(sigma2, k, float(got) * 0.998) > float(delta)


def test_a_discrete_gaussian_costs_less_than_its_zcdp_conversion_and_a_bare_rho_costs_exactly_that():
    """A marked discrete Gaussian gets its own PLD (less than ρ's optimal conversion); an unmarked ρ-zCDP event,
    of which only ρ is known, is its (ε, δ) at its own δ: never a Gaussian (a ρ-zCDP mechanism need not be one)."""
    rho, delta = F(1, 10000), F(1, 10**7)
    converted = acc.zcdp_to_approx(float(rho), float(delta))
    bare = pld.block_cost([PrivacyEvent("zcdp", "auto", rho=rho, delta=delta)])
    assert bare == (fraction_at_least(converted), delta)
    marked, _ = pld.block_cost([gauss("0.0001", "1e-7")])
    assert marked < F(converted) * F(95, 100)


def _reference(events: list[PrivacyEvent], count: int, delta: float) -> float:
    """The same block composed with dp_accounting's own constructors on a fine grid (10⁻⁵), independently."""
    grid = 1e-5
    parts = []
    for ev in events:
        if ev.kind == "zcdp" and ev.rdp_curve == "discrete_gaussian":
            parts.append(dpl.from_discrete_gaussian_mechanism(pld.gaussian_sigma(ev.rho),
                                                              value_discretization_interval=grid))
        elif ev.kind == "zcdp":
            eps = acc.zcdp_to_approx(float(ev.rho), float(ev.delta))
            parts.append(dpl.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, float(ev.delta)),
                                                     value_discretization_interval=grid))
        else:
            parts.append(dpl.from_privacy_parameters(
                common.DifferentialPrivacyParameters(float(ev.epsilon), float(ev.delta)),
                value_discretization_interval=grid))
    composed = parts[0]
    for p in parts[1:]:
        composed = composed.compose(p)
    if count > 1:
        composed = composed.self_compose(count)
    return float(composed.get_epsilon_for_delta(delta))


def _random_events(rng: random.Random) -> list[PrivacyEvent]:
    kinds = rng.sample(["pure", "pure2", "approx", "threshold", "gauss", "zcdp"], rng.randint(1, 4))
    out = []
    for kind in kinds:
        eps = F(rng.choice([5, 10, 25, 50, 120]), 1000)
        if kind in ("pure", "pure2"):
            out.append(PrivacyEvent("pure", "m", epsilon=eps))
        elif kind == "approx":
            out.append(PrivacyEvent("approx", "histogram/laplace+threshold", epsilon=eps, delta=F(1, 10**9)))
        elif kind == "threshold":
            out.append(PrivacyEvent("approx", "histogram/threshold", delta=F(1, 10**8)))
        elif kind == "gauss":
            out.append(gauss(str(F(rng.choice([1, 5, 20]), 10000))))
        else:
            out.append(PrivacyEvent("zcdp", "auto", rho=F(rng.choice([1, 5]), 10000), delta=F(1, 10**8)))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_blocks_agree_with_dp_accounting_on_mixed_sequences(seed):
    """Mixed releases (Laplace, thresholds' δ, thresholded Laplace, discrete Gaussians, bare ρ), as one release
    and as a series: dpcli's ε is within 0.3% of dp_accounting composing the same PLDs on its own, never far
    below it (both round losses up; dpcli's grid may be the exact lattice), and never above basic composition."""
    rng = random.Random(seed)
    for _ in range(3):
        events = _random_events(rng)
        count = rng.choice([1, 7, 60])
        own = sum((ev.delta for ev in events), F(0)) * count
        delta = own + F(1, 10**6)
        got, at = pld.block_cost(events, count, delta)
        assert at == delta
        reference = _reference(events, count, float(delta))
        assert float(got) == pytest.approx(reference, rel=3e-3), (events, count)
        basic = pld._basic(events, count)
        if basic is not None:
            assert got <= basic[0]


def test_epsilon_for_delta_is_dp_accountings_own_computation():
    """The vectorised ε-for-δ gives dp_accounting's answer (its Python loop), never less beyond float error, and
    more by at most 10⁻⁸ relative at δ ≥ 10⁻⁶ (10⁻⁵ at 10⁻⁹): the FFT's round-off (±10⁻¹⁷ a grid point, of
    either sign) is dropped where negative, which only raises the divergence, by up to 10⁻¹² of mass in all."""
    rng = random.Random(7)
    for _ in range(15):
        grid = 10.0 ** -rng.choice([3, 4])  # (dp_accounting's loop is slow on fine grids)
        p = dpl.from_privacy_parameters(common.DifferentialPrivacyParameters(rng.choice([0.01, 0.05, 0.3]),
                                                                             rng.choice([0.0, 1e-9])),
                                        value_discretization_interval=grid)
        if rng.random() < 0.5:
            p = p.compose(dpl.from_discrete_gaussian_mechanism(rng.choice([2.0, 10.0]),
                                                               value_discretization_interval=grid))
        p = p.self_compose(rng.choice([1, 10, 60]))
        for delta in (1e-9, 1e-6, 1e-3):
            theirs, ours = p.get_epsilon_for_delta(delta), pld.epsilon_for_delta(p, delta)
            if math.isinf(theirs):
                assert math.isinf(ours)
                continue
            assert ours >= theirs * (1 - 1e-10) - 1e-12  # (a block's ε is padded by 10⁻⁹ for this float error)
            assert ours <= theirs * (1 + (1e-5 if delta < 1e-6 else 1e-8)) + 1e-9


def test_the_block_costs_of_simple_cases():
    """Pure events at δ = 0 are summed exactly (no PLD needed); a series grows with its length; nothing costs
    nothing; an (ε, δ) event alone costs exactly (ε, δ); a br event's units are randomized responses."""
    assert pld.block_cost([pure("0.1"), pure("0.2")]) == (F(3, 10), F(0))
    assert pld.block_cost([pure("0.1")], 7) == (F(7, 10), F(0))
    assert pld.block_cost([]) == (F(0), F(0))
    assert pld.block_cost([PrivacyEvent("approx", "t", epsilon=F(1, 2), delta=F(1, 10**7))]) == (F(1, 2), F(1, 10**7))
    a, _ = pld.block_cost([pure("0.05")], 20, F(1, 10**6))
    b, _ = pld.block_cost([pure("0.05")], 21, F(1, 10**6))
    assert a < b < F(21, 20)
    br = PrivacyEvent("br", "topk/knowngumb", epsilon=F(1, 10), units=30)
    assert pld.block_cost([br], 1, F(1, 10**6)) == pld.block_cost([pure("0.1")], 30, F(1, 10**6))


def test_what_cannot_be_charged_is_refused():
    """A bare ρ with no δ to convert at, a discrete Gaussian with δ = 0 (never pure), a series whose thresholds
    alone need more δ than it has, an impossible series."""
    with pytest.raises(ChargeRefused, match="give --delta"):
        pld.block_cost([PrivacyEvent("zcdp", "auto", rho=F(1, 100))], 1, F(1, 10**6))
    with pytest.raises(ChargeRefused, match="needs a δ > 0"):
        pld.block_cost([gauss("0.01")])
    threshold = PrivacyEvent("approx", "histogram/laplace+threshold", epsilon=F(1, 100), delta=F(1, 10**8))
    with pytest.raises(ChargeRefused, match="365 runs of histogram/laplace.threshold need more δ than the series' "
                                            "1e-06 .their thresholds' δ alone is 3.65e-06"):
        pld.block_cost([threshold], 365, F(1, 10**6))
    with pytest.raises(ValueError):
        pld.block_cost([pure("0.1")], 0)
    with pytest.raises(ValueError):
        pld.block_cost([pure("0.1")], pld.MAX_COUNT + 1)


def test_the_accountant_composes_blocks_basically():
    """Across blocks a pld ledger adds (ε_j, δ_j): k charges of one release cost k times one (the filter rule), a
    series of k costs less; limits, remaining and guarantee read as an approx ledger's."""
    a = PldAccountant(Limits("pld", {"epsilon": F(1), "delta": F(1, 10**6)}))
    one = a.spend([pure("0.05")])
    total = Spend()
    for _ in range(20):
        total = a.spend([pure("0.05")], total)
    assert one == Spend(epsilon=F(1, 20)) and total == Spend(epsilon=F(1))
    assert a.fits(total, one) is not None and a.fits(a.spend([pure("0.05")], Spend()), one) is None
    series = a.series([pure("0.05")], 20, F(1, 10**6))
    assert series.epsilon < F(1) and series.delta == F(1, 10**6)
    assert a.remaining(series) == {"epsilon": fraction_text(1 - series.epsilon), "delta": "0"}
    assert a.guarantee(series) == (float(series.epsilon), 1e-6)


def test_without_dp_accounting_every_charge_is_refused_in_one_line(monkeypatch):
    """A pld ledger without the extra: any cost (even a pure one that needs no PLD) is refused with one line;
    nothing costs nothing."""
    monkeypatch.setattr(pld, "available", lambda: False)
    a = PldAccountant(Limits("pld", {"epsilon": F(1), "delta": F(1, 10**6)}))
    with pytest.raises(pld.PldUnavailable, match=r"pip install 'dpcli\[pld\]'"):
        a.spend([pure("0.1")])
    assert a.spend([]) == Spend()
    with pytest.raises(pld.PldUnavailable):
        pld.accounting_version()
