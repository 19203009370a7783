"""A histogram release planned from the query and the ledger alone (no data): its noisy measurements, the
split of the budget and each noise (:func:`plan_histogram`), and the dry run's description, with its margins
at the caps of 1 and the largest caps ``auto`` can choose (:func:`describe_plan`, :func:`largest_cap_margins`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, TypedDict

from dpcli import bounding
from dpcli.core import intervals
from dpcli.core import mechanisms as mech
from dpcli.core.accounting import composition as acc
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks import (
    auto_bounds,
    bias_report,
    quantile_gaps,
    quantile_interval,
)
from dpcli.tasks.budgets import gaussian_budget
from dpcli.tasks.dry_runs import LargestCaps
from dpcli.tasks.histogram.query import HistogramQuery, measurement_names, parse_quantile

if TYPE_CHECKING:
    from dpcli.tasks.dry_runs import HistogramDryRun, MeasurementPlan


@dataclass(frozen=True)
class NoisyStatistic:
    """One noisy per-group statistic and its calibration."""

    name: str
    sensitivity: int  # per-group ℓ∞ sensitivity, in the measurement's units
    noise: mech.Noise | None = None  # None for exponential-mechanism quantiles
    em_rate: Fraction | None = None  # exponential-mechanism rate for quantiles
    share: str = ""  # the budget share, for display


class PlanSummary(TypedDict, total=False):
    """How a plan splits its budget, as its dry run shows it: the split, the measurements by name, the quantiles'
    sampler (in the seed: a release by another sampler is another release), the budget's parts."""

    split: str
    measurements: list[str]
    quantiles: str
    parts: dict[str, str]


class LargestCapMargins(LargestCaps):
    """The largest caps ``auto`` can choose and the 95% margins there, by measurement (:func:`largest_cap_margins`)."""

    moe95: dict[str, float]


@dataclass(frozen=True)
class HistogramPlan:
    """What a query costs and how it is calibrated (decided without the data)."""

    measurements: dict[str, NoisyStatistic]
    events: list[PrivacyEvent]
    threshold: int | None = None  # minimum noisy unit count (thresholding)
    unklap_offset: int | None = None
    summary: PlanSummary = field(default_factory=lambda: PlanSummary())
    #: With bounds chosen from the data or a bias report: the budget's parts and the ledger's (mode, limits)
    #: the release is planned again with, at the chosen bounds (this plan's calibration is then provisional).
    #: Not compared, so not seed material of their own: the query's canonical form carries the parts, and the
    #: seed's calibration the ledger's mode (every plan without parts keeps its seed).
    parts: auto_bounds.BudgetParts | None = field(default=None, compare=False)
    ledger: tuple[str, dict[str, Fraction]] = field(default=("pure", {}), compare=False)
    #: The value grid the release bounds with (lo, hi, granularity), resolved from the query's defaults: seed
    #: material, so a change of a default grid (quantiles' 65,536 steps) is another release, never a free replay.
    grid: tuple[float, float, Fraction] | None = None


def describe_plan(q: HistogramQuery, plan: HistogramPlan) -> HistogramDryRun:
    """The public calibration and cost of a planned query (``--dry-run``): no data involved."""
    scale = float(q.grid.granularity) if q.grid is not None else 1.0
    v = q.value
    quantiles = {"q" + fraction_text(p): a for a in q.aggregations if (p := parse_quantile(a)) is not None}
    what = {"rows": "count (also the n of means and variances)", "units": "count_units (and the threshold)",
            "sum": f"sum_{v}", "csum": f"mean_{v}: centred sum, in grid units",
            "csumsq": f"variance_{v}: centred sum of squares, in grid units²"}
    measurements: dict[str, MeasurementPlan] = {}
    for n, m in plan.measurements.items():
        if n.startswith("i"):  # a quantile's interval: its count and its two ends
            part = {"n": "row count", "lo": "low end", "hi": "high end"}[n.rsplit(":", 1)[1]]
            entry: MeasurementPlan = {"column": f"{quantiles[n[1:].rsplit(':', 1)[0]]}_{v}_moe95",
                                      "part": f"interval {part}"}
            if m.noise is not None:
                m.noise.described_in(entry)
            else:
                entry["mechanism"] = "exponential"
            measurements[n] = entry
            continue
        if m.noise is None:  # a quantile: its error is a rank, in bounded rows (public: ε, C and the grid)
            rank = quantile_rank_margin(m, q.grid) if q.grid is not None and m.em_rate is not None else None
            measurements[n] = {"column": f"{quantiles.get(n, n)}_{v}", "mechanism": "exponential"}
            if rank is not None:
                measurements[n]["rank_moe95"] = rank
            continue
        # The 95% margin in the units of the output column (sums are released in --value's units).
        margin: float | None = None
        if n in ("rows", "units"):
            margin = m.noise.margin95()
        elif n == "sum":
            margin = m.noise.margin95() * scale
        entry = {"column": what.get(n, n)}
        measurements[n] = m.noise.described_in(entry)
        entry["moe95"] = margin
    summary = plan.summary
    described: HistogramDryRun = {"query": q.canonical(), "measurements": summary["measurements"],
                                  "threshold": plan.threshold, "cost": [e.to_json() for e in plan.events],
                                  "split": summary["split"]}
    if "quantiles" in summary:
        described["quantiles"] = summary["quantiles"]
    if "parts" in summary:
        described["parts"] = summary["parts"]
    described["calibration"] = measurements
    return described


def measurement_sensitivity(name: str, q: HistogramQuery) -> int:
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
    names = measurement_names(q)
    summary: PlanSummary = {"split": f"equal, 1/{len(names)} of the budget per measurement", "measurements": names}
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
        auto_bounds.check_choice(choice_epsilon(q))
    if q.bias_share is not None:  # nor the bias report's (its counts at the bounds in force: the limits' too)
        bias_report.check_bias(q.epsilon, q.rho, q.bias_share)
    events = [*_generic_curve(release.events, q.auto), *parts.events("histogram", q.epsilon, q.rho)]
    shown = {name: auto_bounds.rho_or_epsilon_text(q.epsilon, q.rho, share)
             for name, share in (("bounds", parts.auto), ("bias", parts.bias), ("release", parts.release)) if share}
    return replace(release, events=events, summary={**release.summary, "parts": shown}, parts=parts,
                   ledger=(ledger_mode, dict(ledger_limits)))


def _plan_unklap(q: HistogramQuery, names: list[str], summary: PlanSummary) -> HistogramPlan:
    """UnkLap (LinkedIn Alg. 3): one Laplace count, its threshold offset, (ε, δ) for the release."""
    if q.epsilon is None:
        raise UsageError("is required", field="epsilon")
    k, name = q.max_partitions, names[0]
    sensitivity = measurement_sensitivity(name, q)
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
        s = measurement_sensitivity(name, q)
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
        s = measurement_sensitivity(name, q)
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
    lone = names == ["units"] and k == 1 and q.domain == "keys" and measurement_sensitivity("units", q) == 1
    curve = "discrete_gaussian" if lone else "pure"  # a lone unit count: a pld ledger composes its own PLD
    events = [PrivacyEvent("zcdp", "histogram/gaussian", rho=rho, delta=conv_delta if conv_delta else Fraction(0),
                           rdp_curve=curve)]
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
    sensitivity = measurement_sensitivity(name, q)
    k = q.max_partitions
    summary: PlanSummary = {"split": "all of ε_per", "measurements": [name]}
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


def choice_epsilon(q: HistogramQuery) -> Fraction:
    """The pure ε of each part of the choice of bounds (:func:`auto_bounds.model_parts`): with ``--keys`` the groups
    are the public list's, without it a noisy count is one more part."""
    assert q.auto is not None
    listed = q.domain == "keys"
    parts = auto_bounds.model_parts(q.auto, listed, power=1 if q.rho is None else 2)
    return auto_bounds.pure_epsilon(q.epsilon, q.rho, q.auto.share, parts)


def _generic_curve(events: list[PrivacyEvent], request: auto_bounds.AutoBounds | None) -> list[PrivacyEvent]:
    """The release's events when its partition bound is chosen at run time: a chosen K may exceed 1, so the plan
    made before the choice (at K = 1) cannot promise the discrete Laplace's tighter RDP curve of a lone unit
    count with K = 1 (nor a pld ledger the discrete Gaussian's own PLD); the generic curve holds whatever K is
    chosen (the events charged are these)."""
    if request is None or not request.partitions:
        return list(events)
    return [replace(e, rdp_curve="pure") if e.rdp_curve in ("discrete_laplace", "discrete_gaussian") else e
            for e in events]


def unknown_margins(request: auto_bounds.AutoBounds, described: HistogramDryRun,
                     largest: LargestCapMargins | None = None) -> None:
    """A dry run's margins that depend on a bound chosen at run time: the partition and row bounds scale every
    noise and the threshold; the value limits scale the sums. Beside each, its margin at caps of 1 (the least)
    and, with ``largest`` (:func:`largest_cap_margins`), at the largest caps the choice can make (the most)."""
    every = request.partitions or request.contributions
    high = largest["moe95"] if largest is not None else {}
    if largest is not None:
        described["largest_caps"] = {"max_partitions": largest["max_partitions"],
                                     "max_contributions": largest["max_contributions"],
                                     "sampleable": largest["sampleable"]}
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
            _noise_at_run_time(m, high.get(name), at_caps_of_1=not (request.values and valued))
    if request.partitions and described.get("threshold") is not None:
        described["threshold"] = auto_bounds.AT_RUN_TIME


def _noise_at_run_time(m: MeasurementPlan, high: float | None, at_caps_of_1: bool) -> None:
    """A noisy measurement whose scale and margin are chosen at run time: its margin at the plan's placeholders
    (caps of 1: a lower bound on the margin, which grows with the caps) and ``high`` at the largest caps beside it,
    unless the value limits it depends on are chosen too (``at_caps_of_1`` false)."""
    low = m.get("moe95")
    if at_caps_of_1 and isinstance(low, int | float):
        m["moe95_at_caps_of_1"] = low
        if high is not None:
            m["moe95_at_largest_caps"] = high
    if "scale" in m:
        m["scale"] = auto_bounds.AT_RUN_TIME
    if "moe95" in m:
        m["moe95"] = auto_bounds.AT_RUN_TIME


def largest_cap_margins(q: HistogramQuery, ledger: tuple[str, dict[str, Fraction]],
                        listed: int | None) -> LargestCapMargins | None:
    """The 95% margins at the largest caps ``auto`` can choose (:func:`auto_bounds.cap_candidates`: public), for
    a dry run: ``{"max_partitions": K, "max_contributions": C, "sampleable": …, "moe95": {measurement: margin}}``
    (a quantile's: its rank margin, rows). Every margin grows with K and C, so these are the largest the release
    can show. Where the noise at (K, C) is too large to sample the release falls back to caps of 1
    (:func:`plannable`): ``sampleable`` is then false and each margin is the largest over the caps it can sample
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
    return {"max_partitions": ks[-1], "max_contributions": cs[-1], "sampleable": top is not None,
            "moe95": top if top is not None else _staircase_most(ks, cs, margins)}


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
