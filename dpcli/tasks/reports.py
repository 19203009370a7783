"""Each task's report, typed: what a release says of itself, read by name (issue 40, item 4).

A task's :class:`dpcli.tasks.Result` carries its report (``metadata``), one TypedDict per command:
:class:`HistogramReport`, :class:`TopKReport`, :class:`TabulateReport`, :class:`SqlReport` and
:class:`StreamReport`; :data:`Report` is any of them, told apart by ``command`` (``assert report["command"] ==
"histogram"`` narrows it). Every report may also hold what the release path adds and reads of any report
(:class:`ReportBase`: the charge's cost, whether it was charged, the seed id, the ledger's receipt, a reservation
made, a scheduled run's ``schedule``; the ``auto`` bounds chosen from the data, the grid released values lie on).
``--json`` writes a charged release's report as it is (its ``summary``); :mod:`dpcli.cli.render`,
:mod:`dpcli.plot.release_view` and the continuations of :mod:`dpcli.release` read it by name. Each key may be
missing (``total=False``): a task builds its report in parts, each part of the report's own type. Nested parts
that no seam reads by name stay plain mappings.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from dpcli.core.schedules import ScheduleLabel

#: A :class:`dpcli.core.events.PrivacyEvent` as JSON (``to_json``): kind, mechanism, ε, δ, ρ, details.
EventJSON = dict[str, Any]


class AutoReport(TypedDict, total=False):
    """The ``auto`` part: the bounds chosen from the data (released, noisy) and the budget that chose them, or the
    bounds a schedule's later run keeps from its first (``kept``)."""

    max_partitions: int
    max_contributions: int
    bounds: list[float]
    reduced: bool  # the chosen bounds' noise could not be sampled: the placeholders were in force instead
    kept: bool  # a schedule's later run: the bounds its first run chose
    epsilon: str
    rho: str


class ReportBase(TypedDict, total=False):
    """What any report may hold besides its task's own parts: what the release path adds to it, and what the
    release path reads of any report."""

    # added by the charge (:func:`dpcli.release.steps.charge`)
    cost: list[EventJSON]  # what was charged (nothing for a run a reservation covers)
    charged: bool  # False: a free replay, a cached or retried run, or one a reservation covers
    seed_id: str
    ledger: dict[str, Any]  # the ledger's receipt and what remains
    reserved: list[EventJSON]  # the reservation this run made (a schedule's or a stream's first run)
    schedule: ScheduleLabel  # a scheduled run's (:mod:`dpcli.release.schedules`)
    # read of any report
    auto: AutoReport  # the bounds chosen from the data (histogram, topk, sql, stream-replay)
    granularity: str | None  # the grid released values are snapped to (histogram, sql): how text rounds them


class HistogramReport(ReportBase, total=False):
    """``dpcli histogram``'s report."""

    command: Literal["histogram"]
    groups: int  # groups released
    aggregations: list[str]
    max_partitions: int | None
    max_contributions: int
    split: str | None  # how the budget was split among the measurements
    threshold: int | None  # the noisy-unit threshold a group needed (``--selection threshold``)
    bottom: int  # UnkLap's noisy ⊥ threshold (``--selection unklap``)
    measurements: dict[str, dict[str, Any]]  # each measurement's share and noise
    margins: dict[str, str]  # how each column's 95% margin was computed (``--with-error``)
    epsilon: str  # the query's ε as given
    target: dict[str, Any]  # a margin target and the ε or ρ it chose
    bias: dict[str, Any]  # the bias report (:meth:`dpcli.tasks.bias_report.BiasReport.to_json`) and its budget
    bounds: list[float]  # the value bounds of a released mean or variance (``dpcli diff`` bounds a mean's change)


class TopKReport(ReportBase, total=False):
    """``dpcli topk``'s report."""

    command: Literal["topk"]
    tau: int  # each unit's rows per group counted (1 for distinct units)
    selection: str  # known, threshold or unkgumb
    threshold: int  # ``--selection threshold``: the noisy-unit threshold, the groups each unit counts in,
    max_partitions: int
    selected: int  # and the groups that passed it
    k_bar: int  # UnkGumb's k̄, the groups it considered and its ⊥ offset
    dbar: int
    bottom_offset: float
    count_noise: dict[str, Any]
    found: int  # groups released
    k: int
    bottom: bool  # fewer than k groups were released
    br_units: int  # a br ledger's units of the release
    guarantee: dict[str, Any]  # the paper's guarantee of the release (ε, δ, its source)
    target: dict[str, Any]
    bias: dict[str, Any]


class TabulateReport(ReportBase, total=False):
    """``dpcli tabulate``'s report."""

    command: Literal["tabulate"]
    noise: str  # geometric or gaussian
    levels: list[dict[str, Any]]  # each level's groups, branches, budget per group and noise
    rows: int  # cells released


class SqlReport(ReportBase, total=False):
    """``dpcli sql``'s report."""

    command: Literal["sql"]
    tables: list[str]
    groups: int  # rows released
    domain: str
    max_partitions: int | None
    max_rows_per_table: int | None
    split: str | None
    threshold: int | None
    measurements: dict[str, dict[str, Any]]
    epsilon: str
    margins: dict[str, str]
    per_unit_means: list[str]  # the columns that average each unit's own mean (ANON_AVG, ANON_VAR, ANON_STDDEV)
    columns: dict[str, dict[str, str]]  # each aggregate column: its aggregate, a count's or sum's measurement
    bias: dict[str, Any]


class StreamCalibration(TypedDict, total=False):
    """A stream's calibration, its plan's summary (:attr:`dpcli.tasks.stream.plan.StreamPlan.summary`): part of its
    report and of its dry run (:class:`dpcli.tasks.dry_runs.StreamDryRun`)."""

    key_selection: dict[str, Any]
    perturbation: dict[str, Any]
    levels: int
    parts: dict[str, str]  # the budget's parts (with ``auto`` bounds or the bias report)


class StreamReport(ReportBase, StreamCalibration, total=False):
    """``dpcli stream-replay``'s report (with its calibration, :class:`StreamCalibration`)."""

    command: Literal["stream-replay"]
    state: str  # the state file a ``--state`` run fed
    releases: int  # rows released
    through: str  # the end of the last trigger run (UTC)
    bias: dict[str, Any]
    retry: bool  # the last run's input again: its rows again, free


#: Any task's report.
Report = HistogramReport | TopKReport | TabulateReport | SqlReport | StreamReport
