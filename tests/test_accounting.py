"""The figures the papers print, recomputed by the accounting library."""

import math

import numpy as np
import pytest

from dpcli.core import accounting as acc

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


def test_pure_to_zcdp_curve_and_group_privacy():
    assert acc.pure_rdp(1.0, np.array([2.0]))[0] == pytest.approx(1.0)
    assert acc.group_privacy(0.5, 1e-9, 2)[0] == 1.0
    eps, _ = acc.advanced_composition(0.1, 0, 100, 1e-6)
    assert eps < 10
