"""``dpcli stream-replay`` as a :class:`dpcli.tasks.Task`: one whole replay of an input (a run against a
``--state`` file is :mod:`dpcli.release.streams`, with the same query and plan)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

from dpcli.tasks import Engine, Frames, Needs, Result
from dpcli.tasks.stream.algorithm import trigger_through
from dpcli.tasks.stream.notes import empty_run
from dpcli.tasks.stream.plan import StreamPlan, margins95, margins95_by_trigger, plan_stream, with_margins
from dpcli.tasks.stream.query import StreamQuery
from dpcli.tasks.stream.run import run_stream


@dataclass(frozen=True)
class StreamTask:
    """A replay of every trigger ending at or before ``through`` (None: now); ``with_error`` adds the
    95% margins (post-processing: not part of the seed)."""

    query: StreamQuery
    through: datetime | None = None
    with_error: bool = False
    command: str = "stream-replay"

    def for_ledger(self, mode: str) -> StreamTask:
        return self

    def check(self) -> None:
        """Refuse an inconsistent query (one-line usage errors) before anything else is read."""
        self.query.validate()

    def needs(self) -> Needs:
        q = self.query
        # In this order (time, unit, keys, value): the order of the columns read as text is part of how the
        # input was read, and so of the seed.
        columns: dict[str, Any] = {q.time: "temporal", q.unit: "key", **dict.fromkeys(q.keys, "key")}
        if q.value:
            columns[q.value] = "any"  # numeric or text (parsed per record; unparsable values are dropped)
        return Needs(columns)

    def plan(self, mode: str, limits: Mapping[str, Fraction]) -> StreamPlan:
        return plan_stream(self.query)

    def describe(self, plan: StreamPlan) -> dict[str, Any]:
        return {"query": self.query.canonical(), **plan.summary, "moe95": margins95(self.query, plan),
                "moe95_by_trigger": margins95_by_trigger(self.query, plan), "cost": [e.to_json() for e in plan.events]}

    def seed_query(self) -> dict[str, Any]:
        # v2: records that cannot count are dropped (v1 refused the file or counted null values as 0).
        return {"command": "stream-replay", "v": 2, **self.query.canonical()}

    def run(self, frames: Frames, plan: StreamPlan, seed: bytes, engine: Engine | None) -> Result:
        released = run_stream(frames.data, self.query, plan, seed, self.through, name=frames.name,
                              engine=engine.stream_events if engine else None)
        return Result(self.margins(released.table, plan), {"command": "stream-replay", **released.metadata})

    def margins(self, table: Any, plan: StreamPlan) -> Any:
        """``table`` with its 95% margins when asked for (post-processing of released values)."""
        return with_margins(table, self.query, plan) if self.with_error else table

    def summary(self, name: str, result: Result) -> str:
        return (f"stream-replay of {name}: {result.metadata['releases']} release row(s), "
                f"triggers run through {result.metadata['through']}")

    def notes(self, plan: StreamPlan, result: Result) -> list[Any]:
        """Why nothing was released, when nothing was (public: the triggers run and the released row count)."""
        if result.metadata["releases"]:
            return []
        through = trigger_through(datetime.fromisoformat(result.metadata["through"]), self.query.step)
        return [empty_run(through, None, self.query.step, kept=False)]
