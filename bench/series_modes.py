"""A year of nightly releases (issue 42, item 2): the least noise each ledger mode allows per release.

365 releases at a fixed total of (ε = 1, δ = 10⁻⁶), each the same release, in three workloads:

* Laplace counts: a discrete Laplace count of sensitivity 1 (``histogram --agg count-units --keys …
  --max-partitions 1``), noise scale b = 1/ε;
* Gaussian counts: the discrete Gaussian count of sensitivity 1 (``--noise gaussian``), noise σ;
* a mix with thresholds: each night a Laplace count over public keys and a thresholded Laplace histogram of
  groups found in the data (ε each, δ = 10⁻⁹ for the threshold), noise scale 1/ε for both.

Every figure comes from dpcli's own accountants (``dpcli.core.accounting.accountants``), composing charge by
charge as a ledger does: ``approx`` (basic composition, Gaussians converted at a 365th of δ each), ``zcdp`` (its ρ
limit the largest whose conversion at δ is ε = 1), ``rdp`` (ε at δ over the summed curves), ``pld`` as 365 separate
releases (blocks composed basically: the filter rule) and ``pld`` with the 365 reserved in advance as one series
(``budget plan --runs 365 --reserve``: their 365-fold PLD). The largest per-release budget is bisected to 10⁻⁹
relative; the noise is that of the sampler at that budget.

    .venv/bin/python bench/series_modes.py        (make bench-series; about half a minute)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from fractions import Fraction

from dpcli.core.accounting import composition as acc
from dpcli.core.accounting import pld
from dpcli.core.accounting.accountants import accountant_for
from dpcli.core.accounting.budget import ChargeRefused, Limits, Spend
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_at_most

RUNS = 365
EPSILON = Fraction(1)
DELTA = Fraction(1, 10**6)
THRESHOLD_DELTA = Fraction(1, 10**9)


def laplace(eps: Fraction) -> list[PrivacyEvent]:
    return [PrivacyEvent("pure", "histogram/laplace", epsilon=eps, rdp_curve="discrete_laplace")]


def gaussian(rho: Fraction, delta: Fraction = Fraction(0)) -> list[PrivacyEvent]:
    return [PrivacyEvent("zcdp", "histogram/gaussian", rho=rho, delta=delta, rdp_curve="discrete_gaussian")]


def mix(eps: Fraction) -> list[PrivacyEvent]:
    return [*laplace(eps), PrivacyEvent("approx", "histogram/laplace+threshold", epsilon=eps, delta=THRESHOLD_DELTA)]


def zcdp_limits(delta_spent: Fraction) -> Limits:
    """The zcdp ledger of the same total: ρ whose optimal conversion at the δ left is ε = 1, and that δ spent."""
    rho = fraction_at_most(acc.rho_for_epsilon(float(EPSILON), float(DELTA - delta_spent)))
    return Limits("zcdp", {"rho": rho, "delta": delta_spent})


def ad_hoc(limits: Limits) -> Callable[[list[PrivacyEvent]], bool]:
    """Whether 365 charges of a release fit ``limits``, composed one at a time as the ledger does."""
    accountant = accountant_for(limits)

    def fits(events: list[PrivacyEvent]) -> bool:
        total: Spend | None = None
        try:
            for _ in range(RUNS):
                total = accountant.spend(events, total)
        except ChargeRefused:
            return False
        assert total is not None
        return accountant.fits(Spend(), total) is None

    return fits


def series(events: list[PrivacyEvent]) -> bool:
    """Whether 365 releases reserved as one pld series fit (ε, δ)."""
    eps, _ = pld.block_cost(events, RUNS, DELTA)
    return eps <= EPSILON


def largest(fits: Callable[[Fraction], bool], lo: float, hi: float) -> float:
    """The largest budget in [lo, hi] that fits (bisected in log space)."""
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        mid = (a + b) / 2
        if fits(Fraction(math.exp(mid))):
            a = mid
        else:
            b = mid
    return math.exp(a)


def checks(workload: str) -> dict[str, Callable[[Fraction], bool]]:
    """Each mode's test of one per-release budget (ε, or ρ for Gaussian counts)."""
    approx = Limits("approx", {"epsilon": EPSILON, "delta": DELTA})
    rdp = Limits("rdp", {"epsilon": EPSILON, "delta": DELTA})
    pld_limits = Limits("pld", {"epsilon": EPSILON, "delta": DELTA})
    if workload == "gaussian":
        each = DELTA / RUNS  # approx and ad-hoc pld convert each release at its share of δ
        return {
            "approx": lambda r: ad_hoc(approx)(gaussian(r, each)),
            "zcdp": lambda r: ad_hoc(zcdp_limits(Fraction(0)))(gaussian(r)),
            "rdp": lambda r: ad_hoc(rdp)(gaussian(r)),
            "pld, 365 separate releases": lambda r: ad_hoc(pld_limits)(gaussian(r, each)),
            "pld, one series of 365": lambda r: series(gaussian(r)),
        }
    make = laplace if workload == "laplace" else mix
    spent = THRESHOLD_DELTA * RUNS if workload == "mix" else Fraction(0)
    return {
        "approx": lambda e: ad_hoc(approx)(make(e)),
        "zcdp": lambda e: ad_hoc(zcdp_limits(spent))(make(e)),
        "rdp": lambda e: ad_hoc(rdp)(make(e)),
        "pld, 365 separate releases": lambda e: ad_hoc(pld_limits)(make(e)),
        "pld, one series of 365": lambda e: series(make(e)),
    }


def noise(workload: str, budget: float) -> float:
    """The noise per release at that budget: the discrete Laplace's scale 1/ε, or the discrete Gaussian's σ."""
    if workload == "gaussian":
        return pld.gaussian_sigma(Fraction(budget))
    return 1 / budget


TITLES = {"laplace": "Laplace counts (sensitivity 1): scale b = 1/ε",
          "gaussian": "Gaussian counts (sensitivity 1): σ",
          "mix": "a Laplace count + a thresholded Laplace histogram (δ 10⁻⁹) each night: scale 1/ε"}


def main() -> None:
    start = time.perf_counter()
    for workload, title in TITLES.items():
        print(f"\n**{title}**\n")
        unit = "ρ" if workload == "gaussian" else "ε"
        print(f"| mode | per-release {unit} | noise per release | vs approx | vs rdp |")
        print("|---|---|---|---|---|")
        found = {mode: largest(check, 1e-7, 1.0) for mode, check in checks(workload).items()}
        rdp = noise(workload, found["rdp"])
        base = noise(workload, found["approx"])
        for mode, budget in found.items():
            n = noise(workload, budget)
            print(f"| {mode} | {budget:.5g} | {n:.4g} | {n / base:.1%} | {n / rdp - 1:+.1%} |")
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
