"""``dpcli topk`` as a :class:`dpcli.tasks.Task` (:class:`TopKTask`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.core.events import PrivacyEvent
from dpcli.core.prf import KeyedStream
from dpcli.errors import StateError, UsageError
from dpcli.tasks import Engine, Frames, Needs, PublicList, Result, TaskDefaults, free_replay
from dpcli.tasks.dry_runs import TopKDryRun
from dpcli.tasks.reports import AutoReport, TopKReport
from dpcli.tasks.topk.auto import bounds_chosen
from dpcli.tasks.topk.plan import TopKPlan, describe_plan, epsilon_per_for, plan_topk
from dpcli.tasks.topk.query import TopKQuery
from dpcli.tasks.topk.run import run_topk

if TYPE_CHECKING:
    from collections.abc import Callable

    from dpcli.advice import Note
    from dpcli.tasks.targets import MarginTarget
    from dpcli.tasks.topk.target import TopKChoice


@dataclass(frozen=True)
class TopKTask(TaskDefaults):
    """``dpcli topk`` as a :class:`dpcli.tasks.Task` (``defaulted`` and ``unit_label``: for :meth:`notes`;
    ``target``: a count margin target that :meth:`for_ledger` turns into ε_per, ``chosen`` what it chose)."""

    query: TopKQuery
    defaulted: tuple[str, ...] = free_replay("notes' wording", default=())
    unit_label: str | None = free_replay("notes' wording", default=None)
    command: str = "topk"
    #: A scheduled run is accounted in pure ε-DP whatever the ledger's mode.
    scheduled_mode: str = "pure"
    target: MarginTarget | None = free_replay("margin targets (the ε they resolve to is bound)", default=None)
    chosen: TopKChoice | None = free_replay("margin targets (the ε they resolve to is bound)", default=None)
    mode: str = "pure"
    #: ``--epsilon``: the release's whole ε, turned into ε_per once the selection is known (:meth:`for_ledger`).
    epsilon: Fraction | None = None

    def for_ledger(self, mode: str) -> TopKTask:
        """The ledger's default selection (UnkGumb on br ledgers, the threshold one elsewhere), ε_per from the
        release's ε, and with a target the query at the chosen release ε (the seed binds the ε_per)."""
        query = self.query.resolved(mode)
        if self.epsilon is not None:
            query = replace(query, epsilon_per=epsilon_per_for(self.epsilon, query))
        task = replace(self, query=query, epsilon=None)
        if self.target is None:
            return task
        from dpcli.tasks.topk.target import choose

        choice = choose(task.query, self.target, mode)
        return replace(task, query=choice.query, target=None, chosen=choice, mode=mode)

    def budget_hint(self, pays: Callable[[list[PrivacyEvent]], bool]) -> str | None:
        """With a target: the best count margin a ledger that refuses the chosen ε could pay (None without)."""
        if self.chosen is None:
            return None
        from dpcli.tasks.topk.target import reachable

        return reachable(self.chosen, self.mode, pays)

    def at_epsilon(self, epsilon: Fraction) -> TopKTask:
        """The same query at a schedule run's whole ε (split over its selections and counts as for --epsilon)."""
        q = self.query
        return replace(self, query=replace(q, epsilon_per=epsilon_per_for(epsilon, q)))

    def schedule_mode(self, ledger_mode: str) -> str:
        """Each run of a schedule is planned in :attr:`scheduled_mode` (pure: top-k's accounting per run)."""
        return self.scheduled_mode

    def keeping(self, chosen: AutoReport) -> TopKTask:
        """Top-k chooses no bounds from the data, so a schedule's state keeps none for it."""
        raise StateError("a top-k schedule's state holds chosen bounds, which top-k never chooses: a damaged state")

    def check_schedulable(self) -> None:
        """Refuse a query no schedule can run (each run's ε comes from the schedule: planned per run)."""
        if not self.query.known_domain:
            raise UsageError("a schedule runs pure ε-DP releases: give the candidates with --keys")
        if self.query.epsilon_per is not None:
            raise UsageError("with --schedule each run's ε comes from the schedule; drop --epsilon-per")
        if self.query.auto is not None:
            raise UsageError("--max-contributions auto: a schedule keeps its bounds: choose them once with a run "
                             "without --schedule")
        self.query.validate()

    def schedule_query(self, lists: Mapping[str, str]) -> dict[str, Any]:
        """What names a schedule besides its name: the query without its ε, and the domain's fingerprint."""
        query = {k: v for k, v in self.query.canonical().items() if k != "epsilon_per"}
        return {"command": "topk", **query, "domain": lists["domain"]}

    def check(self) -> None:
        """Refuse an inconsistent query (one-line usage errors) before anything else is read."""
        self.query.validate()
        if self.target is not None:
            from dpcli.tasks.topk.target import count_limit

            if self.query.epsilon_per is not None or self.epsilon is not None:
                raise UsageError("chooses the budget: leave out ε and ε_per", field=self.target.field)
            if self.query.auto is not None:
                raise UsageError("cannot be met with --max-contributions auto: the count margin depends on τ, "
                                 "chosen from the data (give τ, or leave out the target)", field=self.target.field)
            count_limit(self.query, self.target)

    def check_lists(self, lists: Mapping[str, pl.DataFrame | pl.LazyFrame]) -> None:
        """``-k`` at most the known domain's candidates (the list is public: refused before the debit)."""
        domain = lists.get("domain")
        if self.query.known_domain and isinstance(domain, pl.DataFrame) and self.query.k > domain.height:
            raise UsageError(f"-k {self.query.k} is larger than the domain ({domain.height} candidates)", field="k")

    def needs(self) -> Needs:
        q = self.query
        return Needs({q.unit: "key", **dict.fromkeys(q.by, "key")},
                     {"domain": PublicList(q.by)} if q.known_domain else {})

    def plan(self, mode: str, limits: Mapping[str, Fraction]) -> TopKPlan:
        return plan_topk(self.query, mode, dict(limits))

    def describe(self, plan: TopKPlan) -> TopKDryRun:
        described = describe_plan(self.query, plan)
        if self.chosen is not None:
            described["target"] = self.chosen.to_json()
        return described

    def run(self, frames: Frames, plan: TopKPlan, seed: bytes, engine: Engine | None) -> Result:
        domain = frames.lists.get("domain")
        stream = KeyedStream(seed, "topk")
        query, plan, extra = bounds_chosen(frames, self.query, plan, stream)
        released = run_topk(frames.data, query, plan, stream, domain if isinstance(domain, pl.DataFrame) else None,
                            name=frames.name, rows=frames.rows, engine=engine.totals if engine else None)
        metadata: TopKReport = {**released.metadata, "command": "topk", "guarantee": plan.guarantee, **extra}
        if self.chosen is not None:
            metadata["target"] = self.chosen.to_json()
        return Result(released.table, metadata, released.actual)

    def summary(self, name: str, result: Result) -> str:
        report = result.metadata
        assert report["command"] == "topk"
        found, k = report["found"], self.query.k
        line = f"top-{k} of {name}: {found} group(s)"
        if report.get("bottom", False) and "selected" in report:
            line += f", {report['selected']} group(s) passed the selection"
        elif report.get("bottom", False):
            line += f", ⊥ reached (only {found} of {k} could be released)"
        if "auto" in report:
            line += f"; chosen: max_contributions {report['auto']['max_contributions']}"
        return line

    def notes(self, plan: TopKPlan, result: Result) -> list[Note]:
        from dpcli import advice

        report = result.metadata
        assert report["command"] == "topk"
        if self.query.auto is not None:  # the count noise of the τ chosen (a released value)
            query = replace(self.query, max_contributions=int(report["tau"]))
            plan = plan_topk(query, plan.ledger_mode, {})
        notes = advice.topk_notes(self.query, plan, result.table, self.defaulted, self.unit_label)
        if report.get("bottom", False) and "selected" in report:
            notes.append(advice.Note(f"fewer than k = {self.query.k} groups reach the selection's threshold of "
                                     f"{report['threshold']} noisy units: only {report['found']} "
                                     "released (a larger --selection-share or a smaller --max-partitions lowers it)"))
        elif report.get("bottom", False):
            notes.append(advice.Note(f"fewer than k = {self.query.k} groups pass the threshold (⊥): only "
                                     f"{report['found']} released"))
        return notes
