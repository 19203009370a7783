"""The figures the papers print, recomputed by the accounting library (and by ``dpcli budget compose``).
"""

from __future__ import annotations

import decimal
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from dptest import cli

from dpcli.core.accounting import composition as acc
from dpcli.core.events import PrivacyEvent

SAFETAB_GEOMETRIC_TOTALS = [4.27, 4.27, 2.49, 2.49, 0.59, 0.59, 0.59]  # Table 4, ε per level
SAFETAB_ZCDP_TOTALS = [0.534, 0.534, 0.159, 0.159, 0.008, 0.008, 0.008]  # Table 4, ρ per level
PAPER_GRID = np.round(np.arange(1.01, 10.0001, 0.01), 2)  # App. F.2: α ∈ {1.01, …, 10.0}


def test_linkedin_monthly_guarantee_sec_8_4():
    eps, delta = acc.br_budget_guarantee(0.15, 3000, 30, 1e-10, 1e-9)
    assert round(eps, 1) == 34.9 and delta == pytest.approx(7e-9)


def test_br_composition_never_exceeds_basic():
    assert acc.br_composition(2.0, 3, 1e-9) == 6.0
    assert acc.br_composition(0.1, 1000, 1e-6) < 100


def test_safetab_table_2_pure_and_zcdp():
    assert round(sum(SAFETAB_GEOMETRIC_TOTALS), 1) == 15.3
    rho = sum(SAFETAB_ZCDP_TOTALS)
    assert round(acc.zcdp_to_approx_analytic(rho, 1e-10), 1) == 12.8
    assert round(acc.zcdp_to_approx(rho, 1e-10), 1) == 12.2
    # The optimal conversion agrees with the paper's grid method.
    grid_eps, _ = acc.rdp_to_approx(acc.zcdp_rdp(rho, PAPER_GRID), 1e-10, PAPER_GRID)
    assert acc.zcdp_to_approx(rho, 1e-10) <= grid_eps + 1e-6


def test_safetab_table_2_rdp_with_the_papers_curve():
    """Eq. 39-40 with Corollary 1 and Table 4's ε. The paper prints 13.2; eq. 39-40 as
    printed give 13.5 (the max in eq. 39 is always the single-step term here). Either
    way the RDP analysis beats pure DP and loses to zCDP, as the paper says."""
    s, g = 9, 0.1
    f = sum(
        s * np.maximum(acc.geometric_rdp(g * r / s, PAPER_GRID) + acc.geometric_rdp((1 - g) * r / s, PAPER_GRID),
                       acc.geometric_rdp(r / s, PAPER_GRID))
        for r in SAFETAB_GEOMETRIC_TOTALS
    )
    eps, alpha = acc.rdp_to_approx(f, 1e-10, PAPER_GRID)
    assert 13.1 < eps < 13.6
    assert acc.zcdp_to_approx(sum(SAFETAB_ZCDP_TOTALS), 1e-10) < eps < sum(SAFETAB_GEOMETRIC_TOTALS)


def test_exact_discrete_laplace_rdp_matches_direct_sum_and_exceeds_corollary_1():
    e, a = 0.474, 7.0
    x = np.arange(-400, 401)
    c = (1 - math.exp(-e)) / (1 + math.exp(-e))
    lp, lq = math.log(c) - np.abs(x) * e, math.log(c) - np.abs(x - 1) * e
    direct = np.log(np.exp(a * lp + (1 - a) * lq).sum()) / (a - 1)
    exact = acc.discrete_laplace_rdp(e, np.array([a]))[0]
    assert exact == pytest.approx(direct, rel=1e-9)
    assert acc.geometric_rdp(e, np.array([a]))[0] < exact  # Cor. 1 understates it


def test_zcdp_conversions_are_consistent():
    for rho in (0.01, 0.5, 3.0):
        for d in (1e-5, 1e-10):
            opt, ana = acc.zcdp_to_approx(rho, d), acc.zcdp_to_approx_analytic(rho, d)
            assert opt <= ana
            assert acc.zcdp_delta(rho, opt) <= d * (1 + 1e-9)


def test_pure_to_zcdp_curve():
    assert acc.pure_rdp(1.0, np.array([2.0]))[0] == pytest.approx(1.0)
    eps, _ = acc.advanced_composition(0.1, 0, 100, 1e-6)
    assert eps < 10


# ---- extremes: every conversion stays finite and on the safe side (ε up, ρ down) ---------------


DEC = decimal.Context(prec=400, Emin=-(10**6), Emax=10**6)  # also the context of every operator below
RHOS = [5e-324, 1e-300, 1e-24, 1e-12, 1e-6, 0.01, 1.0, 1e3, 1e6, 1e12]
DELTAS = [1e-100, 1e-9, 0.5]


def _cks_log_delta_exact(rho: float, eps: float, delta: float) -> decimal.Decimal:
    """ln δ(α) of CKS's bound at a good order α = 1 + x, evaluated in 400-digit decimals (any x is valid)."""
    a, b = -700.0, 700.0  # bisect ln x on the (float) derivative; the value is then computed exactly
    for _ in range(200):
        m = (a + b) / 2
        x = math.exp(m)
        if (2 * x + 1) * rho - eps - math.log1p(1 / x) < 0:
            a = m
        else:
            b = m
    with decimal.localcontext(DEC):
        x, r, e = decimal.Decimal(math.exp((a + b) / 2)), decimal.Decimal(rho), decimal.Decimal(eps)
        return x * ((1 + x) * r - e) + x * x.ln() - (1 + x) * (1 + x).ln()


@pytest.mark.parametrize("delta", DELTAS)
def test_zcdp_to_approx_is_valid_and_finite_at_extremes(delta):
    previous = 0.0
    for rho in RHOS:
        eps = acc.zcdp_to_approx(rho, delta)
        assert math.isfinite(eps) and previous <= eps <= acc.zcdp_to_approx_analytic(rho, delta)
        previous = eps
        # the stated ε (even 0: δ above the total variation bound) holds at δ in exact arithmetic
        if rho > 0:
            assert _cks_log_delta_exact(rho, eps, delta) <= DEC.ln(decimal.Decimal(delta)), (rho, eps)


@pytest.mark.parametrize("delta", DELTAS)
def test_rho_for_epsilon_rounds_down_and_is_tight_at_extremes(delta):
    for eps in [1e-12, 1e-6, 0.1, 1.0, 1e3, 1e6]:
        rho = acc.rho_for_epsilon(eps, delta)
        assert rho > 0 and acc.zcdp_to_approx(rho, delta) <= eps
        assert acc.zcdp_to_approx(rho * (1 + 1e-6), delta) > eps  # and not needlessly small


def test_br_composition_tiny_epsilon_rounds_up():
    """r − 1 − ln r cancels in floats for small ε; the series keeps it exact to the last digits."""
    count, delta = 10**9, 1e-9
    for eps in [1e-12, 1e-8, 1e-4, 0.05, 3.0, 1e3, 1e6]:
        with decimal.localcontext(DEC):
            x = decimal.Decimal(eps)
            r = x / (1 - (-x).exp())
            sqrt_term = (decimal.Decimal(count) / 2 * -decimal.Decimal(delta).ln()).sqrt()
            exact = min(count * (r - 1 - r.ln()) + x * sqrt_term, count * x)
        got = acc.br_composition(eps, count, delta)
        assert exact <= decimal.Decimal(got) <= exact * (1 + decimal.Decimal(1e-9)), eps


def test_discrete_laplace_rdp_tiny_epsilon_is_not_rounded_away():
    a = np.array([1.01, 2.0, 10.0, 1e4])
    for eps in [1e-12, 1e-6, 0.474, 30.0]:
        got = acc.discrete_laplace_rdp(eps, a)
        for alpha, value in zip(a, got):
            with decimal.localcontext(DEC):
                al, e = decimal.Decimal(alpha), decimal.Decimal(eps)
                exact = (((al - 1) * e).exp() + (-al * e).exp()) / (1 + (-e).exp())
                exact = exact.ln() / (al - 1)
                assert abs(decimal.Decimal(value) - exact) <= exact * decimal.Decimal(1e-9), (eps, alpha)
    assert np.all(acc.discrete_laplace_rdp(1e-12) > 0)


def test_large_epsilon_does_not_overflow():
    big = 1e6
    assert np.all(np.isfinite(acc.geometric_rdp(big, np.array([1.5, 10.0]))))
    assert np.all(np.isfinite(acc.discrete_laplace_rdp(big)))
    eps, _ = acc.advanced_composition(big, 0.0, 10, 1e-6)
    assert eps == 10 * big
    assert math.isfinite(acc.br_composition(big, 10**12, 1e-9))
    eps, _ = acc.rdp_to_approx(np.full(acc.RDP_ORDERS.size, np.inf), 1e-9)
    assert eps == math.inf


def test_one_accountant_per_mode_and_limits_never_change_the_callers_dict():
    from dpcli.core.accounting.accountants import ACCOUNTANTS, accountant_for
    from dpcli.core.accounting.budget import MODES, Limits

    assert sorted(ACCOUNTANTS) == sorted(MODES)
    given = {"epsilon": "1"}
    limits = Limits("pure", given)  # type: ignore[arg-type]
    assert given == {"epsilon": "1"} and limits.values == {"epsilon": Fraction(1)}
    acct = accountant_for(limits)
    ev = PrivacyEvent("pure", "t", epsilon=Fraction(3, 10))
    spent = acct.spend([ev, ev])
    assert acct.spend([ev], base=acct.spend([ev])) == spent and acct.remaining(spent) == {"epsilon": "0.4"}
    assert acct.fits(spent, acct.spend([ev, ev])) == "ε left is 0.4; this query needs 0.6"
    with pytest.raises(ValueError):
        ACCOUNTANTS["rdp"](limits)


def test_compose_br_matches_paper_and_zcdp_keys():
    r = cli("budget", "compose", "--mode", "br", "--epsilon-per", "0.15", "--count", "3000", "--call-budget", "30",
            "--delta-per", "1e-10", "--delta-prime", "1e-9", "--json")
    d = json.loads(r.stdout)
    assert round(d["epsilon"], 1) == 34.9 and abs(d["delta"] - 7e-9) < 1e-20
    d = json.loads(cli("budget", "compose", "--mode", "zcdp", "--rho", "1.41", "--delta", "1e-10", "--json").stdout)
    assert round(d["epsilon"], 1) == 12.2 and round(d["epsilon_analytic"], 1) == 12.8
