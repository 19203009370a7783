"""``topk --target-moe``: the smallest release ε whose released counts' 95% margin meets the target, from
the plan alone (:mod:`dpcli.tasks.targets`). The one column served is ``count`` (Laplace(2τ/ε_per) noise,
ε_per from the release's ε by the paper's guarantee, as for ``--epsilon``); a ranking without counts
(``--no-counts``) has no margin to target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from dpcli.core.events import PrivacyEvent
from dpcli.errors import UsageError
from dpcli.tasks import targets
from dpcli.tasks.topk.plan import epsilon_per_for, plan_topk
from dpcli.tasks.topk.query import TopKQuery


@dataclass(frozen=True)
class TopKChoice:
    """The query at the chosen release ε, and the target (its count margin limit, in rows or units)."""

    query: TopKQuery
    value: Fraction
    limit: Fraction
    target: targets.MarginTarget

    def to_json(self) -> dict[str, Any]:
        """The target and its choice, for ``--dry-run`` and the release's metadata (all public)."""
        limit = self.limit
        shown = str(limit.numerator) if limit.denominator == 1 else f"{float(limit):.6g}"
        return {"option": self.target.field, "epsilon": targets.show(self.value), "size": self.target.size,
                "columns": {"count": {"target": shown, "moe95": _margin(self.query)}}, "digits": targets.DIGITS}


def _at(q: TopKQuery, epsilon: Fraction) -> TopKQuery:
    return replace(q, epsilon_per=epsilon_per_for(epsilon, q))


def _margin(q: TopKQuery) -> int:
    noise = plan_topk(q, "pure", {}).count_noise
    assert noise is not None  # check_target refuses a ranking without counts
    return noise.margin95()


def count_limit(q: TopKQuery, target: targets.MarginTarget) -> Fraction:
    """The target's count margin (refused: a ranking without counts, or a column other than count)."""
    if not q.with_counts:
        raise UsageError("needs released counts: a ranking alone has no margin", field=target.field)
    (column, value), *more = target.items
    if more or column not in (None, "count"):
        raise UsageError("serves the count column of a top-k (count=X, or X)", field=target.field)
    return target.absolute(value)


def choose(q: TopKQuery, target: targets.MarginTarget, mode: str) -> TopKChoice:
    """The query at the smallest release ε meeting ``target`` (usage error if none does)."""
    if mode == "br":
        raise UsageError("cannot choose ε on a br ledger: its ε is the ledger's ε_per", field=target.field)
    limit = count_limit(q, target)
    plan_topk(_at(q, Fraction(1)), "pure", {})  # the query's own problems, reported as such

    def meets(value: Fraction) -> bool:
        try:
            return _margin(_at(q, value)) <= limit
        except UsageError:  # count noise too wide to sample: not this value
            return False

    value = targets.smallest(meets)
    if value is None:
        raise UsageError(f"cannot be met by any epsilon up to {targets.MAX_PARAMETER}", field=target.field)
    return TopKChoice(_at(q, value), value, limit, target)


def reachable(choice: TopKChoice, mode: str, pays: Callable[[list[PrivacyEvent]], bool]) -> str:
    """Why the chosen ε cannot be paid, with the best count margin the ledger can pay now (one clause)."""
    def affordable(value: Fraction) -> bool:
        try:
            return pays(plan_topk(_at(choice.query, value), mode, {}).events)
        except UsageError:  # too small to plan: costs next to nothing
            return True

    best = targets.largest(affordable, choice.value)
    wanted = f"the target needs epsilon={targets.show(choice.value)}"
    try:
        margin = _margin(_at(choice.query, best)) if best else None
    except UsageError:
        margin = None
    if best is None or margin is None:
        return f"{wanted}; the ledger cannot pay an epsilon that gives this query a usable margin now"
    return f"{wanted}; the most the ledger can pay now, epsilon={targets.show(best)}, gives count ±{margin}"


__all__ = ["TopKChoice", "choose", "count_limit", "reachable"]
