"""Bounds chosen privately from the data: ``auto`` for ``--max-partitions``, ``--max-contributions`` and
``--bounds``.

A bound is a noisy quantile over a public grid of candidates (the "DP quantiles of contributions" that
Amin et al., ICML 2019, show trade bias against noise), chosen by AboveThreshold (the sparse vector
technique, Dwork and Roth 2014, §3.6) walking the candidates in order (:func:`first_reaching`), with
exact discrete Laplace noise. The choices are
made in an order where each runs on data already bounded by the ones before it:

1. **groups per unit** (``--max-partitions``): each unit's number of distinct groups; one entry per unit,
   so one unit moves the utility by at most one entry (sensitivity 1 in ranks);
2. **rows per unit and group** (``--max-contributions``): on the groups the partition bound keeps, each
   unit's row count in one of its groups (the first in the keyed order): one entry per unit (sensitivity 1);
3. **value limits** (``--bounds``): the low and high quantiles of the values of the rows kept by both
   bounds, one value per unit (the first in the keyed order; sensitivity 1).

The query of candidate c at level p = a/b is b·#{entries at most c} − a·n (integers); one entry more or
less moves it by at most b, and AboveThreshold's noise is calibrated to that: ε-DP per choice. The choice
spends a share of the query's budget (:data:`AUTO_SHARE`, ``--auto-share``), split equally among the
quantiles chosen; the release spends the rest. Both parts are events of one charge.

A package of five modules: :mod:`~dpcli.tasks.auto_bounds.request` (what a query leaves to dpcli, the bounds in
force, the budget's parts), :mod:`~dpcli.tasks.auto_bounds.walks` (the grids and the sparse-vector walks),
:mod:`~dpcli.tasks.auto_bounds.rule` (the bias–variance rule), :mod:`~dpcli.tasks.auto_bounds.choose` (the choice
on the data) and :mod:`~dpcli.tasks.auto_bounds.text` (how a release names what was chosen); this module
re-exports their public names, and none of them imports it. The bias report that says how much the bounds in
force cut is :mod:`dpcli.tasks.bias_report`.
"""

from __future__ import annotations

from dpcli.tasks.auto_bounds.choose import (
    choose_bounds,
    choose_limit,
    noisy_groups,
    one_group_each,
    one_row_each,
)
from dpcli.tasks.auto_bounds.request import (
    AT_RUN_TIME,
    AUTO,
    AUTO_SHARE,
    AUTO_VERSION,
    AutoBounds,
    BudgetParts,
    ChosenBounds,
    DataShape,
    check_share,
    chosen_of,
    pure_epsilon,
)
from dpcli.tasks.auto_bounds.rule import (
    BIAS_VARIANCE_RULE,
    CHECK_WEIGHT,
    CONTRIBUTIONS_WEIGHT,
    COUNT_LEAN,
    COUNT_THRESHOLD_SHARE,
    GROUP_CHECK_WEIGHT,
    VALUE_WEIGHT,
    WALK_WEIGHT,
    ErrorModel,
    cap_candidates,
    expected_abs,
    leaned,
    model_parts,
)
from dpcli.tasks.auto_bounds.text import (
    budget_json,
    chosen_text,
    rho_or_epsilon_text,
)
from dpcli.tasks.auto_bounds.walks import (
    CONTRIBUTIONS_LEVEL,
    COUNT_CANDIDATES,
    COUNT_SLACK,
    LIMIT_CANDIDATES,
    MOST_ALLOWED,
    PARTITIONS_LEVEL,
    QUANTILE_SCALE,
    VALUE_CANDIDATES,
    VALUE_LEVELS,
    VALUE_SLACK,
    WITHIN_SCALE,
    ZERO,
    check_choice,
    first_reaching,
    first_within,
    sampleable,
)

__all__ = [
    "AT_RUN_TIME",
    "AUTO",
    "AUTO_SHARE",
    "AUTO_VERSION",
    "BIAS_VARIANCE_RULE",
    "CHECK_WEIGHT",
    "CONTRIBUTIONS_LEVEL",
    "CONTRIBUTIONS_WEIGHT",
    "COUNT_CANDIDATES",
    "COUNT_LEAN",
    "COUNT_SLACK",
    "COUNT_THRESHOLD_SHARE",
    "GROUP_CHECK_WEIGHT",
    "LIMIT_CANDIDATES",
    "MOST_ALLOWED",
    "PARTITIONS_LEVEL",
    "QUANTILE_SCALE",
    "VALUE_CANDIDATES",
    "VALUE_LEVELS",
    "VALUE_SLACK",
    "VALUE_WEIGHT",
    "WALK_WEIGHT",
    "WITHIN_SCALE",
    "ZERO",
    "AutoBounds",
    "BudgetParts",
    "ChosenBounds",
    "DataShape",
    "ErrorModel",
    "budget_json",
    "cap_candidates",
    "check_choice",
    "check_share",
    "choose_bounds",
    "choose_limit",
    "chosen_of",
    "chosen_text",
    "expected_abs",
    "first_reaching",
    "first_within",
    "leaned",
    "model_parts",
    "noisy_groups",
    "one_group_each",
    "one_row_each",
    "pure_epsilon",
    "rho_or_epsilon_text",
    "sampleable"
]
