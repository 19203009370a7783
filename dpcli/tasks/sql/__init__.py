"""``dpcli sql``: paper 002's DP SQL over files, on the one release path.

The query text is parsed by sqlglot (:mod:`.parse`) and resolved into a typed plan
(:mod:`.ir`, :mod:`.relations`, :mod:`.query`) under the ownership rules of paper 002's Table 4.3
(:mod:`.rules`) before any data is read; the plan is compiled into polars lazy frames
(:mod:`.compile`, :mod:`.typed`), aggregated per user and bounded (:mod:`.run`), calibrated like
``histogram`` (:mod:`.plan`) and released (:mod:`.outputs`) by :class:`.task.SqlTask`. Tables owned through
another table's key (:class:`.scope.OwnedTable`) get their unit through :mod:`.owners`.
"""

from __future__ import annotations

from dpcli.tasks.sql.plan import Budget, SqlPlan
from dpcli.tasks.sql.scope import OwnedTable, OwnerLink, TableDecl
from dpcli.tasks.sql.task import SqlOptions, SqlTask

__all__ = ["Budget", "OwnedTable", "OwnerLink", "SqlOptions", "SqlPlan", "SqlTask", "TableDecl"]
