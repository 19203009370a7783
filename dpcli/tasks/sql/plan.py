"""The noisy measurements of a ``dpcli sql`` query and their calibration, decided before any data is read.

Each anonymized aggregate needs per-partition sums of per-user partials (docs/commands/sql.md,
"Per-user partials"); one user contributes one partial per partition, so a measurement's
per-partition sensitivity is the range of its partial:

==========  =================================================  ===========================
measure     per-user partial in a partition                    sensitivity per partition
==========  =================================================  ===========================
units       1 (the user is there)                              1
rows        rows, clamped to [0, U]                            U
count       non-null values, clamped to [0, U]                 U
sum         sum of values, clamped to [L, U], on the grid      max(|L|, |U|) in grid units
n           1 if the user has a value                          1
csum        mean of values, clamped to [L, U], minus the centre  half the width, grid units
csq         mean of squared distances to the centre, clamped   (half the width)², grid units²
ntile       the user's own p-quantile, clamped, as a bin       max(num, den − num) of p
==========  =================================================  ===========================

All aggregates of a query share one contribution bound (at most K partitions per user) and one
partition selection; the ε (or ρ) is split equally between the distinct measurements, and
discovering partitions adds the ``units`` count their threshold is decided on. Calibration
follows ``histogram``'s (docs/histogram.md): discrete Laplace with ℓ1 = K·Δ, discrete Gaussian with
ℓ2² = K·Δ², the exponential mechanism for quantiles, and minimum-unit thresholding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from dpcli import bounding
from dpcli.core import mechanisms as mech
from dpcli.core.accounting import composition as acc
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks import quantile_interval as qi
from dpcli.tasks.budgets import gaussian_budget
from dpcli.tasks.quantile_gaps import QUANTILE_SAMPLER
from dpcli.tasks.sql.ir import AnonAgg, Expr, expr_canonical

MeasureKind = Literal["units", "rows", "count", "sum", "n", "csum", "csq", "ntile"]


@dataclass(frozen=True)
class Measure:
    """One noisy per-partition statistic (see the module docstring); ``key`` names it and its noise stream."""

    key: str
    kind: MeasureKind
    value: Expr | None = None
    cap: int = 0
    bounds: tuple[Fraction, Fraction] | None = None
    p: Fraction | None = None

    @property
    def grid(self) -> bounding.ValueGrid:
        assert self.bounds is not None, self.key
        lo, hi = float(self.bounds[0]), float(self.bounds[1])
        return bounding.ValueGrid(lo, hi, bounding.default_granularity(lo, hi))

    @property
    def sensitivity(self) -> int:
        """The most one user moves this measurement in one partition."""
        if self.kind in ("rows", "count"):
            return self.cap
        if self.kind == "sum":
            return max(self.grid.max_abs_units, 1)
        if self.kind == "csum":
            return max(self.grid.half_width_units, 1)
        if self.kind == "csq":
            return max(self.grid.half_width_units, 1) ** 2
        if self.kind == "ntile":
            assert self.p is not None  # one partial per user: C = 1 (mechanisms.quantile_utility_sensitivity)
            return mech.quantile_utility_sensitivity(self.p, 1)
        return 1


def _key(kind: str, *parts: Any) -> str:
    return json.dumps([kind, *parts], sort_keys=True, separators=(",", ":"))


def _bounds(b: tuple[Fraction, Fraction] | None) -> list[str]:
    assert b is not None
    return [fraction_text(b[0]), fraction_text(b[1])]


def measures_for(agg: AnonAgg, default_cap: int) -> tuple[Measure, ...]:
    """The measurements one aggregate reads (a count at the default cap is ``histogram``'s ``rows``)."""
    v = expr_canonical(agg.value) if agg.value is not None else None
    if agg.function == "count_units":
        return (Measure("units", "units"),)
    if agg.function == "count":
        assert agg.cap is not None
        if agg.value is None:
            return (Measure("rows" if agg.cap == default_cap else f"rows/{agg.cap}", "rows", cap=agg.cap),)
        return (Measure(_key("count", v, agg.cap), "count", agg.value, cap=agg.cap),)
    b = _bounds(agg.bounds)
    if agg.function == "sum":
        return (Measure(_key("sum", v, b), "sum", agg.value, bounds=agg.bounds),)
    if agg.function == "ntile":
        assert agg.p is not None
        return (Measure(_key("ntile", v, fraction_text(agg.p), b), "ntile", agg.value, bounds=agg.bounds, p=agg.p),)
    found = [Measure(_key("n", v), "n", agg.value), Measure(_key("csum", v, b), "csum", agg.value, bounds=agg.bounds)]
    if agg.function in ("var", "stddev"):
        found.append(Measure(_key("csq", v, b), "csq", agg.value, bounds=agg.bounds))
    return tuple(found)


def measures_of(aggregates: tuple[AnonAgg, ...], default_cap: int, thresholded: bool) -> tuple[Measure, ...]:
    """Every distinct measurement of a query, in key order (a threshold adds ``units``)."""
    found = {m.key: m for a in aggregates for m in measures_for(a, default_cap)}
    if thresholded:
        found.setdefault("units", Measure("units", "units"))
    return tuple(found[k] for k in sorted(found))


@dataclass(frozen=True)
class Calibrated:
    """A measurement with its noise (or, for an NTILE, its exponential mechanism's rate) and budget share."""

    measure: Measure
    noise: mech.Noise | None = None
    em_rate: Fraction | None = None
    share: str = ""


@dataclass(frozen=True)
class IntervalCalibrated(Calibrated):
    """An NTILE released with its 95% value interval (``--with-error``): ``em_rate`` is the value's (1/2 of the
    share), ``end_rate`` each end's (1/5, sensitivity 1: one partial per user) and ``count`` the noisy number of
    partials' noise (1/10) (:mod:`dpcli.tasks.quantile_interval`)."""

    end_rate: Fraction | None = None
    count: mech.Noise | None = None


@dataclass(frozen=True)
class SqlPlan:
    """A query's calibration: its measurements, what it costs, the threshold (when partitions are discovered)."""

    calibrated: tuple[Calibrated, ...]
    events: tuple[PrivacyEvent, ...]
    domain: str  # threshold, keys, or all (no GROUP BY: one partition)
    max_partitions: int
    threshold: int | None = None
    split: str = ""
    #: The ledger's (mode, limits) the plan was made for, so a dry run can plan the release again at other caps (its
    #: margins at the largest caps ``auto`` can choose). Not compared, so not seed material of its own: the seed's
    #: calibration binds the mode.
    ledger: tuple[str, dict[str, Fraction]] = field(default=("pure", {}), compare=False)

    def get(self, key: str) -> Calibrated:
        return next(c for c in self.calibrated if c.measure.key == key)


@dataclass(frozen=True)
class Budget:
    """What a release may spend, as the options give it."""

    epsilon: Fraction | None = None
    delta: Fraction = Fraction(0)
    rho: Fraction | None = None
    noise: str = "laplace"


def plan_measures(measures: tuple[Measure, ...], budget: Budget, domain: str, max_partitions: int,
                  mode: str, with_error: bool = False, stability: int = 1) -> SqlPlan:
    """Calibrate every measurement from the query alone (no data). ``stability``: how many units' rows one unit can
    move, S = 1 + 2A (:mod:`dpcli.tasks.sql.owners`; 1 without owned tables): each noise is calibrated to S times
    the bound's sensitivity (ℓ1 S·K·Δ, ℓ2² S²·K·Δ², an exponential mechanism's rate over S·K, or S²·K under ρ), and
    the threshold is met by a partition of 1 + A units with probability δ over (1 + A)·K new partitions."""
    if mode == "br":
        raise UsageError("a br ledger pays for histogram counts and top-k only: run dpcli sql against a pure, "
                         "approx, zcdp or rdp ledger")
    if domain == "threshold" and not 0 < budget.delta < 1:
        raise UsageError("discovering groups from the data needs --delta in (0, 1) (the chance a rare group "
                         "leaks); or give the public list of groups with --keys")
    k = 1 if domain == "all" else max_partitions
    split = f"equal, 1/{len(measures)} of the budget per measurement"
    if any(m.kind == "ntile" for m in measures):  # the sampler, in the seed: a release by another is another
        split += f"; {QUANTILE_SAMPLER}"
    if budget.noise == "laplace":
        calibrated, events = _laplace(measures, budget, domain, (k, stability), with_error)
        selection_delta = budget.delta
    else:
        calibrated, events, selection_delta = _gaussian(measures, budget, domain, (k, stability), with_error)
    threshold = None
    if domain == "threshold":
        units = next(c.noise for c in calibrated if c.measure.key == "units")
        assert units is not None
        moved = (stability + 1) // 2  # the most units a partition found in only one of two neighbours holds
        threshold = mech.selection_threshold(units, moved * k, float(selection_delta)) + moved - 1
    return SqlPlan(calibrated, events, domain, k, threshold, split)


def _laplace(measures: tuple[Measure, ...], budget: Budget, domain: str, bound: tuple[int, int],
             with_error: bool = False) -> tuple[tuple[Calibrated, ...], tuple[PrivacyEvent, ...]]:
    """Pure ε split equally: discrete Laplace with ℓ1 = S·K·Δ; NTILEs by the exponential mechanism at ε_m/(S·K)
    (``bound``: K and the stability S)."""
    k = bound[0] * bound[1]  # (S·K: what one unit moves, in units of one partition's sensitivity)
    if budget.rho is not None:
        raise UsageError("calibrates Gaussian noise; Laplace noise needs an ε instead (or choose Gaussian noise)",
                         field="rho")
    if budget.epsilon is None:
        raise UsageError("is required", field="epsilon")
    eps_m = budget.epsilon / len(measures)
    share = fraction_text(eps_m)
    out: list[Calibrated] = []
    for m in measures:
        if m.kind == "ntile" and with_error:
            out.append(IntervalCalibrated(
                m, em_rate=eps_m * qi.POINT_SHARE / k / (2 * m.sensitivity), share=share,
                end_rate=eps_m * qi.END_SHARE / k / 2, count=_probed(mech.laplace(k, eps_m * qi.COUNT_SHARE))))
        elif m.kind == "ntile":
            out.append(Calibrated(m, em_rate=eps_m / k / (2 * m.sensitivity), share=share))
        else:
            out.append(Calibrated(m, _probed(mech.laplace(k * m.sensitivity, eps_m)), share=share))
    if domain == "threshold":
        return tuple(out), (PrivacyEvent("approx", "sql/laplace+threshold", epsilon=budget.epsilon,
                                         delta=budget.delta),)
    return tuple(out), (PrivacyEvent("pure", "sql/laplace", epsilon=budget.epsilon),)


def _gaussian(measures: tuple[Measure, ...], budget: Budget, domain: str, bound: tuple[int, int],
              with_error: bool = False) -> tuple[tuple[Calibrated, ...], tuple[PrivacyEvent, ...], Fraction]:
    """ρ split equally: discrete Gaussian with ℓ2² = S²·K·Δ²; with a threshold, δ is split between the
    (ε, δ) conversion and the selection. Returns the selection's δ too (``bound``: K and the stability S)."""
    k = bound[0] * bound[1] ** 2  # (S²·K: a sum of S changes of √K·Δ each, squared)
    rho, conversion_delta, selection_delta = gaussian_budget(budget.epsilon, budget.rho, budget.delta,
                                                             domain == "threshold")
    rho_m = rho / len(measures)
    share = f"ρ={float(rho_m):.6g}"
    out: list[Calibrated] = []
    for m in measures:
        if m.kind == "ntile" and with_error:
            out.append(IntervalCalibrated(
                m, em_rate=acc.largest_epsilon(rho_m * qi.POINT_SHARE / k, 8) / (2 * m.sensitivity), share=share,
                end_rate=acc.largest_epsilon(rho_m * qi.END_SHARE / k, 8) / 2,
                count=_probed(mech.gaussian(k, rho_m * qi.COUNT_SHARE))))
        elif m.kind == "ntile":
            out.append(Calibrated(m, em_rate=acc.largest_epsilon(rho_m / k, 8) / (2 * m.sensitivity), share=share))
        else:
            out.append(Calibrated(m, _probed(mech.gaussian(k * m.sensitivity ** 2, rho_m)), share=share))
    events = [PrivacyEvent("zcdp", "sql/gaussian", rho=rho, delta=conversion_delta)]
    if domain == "threshold":
        events.append(PrivacyEvent("approx", "sql/threshold", delta=selection_delta))
    return tuple(out), tuple(events), selection_delta


def _probed(noise: mech.Noise) -> mech.Noise:
    """``noise``, once a draw has shown its scale is within the exact samplers' range."""
    try:
        noise.sample(KeyedStream(b"\0" * 32, "probe"), 1)
    except ValueError:
        raise UsageError("noise too large to sample; use tighter bounds or caps") from None
    return noise
