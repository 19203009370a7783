"""The bounds of a ``dpcli sql`` release chosen from its data, and its bias report (:mod:`.auto` says how)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks import auto_bounds as ab
from dpcli.tasks import bias_report as br
from dpcli.tasks.sql.plan import SqlPlan
from dpcli.tasks.sql.run import per_user_frame

if TYPE_CHECKING:
    from dpcli.tasks.sql.task import SqlTask


def bounds_chosen(task: SqlTask, plan: SqlPlan, tables: Mapping[str, pl.LazyFrame], stream: KeyedStream, salt: int,
                  name: str, listed: int | None = None) -> tuple[SqlTask, SqlPlan, dict[str, Any]]:
    """With ``auto``: K then C chosen on the per-user frame (``stream.child("auto")``, the release's bounding
    ``salt``) by the bias–variance rule of :class:`dpcli.tasks.auto_bounds.ErrorModel` (:func:`error_model`; by
    quantiles when no measurement has noise: NTILEs only), the task and its plan at them (the events planned
    before any data was read: asserted); with a bias report: the noisy shares of each user's rows cut by K and
    (where a count is capped by it) by C (:mod:`dpcli.tasks.bias_report`, ``stream.child("bias")``).
    ``listed``: the number of groups in the public list (``--keys``). The metadata of both (released values)."""
    o = task.options
    frame, layout = per_user_frame(task.query, plan, tables, task.query.group_names)
    shape = ab.DataShape(layout.unit, layout.groups)
    bounds = ab.ChosenBounds(o.max_partitions if layout.groups else None, o.max_contributions, None)
    extra: dict[str, Any] = {}
    budget = o.budget
    epsilon, rho = task.unit_budget()  # (the budget over the stability: each choice and count counts units)
    if o.auto is not None:
        at = stream.child("auto")
        each = choice_epsilon(task)
        model = error_model(task, frame, shape, listed, each, at, salt, name)
        if model is None:
            each = ab.pure_epsilon(epsilon, rho, o.auto.share, o.auto.choices)
        bounds = ab.choose_bounds(frame, shape, o.auto, bounds, each, at, salt, name, model)
        task, plan, bounds = _plannable(task, plan, bounds)
        extra["auto"] = {**bounds.to_json(), **_part(budget.epsilon, budget.rho, o.auto.share)}
    if o.bias_share is not None:
        noise = br.bias_noise(epsilon, rho, o.bias_share)
        extra["bias"] = br.report_bias(frame, shape, bounds, noise, stream.child("bias"), salt, name,
                                       rows=task.capped_by_default()).to_json()
    return task, plan, extra


def choice_epsilon(task: SqlTask) -> Fraction:
    """The pure ε of each part of the bias–variance choice (:func:`dpcli.tasks.auto_bounds.model_parts`): without a
    public list of groups (``--keys``, or no GROUP BY: one group) a noisy count of the groups is one more part (over
    the stability of owned tables: :meth:`dpcli.tasks.sql.task.SqlTask.unit_budget`)."""
    o = task.options
    assert o.auto is not None
    parts = ab.model_parts(o.auto, task.domain != "threshold", power=1 if o.budget.rho is None else 2)
    return ab.pure_epsilon(*task.unit_budget(), o.auto.share, parts)


def error_model(task: SqlTask, frame: pl.LazyFrame, shape: ab.DataShape, listed: int | None, epsilon: Fraction,
                stream: KeyedStream, salt: int, name: str) -> ab.ErrorModel | None:
    """The release's noise per unit of sensitivity and the groups it is paid in, for the bias–variance rule: its
    plan at one partition and one row per user (every measurement gets its share), read off its first noisy
    count (else its first noisy measurement; None when none has noise: NTILEs only, whose error is in rank); the
    groups: the public list's ``listed``, one without GROUP BY, else a noisy count of the groups with at least
    the threshold's users (at pure ``epsilon``: one part of the choice)."""
    unit = task.at_bounds(1, 1).plan("pure", {})
    noisy = [c for c in unit.calibrated if c.noise is not None and c.measure.kind != "units"]
    counts = [c for c in noisy if c.measure.kind in ("rows", "count")]
    if not noisy:
        return None
    first = (counts or noisy)[0]
    assert first.noise is not None
    noise = ab.expected_abs(first.noise) / first.measure.sensitivity
    if task.domain == "all":
        return ab.ErrorModel(1, noise)
    if listed is not None:
        return ab.ErrorModel(listed, noise)
    groups = ab.noisy_groups(frame, shape, unit.threshold or 1, epsilon, stream, salt, name)
    return ab.ErrorModel(groups, noise, listed=False)


def _plannable(task: SqlTask, plan: SqlPlan, bounds: ab.ChosenBounds) -> tuple[SqlTask, SqlPlan, ab.ChosenBounds]:
    """The task and its plan at the chosen K and C, or at 1 and 1 (reported as ``reduced``) when the chosen
    bounds' noise cannot be sampled: a run must not fail after the choice (a free, data-dependent exit); 1 and 1
    are what the plan was checked with before any data was read."""
    try:
        at = task.at_bounds(bounds.max_partitions or 1, bounds.max_contributions)
        replanned = at.plan("pure", {})  # the mode only refuses br ledgers, which the first plan did
    except UsageError:
        bounds = replace(bounds, max_partitions=1 if bounds.max_partitions is not None else None,
                         max_contributions=1, reduced=True)
        at = task.at_bounds(1, 1)
        replanned = at.plan("pure", {})
    assert replanned.events == plan.events, "a chosen bound changed the release's cost"
    return at, replanned, bounds


def _part(epsilon: Any, rho: Any, share: Any) -> dict[str, str]:
    """A part's budget as the metadata shows it: ``{"epsilon": …}`` or ``{"rho": …}``."""
    return {"rho": fraction_text(rho * share)} if rho is not None else {"epsilon": fraction_text(epsilon * share)}


__all__ = ["bounds_chosen"]
