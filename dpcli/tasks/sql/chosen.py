"""The bounds of a ``dpcli sql`` release chosen from its data, and its bias report (:mod:`.auto` says how)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.tasks import auto_bounds as ab
from dpcli.tasks.sql.measures import SqlPlan
from dpcli.tasks.sql.run import per_user_frame

if TYPE_CHECKING:
    from dpcli.tasks.sql.task import SqlTask


def bounds_chosen(task: SqlTask, plan: SqlPlan, tables: Mapping[str, pl.LazyFrame], stream: KeyedStream, salt: int,
                  name: str) -> tuple[SqlTask, SqlPlan, dict[str, Any]]:
    """With ``auto``: K then C chosen on the per-user frame (``stream.child("auto")``, the release's bounding
    ``salt``), the task and its plan at them (the events planned before any data was read: asserted); with
    ``--report-bias``: the noisy counts of units over K and with a partition over C (``stream.child("bias")``).
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
        task = task.at_bounds(bounds.max_partitions or 1, bounds.max_contributions)
        replanned = task.plan("pure", {})  # the mode only refuses br ledgers, which the first plan did
        assert replanned.events == plan.events, "a chosen bound changed the release's cost"
        plan = replanned
        extra["auto"] = {**bounds.to_json(), **_part(budget.epsilon, budget.rho, o.auto.share)}
    if o.bias_share is not None:
        noise = ab.bias_noise(budget.epsilon, budget.rho, o.bias_share, len(ab.bias_parts(shape, bounds)))
        extra["bias"] = ab.report_bias(frame, shape, bounds, noise, stream.child("bias"), salt, name).to_json()
    return task, plan, extra


def _part(epsilon: Any, rho: Any, share: Any) -> dict[str, str]:
    """A part's budget as the metadata shows it: ``{"epsilon": …}`` or ``{"rho": …}``."""
    return {"rho": fraction_text(rho * share)} if rho is not None else {"epsilon": fraction_text(epsilon * share)}


__all__ = ["bounds_chosen"]
