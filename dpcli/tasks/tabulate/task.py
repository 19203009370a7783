"""``dpcli tabulate`` as a :class:`dpcli.tasks.Task` (:class:`TabulateTask`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.core.prf import KeyedStream
from dpcli.tasks import Engine, Frames, Needs, PublicList, Result, TaskDefaults, free_replay
from dpcli.tasks.dry_runs import TabulateDryRun
from dpcli.tasks.reports import TabulateReport
from dpcli.tasks.tabulate.plan import TabulatePlan, plan_tabulate
from dpcli.tasks.tabulate.query import Spec
from dpcli.tasks.tabulate.run import block_columns, check_columns, run_tabulate

if TYPE_CHECKING:
    pass  # a list's item type may be a class (pl.List(pl.Int64).inner)


@dataclass(frozen=True)
class TabulateTask(TaskDefaults):
    """``dpcli tabulate`` as a :class:`dpcli.tasks.Task`: the spec (its bytes, as a seed input ``spec``:
    ``document``) and whether cells carry margins."""

    spec: Spec
    document: Any  # the spec's bytes as they enter the seed (:class:`dpcli.release.seeds.DocumentInput`)
    with_error: bool = free_replay("--with-error", default=False)
    command: str = "tabulate"

    def for_ledger(self, mode: str) -> TabulateTask:
        return self

    def check(self) -> None:
        """The spec was checked when it was read (:func:`dpcli.tasks.tabulate.query.read_spec`)."""

    def check_lists(self, lists: Mapping[str, pl.DataFrame | pl.LazyFrame]) -> None:
        """Nothing in its public lists can refuse this task before it runs (their columns are checked on opening)."""

    def check_inputs(self, frames: Frames, plan: TabulatePlan) -> None:
        """The spec's columns against the data's schema (:func:`check_columns`), before the debit: a missing
        column or an unusable type (a float age) is the same for every dataset of that schema."""
        check_columns(frames.schema, self.spec, frames.name)

    def needs(self) -> Needs:
        c = self.spec.columns
        columns: dict[str, Any] = {c[k]: "any" for k in ("block", "race", "ethnicity", "sex", "age")}
        blocks = PublicList(tuple(block_columns(self.spec)), cast_to_data=False,
                            missing="the spec needs geography.blocks: the public list of blocks groups are "
                                    "enumerated from")
        return Needs(columns, {"blocks": blocks}, check_columns=False, documents={"spec": self.document})

    def plan(self, mode: str, limits: Mapping[str, Fraction]) -> TabulatePlan:
        return plan_tabulate(self.spec)

    def describe(self, plan: TabulatePlan) -> TabulateDryRun:
        return {"noise": plan.noise, "levels": [lv.name for lv in plan.levels]}

    def run(self, frames: Frames, plan: TabulatePlan, seed: bytes, engine: Engine | None) -> Result:
        blocks = frames.lists["blocks"]
        released = run_tabulate(frames.data, self.spec, KeyedStream(seed, "tabulate"), self.with_error,
                                blocks=blocks.lazy(), name=frames.name,
                                engine=engine.tabulate_counts if engine else None, plan=plan)
        # The summary holds public values (spec, levels, groups enumerated from the public block list,
        # noise scales) and functions of the noisy output (branches, rows): no count of records.
        report: TabulateReport = {"command": "tabulate", "noise": self.spec.noise, **released.metadata}
        return Result(released.table, report)

    def summary(self, name: str, result: Result) -> str:
        report = result.metadata
        assert report["command"] == "tabulate"
        return f"tabulate {name}: {report['rows']} cell(s) over {len(self.spec.levels)} level(s)"

    def notes(self, plan: TabulatePlan, result: Result) -> list[Any]:
        return []
