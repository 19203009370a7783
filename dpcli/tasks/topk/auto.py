"""The caps a top-k release leaves to dpcli (``auto``), chosen from the data at their share of the budget, and
the release planned again at the chosen caps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks import Frames
from dpcli.tasks.reports import TopKReport
from dpcli.tasks.topk.plan import TopKPlan, plan_topk, whole_epsilon
from dpcli.tasks.topk.query import TopKQuery

if TYPE_CHECKING:

    pass


def _plannable(q: TopKQuery, plan: TopKPlan, chosen: Any) -> tuple[TopKQuery, TopKPlan, Any]:
    """The query and its plan at the chosen τ, or at τ = 1 (reported as ``reduced``) when the chosen τ's noise
    cannot be sampled: a run must not fail after the choice (a free, data-dependent exit). τ = 1 is what the
    plan was checked with before any data was read."""
    try:
        at = replace(q, max_contributions=chosen.max_contributions)
        replanned = plan_topk(at, plan.ledger_mode, {})
    except UsageError:
        chosen = replace(chosen, max_contributions=1, reduced=True)
        at = replace(q, max_contributions=1)
        replanned = plan_topk(at, plan.ledger_mode, {})
    assert replanned.events == plan.events, "a chosen bound changed the release's cost"
    return at, replanned, chosen


def bounds_chosen(frames: Frames, q: TopKQuery, plan: TopKPlan, stream: KeyedStream
                   ) -> tuple[TopKQuery, TopKPlan, TopKReport]:
    """With ``--max-contributions auto``: τ chosen from the data (``stream.child("auto")``), the query and its
    plan at that τ (the same events as planned before any data was read); with ``--report-bias``: the noisy
    average share of each unit's rows beyond τ in a group (``stream.child("bias")``).
    Metadata for both (released values)."""
    from dpcli.tasks import auto_bounds as ab
    from dpcli.tasks import bias_report as br

    extra: TopKReport = {}
    if q.parts.release == 1:
        return q, plan, extra
    shape = ab.DataShape(q.unit, q.by)
    whole = whole_epsilon(q)
    auto = q.auto
    if auto is not None:
        quantile_epsilon = ab.pure_epsilon(whole, None, auto.share, auto.choices)
        chosen = ab.choose_bounds(frames.data, shape, auto, ab.ChosenBounds(None, 1, None), quantile_epsilon,
                                  stream.child("auto"), 0, frames.name)  # salt 0: topk's bounding salt
        q, plan, chosen = _plannable(q, plan, chosen)
        extra["auto"] = {**chosen.to_json(), **ab.budget_json(whole, None, auto.share)}  # ε = whole·share
    if q.bias_share is not None:
        bounds = ab.ChosenBounds(None, q.max_contributions, None)
        noise = br.bias_noise(whole, None, q.bias_share)
        extra["bias"] = br.report_bias(frames.data, shape, bounds, noise, stream.child("bias"), 0,
                                       frames.name).to_json()
    return q, plan, extra
