"""The bounds of a ``dpcli sql`` release chosen from its data, and its bias report (:mod:`.auto` says how)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks import auto_bounds as ab
from dpcli.tasks import bias_report as br
from dpcli.tasks.sql.measures import SqlPlan
from dpcli.tasks.sql.run import per_user_frame

if TYPE_CHECKING:
    from dpcli.tasks.sql.task import SqlTask


def bounds_chosen(task: SqlTask, plan: SqlPlan, tables: Mapping[str, pl.LazyFrame], stream: KeyedStream, salt: int,
                  name: str) -> tuple[SqlTask, SqlPlan, dict[str, Any]]:
    """With ``auto``: K then C chosen on the per-user frame (``stream.child("auto")``, the release's bounding
    ``salt``), the task and its plan at them (the events planned before any data was read: asserted); with
    a bias report: the noisy shares of each user's rows cut by K and (where a count is capped by it) by C
    (:mod:`dpcli.tasks.bias_report`, ``stream.child("bias")``).
    The metadata of both (released values)."""
    o = task.options
    frame, layout = per_user_frame(task.query, plan, tables, task.query.group_names)
    shape = ab.DataShape(layout.unit, layout.groups)
    bounds = ab.ChosenBounds(o.max_partitions if layout.groups else None, o.max_contributions, None)
    extra: dict[str, Any] = {}
    budget = o.budget
    if o.auto is not None:
        quantile = ab.pure_epsilon(budget.epsilon, budget.rho, o.auto.share, o.auto.choices)
        bounds = ab.choose_bounds(frame, shape, o.auto, bounds, quantile, stream.child("auto"), salt, name)
        task, plan, bounds = _plannable(task, plan, bounds)
        extra["auto"] = {**bounds.to_json(), **_part(budget.epsilon, budget.rho, o.auto.share)}
    if o.bias_share is not None:
        noise = br.bias_noise(budget.epsilon, budget.rho, o.bias_share)
        extra["bias"] = br.report_bias(frame, shape, bounds, noise, stream.child("bias"), salt, name,
                                       rows=task.capped_by_default()).to_json()
    return task, plan, extra


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
