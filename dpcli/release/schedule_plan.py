"""A ``--schedule``'s dry run: its next runs planned at sizes the user states, before anything is paid.

For each planned run: the ε of its new release (or that it returns an earlier one, or would be refused),
its ρ in a zcdp ledger, and the 95% margins of its released counts and sums (the task's own calibration at
that ε), also relative to a group of average size; then the ε the runs use of the reservation, what stays
unused, what ``--scheduler fixed`` would give over the same runs, and whether the ledger accepts the
reservation. Sizes are private: dpcli reads none, the plan takes them as stated, noise aside: ``--rows``
(rows) for fixed and bbimprover, ``--units`` (distinct privacy units, which its epochs follow) for
bbscheduler. Reads the ledger, the public lists (a schedule is named by their fingerprints) and the
schedule's state if it exists; reads no data, charges and writes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from dpcli.core import schedules as sch
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.schedules import ScheduleSpec
from dpcli.errors import StateError, UsageError
from dpcli.frames import collect
from dpcli.io.inputs import open_input
from dpcli.release.inputs import Sources
from dpcli.release.schedule_runs import NOISY_SIZES
from dpcli.release.schedule_state import check_state, reservation_event
from dpcli.release.schedules import scheduled_run
from dpcli.release.steps import LedgerRef, Planned, check_dry_run_inputs
from dpcli.state import ledger
from dpcli.state import schedules as store
from dpcli.state.paths import existing_state_dir
from dpcli.tasks.dry_runs import RunMargins

if TYPE_CHECKING:
    from dpcli.core.accounting.budget import Limits
    from dpcli.state.ledger.model import Ledger
    from dpcli.tasks import ExpectedSize, P, SchedulableTask, Task
    from dpcli.tasks.dry_runs import FixedAlternative, RunPlan, ScheduleDryRun
    from dpcli.tasks.reports import AutoReport

#: Runs a dry run plans when ``--runs`` is left out: a month of daily runs.
DEFAULT_RUNS = 30
#: Columns whose margin is also given relative to an average group's count.
COUNT_COLUMNS = ("count", "count_units")
#: A planned run's part that holds its margins (:func:`_margins_doc`).
M = TypeVar("M", bound=RunMargins)


@dataclass(frozen=True)
class _Context:
    """What every planned run is computed with: the task, its planning mode and limits, the ledger, the
    number of groups in the public list (None: unknown), and the ``auto`` bounds the schedule's first run
    chose (its state's ``auto``; None: not chosen yet)."""

    task: SchedulableTask[Any]
    mode: str
    limits: Limits
    led: Ledger
    groups: int | None
    kept: AutoReport | None = None
    counts: str = "rows"  # what the stated sizes count: rows, or privacy units (bbscheduler)


def plan_schedule(task: Task[P], sources: Sources, payer: LedgerRef, spec: ScheduleSpec,
                  size: ExpectedSize | None, runs: int = DEFAULT_RUNS) -> Planned:
    """``--dry-run --schedule``: the next ``runs`` runs of ``spec`` at the stated sizes (see the module
    docstring); the description is public (options, stated sizes, the state's public values)."""
    from dpcli.tasks import SchedulableTask

    led = ledger.read_ledger(existing_state_dir(payer.state_dir), payer.analyst, payer.lock_timeout)
    scheduled = task.for_ledger(led.limits.mode)  # as a run does: the ledger's defaults, then the schedule's rules
    if not isinstance(scheduled, SchedulableTask):
        raise UsageError(f"{task.command} has no --schedule")
    scheduled.check_schedulable()
    check_dry_run_inputs(scheduled, sources)  # the data's schema and the lists' headers, as a run checks them
    fingerprints, groups = _open_lists(scheduled, sources)
    query = scheduled.schedule_query(fingerprints)
    key = store.schedule_key(spec.name, query)
    state = store.peek(payer.state_dir, payer.analyst, key)
    if state is not None and state["runs"]:
        spec = spec.as_in(state["spec"])
        check_state(state, spec, payer.analyst, f"schedule {spec.name!r}")
    else:
        state = None
    mode = scheduled.schedule_mode(led.limits.mode)
    ctx = _Context(scheduled, mode, led.limits, led, groups, state.get("auto") if state is not None else None,
                   size.counts if size is not None else "rows")
    progress = _progress(spec, state, size)
    planned = _planned_runs(spec, progress, size, runs)
    description = _describe(ctx, spec, state, progress, planned, size, query)
    if state is None:
        events = [reservation_event(spec)]
        return Planned(description, events, ledger.refusal(led, events))
    seq = led.find_reservation("schedule", key)
    refusal = None if seq is not None else (f"schedule {spec.name!r} has a state but its reservation is not in this "
                                            "ledger (or not in its current period)")
    description["reservation"] = seq
    return Planned(description, [], refusal)


def _open_lists(task: SchedulableTask[Any], sources: Sources) -> tuple[dict[str, str], int | None]:
    """Each public list's fingerprint by role (they name the schedule), and the number of groups listed."""
    fingerprints: dict[str, str] = {}
    groups = None
    for role, wanted in task.needs().lists.items():
        source = sources.lists.get(role)
        if source is None:
            raise UsageError("a schedule runs on a public list of groups: give --keys")
        table = open_input(source, text_columns=wanted.columns)
        fingerprints[role] = table.fingerprint
        groups = int(collect(table.frame.select(wanted.columns).unique().select(pl.len()),
                             f"cannot read {table.name}").item())
        table.verify_unchanged()
    return fingerprints, groups


def _progress(spec: ScheduleSpec, state: dict[str, Any] | None, size: ExpectedSize | None) -> sch.Progress:
    """Where the schedule stands: nothing yet, or what its state records (public values only: ε, ñ, γ)."""
    if spec.scheduler == "bbscheduler" and (size is None or size.counts != "units"):
        raise UsageError(("--rows counts rows, but " if size is not None else "")
                         + "a bbscheduler's epochs follow the privacy units: give --units N (the expected distinct "
                         "units at the next run) or --units FIRST:LAST (growing over the runs planned)")
    if spec.scheduler != "bbscheduler" and size is not None and size.counts != "rows":
        raise UsageError(f"--units states a bbscheduler's privacy units; --scheduler {spec.scheduler} plans at the "
                         "rows you state with --rows")
    if state is None:
        if spec.scheduler != "bbscheduler":
            return sch.Progress()
        assert size is not None
        return sch.start_progress(spec.total_epsilon, float(spec.total_delta), spec.beta, spec.gamma, size.first)
    runs = state["runs"]
    done = sch.Progress(len(runs), tuple(Fraction(r["epsilon"]) for r in runs),
                        sum((Fraction(r.get("size_epsilon", 0)) for r in runs), Fraction(0)))
    if spec.scheduler != "bbscheduler":
        return done
    if state.get("sizes") != NOISY_SIZES:
        raise StateError(f"schedule {spec.name!r} was made by an older dpcli, whose epochs came from exact row "
                         "counts; it can only return its last release: start a new --schedule name")
    test = state.get("crossing")
    return sch.Progress(done.runs, done.releases, done.sizes, state["n0_noisy"], Fraction(state["gamma"]),
                        runs[-1]["epoch"], test["epoch"] if test else None)


def _planned_runs(spec: ScheduleSpec, progress: sch.Progress, size: ExpectedSize | None,
                  runs: int) -> list[sch.PlannedRun]:
    """The next ``runs`` runs of the schedule, at the stated sizes."""
    sizes = size.sizes(runs) if size is not None else [None] * runs
    if spec.scheduler == "fixed":
        assert spec.run_epsilon is not None
        return sch.plan_fixed(progress, spec.run_epsilon, spec.total_epsilon, list(sizes))
    if spec.scheduler == "bbimprover":
        return sch.plan_improver(progress, spec.total_epsilon, float(spec.total_delta), spec.c, list(sizes))
    return sch.plan_bbscheduler(progress, spec.total_epsilon, float(spec.total_delta),
                                [s for s in sizes if s is not None])


def _describe(ctx: _Context, spec: ScheduleSpec, state: dict[str, Any] | None, progress: sch.Progress,
              planned: list[sch.PlannedRun], size: ExpectedSize | None, query: dict[str, Any]) -> ScheduleDryRun:
    """The plan as a public document (``--json``; the text form is drawn from it), after ``query``."""
    used = sch.Used(float(spec.total_delta))
    for eps in progress.releases:
        used.add(eps)
    used.add(None, progress.sizes)
    runs = []
    kept = ctx.kept
    for r in planned:
        used.add(r.epsilon, r.size_epsilon)
        doc = _run_doc(ctx, r, kept)
        if "parts" in doc:  # this run chooses the auto bounds; the runs after it keep them (not known yet)
            kept = {}
        doc["epsilon_used"] = round(used.total, 6)
        runs.append(doc)
    total = float(spec.total_epsilon)
    return {
        "query": query,
        "schedule": {**spec.to_json(), "new": state is None, "runs_so_far": progress.runs,
                     **_scheduler_doc(spec, state, progress)},
        "rows": None if size is None or size.counts != "rows" else _stated(size),
        "units": None if size is None or size.counts != "units" else _stated(size),
        "groups": ctx.groups,
        "runs": runs,
        "spend": {"runs": len(planned), "epsilon_used": round(used.total, 6), "releases": round(used.releases, 6),
                  "size_estimates": round(used.sizes, 6), "reserved": fraction_text(spec.total_epsilon),
                  "unused": round(max(0.0, total - used.total), 6)},
        "fixed_alternative": _fixed_alternative(ctx, spec, planned, size),
        "cost": [reservation_event(spec).to_json()] if state is None else [],
    }


def _stated(size: ExpectedSize) -> dict[str, Any]:
    """The sizes stated (``--rows`` or ``--units``), as the plan shows them."""
    return {"first": size.first, "last": size.last, "growth": size.growth,
            **({"each": list(size.each)} if size.each else {})}


def _scheduler_doc(spec: ScheduleSpec, state: dict[str, Any] | None, progress: sch.Progress) -> dict[str, Any]:
    """The scheduler's own public values: γ and the size it started from (bbscheduler: stated for a new
    schedule, its noisy ñ for one that ran), c (bbimprover)."""
    if spec.scheduler == "bbscheduler":
        assert progress.gamma is not None
        start = "units_noisy" if state is not None else "units_stated"
        return {"gamma": fraction_text(progress.gamma), start: progress.start}
    return {}


def _run_doc(ctx: _Context, r: sch.PlannedRun, kept: AutoReport | None) -> RunPlan:
    """One planned run: its stated size, what it releases, its ε (ρ in a zcdp ledger) and margins; with
    ``auto`` bounds not chosen yet (``kept`` None), the parts of its ε (choosing them, the release)."""
    doc: RunPlan = {"run": r.run}
    if ctx.counts == "units":
        doc["units"] = r.size
    else:
        doc["rows"] = r.size
    if r.refused is not None:
        doc.update({"release": "refused", "refused": r.refused})
        return doc
    if r.epsilon is None:
        doc["release"] = "cached"
        return doc
    doc.update({"release": "new", "epsilon": fraction_text(r.epsilon)})
    if r.epoch is not None:
        doc["epoch"] = r.epoch
    if ctx.led.limits.mode == "zcdp":
        doc["rho"] = fraction_text(ctx.led.accountant.cost(PrivacyEvent("pure", "schedule run", epsilon=r.epsilon)).rho)
    return _margins_doc(ctx, r.epsilon, r.size, kept, doc)


def _margins_doc(ctx: _Context, epsilon: Fraction, size: int | None, kept: AutoReport | None, doc: M) -> M:
    """The 95% margins of a release at ``epsilon``, and for counts, each relative to a group of average size
    (``size`` spread evenly over the listed groups): a margin of 2 means ± twice such a group's count. Stated
    units (bbscheduler's ``--units``) are spread over the groups for ``count_units`` only (a count of rows
    has no stated size then). A margin that depends on an ``auto`` bound not chosen yet is "chosen at run
    time" (no number). Added to ``doc``, after what it holds."""
    margins, parts = margins_at(ctx.task, ctx.mode, ctx.limits, epsilon, kept)
    doc["moe95"] = margins
    if parts:
        doc["parts"] = parts
    if size is not None and ctx.groups:
        average = size / ctx.groups
        columns = COUNT_COLUMNS if ctx.counts == "rows" else ("count_units",)
        doc["moe95_relative"] = {c: round(m / average, 4) for c, m in margins.items()
                                 if c in columns and not isinstance(m, str)}
    return doc


def margins_at(task: SchedulableTask[Any], mode: str, limits: Limits, epsilon: Fraction,
               kept: AutoReport | None = None) -> tuple[dict[str, float | str], dict[str, str] | None]:
    """Each released column's 95% margin at a run's ε, from the task's own calibration (``describe``), at the
    ``auto`` bounds ``kept`` (:func:`dpcli.release.schedules.scheduled_run`), and the parts of the run's ε (None: the
    release spends it all)."""
    run_task = scheduled_run(task, epsilon, kept)
    description = run_task.describe(run_task.plan(mode, limits.values))
    margins: dict[str, float | str] = {}
    for name, m in (description.get("calibration") or {}).items():
        margin = m.get("moe95")
        if margin is not None:
            margins[m.get("column", name).split(" ")[0].rstrip(":")] = margin
    count = description.get("count_moe95") if "count_moe95" in description else None  # topk's counts
    if count is not None:
        margins["count"] = count
    return margins, description.get("parts")


def _fixed_alternative(ctx: _Context, spec: ScheduleSpec, planned: list[sch.PlannedRun],
                       size: ExpectedSize | None) -> FixedAlternative | None:
    """When the number of runs is known: ``--scheduler fixed --epsilon E`` with E = ε/runs (rounded down to 4
    significant digits) spends the whole total evenly over the planned runs. None for a fixed schedule."""
    if spec.scheduler == "fixed":
        return None
    n = len(planned)
    exact = spec.total_epsilon / n
    digits = 3 - math.floor(math.log10(exact))
    epsilon = Fraction(math.floor(exact * 10**digits), 10**digits) if digits > 0 else Fraction(math.floor(exact))
    if epsilon <= 0:
        return None
    alternative: FixedAlternative = {"epsilon": fraction_text(epsilon), "runs": n}
    return _margins_doc(ctx, epsilon, size.first if size is not None else None, ctx.kept, alternative)
