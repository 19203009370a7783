"""A tabulation planned from its spec alone (no data): each level's budget from its margin of error or its ε or ρ
(:func:`level_budgets`, paper 003's Table 4), the events a release is charged (:func:`events`), and the dry run's
document with the totals of both noises (:func:`plan_document`, Table 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import numpy as np

from dpcli.core import mechanisms as mech
from dpcli.core.accounting import composition as acc
from dpcli.core.events import PrivacyEvent
from dpcli.tasks.tabulate.query import Level, Spec

if TYPE_CHECKING:
    pass  # a list's item type may be a class (pl.List(pl.Int64).inner)


#: α grid of SafeTab App. F (1.01, 1.02, …, 10.00).
SAFETAB_ORDERS = np.round(np.arange(1.01, 10.0001, 0.01), 2)


def base_from_moe(moe: float, noise: str, calibration: str = "paper") -> float:
    """The step-2 per-cell parameter (ε or ρ) for a 95% MOE target.

    ``paper``: eq. 38, ε = ln 20/(⌊MOE⌋ + 1) (geometric), or eq. 37, ρ = 1.92/⌊MOE⌋²
    (discrete Gaussian), as SafeTab prints them. Eq. 38 comes from eq. 35-36,
    which take a floor where the tail bound needs a ceiling: at MOE 6 the exact
    P[|Z| > 6] is 0.0605, so the interval covers 94%, not 95%.
    ``exact``: the smallest parameter (least budget) whose *exact* noise
    distribution has P[|Z| > ⌊MOE⌋] ≤ 0.05, found by bisection on the exact tail.
    """
    m = math.floor(moe)
    if calibration == "paper":
        if noise == "geometric":
            return math.log(20.0) / (m + 1)
        return 1.92 / (m * m)

    def covered(param: float) -> bool:
        noise_q = noise_for(noise, Fraction(param))
        return 2.0 * noise_q.tail(m + 1) <= 0.05

    lo, hi = 1e-9, 50.0
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if covered(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class LevelBudget:
    """A level's parameters: per-cell step-2 value, the level's step-2 and total (× s, ÷ (1 − γ))."""

    level: Level
    base: float  # per population group, step 2 (ε or ρ of one NoisyCount)
    step2: float  # aggregated over the level: base · s
    total: float  # the level's input ρ_i: step2 / (1 − γ)

    @property
    def charged(self) -> Fraction:
        """The level's ρ_i as an exact decimal: the spec's value, or the MOE-derived one rounded *up*
        to 12 decimals (slightly less noise than the formula, charged exactly as used)."""
        if self.level.budget is not None:
            return self.level.budget
        return Fraction(math.ceil(self.total * 10**12), 10**12)

    @property
    def per_group(self) -> Fraction:
        """ρ_i/s: what each population group's TabulatePopulationGroup call gets (Alg. 1, line 11)."""
        return self.charged / self.level.stability


def level_budgets(spec: Spec, noise: str) -> list[LevelBudget]:
    """Per-level parameters for ``noise`` (levels given as budgets only convert for the spec's own noise)."""
    out = []
    g = float(spec.gamma)
    for lv in spec.levels:
        s = lv.stability
        if lv.moe is not None:
            base = base_from_moe(lv.moe, noise, spec.moe_calibration)
            total = base * s / (1.0 - g)
        else:
            if noise != spec.noise:
                continue
            assert lv.budget is not None  # a level has a MOE or a budget (tabulate_spec)
            total = float(lv.budget)
            base = total * (1.0 - g) / s
        out.append(LevelBudget(lv, base, base * s, total))
    return out


@dataclass(frozen=True)
class TabulatePlan:
    """A tabulation's calibration, from its spec alone: what :func:`run_tabulate` draws its noise
    with, exactly. The noise family, γ (the step-1 share), the thresholds θ1 < θ2 < θ3 that choose
    each group's branch, the levels, and each level's ρ_i/s (or ε_i/s) per population group, as
    charged. It enters the release seed (:class:`dpcli.release.Calibration`)."""

    noise: str
    gamma: Fraction
    thresholds: tuple[int, int, int]
    levels: tuple[Level, ...]
    per_group: tuple[Fraction, ...]  # one per level, in order: :attr:`LevelBudget.per_group`
    #: What a run costs (:func:`events`): a function of the fields above, so not part of the seed's material.
    events: list[PrivacyEvent] = field(default_factory=list, compare=False)


def plan_tabulate(spec: Spec) -> TabulatePlan:
    """The calibration of ``spec``'s release (no data read)."""
    budgets = level_budgets(spec, spec.noise)  # every level has a budget in the spec's own noise
    return TabulatePlan(spec.noise, spec.gamma, spec.thresholds, tuple(b.level for b in budgets),
                        tuple(b.per_group for b in budgets), events(spec))


def geometric_rdp_total(budgets: list[LevelBudget], gamma: float, delta: float) -> tuple[float, float]:
    """Eq. 39–40: f(α) = Σ_i s·max[τ(α, γρ_i/s) + τ(α, (1−γ)ρ_i/s), τ(α, ρ_i/s)], minimised over α ∈ {1.01…10}."""
    a = SAFETAB_ORDERS
    f = np.zeros(a.size)
    for b in budgets:
        s, r = b.level.stability, b.total
        two = acc.geometric_rdp(gamma * r / s, a) + acc.geometric_rdp((1 - gamma) * r / s, a)
        f += s * np.maximum(two, acc.geometric_rdp(r / s, a))
    return acc.rdp_to_approx(f, delta, a)


class GeometricLevel(TypedDict):
    """One level of Table 4 under geometric noise."""

    level: str
    moe: float | None
    stability: int
    epsilon_base: float
    epsilon_step2: float
    epsilon_total: float


class GaussianLevel(TypedDict):
    """One level of Table 4 under discrete Gaussian noise."""

    level: str
    moe: float | None
    stability: int
    rho_base: float
    rho_step2: float
    rho_total: float


class GeometricTotals(TypedDict):
    """Table 2 under geometric noise: the levels, and the total ε under pure DP and under RDP."""

    levels: list[GeometricLevel]
    pure_epsilon: float
    rdp_epsilon: float
    rdp_alpha: float


class GaussianTotals(TypedDict):
    """Table 2 under discrete Gaussian noise: the levels, the total ρ and its (ε, δ) conversions."""

    levels: list[GaussianLevel]
    rho: float
    zcdp_analytic_epsilon: float
    zcdp_numerical_epsilon: float
    zcdp_numerical_alpha: float


class PlanDocument(TypedDict):
    """``dpcli tabulate --dry-run``'s document (each noise whose levels can all be converted; the CLI adds
    ``ledger``: whether the analyst's ledger would accept the spec's cost)."""

    noise: str
    gamma: float
    delta: float
    moe_calibration: str
    geometric: NotRequired[GeometricTotals]
    discrete_gaussian: NotRequired[GaussianTotals]
    ledger: NotRequired[dict[str, Any]]


def plan_document(spec: Spec, delta: float = 1e-10) -> PlanDocument:
    """Table 4 (per-level parameters) and Table 2 (total loss under each analysis) for a spec."""
    out: PlanDocument = {"noise": spec.noise, "gamma": float(spec.gamma), "delta": delta,
                         "moe_calibration": spec.moe_calibration}
    geo = level_budgets(spec, "geometric")
    dg = level_budgets(spec, "discrete-gaussian")
    if geo:
        eps_rdp, alpha = geometric_rdp_total(geo, float(spec.gamma), delta)
        out["geometric"] = {
            "levels": [{"level": b.level.name, "moe": b.level.moe, "stability": b.level.stability,
                        "epsilon_base": b.base, "epsilon_step2": b.step2, "epsilon_total": b.total} for b in geo],
            "pure_epsilon": sum(b.total for b in geo),
            "rdp_epsilon": eps_rdp,
            "rdp_alpha": alpha,
        }
    if dg:
        rho = sum(b.total for b in dg)
        numerical, alpha = acc.rdp_to_approx(acc.zcdp_rdp(rho, SAFETAB_ORDERS), delta, SAFETAB_ORDERS)
        out["discrete_gaussian"] = {
            "levels": [{"level": b.level.name, "moe": b.level.moe, "stability": b.level.stability,
                        "rho_base": b.base, "rho_step2": b.step2, "rho_total": b.total} for b in dg],
            "rho": rho,
            "zcdp_analytic_epsilon": acc.zcdp_to_approx_analytic(rho, delta),
            "zcdp_numerical_epsilon": numerical,
            "zcdp_numerical_alpha": alpha,
        }
    return out


def events(spec: Spec) -> list[PrivacyEvent]:
    """What a run costs: Σ ε_i (pure) or Σ ρ_i (zCDP), as exact decimals rounded up."""
    total = sum((b.charged for b in level_budgets(spec, spec.noise)), Fraction(0))
    if spec.noise == "geometric":
        return [PrivacyEvent("pure", "tabulate/geometric", epsilon=total)]
    return [PrivacyEvent("zcdp", "tabulate/discrete-gaussian", rho=total)]


def noise_for(noise: str, param: Fraction) -> mech.Noise:
    """BaseGeometric(ε = param) or BaseDiscreteGaussian(ρ = param) for a sensitivity-1 count."""
    if noise == "geometric":
        return mech.laplace(1, param)
    return mech.gaussian(1, param)
