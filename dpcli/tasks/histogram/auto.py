"""The bounds a histogram release leaves out, chosen from the data at their share of the budget
(:func:`resolve_bounds`: the bias–variance model of :mod:`dpcli.tasks.auto_bounds` fed with this release's plan), and
what the release says about them.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli import bounding
from dpcli.core.events import PrivacyEvent
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks import (
    Frames,
    auto_bounds,
    bias_report,
)
from dpcli.tasks.histogram.plan import HistogramPlan, choice_epsilon, plan_histogram, quantile_rank_margin
from dpcli.tasks.histogram.query import HistogramQuery, parse_quantile
from dpcli.tasks.histogram.run import bounding_salt
from dpcli.tasks.reports import HistogramReport

if TYPE_CHECKING:
    pass


def resolve_bounds(q: HistogramQuery, plan: HistogramPlan, frames: Frames,
             stream: KeyedStream) -> tuple[HistogramQuery, HistogramPlan, auto_bounds.ChosenBounds]:
    """The release as it runs: the bounds chosen from the data (if any), the release query at them, and its
    plan, which costs what the plan made before any data was read said it would."""
    in_force = q.given()
    if q.auto is not None and q.auto.any:
        keys = frames.lists.get("keys")
        listed = keys.height if isinstance(keys, pl.DataFrame) else None
        assert (listed is not None) == (q.domain == "keys")
        each = choice_epsilon(q)
        salt, at = bounding_salt(stream), stream.child("auto")
        model = _error_model(q, plan, frames, listed, each, at, salt)
        in_force = auto_bounds.choose_bounds(frames.data, q.shape, q.auto, in_force, each, at, salt, frames.name,
                                             model)
        if q.auto.values and all(parse_quantile(a) is not None for a in q.aggregations):
            in_force = replace(in_force, bounds=_widened(in_force.bounds))
    return plannable(q, plan, in_force)


def plannable(q: HistogramQuery, plan: HistogramPlan,
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
    left generic (``pure``): the discrete Laplace's own curve (or the discrete Gaussian's PLD) holds for K = 1 only,
    and K was chosen at run time."""
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
        noise = quantile_model_noise(unit, release_grid)
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


def quantile_model_noise(unit: HistogramPlan, grid: bounding.ValueGrid) -> float:
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


def parts_metadata(q: HistogramQuery, frames: Frames, in_force: auto_bounds.ChosenBounds,
                    stream: KeyedStream) -> HistogramReport:
    """The released bounds chosen from the data and the bias report (both noisy, both public)."""
    out: HistogramReport = {}
    if q.auto is not None and q.auto.any:
        out["auto"] = {**in_force.to_json(), **auto_bounds.budget_json(q.epsilon, q.rho, q.auto.share)}
    if q.bias_share is not None:
        noise = bias_report.bias_noise(q.epsilon, q.rho, q.bias_share)
        report = bias_report.report_bias(frames.data, q.shape, in_force, noise, stream.child("bias"),
                                         bounding_salt(stream), frames.name, rows=q.counts_rows)
        out["bias"] = {**report.to_json(), **auto_bounds.budget_json(q.epsilon, q.rho, q.bias_share)}
    return out


def check_target_bounds(request: auto_bounds.AutoBounds | None, limits: Mapping[str, Any], option: str) -> None:
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
