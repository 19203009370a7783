"""``dpcli histogram`` as a :class:`dpcli.tasks.Task`: from the options to the plan, the run, the summary and
the notes (:class:`HistogramTask`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks import (
    Engine,
    Frames,
    Needs,
    PublicList,
    Result,
    TaskDefaults,
    auto_bounds,
    bias_report,
    bound_elsewhere,
    free_replay,
)
from dpcli.tasks.dry_runs import HistogramDryRun
from dpcli.tasks.histogram.auto import check_target_bounds, parts_metadata, resolve_bounds
from dpcli.tasks.histogram.plan import (
    HistogramPlan,
    choice_epsilon,
    describe_plan,
    largest_cap_margins,
    plan_histogram,
    unknown_margins,
)
from dpcli.tasks.histogram.query import HistogramQuery, parse_quantile
from dpcli.tasks.histogram.run import run_histogram
from dpcli.tasks.reports import AutoReport, HistogramReport

if TYPE_CHECKING:
    from dpcli.advice import Note
    from dpcli.tasks.histogram.target import Choice
    from dpcli.tasks.targets import MarginTarget


@dataclass(frozen=True)
class KeptBounds:
    """The ``auto`` bounds a schedule's first run chose, as its later runs give them (``chosen``: released
    values, as in the first run's ``"auto"``), and those not chosen yet (``pending``: a dry run's later runs)."""

    chosen: AutoReport
    pending: auto_bounds.AutoBounds


def _left_out_stays(task: HistogramTask, mode: str | None) -> str | None:
    """Why the bounds left out of ``task`` cannot be chosen from the data (None: they can)."""
    q = task.query
    if mode == "br":
        return "a br ledger"
    if q.domain == "unklap":
        return "--selection unklap"
    if task.target is not None:
        return "a margin target"
    if q.epsilon is None and q.rho is None:
        return "no ε or ρ"
    if mode in ("approx", "pld") and q.rho is not None:  # the choice's part is zCDP with no δ to convert it at
        return f"ρ on an {mode} ledger"
    return None


@dataclass(frozen=True)
class HistogramTask(TaskDefaults):
    """``dpcli histogram`` as a :class:`dpcli.tasks.Task`.

    ``noise_given``: whether the query's noise was chosen (else a zcdp ledger gets Gaussian noise:
    :meth:`for_ledger`); ``defaulted``: the caps left at their defaults, and ``unit_label`` how notes
    name the privacy unit (both for :meth:`notes`). ``target``: a margin target (``--target-moe``) that
    :meth:`for_ledger` turns into the query's ε or ρ (``chosen``: what it chose). ``kept``: a schedule's later
    run, at the ``auto`` bounds its first run chose (:meth:`keeping`).
    """

    query: HistogramQuery
    noise_given: bool = True
    defaulted: tuple[str, ...] = free_replay("notes' wording", default=())
    unit_label: str | None = free_replay("notes' wording", default=None)
    command: str = "histogram"
    target: MarginTarget | None = free_replay("margin targets (the ε they resolve to is bound)", default=None)
    chosen: Choice | None = free_replay("margin targets (the ε they resolve to is bound)", default=None)
    kept: KeptBounds | None = None
    choose_left_out: bool = False
    left_out_stays: str | None = free_replay("notes' wording", default=None)
    left_out_chosen: tuple[str, ...] = free_replay("notes' wording", default=())
    #: The CLI's default when neither ``--report-bias`` nor ``--no-report-bias`` is given: a bias report at
    #: :data:`bias_report.BIAS_SHARE` wherever the release can pay for one (:meth:`with_defaults`).
    report_bias_left_out: bool = bound_elsewhere("the query's bias_share, which it sets", default=False)
    listed: int | None = bound_elsewhere("the public list's digest (its number of groups)", default=None)

    def with_defaults(self, mode: str | None) -> HistogramTask:
        """The bounds left out chosen from the data where they can be (:meth:`_choose_left_out`), then the bias
        report left out added where it can be (:meth:`_report_left_out`); ``mode``: the ledger's (None: not
        known yet). Both decided from public inputs only."""
        return self._choose_left_out(mode)._report_left_out(mode)

    def _report_left_out(self, mode: str | None) -> HistogramTask:
        """With ``report_bias_left_out``, a bias report at :data:`bias_report.BIAS_SHARE` of the budget, unless
        the release cannot have one: where bounds cannot be chosen either (:func:`_left_out_stays`: a br ledger,
        unklap, a margin target, …), when the query's shares would leave the release less than half, when the
        report's noise cannot be drawn, or when no bound in force can cut (count-units over one group)."""
        if not self.report_bias_left_out:
            return self
        task = replace(self, report_bias_left_out=False)
        q = task.query
        share = bias_report.BIAS_SHARE
        if (q.bias_share is not None or _left_out_stays(task, mode) is not None
                or (q.auto is not None and q.auto.any and q.auto.share + share > Fraction(1, 2))
                or not bias_report.can_report(q.epsilon, q.rho, share)
                or not bias_report.bias_parts(q.shape, q.given(), rows=q.counts_rows)):
            return task
        return replace(task, query=replace(q, bias_share=share))

    def _choose_left_out(self, mode: str | None) -> HistogramTask:
        """With ``choose_left_out`` (the CLI's default), the bounds left out (``defaulted``: the caps, and
        ``bounds`` for a value aggregation) chosen from the data as ``auto`` at :data:`auto_bounds.AUTO_SHARE`,
        wherever ``auto`` runs: not in a ``br`` ledger (``mode``; None: not known yet), with unklap, with a
        margin target, with a grid spacing but no bounds, nor when the choice's share of ε is too small to draw
        its noise (:func:`auto_bounds.check_choice`). There the caps stay at 1 and ``left_out_stays`` says
        why. Every reason is a public input: the choice never depends on the data."""
        if not self.choose_left_out:
            return self
        q = self.query
        caps = [f for f in ("max_partitions", "max_contributions") if f in self.defaulted]
        values = "bounds" in self.defaulted and q.value is not None and q.granularity is None
        if not caps and not values:
            return replace(self, choose_left_out=False)
        why = _left_out_stays(self, mode)
        if why is not None:
            return replace(self, choose_left_out=False, left_out_stays=why)
        asked = q.auto or auto_bounds.AutoBounds(False, False, False)
        request = auto_bounds.AutoBounds(asked.partitions or "max_partitions" in caps,
                                         asked.contributions or "max_contributions" in caps, asked.values or values,
                                         q.auto.share if q.auto else auto_bounds.AUTO_SHARE)
        chosen = replace(q, auto=request)
        try:
            auto_bounds.check_choice(choice_epsilon(chosen))
        except UsageError:
            return replace(self, choose_left_out=False, left_out_stays="an ε too small to spend a share on them")
        return replace(self, query=chosen, choose_left_out=False, left_out_chosen=(*caps, *(["bounds"] * values)),
                       defaulted=tuple(f for f in self.defaulted if f not in caps and f != "bounds"))

    def for_ledger(self, mode: str) -> HistogramTask:
        """The task for a ledger's mode: the bounds left out chosen where they can be (:meth:`with_defaults`),
        Gaussian noise on a zcdp ledger unless chosen, and a target's ε or ρ chosen (from the query alone: the
        seed then binds that value, like a given one)."""
        task = self.with_defaults(mode)
        if not task.noise_given and mode == "zcdp":
            task = replace(task, query=replace(task.query, noise="gaussian"), noise_given=True)
        if task.target is None:
            return task
        from dpcli.tasks.histogram.target import choose

        choice = choose(task.query, task.target, mode)
        return replace(task, query=choice.query, target=None, chosen=choice)

    def with_list_groups(self, groups: Callable[[], dict[str, int]]) -> HistogramTask:
        """For a dry run: the number of groups of the public list (``groups``: counted from the lists, called only
        when a partition bound is chosen from a list), which caps the K ``auto`` can choose."""
        q = self.query
        if q.domain != "keys" or q.auto is None or not q.auto.partitions:
            return self
        return replace(self, listed=groups().get("keys"))

    def budget_hint(self, pays: Callable[[list[PrivacyEvent]], bool]) -> str | None:
        """With a target: the best margins a ledger that refuses the chosen ε could pay (None without)."""
        if self.chosen is None:
            return None
        from dpcli.tasks.histogram.target import reachable

        return reachable(self.chosen, pays)

    def at_epsilon(self, epsilon: Fraction) -> HistogramTask:
        """The same query at a schedule run's ε."""
        return replace(self, query=replace(self.query, epsilon=epsilon))

    def keeping(self, chosen: AutoReport) -> HistogramTask:
        """A later run of a schedule whose first run chose its ``auto`` bounds: ``chosen`` (the schedule's state
        keeps them) given as bounds, no part choosing them (the run's whole ε goes to the release), and the
        release's metadata saying they were kept. In a dry run, bounds not chosen yet are missing from
        ``chosen``: the margins that depend on them are "chosen at run time". A query without ``auto``: itself."""
        q = self.query
        if q.auto is None or not q.auto.any:
            return self
        pending = auto_bounds.AutoBounds(q.auto.partitions and "max_partitions" not in chosen,
                                         q.auto.contributions and "max_contributions" not in chosen,
                                         q.auto.values and "bounds" not in chosen)
        in_force = auto_bounds.chosen_of(chosen, q.given())
        kept = replace(q, auto=None, max_partitions=in_force.max_partitions or 1,
                       max_contributions=in_force.max_contributions,
                       bounds=in_force.bounds or ((0.0, 1.0) if q.auto.values else q.bounds))
        return replace(self, query=kept, kept=KeptBounds(chosen.copy(), pending))

    def schedule_mode(self, ledger_mode: str) -> str:
        """Each run of a schedule is planned in the ledger's mode."""
        return ledger_mode

    def check_schedulable(self) -> None:
        """Refuse a query no schedule can run (each run's ε comes from the schedule: planned per run). ``auto``
        bounds are chosen by the schedule's first run and kept (:meth:`keeping`); no bias report."""
        if self.query.domain != "keys" or self.query.noise != "laplace":
            raise UsageError("a schedule runs pure ε-DP releases: give --keys (and Laplace noise)")
        if self.query.bias_share is not None:
            raise UsageError("--report-bias is not offered with --schedule: run it once without --schedule")
        self.query.validate()

    def schedule_query(self, lists: Mapping[str, str]) -> dict[str, Any]:
        """What names a schedule besides its name: the query without its ε, and the keys' fingerprint."""
        query = {k: v for k, v in self.query.canonical().items() if k != "epsilon"}
        return {"command": "histogram", **query, "keys": lists["keys"]}

    def check(self) -> None:
        """Refuse an inconsistent query (one-line usage errors) before anything else is read."""
        self.with_defaults(None).query.validate()
        if self.target is not None:
            from dpcli.tasks.histogram.target import column_limits

            if self.query.epsilon is not None or self.query.rho is not None:
                raise UsageError("chooses the budget: leave out ε and ρ", field=self.target.field)
            limits = column_limits(self.query, self.target)
            check_target_bounds(self.query.auto, limits, self.target.field)

    def check_lists(self, lists: Mapping[str, pl.DataFrame | pl.LazyFrame]) -> None:
        """Nothing in its public lists can refuse this task before it runs (their columns are checked on opening)."""

    def needs(self) -> Needs:
        q = self.query
        columns: dict[str, Any] = {q.unit: "key", **dict.fromkeys(q.by, "key")}
        if q.value:
            columns[q.value] = "value"
        return Needs(columns, {"keys": PublicList(q.by)} if q.domain == "keys" else {})

    def plan(self, mode: str, limits: Mapping[str, Fraction]) -> HistogramPlan:
        return plan_histogram(self.query, mode, dict(limits))

    def describe(self, plan: HistogramPlan) -> HistogramDryRun:
        described = describe_plan(self.query, plan)
        if self.chosen is not None:
            described["target"] = self.chosen.to_json()
        if self.query.auto is not None and self.query.auto.any:
            unknown_margins(self.query.auto, described, largest_cap_margins(self.query, plan.ledger, self.listed))
        if self.kept is not None and self.kept.pending.any:
            unknown_margins(self.kept.pending, described)
        return described

    def run(self, frames: Frames, plan: HistogramPlan, seed: bytes, engine: Engine | None) -> Result:
        q = self.query
        stream = KeyedStream(seed, "histogram")
        release_q, release_plan, in_force = q, plan, None
        if plan.parts is not None:
            if engine is not None:
                raise UsageError("auto bounds and --report-bias are computed by the polars engine only", field="engine")
            release_q, release_plan, in_force = resolve_bounds(q, plan, frames, stream)
        keys = frames.lists.get("keys")
        released = run_histogram(frames.data, release_q, release_plan, stream,
                                 keys if isinstance(keys, pl.DataFrame) else None, name=frames.name, rows=frames.rows,
                                 engine=engine.totals if engine else None,
                                 quantile_engine=engine.quantile_counts if engine else None)
        metadata: HistogramReport = {
            "command": "histogram",
            "groups": released.groups_released,
            "aggregations": list(q.aggregations),
            "max_partitions": release_q.max_partitions,
            "max_contributions": release_q.max_contributions,
            "split": plan.summary.get("split"),
            "threshold": release_plan.threshold,
            **released.metadata,
        }
        if release_q.grid is not None and {"mean", "variance"} & set(q.aggregations):  # (dpcli diff's means)
            metadata["bounds"] = [release_q.grid.lo, release_q.grid.hi]
        if q.epsilon is not None:
            metadata["epsilon"] = fraction_text(q.epsilon)
        if self.chosen is not None:
            metadata["target"] = self.chosen.to_json()
        if in_force is not None:
            metadata = {**metadata, **parts_metadata(q, frames, in_force, stream)}
        if self.kept is not None:
            metadata["auto"] = {**self.kept.chosen, "kept": True}
        return Result(released.table, metadata)

    def summary(self, name: str, result: Result) -> str:
        report = result.metadata
        assert report["command"] == "histogram"
        line = f"histogram of {name}: {report['groups']} group(s) released"
        if report.get("threshold") is not None:
            line += f" (threshold {report['threshold']} noisy units)"
        return line + auto_bounds.chosen_text(report.get("auto"))

    def notes(self, plan: HistogramPlan, result: Result) -> list[Note]:
        from dpcli import advice

        q, report = self.query, result.metadata
        assert report["command"] == "histogram"
        if plan.parts is not None:  # the notes read the release as it ran: at the bounds in force, and its plan
            q = q.release_query(auto_bounds.chosen_of(report.get("auto"), q.given()))
            plan = plan_histogram(q, *plan.ledger)
        in_force = {"max_partitions": q.max_partitions, "max_contributions": q.max_contributions, "bounds": q.bounds}
        unit, bias = self.unit_label or q.unit, report.get("bias")
        chosen = [f for f in report.get("auto") or {} if f in in_force]
        levels = {a: float(p) for a in q.aggregations if (p := parse_quantile(a)) is not None}
        return [*advice.histogram_notes(q, plan, result.table, self.defaulted, self.unit_label),
                *advice.left_out(self.left_out_chosen, report.get("auto"), self.left_out_stays,
                                 [f for f in self.defaulted if f == "max_partitions" or (f == "max_contributions"
                                  and set(q.aggregations) & {"count", "sum", "mean", "variance"})]),
                *advice.bias_report(unit, bias, in_force), *advice.bias_beyond_margin(q, plan, result.table, unit,
                                                                                      bias, levels, chosen)]
