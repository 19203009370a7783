"""SafeTab-style adaptive tabulation of population groups (``dpcli tabulate``, paper 003), a package of the task's
shape: :mod:`.query` (the spec), :mod:`.plan`, :mod:`.run`, :mod:`.task` (its modules import each other, never
this file, which re-exports the public names).

Per level of the spec: each person counts in at most ``stability`` groups (bounded here), a noisy
total per group (step 1), then Sex × Age cells at the granularity that total allows (step 2).
The algorithm, its calibration from margins of error and its accounting are in ``docs/tabulate.md``.
"""

from dpcli.tasks.tabulate.plan import (
    SAFETAB_ORDERS,
    GaussianLevel,
    GaussianTotals,
    GeometricLevel,
    GeometricTotals,
    LevelBudget,
    PlanDocument,
    TabulatePlan,
    base_from_moe,
    events,
    geometric_rdp_total,
    level_budgets,
    noise_for,
    plan_document,
    plan_tabulate,
)
from dpcli.tasks.tabulate.run import (
    COUNT_SCHEMA,
    CountsEngine,
    LevelCounts,
    TabulateRelease,
    block_columns,
    check_columns,
    level_counts,
    read_blocks,
    run_tabulate,
)
from dpcli.tasks.tabulate.task import TabulateTask

__all__ = [
    "COUNT_SCHEMA", "SAFETAB_ORDERS", "CountsEngine", "GaussianLevel", "GaussianTotals", "GeometricLevel",
    "GeometricTotals", "LevelBudget", "LevelCounts", "PlanDocument", "TabulatePlan", "TabulateRelease",
    "TabulateTask", "base_from_moe", "block_columns", "check_columns", "events", "geometric_rdp_total",
    "level_budgets", "level_counts", "noise_for", "plan_document", "plan_tabulate", "read_blocks", "run_tabulate",
]
