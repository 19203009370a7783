"""Each task's dry run, typed: what ``--dry-run`` says of a release before any record is read (issue 40, item 4).

:meth:`dpcli.tasks.Task.describe` gives one of :data:`TaskDryRun` (:class:`HistogramDryRun`, :class:`TopKDryRun`,
:class:`SqlDryRun`, :class:`StreamDryRun`, :class:`TabulateDryRun`), and a ``--schedule``'s dry run is a
:class:`ScheduleDryRun` (:mod:`dpcli.release.schedule_plan`); :data:`DryRun` is any of them, the
:attr:`dpcli.release.steps.Planned.description` that :mod:`dpcli.cli.render` shows, ``dpcli budget plan`` reads the
margins of, and a schedule's plan reads each run's margins from. ``--dry-run --json`` writes it as it is, so each
key's name and place are part of the interface (a test compares the documents).

What several tasks state alike has one name and one type (:class:`DryRunBase`: the query, the cost, the budget's
parts, a margin target, the threshold, and each measurement's calibration, :class:`MeasurementPlan`); each task adds
its own. Every key may be missing (``total=False``): a task states what its plan has. The dry runs are ``@final``, so
a reader tells them apart by a key (``"count_noise" in plan`` narrows to :class:`TopKDryRun`). Parts no seam reads
by name (the canonical query, a target's choice, a schedule's spec) stay plain mappings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, final

from dpcli.core.mechanisms import NoiseJSON
from dpcli.tasks.reports import EventJSON, StreamCalibration

if TYPE_CHECKING:
    from dpcli.tasks.tabulate.plan import GaussianTotals, GeometricTotals


class MeasurementPlan(NoiseJSON, total=False):
    """One noisy measurement's calibration (a ``calibration`` entry): what it measures, its noise (or the exponential
    mechanism), and its 95% margin in the output column's units: a number, None where the column has none, or
    "chosen at run time" (:data:`dpcli.tasks.auto_bounds.AT_RUN_TIME`) with the margins at caps of 1 (the least)
    and at the largest caps ``auto`` can choose (the most) beside it. A quantile's margin is a rank, in rows."""

    column: str  # the output column(s) it serves, and what it adds noise to
    part: str  # a quantile's interval: which part (its row count, its low or high end)
    share: str  # its share of the budget (sql)
    mechanism: str  # "exponential" (a quantile's): no noise of its own
    moe95: float | str | None
    moe95_at_caps_of_1: float
    moe95_at_largest_caps: float
    rank_moe95: float | str
    rank_moe95_at_caps_of_1: float | str
    rank_moe95_at_largest_caps: float


class LargestCaps(TypedDict):
    """The largest caps ``auto`` can choose (:func:`dpcli.tasks.histogram.plan.largest_cap_margins`), and whether
    their noise can be sampled (false: the margins shown are the most at the caps it can sample)."""

    max_partitions: int
    max_contributions: int
    sampleable: bool


class DryRunBase(TypedDict, total=False):
    """What several tasks' dry runs state alike, under one name and one type."""

    query: dict[str, Any]  # the query's canonical form (histogram, topk, stream-replay)
    cost: list[EventJSON]  # the events a release reserves
    parts: dict[str, str]  # the budget's parts (choosing ``auto`` bounds, the bias report, the release)
    target: dict[str, Any]  # a margin target and the ε or ρ it chose (histogram, topk)
    threshold: int | str | None  # the noisy-unit threshold a group needs, or "chosen at run time" with K
    measurements: list[str]  # the noisy measurements, by name (histogram, sql)
    split: str  # how the budget is split among them
    calibration: dict[str, MeasurementPlan]  # each measurement's noise and 95% margin


@final
class HistogramDryRun(DryRunBase, total=False):
    """``dpcli histogram --dry-run``."""

    quantiles: str  # the quantiles' sampler (:data:`dpcli.tasks.quantile_gaps.QUANTILE_SAMPLER`)
    largest_caps: LargestCaps  # with ``auto`` caps: where the "at the largest caps" margins are


class SelectionJSON(NoiseJSON, total=False):
    """How a top-k without a public list finds its groups: the threshold selection (its noise, threshold, K̄ and
    budget: :meth:`dpcli.tasks.topk.threshold.SelectionPlan.describe`) or UnkGumb's ⊥ (its offset's range and
    k̄: :func:`dpcli.tasks.topk.threshold.unkgumb_offsets`)."""

    method: str  # threshold or unkgumb
    threshold: int
    max_partitions: int
    epsilon: str
    delta: str
    counts: str  # what the counts count
    bottom: str
    offset_min: float
    offset_max: float
    k_bar: str


@final
class TopKDryRun(DryRunBase, total=False):
    """``dpcli topk --dry-run``."""

    guarantee: dict[str, Any]  # the paper's guarantee (ε, δ, its source)
    reserve: list[EventJSON]  # what is reserved before the release (a br ledger's ⊥ may cost less)
    count_noise: NoiseJSON | None  # the released counts' noise (its scale in words with τ ``auto``)
    count_moe95: int | None
    selection: SelectionJSON


class SqlBound(TypedDict):
    """The bound every aggregate of an sql query shares."""

    max_partitions: int | str  # "auto": chosen from the data
    max_rows_per_table: int | None
    per_user_partials: str
    shared_by: int  # the aggregates sharing it


class OwnedTable(TypedDict):
    """An owned table: the table it is owned through, and the keys an owner may have."""

    through: str
    max_keys_per_owner: int


@final
class SqlDryRun(DryRunBase, total=False):
    """``dpcli sql --dry-run``."""

    tables: dict[str, str]  # each table, private or public
    bound: SqlBound
    domain: str
    owned: dict[str, OwnedTable]
    stability: int  # the noise's multiple for the owned tables' duplicated keys
    auto: dict[str, Any]  # what ``auto`` chooses at run time


class StreamStanding(TypedDict, total=False):
    """Where a stream stands for its dry run (:meth:`dpcli.release.stream_runs.StreamRuns.plan`): its state file (None:
    none), the runs it recorded and the reservation covering them, the triggers the next run executes, and each of the
    next runs' cost with their total spend (None: the ledger's mode cannot pay them)."""

    state: str | None
    runs_recorded: int
    covered_by: int | None
    triggers: dict[str, Any]
    runs: list[dict[str, Any]]
    spend: dict[str, Any] | None


@final
class StreamDryRun(DryRunBase, StreamCalibration, total=False):
    """``dpcli stream-replay --dry-run``: the calibration (:class:`dpcli.tasks.reports.StreamCalibration`) and the
    95% margins, worst trigger and trigger by trigger."""

    moe95: dict[str, float]
    moe95_by_trigger: dict[str, list[float]]
    moe95_chosen_at_run_time: list[str]  # columns whose margin depends on an ``auto`` bound
    auto: dict[str, Any]  # the bounds a stream state's first run chose
    stream: StreamStanding


@final
class TabulateDryRun(DryRunBase, total=False):
    """``tabulate``'s plan: from :meth:`dpcli.tasks.tabulate.TabulateTask.describe`, its noise and levels; from
    ``dpcli tabulate --dry-run`` (:func:`dpcli.tasks.tabulate.plan.plan_document`), its spec's tables and the
    ledger's answer."""

    noise: str
    levels: list[str]
    gamma: float
    delta: float
    moe_calibration: str
    geometric: GeometricTotals
    discrete_gaussian: GaussianTotals
    ledger: dict[str, Any]


class RunMargins(TypedDict, total=False):
    """A planned release's 95% margins by column (a number, or "chosen at run time"), the parts of its ε when it
    chooses the ``auto`` bounds, and the count margins relative to a group of average size."""

    moe95: dict[str, float | str]
    parts: dict[str, str]
    moe95_relative: dict[str, float]


class RunPlan(RunMargins, total=False):
    """One planned run of a schedule: its stated size (``rows`` or ``units``), what it releases (new, cached or
    refused), its ε (ρ in a zcdp ledger) and margins, and the ε used of the reservation after it."""

    run: int
    rows: int | None
    units: int | None
    release: str
    refused: str
    epsilon: str
    epoch: int
    rho: str
    epsilon_used: float


class FixedAlternative(RunMargins, total=False):
    """``--scheduler fixed --epsilon E`` over the same runs, and its margins."""

    epsilon: str
    runs: int


@final
class ScheduleDryRun(TypedDict, total=False):
    """``--dry-run --schedule``: the schedule, the sizes stated, its next runs and their spend, the fixed alternative,
    the cost and the reservation that covers the runs (:mod:`dpcli.release.schedule_plan`)."""

    query: dict[str, Any]
    schedule: dict[str, Any]
    rows: dict[str, Any] | None
    units: dict[str, Any] | None
    groups: int | None
    runs: list[RunPlan]
    spend: dict[str, Any]
    fixed_alternative: FixedAlternative | None
    cost: list[EventJSON]
    reservation: int | None


#: What :meth:`dpcli.tasks.Task.describe` gives.
TaskDryRun = HistogramDryRun | TopKDryRun | SqlDryRun | StreamDryRun | TabulateDryRun
#: Any dry run (spelt out: mypy narrows a flat union by ``"key" in plan``, not a union of unions).
DryRun = HistogramDryRun | TopKDryRun | SqlDryRun | StreamDryRun | TabulateDryRun | ScheduleDryRun
