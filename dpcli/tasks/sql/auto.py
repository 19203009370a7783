"""``dpcli sql`` with ``--max-partitions auto`` / ``--max-contributions auto`` and ``--report-bias``.

The bounds are chosen by :func:`dpcli.tasks.auto_bounds.choose_bounds` on the rows the query aggregates: the
per-user frame of :func:`dpcli.tasks.sql.run.per_user_frame` (the relation after its joins and ``WHERE``, as
(unit, GROUP BY keys)), the same rows the release bounds. Its groups are the outer query's GROUP BY keys: K is
the partitions per unit, C the rows per unit and partition, which is what ``ANON_COUNT(*)`` (and
``ANON_COUNT(col)``) clamps at its default cap (``--max-contributions`` is nothing else in a query). Every
row of that frame is owned by one unit (the resolver's rules), so a unit moves one entry of each choice.

An ``ANON_COUNT`` without its own cap is resolved at :data:`DEFAULT_CAP_AUTO` (no cap a query can write), and
:func:`with_caps` gives it the cap in force: a placeholder of 1 while planning (the events do not depend on K or
C), the chosen C when the release is planned again after the choice.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from dpcli.errors import UsageError
from dpcli.tasks import auto_bounds as ab
from dpcli.tasks import bias_report as br
from dpcli.tasks.auto_bounds import AutoBounds, BudgetParts, check_share
from dpcli.tasks.sql.ir import AnonAgg, ResolvedQuery
from dpcli.tasks.sql.plan import Budget

#: The cap an ``ANON_COUNT`` without its own is resolved at when C is chosen from the data (caps are ≥ 1).
DEFAULT_CAP_AUTO = 0


def default_counts(query: ResolvedQuery) -> bool:
    """Whether the query has a count at the default cap (what ``--max-contributions auto`` chooses for)."""
    return any(a.function == "count" and a.cap == DEFAULT_CAP_AUTO for a in query.aggregates)


def with_caps(query: ResolvedQuery, cap: int) -> ResolvedQuery:
    """The query with every count at :data:`DEFAULT_CAP_AUTO` at ``cap`` instead."""
    def capped(a: AnonAgg) -> AnonAgg:
        return replace(a, cap=cap) if a.function == "count" and a.cap == DEFAULT_CAP_AUTO else a

    return replace(query, aggregates=tuple(capped(a) for a in query.aggregates))


def check_auto(query: ResolvedQuery, auto: AutoBounds | None, bias_share: Fraction | None) -> None:
    """Refuse ``auto`` where it bounds nothing (one-line usage errors, before anything is read)."""
    if auto is not None:
        if auto.partitions and not query.groups:
            raise UsageError("auto needs a GROUP BY (without one every unit has one partition)",
                             field="max_partitions")
        if auto.contributions and not default_counts(query):
            raise UsageError("auto chooses the cap of an ANON_COUNT without its own, and the query has none",
                             field="max_contributions")
        check_share(auto.share, "auto_share")
    if bias_share is not None:
        check_share(bias_share, "bias_share")
    if parts_of(auto, bias_share).release < Fraction(1, 2):
        raise UsageError("with --auto-share, leaves the release less than half of the budget", field="bias_share")


def parts_of(auto: AutoBounds | None, bias_share: Fraction | None) -> BudgetParts:
    """The budget's parts: choosing the bounds, the bias report, the release."""
    return BudgetParts(auto.share if auto else Fraction(0), bias_share or Fraction(0))


def release_budget(budget: Budget, parts: BudgetParts) -> Budget:
    """The release's own part of the budget (ε or ρ; δ stays the release's)."""
    if parts.release == 1:
        return budget
    return replace(budget, epsilon=None if budget.epsilon is None else budget.epsilon * parts.release,
                   rho=None if budget.rho is None else budget.rho * parts.release)


def check_noise(request: AutoBounds | None, bias_share: Fraction | None, epsilon: Fraction | None,
                rho: Fraction | None) -> None:
    """Refuse, before any data is read, a choice of bounds or a bias report whose noise cannot be drawn (the
    bias report's sums: :func:`dpcli.tasks.bias_report.check_bias`)."""
    if request is not None:
        ab.check_choice(ab.pure_epsilon(epsilon, rho, request.share, request.choices), scale=ab.QUANTILE_SCALE)
    if bias_share is not None:
        br.check_bias(epsilon, rho, bias_share)


__all__ = ["DEFAULT_CAP_AUTO", "check_auto", "check_noise", "default_counts", "parts_of", "release_budget",
           "with_caps"]
