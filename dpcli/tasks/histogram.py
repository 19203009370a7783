"""User-level DP group-by (``dpcli histogram``), importable without the CLI.

:func:`plan_histogram` decides from the query and the ledger mode alone (no data) which noisy
measurements are needed, how the budget is split and the noise of each; :func:`run_histogram`
bounds, aggregates, selects groups and adds the noise. The measurements, their sensitivities
and the calibration are in ``docs/histogram.md``.
"""

from __future__ import annotations

import bisect
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from dpcli import bounding
from dpcli.core import intervals
from dpcli.core import mechanisms as mech
from dpcli.core.accounting import composition as acc
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import floor_parameter, fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.frames import collect
from dpcli.tasks import (
    Engine,
    Frames,
    Needs,
    PublicList,
    Result,
    auto_bounds,
    bias_report,
    bound_elsewhere,
    free_replay,
    quantile_gaps,
    quantile_interval,
)

if TYPE_CHECKING:
    from dpcli.advice import Note
    from dpcli.tasks.histogram_target import Choice
    from dpcli.tasks.targets import MarginTarget

SIMPLE_AGGREGATIONS = ("count", "count-units", "sum", "mean", "variance")
VALUE_AGGREGATIONS = ("sum", "mean", "variance")
#: The column of a quantile's per-group counts holding the grid value, as its offset from lo in grid units.
QUANTILE_OFFSET = "__x"
#: The default grid of a query whose values feed quantiles only: at least this many steps over its bounds (with a
#: sum, mean or variance, 4096: their noise in grid units grows with the grid). The exponential mechanism's noise
#: does not grow with the grid (its candidates are runs between the data's values, weighted by their widths), so a
#: finer grid only lets a released quantile lie nearer the data.
QUANTILE_STEPS = 1 << 16
_QUANTILE = re.compile(r"(median|p(\d{1,2}(?:\.\d{1,4})?))")  # at most 4 decimals: pNN.dddd


def parse_quantile(name: str) -> Fraction | None:
    """``median`` → 1/2, ``p90`` → 9/10, ``p99.9`` → 999/1000; None if not a quantile name.

    At most four decimals (``p99.9999``): the quantile's denominator enters the exponential
    mechanism's integer utility, which must stay within 64 bits."""
    m = _QUANTILE.fullmatch(name)
    if not m:
        return None
    if m.group(1) == "median":
        return Fraction(1, 2)
    q = Fraction(m.group(2)) / 100
    if not 0 < q < 1:
        return None
    return q


def quantile_label(q: Fraction) -> str:
    """The name of the p-quantile's output column before its value's: ``median``, ``p90``, ``p99.9``."""
    return "median" if q == Fraction(1, 2) else "p" + fraction_text(q * 100)


@dataclass(frozen=True)
class HistogramQuery:
    """Everything that defines a histogram release (validated by :meth:`validate`)."""

    by: tuple[str, ...]
    unit: str
    aggregations: tuple[str, ...] = ("count",)
    value: str | None = None
    bounds: tuple[float, float] | None = None
    granularity: Fraction | None = None
    max_partitions: int = 1
    max_contributions: int = 1
    epsilon: Fraction | None = None
    delta: Fraction = Fraction(0)
    rho: Fraction | None = None
    noise: str = "laplace"  # laplace or gaussian (options as given: validate refuses others)
    domain: str = "threshold"  # keys, threshold or unklap
    max_groups: int = 1000
    # a free replay for every aggregation but a quantile, whose --with-error interval takes a part of its share:
    # that changes its calibration, which the seed binds (the plan's measurements), so it is another release
    with_error: bool = free_replay("--with-error", default=False)
    #: The bounds dpcli chooses from the data (``auto``; None: every bound given), and the share of the
    #: budget of the bias report (``--report-bias``; None: no report).
    auto: auto_bounds.AutoBounds | None = None
    bias_share: Fraction | None = None

    def validate(self) -> None:
        """Refuse inconsistent queries with one-line usage errors (the first problem, in this order)."""
        self._check_choices()
        self._check_columns()
        self._check_aggregations()
        self._check_value()
        self._check_parts()
        if self.bounds is not None:
            self._check_bounds(*self.bounds)
        for name in ("max_partitions", "max_contributions"):
            if getattr(self, name) < 1:
                raise UsageError("must be ≥ 1", field=name)
        if self.domain == "unklap":
            self._check_unklap()

    def _check_choices(self) -> None:
        if self.noise not in ("laplace", "gaussian"):
            raise UsageError(f"must be laplace or gaussian, got {self.noise!r}", field="noise")
        if self.domain not in ("keys", "threshold", "unklap"):
            raise UsageError(f"must be threshold or unklap, got {self.domain!r}", field="selection")

    def _check_columns(self) -> None:
        """Group by at least one column, never by the privacy unit."""
        if not self.by:
            raise UsageError("needs at least one column", field="by")
        if self.unit in self.by:
            raise UsageError(f"cannot include the privacy unit column {self.unit!r} (it would release units)",
                             field="by")

    def _check_aggregations(self) -> None:
        """At least one aggregation, each known, none twice."""
        if not self.aggregations:
            raise UsageError("needs at least one aggregation", field="agg")
        for a in self.aggregations:
            if a not in SIMPLE_AGGREGATIONS and parse_quantile(a) is None:
                raise UsageError(
                    f"unknown aggregation {a!r} (choose from {', '.join(SIMPLE_AGGREGATIONS)}, median, pNN)"
                )
        if len(set(self.aggregations)) != len(self.aggregations):
            raise UsageError("lists an aggregation twice", field="agg")

    def _check_value(self) -> None:
        """``--value`` and ``--bounds`` exactly when an aggregation reads values (each missing one named)."""
        reading = [a for a in self.aggregations if a in VALUE_AGGREGATIONS or parse_quantile(a) is not None]
        needs_value = bool(reading)
        if needs_value and self.value is None:
            raise UsageError(f"is needed by {', '.join(reading)}: the numeric column aggregated", field="value")
        if needs_value and self.bounds is None and not (self.auto and self.auto.values):
            raise UsageError(f"is needed by {', '.join(reading)}: LO:HI, the range the values are clamped to "
                             "(e.g. 0:600), chosen without looking at the data", field="bounds")
        if not needs_value and self.value is not None:
            raise UsageError("is only used by sum, mean, variance and quantiles", field="value")
        if not needs_value and self.auto and self.auto.values:
            raise UsageError("auto needs a value aggregation (sum, mean, variance or a quantile) and --value",
                             field="bounds")

    def _check_parts(self) -> None:
        """The shares of bounds chosen from the data and of the bias report, and what they cannot go with."""
        if self.auto is not None and self.auto.any:
            auto_bounds.check_share(self.auto.share, "auto_share")
            if self.auto.values and self.granularity is not None:
                raise UsageError("needs --bounds LO:HI: a grid spacing cannot be chosen before its bounds",
                                 field="granularity")
            if self.domain == "unklap":
                raise UsageError("unklap releases with given bounds: give --max-partitions and "
                                 "--max-contributions", field="selection")
        if self.bias_share is not None:
            auto_bounds.check_share(self.bias_share, "bias_share")
            if self.domain == "unklap":
                raise UsageError("--report-bias is not offered with unklap", field="selection")
        if self.auto is not None and self.bias_share is not None and self.auto.share + self.bias_share > Fraction(1, 2):
            raise UsageError("and --bias-share together must leave the release at least half of the budget",
                             field="auto_share")

    @property
    def parts(self) -> auto_bounds.BudgetParts | None:
        """The budget's parts besides the release (None: the release spends it all)."""
        choosing = self.auto is not None and self.auto.any
        if not choosing and self.bias_share is None:
            return None
        return auto_bounds.BudgetParts(self.auto.share if choosing and self.auto else Fraction(0),
                                self.bias_share or Fraction(0))

    def release_query(self, chosen: auto_bounds.ChosenBounds | None = None) -> HistogramQuery:
        """The release itself: its share of the budget, the bounds in force (``chosen``, or before the
        choice placeholders that calibrate nothing but its cost), no parts."""
        parts = self.parts
        if parts is None:
            return self
        share = parts.release
        q = replace(self, auto=None, bias_share=None,
                    epsilon=self.epsilon * share if self.epsilon is not None else None,
                    rho=self.rho * share if self.rho is not None else None)
        if chosen is not None:
            return replace(q, max_partitions=chosen.max_partitions or 1, max_contributions=chosen.max_contributions,
                           bounds=chosen.bounds if self.value is not None else None)
        if self.auto is not None and self.auto.values:
            q = replace(q, bounds=(0.0, 1.0))
        return q

    @property
    def shape(self) -> auto_bounds.DataShape:
        return auto_bounds.DataShape(self.unit, self.by, self.value)

    @property
    def counts_rows(self) -> bool:
        """Whether the row cap bounds anything released: every aggregation but count-units reads rows."""
        return any(a != "count-units" for a in self.aggregations)

    def given(self) -> auto_bounds.ChosenBounds:
        """The bounds as given (placeholders where auto)."""
        return auto_bounds.ChosenBounds(self.max_partitions, self.max_contributions, self.bounds)

    def _check_bounds(self, lo: float, hi: float) -> None:
        """Finite bounds with LO < HI, a grid that can honour them, and a variance within the float range."""
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise UsageError(f"must be finite with LO < HI, got {lo}:{hi}", field="bounds")
        grid = self.grid  # the grid is public: one it cannot honour is a usage error (ValueGrid says why)
        if grid is None or "variance" not in self.aggregations:
            return
        top = (Fraction(grid.half_width_units) * grid.granularity) ** 2
        if top > Fraction(sys.float_info.max):
            raise UsageError(
                f"a variance of values within --bounds {lo!r}:{hi!r} can reach {bounding.show_number(top)}, "
                "beyond the float range; rescale the values"
            )

    def _check_unklap(self) -> None:
        """UnkLap releases one Laplace count over at most ``max_groups`` groups."""
        counts = [a for a in self.aggregations if a in ("count", "count-units")]
        if len(self.aggregations) != 1 or not counts:
            raise UsageError("unklap releases exactly one of count or count-units", field="selection")
        if self.noise != "laplace":
            raise UsageError("unklap uses Laplace noise, not Gaussian", field="selection")
        if self.max_groups < 1:
            raise UsageError("must be ≥ 1", field="max_groups")

    @property
    def grid(self) -> bounding.ValueGrid | None:
        if self.bounds is None or self.value is None:
            return None
        only_quantiles = self.quantiles and not set(self.aggregations) & set(VALUE_AGGREGATIONS)
        steps = QUANTILE_STEPS if only_quantiles else 1 << 12
        g = self.granularity or bounding.default_granularity(*self.bounds, steps)
        return bounding.ValueGrid(self.bounds[0], self.bounds[1], g)

    def bounding_spec(self) -> bounding.BoundingSpec:
        """The contribution bounds of this query (their stability calibrates its noise)."""
        return bounding.BoundingSpec(unit=self.unit, by=self.by, max_partitions=self.max_partitions,
                                     max_contributions=self.max_contributions, value=self.value, grid=self.grid)

    @property
    def quantiles(self) -> list[Fraction]:
        return [q for a in self.aggregations if (q := parse_quantile(a)) is not None]

    def canonical(self) -> dict[str, Any]:
        """The query as plain data, for the release seed and the ledger."""
        grid = self.grid
        return {
            "by": list(self.by),
            "unit": self.unit,
            "aggregations": list(self.aggregations),
            "value": self.value,
            "bounds": [grid.lo, grid.hi] if grid else None,
            "granularity": fraction_text(grid.granularity) if grid else None,
            "max_partitions": self.max_partitions,
            "max_contributions": self.max_contributions,
            "epsilon": fraction_text(self.epsilon) if self.epsilon is not None else None,
            "delta": fraction_text(self.delta),
            "rho": fraction_text(self.rho) if self.rho is not None else None,
            "noise": self.noise,
            "domain": self.domain,
            "max_groups": self.max_groups if self.domain == "unklap" else None,
            **self._canonical_parts(),
        }

    def _canonical_parts(self) -> dict[str, Any]:
        """The auto bounds and the bias report, only when asked for (every other query keeps its seed)."""
        out: dict[str, Any] = {}
        if self.auto is not None and self.auto.any:
            out["auto"] = {**self.auto.canonical(), "rule": auto_bounds.BIAS_VARIANCE_RULE}
            for name in out["auto"]["chosen"]:
                out[name] = "auto"
            if self.auto.values:
                out["granularity"] = None
        if self.bias_share is not None:
            out["report_bias"] = fraction_text(self.bias_share)
        return out


@dataclass(frozen=True)
class NoisyStatistic:
    """One noisy per-group statistic and its calibration."""

    name: str
    sensitivity: int  # per-group ℓ∞ sensitivity, in the measurement's units
    noise: mech.Noise | None = None  # None for exponential-mechanism quantiles
    em_rate: Fraction | None = None  # exponential-mechanism rate for quantiles
    share: str = ""  # the budget share, for display


@dataclass(frozen=True)
class HistogramPlan:
    """What a query costs and how it is calibrated (decided without the data)."""

    measurements: dict[str, NoisyStatistic]
    events: list[PrivacyEvent]
    threshold: int | None = None  # minimum noisy unit count (thresholding)
    unklap_offset: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    #: With bounds chosen from the data or a bias report: the budget's parts and the ledger's (mode, limits)
    #: the release is planned again with, at the chosen bounds (this plan's calibration is then provisional).
    #: Not compared, so not seed material of their own: the query's canonical form carries the parts, and the
    #: seed's calibration the ledger's mode (every plan without parts keeps its seed).
    parts: auto_bounds.BudgetParts | None = field(default=None, compare=False)
    ledger: tuple[str, dict[str, Fraction]] = field(default=("pure", {}), compare=False)
    #: The value grid the release bounds with (lo, hi, granularity), resolved from the query's defaults: seed
    #: material, so a change of a default grid (quantiles' 65,536 steps) is another release, never a free replay.
    grid: tuple[float, float, Fraction] | None = None


#: The noisy measurements each simple aggregation needs (a quantile needs its own: ``q`` + its fraction).
_MEASUREMENTS: dict[str, tuple[str, ...]] = {
    "count": ("rows",),
    "count-units": ("units",),
    "sum": ("sum",),
    "mean": ("rows", "csum"),
    "variance": ("rows", "csum", "csumsq"),
}


def quantile_measurement(aggregation: str) -> str | None:
    """The measurement of a quantile aggregation (``median`` → ``q1/2``); None for any other."""
    p = parse_quantile(aggregation)
    return None if p is None else "q" + fraction_text(p)


def _measurements_of(aggregation: str) -> tuple[str, ...]:
    quantile = quantile_measurement(aggregation)
    if quantile is not None:
        return (quantile,)
    return _MEASUREMENTS[aggregation]  # validated: every other aggregation is in _MEASUREMENTS


def _measurement_names(q: HistogramQuery) -> list[str]:
    """The measurements of a query, each once, in the order its aggregations first need them
    (thresholding needs the unit counts last)."""
    wanted = [n for a in q.aggregations for n in _measurements_of(a)]
    if q.domain == "threshold":
        wanted.append("units")
    return list(dict.fromkeys(wanted))


def describe_plan(q: HistogramQuery, plan: HistogramPlan) -> dict[str, Any]:
    """The public calibration and cost of a planned query (``--dry-run``): no data involved."""
    scale = float(q.grid.granularity) if q.grid is not None else 1.0
    v = q.value
    quantiles = {"q" + fraction_text(p): a for a in q.aggregations if (p := parse_quantile(a)) is not None}
    what = {"rows": "count (also the n of means and variances)", "units": "count_units (and the threshold)",
            "sum": f"sum_{v}", "csum": f"mean_{v}: centred sum, in grid units",
            "csumsq": f"variance_{v}: centred sum of squares, in grid units²"}
    measurements: dict[str, Any] = {}
    for n, m in plan.measurements.items():
        if n.startswith("i"):  # a quantile's interval: its count and its two ends
            part = {"n": "row count", "lo": "low end", "hi": "high end"}[n.rsplit(":", 1)[1]]
            measurements[n] = {"column": f"{quantiles[n[1:].rsplit(':', 1)[0]]}_{v}_moe95", "part": f"interval {part}",
                               **(m.noise.describe() if m.noise else {"mechanism": "exponential"})}
            continue
        if m.noise is None:  # a quantile: its error is a rank, in bounded rows (public: ε, C and the grid)
            rank = quantile_rank_margin(m, q.grid) if q.grid is not None and m.em_rate is not None else None
            measurements[n] = {"column": f"{quantiles.get(n, n)}_{v}", "mechanism": "exponential",
                               **({"rank_moe95": rank} if rank is not None else {})}
            continue
        # The 95% margin in the units of the output column (sums are released in --value's units).
        margin: float | None = None
        if n in ("rows", "units"):
            margin = m.noise.margin95()
        elif n == "sum":
            margin = m.noise.margin95() * scale
        measurements[n] = {"column": what.get(n, n), **m.noise.describe(), "moe95": margin}
    return {"query": q.canonical(), "measurements": measurements, "threshold": plan.threshold,
            "cost": [e.to_json() for e in plan.events], **plan.summary, "calibration": measurements}


def _sensitivity(name: str, q: HistogramQuery) -> int:
    """The per-group (L∞) sensitivity of a measurement, from the stability its bounding guarantees."""
    if name.startswith("q"):  # a quantile's utility moves by C·max(num, den − num) (see the mechanism's proof)
        return mech.quantile_utility_sensitivity(Fraction(name[1:]), q.max_contributions)
    return int(q.bounding_spec().stability().linf(name))


def plan_histogram(q: HistogramQuery, ledger_mode: str, ledger_limits: dict[str, Fraction]) -> HistogramPlan:
    """Calibrate every measurement and list the privacy events, from the query alone (and the grid it bounds with)."""
    plan = _calibrate(q, ledger_mode, ledger_limits)
    grid = q.grid
    return replace(plan, grid=(grid.lo, grid.hi, grid.granularity)) if grid is not None else plan


def _calibrate(q: HistogramQuery, ledger_mode: str, ledger_limits: dict[str, Fraction]) -> HistogramPlan:
    """:func:`plan_histogram` before the grid is recorded."""
    q.validate()
    if q.parts is not None:
        return _plan_parts(q, q.parts, ledger_mode, ledger_limits)
    if ledger_mode == "br":
        return _plan_br(q, ledger_limits)
    if q.domain != "keys" and not 0 < q.delta < 1:
        raise UsageError(
            "discovering groups from the data needs --delta in (0, 1) (the chance a rare group leaks); "
            "or give the public list of groups with --keys"
        )
    names = _measurement_names(q)
    summary: dict[str, Any] = {"split": f"equal, 1/{len(names)} of the budget per measurement", "measurements": names}
    if q.quantiles:  # the sampler, in the seed (the plan is): a release by another sampler is another release
        summary["quantiles"] = quantile_gaps.QUANTILE_SAMPLER
    if q.domain == "unklap":
        return _plan_unklap(q, names, summary)
    if q.noise == "laplace":
        measurements, events = _plan_laplace(q, names)
    else:
        measurements, events, q = _plan_gaussian(q, names)
    threshold = None
    if q.domain == "threshold":
        units = measurements["units"].noise
        assert units is not None  # the unit counts are always a noisy count
        threshold = mech.selection_threshold(units, q.max_partitions, float(q.delta))
    return HistogramPlan(measurements, events, threshold=threshold, summary=summary)


def _plan_parts(q: HistogramQuery, parts: auto_bounds.BudgetParts, ledger_mode: str,
                ledger_limits: dict[str, Fraction]) -> HistogramPlan:
    """The release at its share of the budget (at placeholder bounds when some are chosen from the data: its
    cost does not depend on them), and the events of the other parts, charged with it."""
    if ledger_mode == "br":
        raise UsageError("a br ledger releases with given bounds and no bias report (it counts one mechanism per "
                         "call): leave out auto and --report-bias")
    if q.epsilon is None and q.rho is None:
        raise UsageError("is required", field="epsilon")
    release = plan_histogram(q.release_query(), ledger_mode, ledger_limits)
    if q.auto is not None and q.auto.any:  # the choice's noise is drawn after the data is read: it must not fail
        auto_bounds.check_choice(_choice_epsilon(q))
    if q.bias_share is not None:  # nor the bias report's (its counts at the bounds in force: the limits' too)
        bias_report.check_bias(q.epsilon, q.rho, q.bias_share)
    events = [*_generic_curve(release.events, q.auto), *parts.events("histogram", q.epsilon, q.rho)]
    shown = {name: auto_bounds.rho_or_epsilon_text(q.epsilon, q.rho, share)
             for name, share in (("bounds", parts.auto), ("bias", parts.bias), ("release", parts.release)) if share}
    return replace(release, events=events, summary={**release.summary, "parts": shown}, parts=parts,
                   ledger=(ledger_mode, dict(ledger_limits)))


def _plan_unklap(q: HistogramQuery, names: list[str], summary: dict[str, Any]) -> HistogramPlan:
    """UnkLap (LinkedIn Alg. 3): one Laplace count, its threshold offset, (ε, δ) for the release."""
    if q.epsilon is None:
        raise UsageError("is required", field="epsilon")
    k, name = q.max_partitions, names[0]
    sensitivity = _sensitivity(name, q)
    eps_per = 2 * q.epsilon  # UnkLap is (ε_per/2, δ)-DP (paper 000, Lemma 5.3)
    noise = _checked(mech.laplace, 2 * sensitivity * k, eps_per)
    offset = mech.unklap_threshold_offset(sensitivity, k, float(eps_per), float(q.delta))
    event = PrivacyEvent("approx", "histogram/unklap", epsilon=q.epsilon, delta=q.delta,
                         detail={"max_groups": str(q.max_groups)})
    return HistogramPlan({name: NoisyStatistic(name, sensitivity, noise, share="all")}, [event],
                         unklap_offset=offset, summary=summary)


def _plan_laplace(q: HistogramQuery, names: list[str]) -> tuple[dict[str, NoisyStatistic], list[PrivacyEvent]]:
    """Pure ε split equally: discrete Laplace per measurement (ℓ1 = K·Δ), quantiles by the exponential mechanism."""
    if q.rho is not None:
        raise UsageError("calibrates Gaussian noise; Laplace noise needs an ε instead (or choose Gaussian noise)",
                         field="rho")
    if q.epsilon is None:
        raise UsageError("is required", field="epsilon")
    k, eps_m = q.max_partitions, q.epsilon / len(names)
    share = fraction_text(eps_m)
    measurements: dict[str, NoisyStatistic] = {}
    for name in names:
        s = _sensitivity(name, q)
        if name.startswith("q"):
            # Pure ε_m over K groups → ε_m/K per group; EM rate ε/(2Δu). With its interval: a share of ε_m.
            point = quantile_interval.POINT_SHARE if q.with_error else 1
            measurements[name] = NoisyStatistic(name, s, em_rate=eps_m * point / k / (2 * s), share=share)
            if q.with_error:
                c = q.max_contributions
                measurements.update(_interval_parts(
                    name, c, eps_m * quantile_interval.END_SHARE / k / (2 * c),
                    _checked(mech.laplace, k * c, eps_m * quantile_interval.COUNT_SHARE), share))
        else:
            measurements[name] = NoisyStatistic(name, s, _checked(mech.laplace, k * s, eps_m), share=share)
    if q.domain == "keys":
        curve = "discrete_laplace" if names == ["units"] and k == 1 else "pure"
        return measurements, [PrivacyEvent("pure", "histogram/laplace", epsilon=q.epsilon, rdp_curve=curve)]
    return measurements, [PrivacyEvent("approx", "histogram/laplace+threshold", epsilon=q.epsilon, delta=q.delta)]


def _plan_gaussian(
    q: HistogramQuery, names: list[str]
) -> tuple[dict[str, NoisyStatistic], list[PrivacyEvent], HistogramQuery]:
    """ρ split equally: discrete Gaussian per measurement (ℓ2² = K·Δ²); with thresholding, δ is split between
    the (ε, δ) conversion and the selection. Returns the query with the selection's δ for the threshold."""
    rho, conv_delta, sel_delta = gaussian_budget(q.epsilon, q.rho, q.delta, q.domain != "keys")
    k, rho_m = q.max_partitions, rho / len(names)
    share = f"ρ={float(rho_m):.6g}"
    measurements: dict[str, NoisyStatistic] = {}
    for name in names:
        s = _sensitivity(name, q)
        if name.startswith("q"):  # the exponential mechanism is ε-bounded-range: ε²/8-zCDP, over K groups
            point = quantile_interval.POINT_SHARE if q.with_error else 1
            em_rate = acc.largest_epsilon(rho_m * point / k, 8) / (2 * s)
            measurements[name] = NoisyStatistic(name, s, em_rate=em_rate, share=share)
            if q.with_error:
                c = q.max_contributions
                measurements.update(_interval_parts(
                    name, c, acc.largest_epsilon(rho_m * quantile_interval.END_SHARE / k, 8) / (2 * c),
                    _checked(mech.gaussian, k * c * c, rho_m * quantile_interval.COUNT_SHARE), share))
        else:
            measurements[name] = NoisyStatistic(name, s, _checked(mech.gaussian, k * s * s, rho_m), share=share)
    events = [PrivacyEvent("zcdp", "histogram/gaussian", rho=rho, delta=conv_delta if conv_delta else Fraction(0))]
    if q.domain == "threshold":
        events.append(PrivacyEvent("approx", "histogram/threshold", delta=sel_delta))
        q = replace(q, delta=sel_delta)
    return measurements, events, q


def _interval_parts(name: str, c: int, end_rate: Fraction, count: mech.Noise,
                    share: str) -> dict[str, NoisyStatistic]:
    """The measurements of a quantile's 95% interval (:mod:`dpcli.tasks.quantile_interval`): a noisy count of the
    group's bounded rows and two exponential mechanisms of sensitivity C (named ``i<quantile>:n``, ``:lo``, ``:hi``;
    never a ``q`` name, which is a released quantile)."""
    return {f"i{name}:n": NoisyStatistic(f"i{name}:n", c, count, share=share),
            f"i{name}:lo": NoisyStatistic(f"i{name}:lo", c, em_rate=end_rate, share=share),
            f"i{name}:hi": NoisyStatistic(f"i{name}:hi", c, em_rate=end_rate, share=share)}


def gaussian_budget(epsilon: Fraction | None, rho: Fraction | None, delta: Fraction,
                    discovered: bool) -> tuple[Fraction, Fraction, Fraction]:
    """(ρ, the δ of the (ε, δ) conversion, the δ of the selection) of a release with Gaussian noise: ``--rho`` as
    given, or the ρ whose conversion at δ (half of it when groups are ``discovered``: the other half is the
    selection's) gives ``--epsilon`` (histogram and sql)."""
    if rho is not None:
        if epsilon is not None:
            raise UsageError("and an ε calibrate the same Gaussian noise: give one of them", field="rho")
        return rho, delta, delta
    if epsilon is None or not 0 < delta < 1:
        raise UsageError("Gaussian noise needs --rho, or --epsilon with --delta in (0, 1)")
    conversion = delta / 2 if discovered else delta
    found = floor_parameter(acc.rho_for_epsilon(float(epsilon), float(conversion)))
    if found <= 0:
        raise UsageError(f"{fraction_text(epsilon)} is too small for Gaussian noise at this δ", field="epsilon")
    return found, conversion, delta - conversion


def _checked(make: Callable[[Fraction | int, Fraction], mech.Noise], sensitivity: Fraction | int,
             budget: Fraction) -> mech.Noise:
    noise = make(sensitivity, budget)
    try:
        noise.sample(KeyedStream(b"\0" * 32, "probe"), 1)
    except ValueError:
        raise UsageError("noise too large to sample; use a coarser --granularity or tighter bounds") from None
    return noise


def _plan_br(q: HistogramQuery, limits: dict[str, Fraction]) -> HistogramPlan:
    """LinkedIn's budget system (paper 000, Alg. 5): KnownLap or UnkLap at the ledger's ε_per and δ."""
    if len(q.aggregations) != 1 or q.aggregations[0] not in ("count", "count-units"):
        raise UsageError("a br ledger releases one count or count-units per histogram (LinkedIn's KnownLap/UnkLap)")
    if q.noise != "laplace":
        raise UsageError("a br ledger uses Laplace noise")
    eps_per = limits["epsilon_per"]
    if q.epsilon is not None and q.epsilon != eps_per:
        raise UsageError(f"must be left out or match the br ledger's ε_per = {fraction_text(eps_per)}", field="epsilon")
    name = "rows" if q.aggregations[0] == "count" else "units"
    sensitivity = _sensitivity(name, q)
    k = q.max_partitions
    summary = {"split": "all of ε_per", "measurements": [name]}
    if q.domain == "keys":
        # KnownLap: Lap(2τ/ε_per) per count; Δ·ε_per-BR → Δ information units.
        noise = _checked(mech.laplace, 2 * sensitivity, eps_per)
        ev = PrivacyEvent("br", "histogram/knownlap", epsilon=eps_per, units=k)
        return HistogramPlan({name: NoisyStatistic(name, sensitivity, noise, share="ε_per")}, [ev], summary=summary)
    if q.domain == "threshold":
        raise UsageError("a br ledger discovers groups with --selection unklap (or give --keys)")
    delta = limits["delta"]
    noise = _checked(mech.laplace, 2 * sensitivity * k, eps_per)
    offset = mech.unklap_threshold_offset(sensitivity, k, float(eps_per), float(delta))
    ev = PrivacyEvent("br", "histogram/unklap", epsilon=eps_per, delta=delta, units=1, calls=1)
    return HistogramPlan({name: NoisyStatistic(name, sensitivity, noise, share="ε_per")}, [ev], unklap_offset=offset,
                         summary=summary)


@dataclass
class HistogramRelease:
    """The released table and what a reader needs to interpret it."""

    table: pl.DataFrame
    groups_released: int
    metadata: dict[str, Any]


# An algorithm kernel, kept whole (about 70 lines): bounding, selection and the noise draws happen
# in one visible order, and the keyed stream's children are taken in that order (reordering them
# would change every release).
def run_histogram(  # noqa: C901 (an algorithm kernel: see above)
    frame: pl.LazyFrame,
    q: HistogramQuery,
    plan: HistogramPlan,
    stream: KeyedStream,
    keys: pl.DataFrame | None = None,
    *,
    name: str = "the input",
    rows: int | None = None,
    engine: bounding.TotalsEngine | None = None,
    quantile_engine: Callable[[bounding.BoundingSpec, int], pl.DataFrame] | None = None,
) -> HistogramRelease:
    """Bound, aggregate, select and noise one histogram (the plan must come from the same query).

    ``frame`` is the input's lazy frame, ``name`` names it in error messages, and ``rows`` is its row
    count when known without a pass over the data (a large Parquet input is bounded in unit buckets).
    ``engine`` bounds on another engine (Spark) instead of polars, and ``quantile_engine`` counts the
    rows at each grid value there ((spec, salt) → the group columns, ``__x`` (offset from lo in grid units), ``__n``).
    """
    grid = q.grid
    spec = q.bounding_spec()
    salt = bounding_salt(stream)
    bins: list[pl.DataFrame] = []

    def quantile_bins(part: pl.LazyFrame, partial: pl.DataFrame) -> None:
        bins.append(_quantile_counts(part, name, q, spec, salt, partial))

    if engine is not None:
        if q.quantiles:
            if quantile_engine is None:
                raise UsageError("are computed by polars only on this engine", field="agg")
            bins.append(quantile_engine(spec, salt))
        totals = engine(spec, salt)
    else:
        totals = bounding.bounded_totals(frame, spec, salt, bounding.unit_buckets(rows),
                                         quantile_bins if q.quantiles else None, name=name)
    qhist = None
    if q.quantiles:
        qhist = pl.concat(bins).group_by([*q.by, QUANTILE_OFFSET]).agg(pl.col("__n").sum())

    if q.domain == "keys":
        assert keys is not None
        totals = keys.join(totals, on=list(q.by), how="left", nulls_equal=True).with_columns(
            pl.col(c).fill_null(0) for c in totals.columns if c not in q.by
        )
        totals = totals.sort(list(q.by), nulls_last=True)
    noisy: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {}
    if q.domain == "threshold":
        units_noise = plan.measurements["units"].noise
        assert units_noise is not None and plan.threshold is not None
        u = totals["units"].to_numpy() + units_noise.sample(stream.child("units"), totals.height)
        keep = u >= plan.threshold
        totals = totals.filter(pl.Series(keep))
        noisy["units"] = u[keep]
        meta["threshold"] = plan.threshold  # public: from the plan (no count of the groups seen)
    elif q.domain == "unklap":
        totals, noisy, bottom = _unklap(totals, q, plan, stream)
        meta["bottom"] = bottom  # v_⊥: the noisy threshold, part of UnkLap's output (Alg. 3)
    for name, mmt in plan.measurements.items():
        if name in noisy or mmt.noise is None or name.startswith("i"):  # an interval's count: drawn with it
            continue
        noisy[name] = _noisy(_true_values(totals, name, grid), mmt.noise.sample(stream.child(name), totals.height))
    out = totals.select(list(q.by))
    margins: dict[str, str] = {}
    released = _Released(q, plan, noisy, _selection(q, plan, meta))
    for agg in q.aggregations:
        col, values, margin, how = _aggregate(agg, released, totals, qhist, stream)
        out = out.with_columns(pl.Series(col, values))
        if q.with_error:
            if margin is not None:
                out = out.with_columns(pl.Series(col + "_moe95", margin))
            margins[col] = how
    if q.domain == "unklap":
        out = out.with_columns(pl.Series("__order", -noisy[next(iter(plan.measurements))])).sort(
            ["__order", *q.by], nulls_last=True
        ).drop("__order")
    meta.update(
        {
            "measurements": {
                n: {"share": m.share, **(m.noise.describe() if m.noise else {"mechanism": "exponential"})}
                for n, m in plan.measurements.items()
            },
            "granularity": fraction_text(grid.granularity) if grid else None,
        }
    )
    if margins:
        meta["margins"] = margins
    return HistogramRelease(out, out.height, meta)


def bounding_salt(stream: KeyedStream) -> int:
    """The 128-bit secret salt of a histogram's keyed order (the release's and its bounds' choice)."""
    words = stream.child("bounding-salt").uint64(2)
    return int(words[0]) | (int(words[1]) << 64)


def _true_values(totals: pl.DataFrame, name: str, grid: bounding.ValueGrid | None) -> pl.Series:
    """The exact integer aggregate noise is added to: Int64 for counts, Int128 for value sums (never wraps)."""
    if name in ("rows", "units"):
        return totals[name].cast(pl.Int64)
    if name in ("csum", "csumsq"):
        return totals[name].cast(pl.Int128)
    if name == "sum":
        assert grid is not None
        mid = pl.lit(grid.mid_units, dtype=pl.Int128)
        return totals.select(pl.col("csum").cast(pl.Int128) + pl.col("rows").cast(pl.Int128) * mid).to_series()
    raise KeyError(name)


def _noisy(true: pl.Series, noise: np.ndarray) -> np.ndarray:
    """``true + noise`` exactly (integers), then as int64 for counts or float64 for value sums.

    Value sums are Int128 (up to ~2^126): the exact noisy integer is rounded to
    a float afterwards, which is post-processing (they are scaled by the
    granularity into floats anyway).
    """
    if true.dtype == pl.Int64:
        counts: np.ndarray = true.to_numpy() + noise
        return counts
    exact = true + pl.Series(noise, dtype=pl.Int64).cast(pl.Int128)
    return exact.cast(pl.Float64).to_numpy()


def _unklap(
    totals: pl.DataFrame, q: HistogramQuery, plan: HistogramPlan, stream: KeyedStream
) -> tuple[pl.DataFrame, dict[str, np.ndarray], int]:
    """UnkLap (paper 000, Alg. 3): top-d̄ groups and a noisy ⊥ threshold."""
    name = next(iter(plan.measurements))
    mmt = plan.measurements[name]
    assert mmt.noise is not None and plan.unklap_offset is not None
    ranked = totals.sort([name, *q.by], descending=[True] + [False] * len(q.by), nulls_last=True)
    h = ranked[name].to_numpy().astype(np.int64)
    dbar = q.max_groups
    h_next = int(h[dbar]) if h.size > dbar else 0
    top = ranked.head(dbar)
    v = h[: top.height] + mmt.noise.sample(stream.child(name), top.height)
    bottom = h_next + plan.unklap_offset + int(mmt.noise.sample(stream.child("bottom"), 1)[0])
    keep = v > bottom
    return top.filter(pl.Series(keep)), {name: v[keep]}, bottom


def _quantile_counts(
    frame: pl.LazyFrame, name: str, q: HistogramQuery, spec: bounding.BoundingSpec, salt: int, partial: pl.DataFrame
) -> pl.DataFrame:
    """Per group, the count of bounded rows at each grid value, as ``__x``: its offset from lo in grid units,
    in [0, hi − lo] (the gap sampler's input: :mod:`dpcli.tasks.quantile_gaps`)."""
    grid = q.grid
    assert grid is not None
    rows = bounding.bounded_rows(frame, spec, salt)
    offsets = rows.join(
        partial.lazy().select([q.unit, *q.by]), on=[q.unit, *q.by], how="semi", nulls_equal=True
    ).select(
        [
            *[pl.col(c) for c in q.by],
            (pl.col(bounding.GRID) + grid.mid_units - grid.lo_units)
            .clip(0, grid.hi_units - grid.lo_units)
            .cast(pl.Int64)
            .alias(QUANTILE_OFFSET),
        ]
    )
    return collect(offsets.group_by([*q.by, QUANTILE_OFFSET]).agg(pl.len().cast(pl.Int64).alias("__n")),
                   f"cannot read {name}")


def _quantile_values(
    q: HistogramQuery,
    p: Fraction,
    rate: Fraction,
    totals: pl.DataFrame,
    qhist: pl.DataFrame,
    stream: KeyedStream,
) -> np.ndarray:
    """The exponential-mechanism quantile of every group in ``totals`` (in its order), over every grid point
    of [lo, hi] by exact gap sampling (:mod:`dpcli.tasks.quantile_gaps`)."""
    grid = q.grid
    assert grid is not None
    idx = totals.select(list(q.by)).with_row_index("__g")
    joined = qhist.join(idx, on=list(q.by), how="inner", nulls_equal=True)
    chosen = quantile_gaps.gap_quantiles(stream, joined["__g"].to_numpy(), joined[QUANTILE_OFFSET].to_numpy(),
                                         joined["__n"].to_numpy(), totals.height, grid.hi_units - grid.lo_units,
                                         p, rate)
    units = (grid.lo_units + chosen).astype(np.float64)
    return np.clip(units * float(grid.granularity), grid.lo, grid.hi)


@dataclass(frozen=True)
class _Selection:
    """The noisy measurement that decided which groups appear, and how: a group is released when its
    noisy value is at least ``threshold`` (thresholding: the unit count against τ; UnkLap: the count
    against the noisy ⊥ + 1, which is released and drawn independently of the group's own noise)."""

    measurement: str
    threshold: int


def _selection(q: HistogramQuery, plan: HistogramPlan, meta: Mapping[str, Any]) -> _Selection | None:
    """How groups were selected (None for ``--keys``: every listed group appears)."""
    if q.domain == "threshold":
        assert plan.threshold is not None
        return _Selection("units", plan.threshold)
    if q.domain == "unklap":
        return _Selection(next(iter(plan.measurements)), int(meta["bottom"]) + 1)
    return None


@dataclass(frozen=True)
class _Released:
    """What every aggregation and its margin is computed from: the query, its calibration, the noisy
    measurements of the released groups and how the groups were selected."""

    q: HistogramQuery
    plan: HistogramPlan
    noisy: dict[str, np.ndarray]
    selection: _Selection | None

    def noise(self, name: str) -> mech.Noise:
        noise = self.plan.measurements[name].noise
        assert noise is not None  # every measurement but a quantile's is a noisy count or sum
        return noise

    def noise_margin(self, name: str, scale: float | None = None) -> Any:
        """The 95% margin of a count or sum measurement: its noise's exact interval, or, for the
        measurement that selected the groups, the interval conditional on that selection (per group)."""
        if not self.q.with_error:
            return None
        noise, values = self.noise(name), self.noisy[name]
        if self.selection is not None and self.selection.measurement == name:
            lo, hi = intervals.selected_interval(noise, values, self.selection.threshold)
            return intervals.cover_margin(values, lo, hi).astype(np.int64)
        m = noise.margin95()
        return [m if scale is None else m * scale] * values.size


_EXACT = "exact 95% interval of the noise"
_SELECTED = ("95% interval conditional on the group passing its selection (the noise truncated at the threshold), "
             "as a margin around the released value")


def _aggregate(
    agg: str, released: _Released, totals: pl.DataFrame, qhist: pl.DataFrame | None, stream: KeyedStream
) -> tuple[str, Any, Any, str]:
    """(column name, values, 95% margins (None: no margin column), how the margin is meant)."""
    q, noisy = released.q, released.noisy
    if agg in ("count", "count-units"):
        name = "rows" if agg == "count" else "units"
        selected = released.selection is not None and released.selection.measurement == name
        return agg.replace("-", "_"), noisy[name], released.noise_margin(name), _SELECTED if selected else _EXACT
    grid = q.grid
    assert grid is not None and q.value is not None
    g = float(grid.granularity)
    v = q.value
    if agg == "sum":
        return f"sum_{v}", noisy["sum"] * g, released.noise_margin("sum", g), _EXACT
    if agg in ("mean", "variance"):
        return _mean_or_variance(agg, released, grid)
    p = parse_quantile(agg)
    assert p is not None and qhist is not None
    mmt = released.plan.measurements["q" + fraction_text(p)]
    assert mmt.em_rate is not None
    values = _quantile_values(q, p, mmt.em_rate, totals, qhist, stream.child(mmt.name))
    if q.with_error:  # the interval's releases are in the plan only with --with-error
        lo, hi = _quantile_interval(released, p, mmt.name, totals, qhist, stream)
        return f"{quantile_label(p)}_{v}", values, intervals.cover_margin(values, lo, hi), quantile_interval.describe()
    return f"{quantile_label(p)}_{v}", values, None, ""


def _quantile_interval(released: _Released, p: Fraction, name: str, totals: pl.DataFrame, qhist: pl.DataFrame,
                       stream: KeyedStream) -> tuple[np.ndarray, np.ndarray]:
    """The 95% interval of every group's bounded sample quantile, in the value's units: a noisy row count, then
    two exponential mechanisms at targets from it alone (:mod:`dpcli.tasks.quantile_interval`)."""
    q, plan = released.q, released.plan
    grid = q.grid
    assert grid is not None
    count = plan.measurements[f"i{name}:n"]
    ends = (plan.measurements[f"i{name}:lo"].em_rate, plan.measurements[f"i{name}:hi"].em_rate)
    assert count.noise is not None and ends[0] is not None and ends[1] is not None
    n_hat = totals["rows"].cast(pl.Int64).to_numpy() + count.noise.sample(stream.child(count.name), totals.height)
    idx = totals.select(list(q.by)).with_row_index("__g")
    joined = qhist.join(idx, on=list(q.by), how="inner", nulls_equal=True)
    low, high = quantile_interval.interval_offsets(
        stream.child(f"i{name}"), joined["__g"].to_numpy(), joined[QUANTILE_OFFSET].to_numpy(),
        joined["__n"].to_numpy(), totals.height, grid.hi_units - grid.lo_units, p, n_hat,
        count.noise.margin(quantile_interval.COUNT_ALPHA), (ends[0], ends[1]))
    scale = float(grid.granularity)
    return (np.clip((grid.lo_units + low).astype(np.float64) * scale, grid.lo, grid.hi),
            np.clip((grid.lo_units + high).astype(np.float64) * scale, grid.lo, grid.hi))


def quantile_candidates(grid: bounding.ValueGrid) -> int:
    """A quantile's candidates: every grid point of [lo, hi] (:mod:`dpcli.tasks.quantile_gaps`)."""
    return quantile_gaps.grid_points(grid.lo_units, grid.hi_units)


def quantile_rank_margin(mmt: NoisyStatistic, grid: bounding.ValueGrid) -> float:
    """A quantile's 95% rank margin, in rows: with probability ≥ 95% the released grid point's rank
    (rows below it) is at most this much further from q·n than the best point's.

    The utility is −|den(q)·rank − num(q)·n| and the mechanism chooses ∝ exp(rate·utility) among
    the grid's points (gap sampling draws exactly that distribution;
    :func:`dpcli.core.intervals.exponential_margin`), so the margin is that tail bound divided by
    den(q). It is for the plan's rate: the exact sampler rounds a rate down only where a utility gap
    would overflow 64-bit integers (:func:`dpcli.core.samplers.rate_at_most`), and the margin then
    grows in the same proportion."""
    assert mmt.em_rate is not None
    return (intervals.exponential_margin(float(mmt.em_rate), quantile_candidates(grid))
            / Fraction(mmt.name[1:]).denominator)


def _mean_or_variance(agg: str, released: _Released, grid: bounding.ValueGrid) -> tuple[str, np.ndarray, Any, str]:
    """The mean or the variance of every group, post-processed from the noisy count and centred sums
    (clamped to what the bounds allow), and with ``--with-error`` its conservative 95% margin."""
    noisy, v = released.noisy, released.q.value
    g = float(grid.granularity)
    n = np.maximum(noisy["rows"], 1).astype(np.float64)
    mean_c = noisy["csum"] / n
    if agg == "mean":
        values = np.clip((grid.mid_units + mean_c) * g, grid.lo, grid.hi)
        return f"mean_{v}", values, _ratio_margin(agg, released, grid, values), _MEAN_HOW
    var_units = np.clip(noisy["csumsq"] / n - mean_c * mean_c, 0.0, float(grid.half_width_units) ** 2)
    values = var_units * g * g
    return f"variance_{v}", values, _ratio_margin(agg, released, grid, values), _VARIANCE_HOW


_MEAN_HOW = ("conservative 95%: the noisy count's and centred sum's own 97.5% intervals (union bound), "
             "through the ratio and the bounds, as a margin around the released value")
_VARIANCE_HOW = ("conservative 95%: the noisy count's, centred sum's and sum of squares' own 98.33% intervals "
                 "(union bound), through the ratios and the bounds, as a margin around the released value")


def _ratio_margin(agg: str, released: _Released, grid: bounding.ValueGrid, values: np.ndarray) -> np.ndarray | None:
    """The 95% margin of released means or variances (None without ``--with-error``): a union bound
    over the intervals of the measurements they are ratios of (:mod:`dpcli.core.intervals`)."""
    if not released.q.with_error:
        return None
    noisy, g = released.noisy, float(grid.granularity)
    lo_c, hi_c = float(grid.lo_units - grid.mid_units), float(grid.hi_units - grid.mid_units)
    if agg == "mean":
        alpha = intervals.ALPHA / 2
        a, b = intervals.mean_interval(noisy["rows"], noisy["csum"], released.noise("rows").margin(alpha),
                                       released.noise("csum").margin(alpha), lo_c, hi_c)
        lo, hi = (grid.mid_units + a) * g, (grid.mid_units + b) * g
    else:
        alpha = intervals.ALPHA / 3
        margins = tuple(float(released.noise(n).margin(alpha)) for n in ("rows", "csum", "csumsq"))
        a, b = intervals.variance_interval(noisy["rows"], noisy["csum"], noisy["csumsq"],
                                           (margins[0], margins[1], margins[2]), lo_c, hi_c)
        lo, hi = a * g * g, b * g * g
    return intervals.cover_margin(values, lo, hi)


def _choice_epsilon(q: HistogramQuery) -> Fraction:
    """The pure ε of each part of the choice of bounds (:func:`auto_bounds.model_parts`): with ``--keys`` the groups
    are the public list's, without it a noisy count is one more part."""
    assert q.auto is not None
    listed = q.domain == "keys"
    parts = auto_bounds.model_parts(q.auto, listed, power=1 if q.rho is None else 2)
    return auto_bounds.pure_epsilon(q.epsilon, q.rho, q.auto.share, parts)


def _resolve(q: HistogramQuery, plan: HistogramPlan, frames: Frames,
             stream: KeyedStream) -> tuple[HistogramQuery, HistogramPlan, auto_bounds.ChosenBounds]:
    """The release as it runs: the bounds chosen from the data (if any), the release query at them, and its
    plan, which costs what the plan made before any data was read said it would."""
    in_force = q.given()
    if q.auto is not None and q.auto.any:
        keys = frames.lists.get("keys")
        listed = keys.height if isinstance(keys, pl.DataFrame) else None
        assert (listed is not None) == (q.domain == "keys")
        each = _choice_epsilon(q)
        salt, at = bounding_salt(stream), stream.child("auto")
        model = _error_model(q, plan, frames, listed, each, at, salt)
        in_force = auto_bounds.choose_bounds(frames.data, q.shape, q.auto, in_force, each, at, salt, frames.name,
                                             model)
        if q.auto.values and all(parse_quantile(a) is not None for a in q.aggregations):
            in_force = replace(in_force, bounds=_widened(in_force.bounds))
    return _plannable(q, plan, in_force)


def _plannable(q: HistogramQuery, plan: HistogramPlan,
               chosen: auto_bounds.ChosenBounds) -> tuple[HistogramQuery, HistogramPlan, auto_bounds.ChosenBounds]:
    """The release at the chosen bounds and its plan. A chosen bound can make the release's noise too large to
    sample (a tiny ε with a large K·C or wide limits); the run must not fail then: a refusal after the choice and
    before the debit would tell the chosen bounds for free, and depend on the data. So the chosen caps, then the
    chosen limits too, fall back to the placeholders the plan was made with before any data was read (which it
    could sample): a function of released values and public inputs, reported as ``reduced``."""
    given = q.given()
    caps = replace(chosen, max_partitions=given.max_partitions, max_contributions=given.max_contributions)
    steps = [chosen, caps, replace(caps, bounds=q.release_query().bounds)]
    for i, bounds in enumerate(steps):
        release_q = q.release_query(bounds)
        try:
            release_plan = plan_histogram(release_q, *plan.ledger)
        except UsageError:
            if i == len(steps) - 1:
                raise  # the placeholders' plan was made before the data was read: it cannot fail here
            continue
        planned = list(plan.events)[: len(release_plan.events)]
        assert _covers(planned, list(release_plan.events)), "a chosen bound changed the cost"
        return release_q, release_plan, replace(bounds, reduced=i > 0)
    raise AssertionError("unreachable")


def _covers(planned: list[PrivacyEvent], actual: list[PrivacyEvent]) -> bool:
    """The release's events are the ones charged (planned before any data was read), but for an RDP curve the plan
    left generic (``pure``): the discrete Laplace's own curve holds for K = 1 only, and K was chosen at run time."""
    return len(planned) == len(actual) and all(p in (a, replace(a, rdp_curve="pure"))
                                               for p, a in zip(planned, actual, strict=True))


def _error_model(q: HistogramQuery, plan: HistogramPlan, frames: Frames, listed: int | None, epsilon: Fraction,
                 stream: KeyedStream, salt: int) -> auto_bounds.ErrorModel:
    """The release's noise per unit of sensitivity (its plan at one group and one row per unit: every
    measurement gets the same share) and the groups it is paid in: the public list's length, or a noisy count
    of the groups with at least the threshold's units (at pure ``epsilon``)."""
    unit = plan_histogram(replace(q.release_query(), max_partitions=1, max_contributions=1), *plan.ledger)
    first = next((m for n, m in unit.measurements.items() if m.noise is not None and not n.startswith("i")), None)
    if first is None:  # quantiles only: their error is in rank (rows), not a noisy count's
        release_grid = q.release_query().grid
        assert release_grid is not None  # quantiles read values: placeholder bounds when they are chosen
        noise = _quantile_model_noise(unit, release_grid)
    else:
        assert first.noise is not None
        noise = auto_bounds.expected_abs(first.noise) / first.sensitivity
    groups = listed
    if groups is None:
        groups = auto_bounds.noisy_groups(frames.data, q.shape, unit.threshold or 1, epsilon, stream, salt,
                                          frames.name)
    return auto_bounds.ErrorModel(groups, noise, listed=listed is not None)


#: How many candidates of the value walk (auto_bounds.VALUE_CANDIDATES: steps of √2) a quantile-only release
#: widens each chosen limit outward by.
QUANTILE_WIDEN_STEPS = 2


def _widened(bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    """Limits chosen for quantiles only, each moved :data:`QUANTILE_WIDEN_STEPS` candidates outward (post-processing
    of the released limits). Clamping leaves a quantile inside the limits where it is, while a limit the walk's
    noise stopped short of a quantile's far side clamps it; wider limits cost a quantile only the few candidates
    of the empty tails, whose utility is that of a rank n or 0 (one row less of the rank margin per doubling of
    the width, about, with gap sampling)."""
    if bounds is None:
        return None
    grid = auto_bounds.VALUE_CANDIDATES
    lo = bisect.bisect_left(grid, bounds[0]) - QUANTILE_WIDEN_STEPS
    hi = bisect.bisect_right(grid, bounds[1]) - 1 + QUANTILE_WIDEN_STEPS
    return (min(grid[max(lo, 0)], bounds[0]), max(grid[min(hi, len(grid) - 1)], bounds[1]))


def _quantile_model_noise(unit: HistogramPlan, grid: bounding.ValueGrid) -> float:
    """The error per unit of sensitivity of a release of quantiles only, for the bias–variance rule: each
    quantile's 95% rank margin at one group and one row per unit (rows; it grows as K·C), times
    2·min(p, 1 − p), the least over the quantiles asked. A row cut by a cap or a limit moves the quantile's
    rank by at most one, so the rule lets about as many rows be cut as the noise already moves the rank by;
    a row clamped at a limit moves it only if the limit lies on the quantile's far side, which the limits'
    share keeps unlikely: rows beyond the high limit are scaled by the share 1 − p above the quantile (2·(1 − p)
    of the median's), so a p99 cuts fifty times fewer rows than a median. Public: the plan's rates and p."""
    rates = [(Fraction(n[1:]), quantile_rank_margin(m, grid)) for n, m in unit.measurements.items()
             if n.startswith("q")]
    return min(float(margin) * 2 * float(min(p, 1 - p)) for p, margin in rates) or 1.0


def _generic_curve(events: list[PrivacyEvent], request: auto_bounds.AutoBounds | None) -> list[PrivacyEvent]:
    """The release's events when its partition bound is chosen at run time: a chosen K may exceed 1, so the plan
    made before the choice (at K = 1) cannot promise the discrete Laplace's tighter RDP curve of a lone unit
    count with K = 1; the generic pure-ε curve holds whatever K is chosen (the events charged are these)."""
    if request is None or not request.partitions:
        return list(events)
    return [replace(e, rdp_curve="pure") if e.rdp_curve == "discrete_laplace" else e for e in events]


def _parts_metadata(q: HistogramQuery, frames: Frames, in_force: auto_bounds.ChosenBounds,
                    stream: KeyedStream) -> dict[str, Any]:
    """The released bounds chosen from the data and the bias report (both noisy, both public)."""
    out: dict[str, Any] = {}
    if q.auto is not None and q.auto.any:
        out["auto"] = {**in_force.to_json(), **auto_bounds.budget_json(q.epsilon, q.rho, q.auto.share)}
    if q.bias_share is not None:
        noise = bias_report.bias_noise(q.epsilon, q.rho, q.bias_share)
        report = bias_report.report_bias(frames.data, q.shape, in_force, noise, stream.child("bias"),
                                         bounding_salt(stream), frames.name, rows=q.counts_rows)
        out["bias"] = {**report.to_json(), **auto_bounds.budget_json(q.epsilon, q.rho, q.bias_share)}
    return out


def _check_target_bounds(request: auto_bounds.AutoBounds | None, limits: Mapping[str, Any], option: str) -> None:
    """A target cannot be met by a margin that depends on a bound chosen from the data: every margin under an
    auto partition or row bound, a sum's under auto value limits (counts' margins do not depend on them)."""
    if request is None or not request.any:
        return
    if request.partitions or request.contributions:
        raise UsageError("cannot be met with --max-partitions auto or --max-contributions auto (every margin "
                         "depends on them): give those bounds", field=option)
    if request.values and "sum" in limits:
        raise UsageError("cannot be met for a sum with --bounds auto (its margin depends on the bounds): target the "
                         "counts only, or give --bounds", field=option)
    if request.values and "mean" in limits:
        raise UsageError("cannot be met for a mean with --bounds auto (its margin depends on the bounds): give "
                         "--bounds", field=option)
    if request.values and any(n.startswith("q") for n in limits):
        raise UsageError("cannot be met for a quantile's rank with --bounds auto (its margin depends on the grid the "
                         "bounds span): give --bounds", field=option)


def _unknown_margins(request: auto_bounds.AutoBounds, described: dict[str, Any],
                     largest: dict[str, Any] | None = None) -> None:
    """A dry run's margins that depend on a bound chosen at run time: the partition and row bounds scale every
    noise and the threshold; the value limits scale the sums. Beside each, its margin at caps of 1 (the least)
    and, with ``largest`` (:func:`largest_cap_margins`), at the largest caps the choice can make (the most)."""
    every = request.partitions or request.contributions
    high = largest["moe95"] if largest is not None else {}
    if largest is not None:
        described["largest_caps"] = {k: v for k, v in largest.items() if k != "moe95"}
    for name, m in described["calibration"].items():
        if "rank_moe95" in m and (every or request.values):  # a quantile's: K·C and the grid's points
            if not request.values:
                m["rank_moe95_at_caps_of_1"] = m["rank_moe95"]
            if name in high:
                m["rank_moe95_at_largest_caps"] = high[name]
            m["rank_moe95"] = auto_bounds.AT_RUN_TIME
            continue
        valued = name in ("sum", "csum", "csumsq")
        if m.get("mechanism") != "exponential" and (every or valued):
            if not (request.values and valued) and isinstance(m.get("moe95"), (int, float)):
                # the plan's placeholders are caps of 1: a lower bound on the margin, which grows with the caps
                m["moe95_at_caps_of_1"] = m["moe95"]
                if name in high:
                    m["moe95_at_largest_caps"] = high[name]
            m.update({k: auto_bounds.AT_RUN_TIME for k in ("scale", "moe95") if k in m})
    if request.partitions and described.get("threshold") is not None:
        described["threshold"] = auto_bounds.AT_RUN_TIME


def largest_cap_margins(q: HistogramQuery, ledger: tuple[str, dict[str, Fraction]],
                        listed: int | None) -> dict[str, Any] | None:
    """The 95% margins at the largest caps ``auto`` can choose (:func:`auto_bounds.cap_candidates`: public), for
    a dry run: ``{"max_partitions": K, "max_contributions": C, "sampleable": …, "moe95": {measurement: margin}}``
    (a quantile's: its rank margin, rows). Every margin grows with K and C, so these are the largest the release
    can show. Where the noise at (K, C) is too large to sample the release falls back to caps of 1
    (:func:`_plannable`): ``sampleable`` is then false and each margin is the largest over the caps it can sample
    (a staircase over the two grids: what can be sampled shrinks as either cap grows). None when the caps are
    given, or the value limits are ``auto`` too (which caps can be sampled then depends on the limits chosen), or
    K is chosen from a public list whose length is not known here (``listed`` None: a schedule's plan)."""
    request = q.auto
    if request is None or not (request.partitions or request.contributions) or request.values:
        return None
    if request.partitions and q.domain == "keys" and listed is None:
        return None
    ks, cs = auto_bounds.cap_candidates(request, q.given(), listed if q.domain == "keys" else None)
    base = q.release_query()

    def margins(k: int, c: int) -> dict[str, float] | None:
        at = replace(base, max_partitions=k, max_contributions=c)
        try:
            described = describe_plan(at, plan_histogram(at, *ledger))
        except UsageError:  # noise too large to sample at these caps
            return None
        out: dict[str, float] = {}
        for name, m in described["calibration"].items():
            margin = m.get("rank_moe95", m.get("moe95"))
            if isinstance(margin, int | float) and not name.startswith("i"):
                out[name] = margin
        return out

    top = margins(ks[-1], cs[-1])
    doc: dict[str, Any] = {"max_partitions": ks[-1], "max_contributions": cs[-1], "sampleable": top is not None}
    return {**doc, "moe95": top if top is not None else _staircase_most(ks, cs, margins)}


def _staircase_most(ks: tuple[int, ...], cs: tuple[int, ...],
                    margins: Callable[[int, int], dict[str, float] | None]) -> dict[str, float]:
    """Each margin's largest over the pairs (K, C) of the grids where ``margins`` is not None (the noise can be
    sampled). What can be sampled shrinks as either cap grows and every margin grows with both, so the largest lie
    on the frontier: for K from the largest down, the largest C that can be sampled, which can only grow."""
    best: dict[str, float] = {}
    j = -1  # the index of the largest C sampleable at the K in hand
    for k in reversed(ks):
        found = margins(k, cs[j]) if j >= 0 else None
        while j + 1 < len(cs) and (up := margins(k, cs[j + 1])) is not None:
            j, found = j + 1, up
        for name, margin in (found or {}).items():
            best[name] = max(best.get(name, 0.0), margin)
    return best


@dataclass(frozen=True)
class KeptBounds:
    """The ``auto`` bounds a schedule's first run chose, as its later runs give them (``chosen``: released
    values, as in the first run's ``"auto"``), and those not chosen yet (``pending``: a dry run's later runs)."""

    chosen: dict[str, Any]
    pending: auto_bounds.AutoBounds


def _left_out_stays(task: HistogramTask, mode: str | None) -> str | None:
    """Why the bounds left out of ``task`` cannot be chosen from the data (None: they can)."""
    q = task.query
    if mode == "br":
        return "a br ledger"
    if q.domain == "unklap":
        return "--selection unklap"
    if task.target is not None:
        return "a margin target"
    if q.epsilon is None and q.rho is None:
        return "no ε or ρ"
    if mode == "approx" and q.rho is not None:  # the choice's part is zCDP with no δ to convert it at
        return "ρ on an approx ledger"
    return None


@dataclass(frozen=True)
class HistogramTask:
    """``dpcli histogram`` as a :class:`dpcli.tasks.Task`.

    ``noise_given``: whether the query's noise was chosen (else a zcdp ledger gets Gaussian noise:
    :meth:`for_ledger`); ``defaulted``: the caps left at their defaults, and ``unit_label`` how notes
    name the privacy unit (both for :meth:`notes`). ``target``: a margin target (``--target-moe``) that
    :meth:`for_ledger` turns into the query's ε or ρ (``chosen``: what it chose). ``kept``: a schedule's later
    run, at the ``auto`` bounds its first run chose (:meth:`keeping`).
    """

    query: HistogramQuery
    noise_given: bool = True
    defaulted: tuple[str, ...] = free_replay("notes' wording", default=())
    unit_label: str | None = free_replay("notes' wording", default=None)
    command: str = "histogram"
    target: MarginTarget | None = free_replay("margin targets (the ε they resolve to is bound)", default=None)
    chosen: Choice | None = free_replay("margin targets (the ε they resolve to is bound)", default=None)
    kept: KeptBounds | None = None
    choose_left_out: bool = False
    left_out_stays: str | None = free_replay("notes' wording", default=None)
    left_out_chosen: tuple[str, ...] = free_replay("notes' wording", default=())
    #: The CLI's default when neither ``--report-bias`` nor ``--no-report-bias`` is given: a bias report at
    #: :data:`bias_report.BIAS_SHARE` wherever the release can pay for one (:meth:`with_defaults`).
    report_bias_left_out: bool = bound_elsewhere("the query's bias_share, which it sets", default=False)
    listed: int | None = bound_elsewhere("the public list's digest (its number of groups)", default=None)

    def with_defaults(self, mode: str | None) -> HistogramTask:
        """The bounds left out chosen from the data where they can be (:meth:`_choose_left_out`), then the bias
        report left out added where it can be (:meth:`_report_left_out`); ``mode``: the ledger's (None: not
        known yet). Both decided from public inputs only."""
        return self._choose_left_out(mode)._report_left_out(mode)

    def _report_left_out(self, mode: str | None) -> HistogramTask:
        """With ``report_bias_left_out``, a bias report at :data:`bias_report.BIAS_SHARE` of the budget, unless
        the release cannot have one: where bounds cannot be chosen either (:func:`_left_out_stays`: a br ledger,
        unklap, a margin target, …), when the query's shares would leave the release less than half, when the
        report's noise cannot be drawn, or when no bound in force can cut (count-units over one group)."""
        if not self.report_bias_left_out:
            return self
        task = replace(self, report_bias_left_out=False)
        q = task.query
        share = bias_report.BIAS_SHARE
        if (q.bias_share is not None or _left_out_stays(task, mode) is not None
                or (q.auto is not None and q.auto.any and q.auto.share + share > Fraction(1, 2))
                or not bias_report.can_report(q.epsilon, q.rho, share)
                or not bias_report.bias_parts(q.shape, q.given(), rows=q.counts_rows)):
            return task
        return replace(task, query=replace(q, bias_share=share))

    def _choose_left_out(self, mode: str | None) -> HistogramTask:
        """With ``choose_left_out`` (the CLI's default), the bounds left out (``defaulted``: the caps, and
        ``bounds`` for a value aggregation) chosen from the data as ``auto`` at :data:`auto_bounds.AUTO_SHARE`,
        wherever ``auto`` runs: not in a ``br`` ledger (``mode``; None: not known yet), with unklap, with a
        margin target, with a grid spacing but no bounds, nor when the choice's share of ε is too small to draw
        its noise (:func:`auto_bounds.check_choice`). There the caps stay at 1 and ``left_out_stays`` says
        why. Every reason is a public input: the choice never depends on the data."""
        if not self.choose_left_out:
            return self
        q = self.query
        caps = [f for f in ("max_partitions", "max_contributions") if f in self.defaulted]
        values = "bounds" in self.defaulted and q.value is not None and q.granularity is None
        if not caps and not values:
            return replace(self, choose_left_out=False)
        why = _left_out_stays(self, mode)
        if why is not None:
            return replace(self, choose_left_out=False, left_out_stays=why)
        asked = q.auto or auto_bounds.AutoBounds(False, False, False)
        request = auto_bounds.AutoBounds(asked.partitions or "max_partitions" in caps,
                                         asked.contributions or "max_contributions" in caps, asked.values or values,
                                         q.auto.share if q.auto else auto_bounds.AUTO_SHARE)
        chosen = replace(q, auto=request)
        try:
            auto_bounds.check_choice(_choice_epsilon(chosen))
        except UsageError:
            return replace(self, choose_left_out=False, left_out_stays="an ε too small to spend a share on them")
        return replace(self, query=chosen, choose_left_out=False, left_out_chosen=(*caps, *(["bounds"] * values)),
                       defaulted=tuple(f for f in self.defaulted if f not in caps and f != "bounds"))

    def for_ledger(self, mode: str) -> HistogramTask:
        """The task for a ledger's mode: the bounds left out chosen where they can be (:meth:`with_defaults`),
        Gaussian noise on a zcdp ledger unless chosen, and a target's ε or ρ chosen (from the query alone: the
        seed then binds that value, like a given one)."""
        task = self.with_defaults(mode)
        if not task.noise_given and mode == "zcdp":
            task = replace(task, query=replace(task.query, noise="gaussian"), noise_given=True)
        if task.target is None:
            return task
        from dpcli.tasks.histogram_target import choose

        choice = choose(task.query, task.target, mode)
        return replace(task, query=choice.query, target=None, chosen=choice)

    def with_list_groups(self, groups: Callable[[], dict[str, int]]) -> HistogramTask:
        """For a dry run: the number of groups of the public list (``groups``: counted from the lists, called only
        when a partition bound is chosen from a list), which caps the K ``auto`` can choose."""
        q = self.query
        if q.domain != "keys" or q.auto is None or not q.auto.partitions:
            return self
        return replace(self, listed=groups().get("keys"))

    def budget_hint(self, pays: Callable[[list[PrivacyEvent]], bool]) -> str | None:
        """With a target: the best margins a ledger that refuses the chosen ε could pay (None without)."""
        if self.chosen is None:
            return None
        from dpcli.tasks.histogram_target import reachable

        return reachable(self.chosen, pays)

    def at_epsilon(self, epsilon: Fraction) -> HistogramTask:
        """The same query at a schedule run's ε."""
        return replace(self, query=replace(self.query, epsilon=epsilon))

    def keeping(self, chosen: Mapping[str, Any]) -> HistogramTask:
        """A later run of a schedule whose first run chose its ``auto`` bounds: ``chosen`` (the schedule's state
        keeps them) given as bounds, no part choosing them (the run's whole ε goes to the release), and the
        release's metadata saying they were kept. In a dry run, bounds not chosen yet are missing from
        ``chosen``: the margins that depend on them are "chosen at run time". A query without ``auto``: itself."""
        q = self.query
        if q.auto is None or not q.auto.any:
            return self
        pending = auto_bounds.AutoBounds(q.auto.partitions and "max_partitions" not in chosen,
                                         q.auto.contributions and "max_contributions" not in chosen,
                                         q.auto.values and "bounds" not in chosen)
        in_force = auto_bounds.chosen_of(dict(chosen), q.given())
        kept = replace(q, auto=None, max_partitions=in_force.max_partitions or 1,
                       max_contributions=in_force.max_contributions,
                       bounds=in_force.bounds or ((0.0, 1.0) if q.auto.values else q.bounds))
        return replace(self, query=kept, kept=KeptBounds(dict(chosen), pending))

    def check_schedulable(self) -> None:
        """Refuse a query no schedule can run (each run's ε comes from the schedule: planned per run). ``auto``
        bounds are chosen by the schedule's first run and kept (:meth:`keeping`); no bias report."""
        if self.query.domain != "keys" or self.query.noise != "laplace":
            raise UsageError("a schedule runs pure ε-DP releases: give --keys (and Laplace noise)")
        if self.query.bias_share is not None:
            raise UsageError("--report-bias is not offered with --schedule: run it once without --schedule")
        self.query.validate()

    def schedule_query(self, lists: Mapping[str, str]) -> dict[str, Any]:
        """What names a schedule besides its name: the query without its ε, and the keys' fingerprint."""
        query = {k: v for k, v in self.query.canonical().items() if k != "epsilon"}
        return {"command": "histogram", **query, "keys": lists["keys"]}

    def check(self) -> None:
        """Refuse an inconsistent query (one-line usage errors) before anything else is read."""
        self.with_defaults(None).query.validate()
        if self.target is not None:
            from dpcli.tasks.histogram_target import column_limits

            if self.query.epsilon is not None or self.query.rho is not None:
                raise UsageError("chooses the budget: leave out ε and ρ", field=self.target.field)
            limits = column_limits(self.query, self.target)
            _check_target_bounds(self.query.auto, limits, self.target.field)

    def check_lists(self, lists: Mapping[str, pl.DataFrame | pl.LazyFrame]) -> None:
        """Nothing in its public lists can refuse this task before it runs (their columns are checked on opening)."""

    def needs(self) -> Needs:
        q = self.query
        columns: dict[str, Any] = {q.unit: "key", **dict.fromkeys(q.by, "key")}
        if q.value:
            columns[q.value] = "value"
        return Needs(columns, {"keys": PublicList(q.by)} if q.domain == "keys" else {})

    def plan(self, mode: str, limits: Mapping[str, Fraction]) -> HistogramPlan:
        return plan_histogram(self.query, mode, dict(limits))

    def describe(self, plan: HistogramPlan) -> dict[str, Any]:
        described = describe_plan(self.query, plan)
        if self.chosen is not None:
            described["target"] = self.chosen.to_json()
        if self.query.auto is not None and self.query.auto.any:
            _unknown_margins(self.query.auto, described, largest_cap_margins(self.query, plan.ledger, self.listed))
        if self.kept is not None and self.kept.pending.any:
            _unknown_margins(self.kept.pending, described)
        return described

    def run(self, frames: Frames, plan: HistogramPlan, seed: bytes, engine: Engine | None) -> Result:
        q = self.query
        stream = KeyedStream(seed, "histogram")
        release_q, release_plan, in_force = q, plan, None
        if plan.parts is not None:
            if engine is not None:
                raise UsageError("auto bounds and --report-bias are computed by the polars engine only", field="engine")
            release_q, release_plan, in_force = _resolve(q, plan, frames, stream)
        keys = frames.lists.get("keys")
        released = run_histogram(frames.data, release_q, release_plan, stream,
                                 keys if isinstance(keys, pl.DataFrame) else None, name=frames.name, rows=frames.rows,
                                 engine=engine.totals if engine else None,
                                 quantile_engine=engine.quantile_counts if engine else None)
        metadata = {
            "command": "histogram",
            "groups": released.groups_released,
            "aggregations": list(q.aggregations),
            "max_partitions": release_q.max_partitions,
            "max_contributions": release_q.max_contributions,
            "split": plan.summary.get("split"),
            "threshold": release_plan.threshold,
            **released.metadata,
        }
        if q.epsilon is not None:
            metadata["epsilon"] = fraction_text(q.epsilon)
        if self.chosen is not None:
            metadata["target"] = self.chosen.to_json()
        if in_force is not None:
            metadata.update(_parts_metadata(q, frames, in_force, stream))
        if self.kept is not None:
            metadata["auto"] = {**self.kept.chosen, "kept": True}
        return Result(released.table, metadata)

    def summary(self, name: str, result: Result) -> str:
        line = f"histogram of {name}: {result.metadata['groups']} group(s) released"
        if result.metadata.get("threshold") is not None:
            line += f" (threshold {result.metadata['threshold']} noisy units)"
        return line + auto_bounds.chosen_text(result.metadata.get("auto"))

    def notes(self, plan: HistogramPlan, result: Result) -> list[Note]:
        from dpcli import advice

        q = self.query
        if plan.parts is not None:  # the notes read the release as it ran: at the bounds in force, and its plan
            q = q.release_query(auto_bounds.chosen_of(result.metadata.get("auto"), q.given()))
            plan = plan_histogram(q, *plan.ledger)
        in_force = {"max_partitions": q.max_partitions, "max_contributions": q.max_contributions, "bounds": q.bounds}
        unit, bias = self.unit_label or q.unit, result.metadata.get("bias")
        chosen = [f for f in result.metadata.get("auto") or {} if f in in_force]
        levels = {a: float(p) for a in q.aggregations if (p := parse_quantile(a)) is not None}
        return [*advice.histogram_notes(q, plan, result.table, self.defaulted, self.unit_label),
                *advice.left_out(self.left_out_chosen, result.metadata.get("auto"), self.left_out_stays,
                                 [f for f in self.defaulted if f == "max_partitions" or (f == "max_contributions"
                                  and set(q.aggregations) & {"count", "sum", "mean", "variance"})]),
                *advice.bias_report(unit, bias, in_force), *advice.bias_beyond_margin(q, plan, result.table, unit,
                                                                                      bias, levels, chosen)]
