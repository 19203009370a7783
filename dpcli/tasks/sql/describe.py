"""What a ``dpcli sql`` release says about itself: its ``--dry-run`` plan and the notes on its output.

Both come from public inputs (the query, its calibration) and, for notes, the noisy table only.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.core.exact import fraction_text
from dpcli.tasks.auto_bounds import AT_RUN_TIME
from dpcli.tasks.sql.ir import AnonAgg, ResolvedQuery
from dpcli.tasks.sql.plan import Measure, SqlPlan, measures_for

if TYPE_CHECKING:
    from dpcli.advice import Note
    from dpcli.tasks.dry_runs import MeasurementPlan, OwnedTable, SqlDryRun
    from dpcli.tasks.sql.task import SqlTask

_WHAT = {
    "units": "distinct users per partition (the threshold is decided on it)",
    "rows": "rows per user, each user's count clamped to [0, {cap}]",
    "count": "non-null values per user, each user's count clamped to [0, {cap}]",
    "sum": "each user's sum clamped to [{lo}, {hi}], in grid units of {g}",
    "n": "users with a value (the n of means and variances)",
    "csum": "each user's mean clamped to [{lo}, {hi}], centred, in grid units of {g}",
    "csq": "each user's mean squared distance to the centre, in grid units² of {g}",
    "ntile": "exponential mechanism over the {bins} grid points of [{lo}, {hi}] (gap sampling) at p = {p}",
}


def _what(m: Measure, unit: str = "user") -> str:
    """What measurement ``m`` adds noise to, in words, the privacy unit named ``unit`` (as the notes name it)."""
    fields: dict[str, Any] = {"cap": m.cap, "bins": 0, "p": fraction_text(m.p) if m.p is not None else ""}
    if m.bounds is not None:
        fields.update(lo=fraction_text(m.bounds[0]), hi=fraction_text(m.bounds[1]))
        if m.kind in ("sum", "csum", "csq"):
            fields["g"] = fraction_text(m.grid.granularity)
        if m.kind == "ntile":
            fields["bins"] = m.grid.hi_units - m.grid.lo_units + 1
    text = _WHAT[m.kind].format(**fields)
    return re.sub(r"\buser(s?)\b", lambda w: unit + w.group(1), text)


def _users_of(task: SqlTask) -> dict[str, list[str]]:
    """Each measurement's key → the output columns it serves."""
    out: dict[str, list[str]] = {}
    for o in task.query.outputs:
        if o.aggregate is None:
            continue
        for m in measures_for(task.query.aggregates[o.aggregate], task.options.max_contributions):
            out.setdefault(m.key, []).append(o.name)
    return out


def describe_plan(task: SqlTask, plan: SqlPlan) -> SqlDryRun:
    """The dry run's document: each measurement's columns, noise and 95% margin, the bound shared by
    all aggregates, the split, the threshold and the cost (no data involved). The resolved plan itself is
    not shown: for ``SELECT *`` it lists every column of a table, names that in service mode are the
    operator's (rule 8). Margins that depend on a bound chosen from the data (``auto``: every margin and the
    threshold with K, the default-cap counts' with C) are "chosen at run time", with no number."""
    chosen = _chosen_at_run_time(task)
    capped_by_c = _capped_by_c(task)  # their clamp is [0, C] whether or not K is chosen too
    largest = _largest_cap_margins(task, plan) if chosen is not None else {}
    task = task.at_bounds(task.options.max_partitions, task.options.max_contributions)  # auto: the placeholders
    serves = _users_of(task)
    calibration: dict[str, MeasurementPlan] = {}
    for i, c in enumerate(plan.calibrated):
        m = c.measure
        columns = ", ".join(serves.get(m.key, [])) or "threshold"
        what = _what(m, task.unit_word)
        if m.key in capped_by_c:  # a count at the default cap, C chosen from the data
            what = what.replace(f"[0, {m.cap}]", "[0, C]")
        entry: MeasurementPlan = {"column": f"{columns}: {what}", "share": c.share}
        if c.noise is None:
            entry["mechanism"] = "exponential"
        else:
            scale = float(m.grid.granularity) if m.kind == "sum" else 1.0
            c.noise.described_in(entry)
            entry["moe95"] = c.noise.margin95() * scale if m.kind in ("units", "rows", "count", "sum") else None
        if chosen is not None and (not chosen or m.key in chosen):
            entry.pop("scale", None)
            low = entry.get("moe95")
            entry["moe95"] = AT_RUN_TIME
            if isinstance(low, float | int):  # at the placeholders: caps of 1 where they are chosen
                entry["moe95_at_caps_of_1"] = low
                if isinstance(high := largest.get(i), float | int):
                    entry["moe95_at_largest_caps"] = high
        calibration[f"m{i}"] = entry
    described: SqlDryRun = {
        "tables": {t.name: "private" if t.private else "public" for t in task.tables},
        "bound": {"max_partitions": "auto" if chosen == set() else plan.max_partitions,
                  "max_rows_per_table": task.options.max_rows_per_table,
                  "per_user_partials": "one per partition, clamped",
                  "shared_by": len(task.query.aggregates)},
        "measurements": [c.measure.key for c in plan.calibrated], "split": plan.split, "domain": plan.domain,
        "threshold": plan.threshold, "cost": [e.to_json() for e in plan.events], "calibration": calibration,
    }
    _owned(task, described)
    _auto_parts(task, chosen, described)
    return described


def _owned(task: SqlTask, described: SqlDryRun) -> None:
    """The owned tables (each with the table it is owned through and its keys per owner) and the stability the
    release is calibrated to (:mod:`dpcli.tasks.sql.owners`), added to ``described``; nothing without owned tables.
    No column is named."""
    from dpcli.tasks.sql.scope import owner_of

    links = {t.name: link for t in task.tables if (link := owner_of(t)) is not None}
    if not links:
        return
    owned: dict[str, OwnedTable] = {name: {"through": link.parent, "max_keys_per_owner": link.max_keys}
                                    for name, link in sorted(links.items())}
    described["owned"] = owned
    described["stability"] = task.stability


def _largest_cap_margins(task: SqlTask, plan: SqlPlan) -> dict[int, float]:
    """Each measurement's 95% margin (by its place in the plan) at the largest caps ``auto`` can choose
    (:func:`dpcli.tasks.auto_bounds.cap_candidates`: public grids; K among every candidate, a query's groups are
    not counted in a dry run): the most the release can show. Empty where the noise at those caps cannot be
    sampled (the release would fall back to caps of 1; the dry run then says "more at the caps chosen")."""
    from dpcli.errors import UsageError
    from dpcli.tasks.auto_bounds import ChosenBounds, cap_candidates

    o = task.options
    assert o.auto is not None
    ks, cs = cap_candidates(o.auto, ChosenBounds(o.max_partitions, o.max_contributions, None), None)
    at = task.at_bounds(ks[-1], cs[-1])
    try:
        replanned = at.plan(*plan.ledger)
    except UsageError:  # too large to sample at these caps
        return {}
    out: dict[int, float] = {}
    for i, c in enumerate(replanned.calibrated):
        if c.noise is not None and c.measure.kind in ("units", "rows", "count", "sum"):
            scale = float(c.measure.grid.granularity) if c.measure.kind == "sum" else 1.0
            out[i] = c.noise.margin95() * scale
    return out


def _chosen_at_run_time(task: SqlTask) -> set[str] | None:
    """The measurements whose noise depends on a bound chosen from the data: None (no ``auto``), empty (K is
    chosen: all of them), or the keys of the counts at the default cap (C is chosen)."""
    auto = task.options.auto
    if auto is None:
        return None
    if auto.partitions:
        return set()
    return _capped_by_c(task)


def _capped_by_c(task: SqlTask) -> set[str]:
    """The keys of the counts at the default cap, whose cap C is chosen from the data (with ``auto`` C)."""
    from dataclasses import replace

    from dpcli.tasks.sql.auto import DEFAULT_CAP_AUTO

    if task.options.auto is None or not task.options.auto.contributions:
        return set()
    cap = task.options.max_contributions
    return {m.key for a in task.query.aggregates if a.function == "count" and a.cap == DEFAULT_CAP_AUTO
            for m in measures_for(replace(a, cap=cap), cap)}


def _auto_parts(task: SqlTask, chosen: set[str] | None, described: SqlDryRun) -> None:
    """The budget's parts (choosing the bounds, the bias report, the release) and what is chosen at run time, added
    to ``described``."""
    from dpcli.tasks.sql.auto import parts_of

    o = task.options
    parts = parts_of(o.auto, o.bias_share)
    if parts.release == 1:
        return
    budget = o.budget
    whole, name = (budget.rho, "rho") if budget.rho is not None else (budget.epsilon, "epsilon")
    assert whole is not None
    described["parts"] = {part: f"{name}={fraction_text(whole * share)}" for part, share in
                          (("auto-bounds", parts.auto), ("bias", parts.bias), ("release", parts.release)) if share}
    if o.auto is not None:
        described["auto"] = {"chosen at run time": o.auto.canonical()["chosen"]}
        if o.auto.partitions:  # the threshold depends on K: shown once K is chosen
            described["threshold"] = None


def sql_notes(task: SqlTask, plan: SqlPlan, table: pl.DataFrame) -> list[Note]:
    """Notes on a release: nothing released, count or sum columns that are mostly noise, caps left at 1."""
    from dpcli import advice

    notes: list[Note] = []
    if table.height == 0 and plan.domain == "threshold":
        notes.append(advice.empty_release("groups"))
    for o in task.query.outputs:
        if o.aggregate is None or o.name not in table.columns or not table.height:
            continue
        margin = _margin(task.query.aggregates[o.aggregate], task, plan)
        note = advice.mostly_noise(o.name, table[o.name].to_list(), margin) if margin is not None else None
        if note is not None:
            notes.append(note)
    averaged = task.per_unit_means()
    if averaged:
        notes.append(advice.Note(f"{', '.join(averaged)}: each {task.unit_word}'s rows are averaged first, then the "
                          f"{task.unit_word}s' means (every {task.unit_word} weighs the same, whatever its rows): "
                          "not the per-row mean or variance of plain SQL"))
    summed = [o.name for o in task.query.outputs
              if o.aggregate is not None and task.query.aggregates[o.aggregate].function == "sum"]
    if summed:  # the new-user trial read ANON_SUM(distance, 0, 5000) as a per-row clamp: off by 93%, no warning
        u = task.unit_word
        notes.append(advice.Note(f"{', '.join(summed)}: the bounds clamp each {u}'s total in a group (the sum of its "
                                 f"rows), not each row's value: give the range of one {u}'s total"))
    if task.stability > 1:
        others, s = (task.stability - 1) // 2, task.stability
        notes.append(advice.Note(f"owned tables: the noise covers one {task.unit_word} changing the rows of up to "
                                 f"{others} others through duplicated keys (×{s} the noise of a unit table's release; "
                                 "fewer keys per owner, less noise, but the rows of an owner's keys beyond "
                                 "--max-keys-per-owner are dropped, uncounted by any note)"))
    defaulted = set(task.defaulted)
    counts_rows = any(a.function == "count" and a.cap == task.options.max_contributions
                      for a in task.query.aggregates)
    notes += advice.default_caps(task.unit_word, "max_contributions" in defaulted and counts_rows,
                                 "max_partitions" in defaulted and bool(task.query.groups))
    return notes


def _margin(agg: AnonAgg, task: SqlTask, plan: SqlPlan) -> float | None:
    if agg.function not in ("count", "count_units", "sum"):
        return None
    (m,) = measures_for(agg, task.options.max_contributions)
    noise = plan.get(m.key).noise
    assert noise is not None
    return noise.margin95() * (float(m.grid.granularity) if m.kind == "sum" else 1.0)


def released_columns(query: ResolvedQuery, default_cap: int) -> dict[str, dict[str, str]]:
    """Each aggregate column of the released table: its aggregate and, for a count or a sum (one noisy measurement
    each), that measurement's key in the report's ``measurements`` and (a sum) its grid's step: what ``dpcli diff``
    needs to combine two releases' noises. Public: a function of the query."""
    out: dict[str, dict[str, str]] = {}
    for o in query.outputs:
        if o.aggregate is None:
            continue
        agg = query.aggregates[o.aggregate]
        entry: dict[str, str] = {"aggregate": agg.function}
        if agg.function in ("count", "count_units", "sum"):
            (m,) = measures_for(agg, default_cap)
            entry["measurement"] = m.key
            if m.bounds is not None:
                entry["granularity"] = fraction_text(m.grid.granularity)
        out[o.name] = entry
    return out
