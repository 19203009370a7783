"""The papers' algorithms as tasks: what a release computes, without I/O or state.

Every command's release is one :class:`Task` run by :func:`dpcli.release.path`: the task says
which inputs it reads (:meth:`Task.needs`), plans its noise from the ledger's mode and limits
(:meth:`Task.plan`: the events the release reserves, decided before any data is read), computes
on the opened frames with its keyed seed (:meth:`Task.run`), and describes the result
(:meth:`Task.summary`, :meth:`Task.notes`). The release path does the rest, in one order for
every task: limits → plan once → payable? → open → seed → run → charge. A task's optional capabilities are
declared in :class:`Task` with what a task without them does (:class:`TaskDefaults`, which every task
inherits): ``check_inputs(frames, plan)``, its own check of its inputs' schemas beyond :class:`Needs`'
column kinds (after opening and before the debit, and in a dry run on the schemas declared: no record
read); ``with_list_groups``, a dry run's count of a public list's groups; ``budget_hint``, what a refused
margin target could have within the ledger's budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar, runtime_checkable

if TYPE_CHECKING:
    import polars as pl

    from dpcli.advice import Note
    from dpcli.bounding import BoundingSpec, TotalsEngine
    from dpcli.core.events import PrivacyEvent
    from dpcli.io.schemas import ColumnKind
    from dpcli.tasks.dry_runs import TaskDryRun
    from dpcli.tasks.reports import AutoReport, Report
    from dpcli.tasks.sql.plan import SqlPlan
    from dpcli.tasks.sql.run import Layout
    from dpcli.tasks.sql.task import SqlTask
    from dpcli.tasks.stream.query import StreamQuery
    from dpcli.tasks.tabulate.query import Spec
    from dpcli.tasks.tabulate.run import LevelCounts


#: What a release may change and stay a free replay (the same seed, the same noise), in one place: each
#: acts only after the noise, on the released table or how it is shown, and each has a test that
#: changing it is a free replay (``tests/attacks/test_rule1_seed_binds_what_is_read.py``). The seed is
#: built from every field of the resolved task (:func:`dpcli.release.seeds.task_material`), except the
#: fields marked with :func:`free_replay` and the options that never reach a task (``-o``, ``--format``,
#: ``--json``). A margin target acts before the noise, but only through the ε it resolves to (and the
#: plan made at that ε), both bound: a release at that ε spelt out is the same release. An ``sql``
#: output alias is free only where it names nothing read: with ``--keys`` a GROUP BY key's alias names
#: the list column read, and :class:`dpcli.release.seeds.Reads` binds it.
FREE_REPLAY: tuple[str, ...] = (
    "output path (-o)",
    "output format (--format)",
    "--json",
    "--with-error",
    "sql output aliases",
    "sql SELECT order",
    "sql HAVING",
    "sql ORDER BY",
    "sql LIMIT",
    "stream-replay --through",
    "notes' wording",
    "margin targets (the ε they resolve to is bound)",
)


#: A field's type (:func:`free_replay`, :func:`bound_elsewhere`: the field is typed as its default is).
F = TypeVar("F")


def free_replay(*labels: str, default: F) -> F:
    """A dataclass field that acts only after the noise, left out of the release seed: ``labels`` are the
    :data:`FREE_REPLAY` entries it holds (refused if one is not listed)."""
    unknown = [label for label in labels if label not in FREE_REPLAY]
    if unknown or not labels:
        raise ValueError(f"not listed in FREE_REPLAY: {unknown}")
    return field(default=default, metadata={"free_replay": labels})


def bound_elsewhere(by: str, default: F) -> F:
    """A dataclass field that acts before the noise only through what another part of the seed material
    binds by content (``by`` says which): left out of the task's material, so the seed does not depend on
    it twice, nor on where files lie (a spec's directory locates its block list, bound by its digest)."""
    return field(default=default, metadata={"bound_elsewhere": by})


class QuantileCounts(Protocol):
    """``histogram``'s quantile counts on another engine: (the bounding spec, the salt) → per group the grid offset
    ``__x`` of each bounded value and ``__n`` of them (:func:`dpcli.spark.bounding.quantile_counts`)."""

    def __call__(self, spec: BoundingSpec, salt: int, /) -> pl.DataFrame: ...


class TabulateCounts(Protocol):
    """``tabulate``'s counts on another engine: (the spec, the public block list) → each level's bounded counts
    (:data:`dpcli.tasks.tabulate.run.CountsEngine`; :func:`dpcli.spark.tabulate.level_counts`)."""

    def __call__(self, spec: Spec, blocks: pl.DataFrame, /) -> LevelCounts: ...


class StreamEvents(Protocol):
    """``stream-replay``'s bounded events on another engine: (query, through, after, each unit's records used so far,
    the unit column's type) → the events :func:`dpcli.tasks.stream.events.prepare_events` gives
    (:data:`dpcli.tasks.stream.events.EventsEngine`; :func:`dpcli.spark.stream.events_engine`)."""

    def __call__(self, q: StreamQuery, through: int | None, after: int | None, used: Mapping[Any, int] | None,
                 unit_type: pl.DataType, /) -> pl.DataFrame: ...


class SqlTotals(Protocol):
    """``sql``'s data pass on another engine: (the task, its plan, the per-user layout, the salt, the per-user frame's
    schema) → the bounded totals and the NTILE bins (:func:`dpcli.spark.sql.sql_engine`)."""

    def __call__(self, task: SqlTask, plan: SqlPlan, layout: Layout, salt: int, schema: pl.Schema,
                 /) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]: ...


class Precheck(Protocol):
    """What an engine refuses from the input's schema alone (``task`` → None, or a one-line error): called before the
    seed and the debit, so a query the engine cannot run costs nothing."""

    def __call__(self, task: Task[Any], /) -> None: ...


@dataclass(frozen=True)
class Engine:
    """Bounding on another engine than polars (``--engine spark``: :func:`dpcli.spark.engine.bounding_engine`):
    the functions a task may hand its data pass to, and what enters the release seed.

    ``seed_tag`` enters the release seed. The CLI always sets one for Spark: the engines compute
    the same totals (selection v3, one number grammar; ``tests/test_spark.py``), but if they ever
    diverged silently (a reader that skips a file, two CSV parsers splitting a damaged record
    differently), a "free replay" across engines would reuse the noise over different values and
    publish their exact difference. So a Spark release has its own noise and its own charge. An
    empty tag (tests) gives polars' seed, and then the release is byte-identical to polars'.
    """

    totals: TotalsEngine
    seed_tag: str = ""
    #: One data pass per task (None: the task's own, on polars): :class:`QuantileCounts`, :class:`TabulateCounts`,
    #: :class:`StreamEvents`, :class:`SqlTotals`; and the engine's refusals before the debit (:class:`Precheck`).
    quantile_counts: QuantileCounts | None = None
    tabulate_counts: TabulateCounts | None = None
    stream_events: StreamEvents | None = None
    sql_totals: SqlTotals | None = None
    precheck: Precheck | None = None


@dataclass(frozen=True)
class PublicList:
    """A public list a task reads besides its data: its columns (read as text), and whether they are
    cast to the data's types (a list of groups) or kept as text (a block list)."""

    columns: tuple[str, ...]
    cast_to_data: bool = True
    #: The error when no source is given for it (None: the list is optional); message text, not in the seed.
    missing: str | None = field(default=None, compare=False)
    #: A list of groups (or blocks groups are enumerated from): its rows decide the partitions, and their
    #: digest enters the seed (:func:`dpcli.release.inputs.partition_digest`). False: a public table (sql).
    groups: bool = True


@dataclass(frozen=True)
class Needs:
    """The inputs a task reads: the data's columns (each read as text from CSV and NDJSON, so a type
    never depends on a record) with how each is checked, and the public lists by their seed role.

    All of it enters the release seed (:class:`dpcli.release.seeds.Reads`, by
    :func:`dpcli.release.seeds.plan_material`: every compared field), so what is read of an input,
    and which list column becomes which group, is bound for every format."""

    columns: Mapping[str, ColumnKind]
    lists: Mapping[str, PublicList] = field(default_factory=dict)
    #: False: the task checks the data's columns itself (tabulate, against its spec).
    check_columns: bool = True
    #: Inputs read before the release (a tabulation's spec), by their seed role: anything with
    #: ``seed_material()`` (:class:`dpcli.release.seeds.DocumentInput`).
    documents: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Frames:
    """The opened inputs as a task computes on them: the data's lazy frame, its public name, its row
    count when known without a pass (Parquet metadata), and each public list's frame by role."""

    data: pl.LazyFrame
    name: str
    rows: int | None
    schema: pl.Schema
    lists: Mapping[str, pl.DataFrame | pl.LazyFrame] = field(default_factory=dict)
    #: The roles (``data``, a list's) of the inputs whose column types are schema (Parquet: a String column
    #: is text, never numbers to parse); the others are CSV or NDJSON, whose columns are read as text.
    typed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Result:
    """A task's release, computed in memory: the noisy table, its public report (:mod:`dpcli.tasks.reports`: one
    typed report per task, read by name), and what it actually cost when that is less than what was reserved
    (topk's ⊥ in a br ledger)."""

    table: pl.DataFrame
    metadata: Report
    actual: list[PrivacyEvent] | None = None
    #: Columns of moments the task computed (naive datetimes in UTC), which text outputs show as ISO 8601 with
    #: ``Z`` (:func:`dpcli.io.outputs.shown`); datetime columns from the data are not among them.
    times: tuple[str, ...] = ()


class Plan(Protocol):
    """A task's calibration: every field of it enters the release seed (:func:`dpcli.release.seeds.plan_material`)."""

    @property
    def events(self) -> Sequence[PrivacyEvent]: ...


#: A task's own plan type (:class:`dpcli.tasks.histogram.HistogramPlan`, …).
P = TypeVar("P", bound=Plan)


class Task(Protocol[P]):
    """One kind of release (see the module docstring), planned as a ``P``."""

    @property
    def command(self) -> str:
        """The command that makes it, as the ledger records it (``histogram``, ``topk``, …)."""
        ...

    def check(self) -> None:
        """Refuse an inconsistent query (one-line usage errors): public inputs first, before any state."""
        ...

    def for_ledger(self, mode: str) -> Task[P]:
        """The task with the ledger's defaults filled in (a zcdp ledger: Gaussian noise)."""
        ...

    def needs(self) -> Needs: ...

    def check_lists(self, lists: Mapping[str, pl.DataFrame | pl.LazyFrame]) -> None:
        """Refuse (one-line usage or data error) what the public lists alone show wrong, once they are read and
        before the release is debited: a query its lists cannot serve costs nothing."""
        ...

    def plan(self, mode: str, limits: Mapping[str, Fraction]) -> P: ...

    def describe(self, plan: P) -> TaskDryRun:
        """The plan for ``--dry-run``: each measurement's noise and margin (public inputs only), typed
        (:mod:`dpcli.tasks.dry_runs`)."""
        ...

    def run(self, frames: Frames, plan: P, seed: bytes, engine: Engine | None) -> Result: ...

    def summary(self, name: str, result: Result) -> str:
        """The one public line of a release (public parameters and noisy counts only)."""
        ...

    def notes(self, plan: P, result: Result) -> list[Note]:
        """Notes that change how to read the release, from public inputs and the noisy output only."""
        ...

    def check_inputs(self, frames: Frames, plan: P) -> None:
        """Refuse (one line) what the inputs' schemas alone show the query cannot use, before the debit and in a
        dry run on the declared schemas (``dpcli sql``'s types, ``stream-replay``'s value column, ``tabulate``'s
        spec columns); its messages follow the service-mode rule themselves (no column type named to an analyst)."""
        ...

    def with_list_groups(self, groups: Callable[[], dict[str, int]]) -> Task[P]:
        """For a dry run: the task knowing how many groups each public list holds (``groups``, called only if the
        plan needs it: histogram's ``auto`` K never exceeds the listed groups)."""
        ...

    def budget_hint(self, pays: Callable[[list[PrivacyEvent]], bool]) -> str | None:
        """With a margin target the ledger refuses: the best margins a cost ``pays`` accepts could give (None:
        nothing to say)."""
        ...


class TaskDefaults:
    """What a task without one of :class:`Task`'s optional capabilities does (every task inherits it): no check
    of its own on the schemas, no use for a list's size in a dry run, no hint when refused."""

    def check_inputs(self, frames: Frames, plan: Any) -> None:
        return None

    def with_list_groups(self, groups: Callable[[], dict[str, int]]) -> Self:
        return self

    def budget_hint(self, pays: Callable[[list[PrivacyEvent]], bool]) -> str | None:
        return None


@runtime_checkable
class SchedulableTask(Task[P], Protocol[P]):
    """A task a ``--schedule`` can run (histogram and topk): each run at the ε the schedule gives it."""

    def check_schedulable(self) -> None:
        """Refuse a query no schedule can run (before any state is read)."""
        ...

    def at_epsilon(self, epsilon: Fraction) -> SchedulableTask[P]:
        """The same query at a schedule run's ε."""
        ...

    def schedule_query(self, lists: Mapping[str, str]) -> dict[str, Any]:
        """What names a schedule besides its name (the query without its ε, the public lists' fingerprints)."""
        ...

    def schedule_mode(self, ledger_mode: str) -> str:
        """The accounting mode each run is planned in (top-k: pure, its runs' cost; a histogram: the ledger's)."""
        ...

    def keeping(self, chosen: AutoReport) -> SchedulableTask[P]:
        """A later run at the ``auto`` bounds the schedule's first run chose (its state keeps them)."""
        ...


@dataclass(frozen=True)
class ExpectedSize:
    """A size the user states for a dry run (``--rows``, or ``--units``): sizes are private, so dpcli never
    reads one from the data, and a plan that needs one (a schedule's epochs, a margin relative to a count)
    takes it as a public input. ``first`` is the size of the next run; ``last``, of the last run planned, the
    sizes in between growing geometrically (equal to ``first``: no growth), unless ``each`` states every run's
    size (the last stated holds for the runs after it). ``counts`` says what the size counts: ``rows`` (bounded
    rows: a relative margin's, a schedule's under fixed or bbimprover) or ``units`` (distinct privacy units:
    what a bbscheduler's epochs follow)."""

    first: int
    last: int
    each: tuple[int, ...] = ()
    counts: str = "rows"

    @property
    def option(self) -> str:
        """The option that stated it (``--rows`` or ``--units``)."""
        return f"--{self.counts}"

    @property
    def growth(self) -> str:
        """How the sizes between the stated ones are taken (said in the plan)."""
        if self.each:
            return "as stated run by run"
        return "constant" if self.first == self.last else "growing by a constant factor per run (geometric)"

    def sizes(self, runs: int) -> list[int]:
        """The stated size of each of ``runs`` runs: ``each``, or ``first`` … ``last`` by a constant factor per run."""
        if self.each:
            return [self.each[min(j, len(self.each) - 1)] for j in range(runs)]
        if runs == 1 or self.first == self.last:
            return [self.first] * runs
        ratio = self.last / self.first
        return [max(1, round(self.first * ratio ** (j / (runs - 1)))) for j in range(runs)]
