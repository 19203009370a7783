"""``dpcli stream-replay`` as a :class:`dpcli.tasks.Task`: one whole replay of an input, or one run of a stream kept
in a ``--state`` file (fed the stream its state holds: :class:`dpcli.tasks.stream.run.StreamFeed`; the state file
itself, its lock and its ledger steps are :mod:`dpcli.release.streams`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dpcli.errors import UsageError
from dpcli.tasks import Engine, Frames, Needs, Result, TaskDefaults, bound_elsewhere, free_replay
from dpcli.tasks.dry_runs import StreamDryRun
from dpcli.tasks.reports import StreamReport
from dpcli.tasks.stream.algorithm import TIME_COLUMNS, trigger_through
from dpcli.tasks.stream.auto import choose, chosen_line, resolve
from dpcli.tasks.stream.notes import empty_run
from dpcli.tasks.stream.plan import (
    PendingPlan,
    StreamPlan,
    margins95,
    margins95_by_trigger,
    plan_pending,
    plan_stream,
    with_margins,
)
from dpcli.tasks.stream.query import StreamQuery
from dpcli.tasks.stream.run import StreamFeed, advance_stream, run_stream

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class StreamTask(TaskDefaults):
    """A replay of every trigger ending at or before ``through`` (None: now); ``with_error`` adds the
    95% margins (post-processing: not part of the seed)."""

    query: StreamQuery
    through: datetime | None = free_replay("stream-replay --through", default=None)
    with_error: bool = free_replay("--with-error", default=False)
    command: str = "stream-replay"
    #: With ``auto`` bounds or the bias report, the last trigger the choice reads (set by :meth:`for_ledger`,
    #: bound by the seed): the choice reads the events of every trigger up to it, so a later ``--through``
    #: chooses on other events and must not reuse the seed (issue 37). A replay that chooses nothing keeps
    #: one seed whatever ``--through``: a later one only adds the rows of later triggers, each trigger's
    #: noise its own.
    chosen_through: int | None = None
    #: A run against a ``--state`` file: the stream its state holds, fed this run's input (None: a whole replay).
    feed: StreamFeed | None = bound_elsewhere("a stream state's seed (made once, at the stream's creation) and each "
                                              "run's step digest in the ledger", default=None)

    def for_ledger(self, mode: str) -> StreamTask:
        """The task of one run, its moment fixed once (``through``, default now): the seed and the run then see
        the same last trigger (``chosen_through``, when the run chooses bounds)."""
        task = self if self.through is not None else replace(self, through=datetime.now(UTC))
        if task.chooses:
            assert task.through is not None
            task = replace(task, chosen_through=trigger_through(task.through, self.query.step))
        return task

    def check(self) -> None:
        """Refuse an inconsistent query (one-line usage errors) before anything else is read."""
        self.query.validate()

    def check_lists(self, lists: Mapping[str, pl.DataFrame | pl.LazyFrame]) -> None:
        """Nothing in its public lists can refuse this task before it runs (their columns are checked on opening)."""

    def check_inputs(self, frames: Frames, plan: object) -> None:
        """The value column by the rule of every value column, from the schema alone and before any debit
        (:func:`dpcli.io.schemas.check_schema`, kind ``value``: in Parquet a numeric type, since its text,
        booleans or dates would be summed as nothing but noise; in CSV and NDJSON text parsed per record).
        Checked here rather than as the kind :meth:`needs` gives it (``any``), because that kind enters the
        release seed: the same replay keeps the seed, and the noise, it had."""
        from dpcli.io.schemas import SchemaOf, check_schema

        if self.query.value is not None:  # (the column is there: require_columns found it)
            fmt = "parquet" if "data" in frames.typed else "csv"
            check_schema(frames.schema, {self.query.value: "value"}, SchemaOf(frames.name, fmt))

    def needs(self) -> Needs:
        q = self.query
        # In this order (time, unit, keys, value): the order of the columns read as text is part of how the
        # input was read, and so of the seed.
        columns: dict[str, Any] = {q.time: "temporal", q.unit: "key", **dict.fromkeys(q.keys, "key")}
        if q.value:
            columns[q.value] = "any"  # its type: :meth:`check_inputs` (this kind enters the seed)
        return Needs(columns)

    @property
    def chooses(self) -> bool:
        """Does a run read the data for more than DP-SQLP: ``auto`` bounds or the bias report?"""
        return self.query.auto is not None or self.query.report_bias is not None

    def plan(self, mode: str, limits: Mapping[str, Fraction]) -> StreamPlan | PendingPlan:
        """The calibration, or with ``auto`` bounds the cost and what is known before they are chosen."""
        if mode == "br" and self.chooses:
            raise UsageError("auto bounds and --report-bias are not available on a br ledger (its accounting knows "
                             "one mechanism per release)")
        return plan_pending(self.query) if self.query.pending else plan_stream(self.query)

    def describe(self, plan: StreamPlan | PendingPlan) -> StreamDryRun:
        calibration = plan.summary
        described: StreamDryRun = {"query": self.query.canonical(), "key_selection": calibration["key_selection"],
                                   "perturbation": calibration["perturbation"], "levels": calibration["levels"]}
        if "parts" in calibration:
            described["parts"] = calibration["parts"]
        if isinstance(plan, PendingPlan):
            by_trigger = plan.moe95_by_trigger
            described.update({"moe95": {c: m[-1] for c, m in by_trigger.items()}, "moe95_by_trigger": by_trigger,
                              "moe95_chosen_at_run_time": list(plan.chosen_at_run_time)})
        else:
            described.update({"moe95": margins95(self.query, plan),
                              "moe95_by_trigger": margins95_by_trigger(self.query, plan)})
        described["cost"] = [e.to_json() for e in plan.events]
        return described

    def run(self, frames: Frames, plan: StreamPlan | PendingPlan, seed: bytes, engine: Engine | None) -> Result:
        """The replay; with ``auto`` bounds (or the bias report) first the choice on the same records, then the
        replay at the chosen bounds (planned again: the same events). With a :attr:`feed`, one run of the stream
        its state holds instead (:meth:`_advance`)."""
        if self.feed is not None:
            assert isinstance(plan, StreamPlan) and seed == self.feed.stream.seed  # (at the stream's kept bounds)
            return self._advance(self.feed, frames, plan, engine)
        q, moment = self.query, self.through or datetime.now(UTC)
        extra: StreamReport = {}
        if self.chooses:
            if engine is not None:
                raise UsageError("auto bounds and --report-bias are chosen by the polars engine only")
            choice = choose(frames.data, q, seed, trigger_through(moment, q.step), frames.name)
            q, plan = resolve(q, plan.events, choice)
            extra = choice.metadata(self.query)
        assert isinstance(plan, StreamPlan)
        released = run_stream(frames.data, q, plan, seed, moment, name=frames.name,
                              engine=engine.stream_events if engine else None)
        report: StreamReport = {"command": "stream-replay", **released.metadata, **extra}
        return Result(self.margins(released.table, plan, q), report, times=TIME_COLUMNS)

    def _advance(self, feed: StreamFeed, frames: Frames, plan: StreamPlan, engine: Engine | None) -> Result:
        """One run of a stream kept in a state file: the events of this run's input (none if fed before) and those
        the state kept run in every trigger due by ``feed.through``, the later ones kept
        (:func:`dpcli.tasks.stream.run.advance_stream`); what it released before margins stays in ``feed``."""
        fed = feed.fed_before
        released = advance_stream(frames.data.head(0) if fed else frames.data, feed.stream, feed.through, keep=True,
                                  name=frames.name, engine=None if fed or engine is None else engine.stream_events)
        released.metadata.update(feed.chosen)
        feed.released = released
        report: StreamReport = {"command": "stream-replay", "state": feed.state, **released.metadata}
        return Result(self.margins(released.table, plan), report, times=TIME_COLUMNS)

    def margins(self, table: Any, plan: StreamPlan, query: StreamQuery | None = None) -> Any:
        """``table`` with its 95% margins when asked for (post-processing of released values); ``query``: the
        query at its chosen bounds (default: this task's)."""
        return with_margins(table, query or self.query, plan) if self.with_error else table

    def summary(self, name: str, result: Result) -> str:
        report = result.metadata
        assert report["command"] == "stream-replay"
        return (f"stream-replay of {name}: {report['releases']} release row(s), "
                f"triggers run through {report['through']}{chosen_line(report)}")

    def notes(self, plan: StreamPlan | PendingPlan, result: Result) -> list[Any]:
        """Why nothing was released, when nothing was (public: the triggers run and the released row count)."""
        report = result.metadata
        assert report["command"] == "stream-replay"
        if report["releases"]:
            return []
        through = trigger_through(datetime.fromisoformat(report["through"]), self.query.step)
        return [empty_run(through, None, self.query.step, kept=False)]
