"""Plain-words notes that change how a release should be read: mostly noise, biased by caps, empty.

Every note is a function of public inputs (the query, its calibration) and of the noisy output
only, never of the data: adding one person changes a note no more than it changes the release.
A note naming an option holds its field (``max_contributions``); the CLI spells it as its flag.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpcli.core.display import parameter_text, quantity_text

if TYPE_CHECKING:
    from dpcli.core.schedules import ScheduleLabel


@dataclass(frozen=True)
class Note:
    """One line of advice; ``{}`` in ``text`` stands for ``field`` (an option) when it has one."""

    text: str
    field: str | None = None

    def render(self, name: str | None = None) -> str:
        """The text with the field shown as ``name`` (default: the field name)."""
        return self.text.format(name or self.field) if self.field else self.text

    def __str__(self) -> str:
        return self.render()


def _typical(values: Iterable[Any]) -> float | None:
    """The median absolute released value (None without values)."""
    xs = sorted(abs(float(v)) for v in values if v is not None)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def mostly_noise(column: str, values: Sequence[Any], margin: float) -> Note | None:
    """A note when the 95% margin of ``column``'s noise exceeds its typical (median) released value."""
    typical = _typical(values)
    if typical is None or margin <= typical:
        return None
    return Note(f"{column} is mostly noise: its 95% margin (±{quantity_text(margin)}) exceeds the typical released "
                f"value ({quantity_text(typical)}); a larger ε, or fewer and coarser groups, help")


def default_caps(unit: str, rows: bool, groups: bool) -> list[Note]:
    """Notes for contribution caps left at their default of 1 (rows per unit and group, groups per unit)."""
    notes = []
    if rows:
        notes.append(Note(f"counts are per {unit}-group pair, at most 1 row per {unit}: raise {{}} to count more rows",
                          "max_contributions"))
    if groups:
        notes.append(Note(f"each {unit} counts in 1 group only (chosen at random): raise {{}} to let a {unit} "
                          "count in more groups", "max_partitions"))
    return notes


def left_out(chosen: Sequence[str], auto: Mapping[str, Any] | None, stays: str | None,
             defaulted: Sequence[str]) -> list[Note]:
    """What became of the bounds a command left out: chosen from the data (``chosen``, at ``auto``'s share: the
    values chosen are released), or kept at caps of 1 (``stays``: the public reason ``auto`` cannot run)."""
    flags = {"max_partitions": "--max-partitions", "max_contributions": "--max-contributions", "bounds": "--bounds"}
    if chosen and auto is not None:
        shown = ", ".join(f"{flags[f]} {_chosen_value(auto, f)}" for f in chosen if f in auto)
        spent = (f"ε = {parameter_text(auto['epsilon'], 'up')}" if "epsilon" in auto
                 else f"ρ = {parameter_text(auto['rho'], 'up')}" if "rho" in auto else "a share")
        return [Note(f"left out, so chosen from the data with {spent} of the budget: {shown}; give them to spend the "
                     "whole budget on the release")]
    if stays and defaulted:
        return [Note(f"{' and '.join(flags[f] for f in defaulted)} left at 1: dpcli chooses left-out caps from the "
                     f"data, but not with {stays}")]
    return []


def _chosen_value(auto: Mapping[str, Any], field: str) -> str:
    value = auto[field]
    return f"{value[0]:g}:{value[1]:g}" if isinstance(value, (list, tuple)) else str(value)


def empty_release(what: str) -> Note:
    """Nothing was released (no group passed the threshold): not an error, but worth knowing."""
    return Note(f"0 {what} released: no group was supported by enough privacy units to pass the threshold")


def small_run_epsilon(run_epsilon: float, total_epsilon: float, scheduler: str = "bbscheduler") -> Note | None:
    """A scheduled run that used under 1% of its schedule's total ε (early runs do: their noise is large). A
    growing-data scheduler keeps most of its total for runs far ahead: when the number of runs is known,
    ``fixed`` spends it evenly (docs/commands/schedules.md, "Which scheduler")."""
    if not run_epsilon < total_epsilon / 100:
        return None
    hint = ("; if you know how many runs there will be, compare --scheduler fixed, which spends the total evenly "
            f"over them (--dry-run {'--units' if scheduler == 'bbscheduler' else '--rows'} … --runs N shows both)"
            ) if scheduler != "fixed" else ""
    return Note(f"this run of the schedule used ε = {parameter_text(run_epsilon, 'up')} of its total "
                f"{parameter_text(total_epsilon, 'up')}: early runs get a small share, so expect much noise until "
                f"the data has grown{hint}")


def schedule_backfill(label: ScheduleLabel) -> Note | None:
    """A bbscheduler backfill answered with the release in force at its moment (made on an earlier snapshot)."""
    if "in_force_through" not in label:
        return None
    made = f", made through {label['made_through']}" if label.get("made_through") else ""
    return Note(f"a backfill: through {label['in_force_through']} the schedule's release in force was that of epoch "
                f"{label.get('epoch')}{made}; bbscheduler starts epochs only as the data grow, never on an older "
                "snapshot, so this is that release again (free)")


def schedule_repeat(label: ScheduleLabel) -> Note | None:
    """A schedule's call answered with a release it made before (free): the output is that release's, byte for
    byte, so a reader comparing files should not read it as a new measurement."""
    if not label.get("cached") or "in_force_through" in label:
        return None
    epoch = f"epoch {label['epoch']}" if "epoch" in label else None
    if "replay_of_run" in label:
        which = f"run {label['replay_of_run']}" + (f" ({epoch})" if epoch else "")
        return Note(f"the same input as an earlier call: {which}'s release again (free, identical output)")
    return Note(f"no new epoch yet: {epoch or 'the last run'}'s release again (free, identical output); bbscheduler "
                "starts the next epoch once the noisy count of units has grown by the factor 1 + γ")


def improver_c_without_gain(scheduler: str, c: float) -> Note | None:
    """A BBImprover schedule made with c ≥ 1/4 (dpcli 0.2's default): its error bound no longer falls."""
    if scheduler != "bbimprover" or c < 0.25:
        return None
    return Note(f"this bbimprover schedule has c = {c:g} ≥ 1/4, where Theorem 13's error bound no longer "
                "improves as the data grow; a new --schedule name would get c = 0.1")


def improver_counts_runs(made_with_index: str | None) -> Note | None:
    """A BBImprover schedule made counting rows: it goes on counting runs (row counts are not public)."""
    if made_with_index != "rows":
        return None
    return Note("this bbimprover schedule was made counting rows; it counts runs from now on (t = the run's "
                "number), which keeps its total within its reservation and needs no row count")


def histogram_notes(query: Any, plan: Any, table: Any, defaulted: Iterable[str] = (),
                    unit: str | None = None) -> list[Note]:
    """Notes for a histogram release: empty, mostly-noise count/sum columns, caps left at their default.

    ``plan`` is the query's :class:`dpcli.tasks.histogram.HistogramPlan`, ``table`` the released
    polars table, ``defaulted`` the cap fields the user did not set (``max_contributions``,
    ``max_partitions``); ``unit`` is how notes name the privacy unit (default: its column).
    """
    notes: list[Note] = []
    if table.height == 0 and query.domain != "keys":
        notes.append(empty_release("groups"))
    noisy = _mostly_noise_columns(query, plan, table)
    notes += noisy
    if query.value is not None and any(n.text.startswith("count is mostly noise") for n in noisy):
        notes.append(few_values(query.value))
    if "mean" in query.aggregations and table.height:
        notes += mean_near_bounds(f"mean_{query.value}", table[f"mean_{query.value}"].to_list(), *query.bounds)
    if "count" in query.aggregations and query.value is not None:
        notes.append(Note(f"count counts the rows with a {query.value} (it is also the n of means and variances): "
                          "rows whose value is null, NaN or unreadable are not counted; release count alone to count "
                          "every row"))
    defaulted = set(defaulted)
    counts_rows = any(a in ("count", "sum", "mean", "variance") for a in query.aggregations)
    notes += default_caps(unit or query.unit, "max_contributions" in defaulted and counts_rows,
                          "max_partitions" in defaulted)
    return notes


def few_values(column: str) -> Note:
    """The note for a released count of the rows with a value that is mostly noise (decided from the released
    counts and their public margin only): few rows hold a number in ``column``. In a CSV or NDJSON file every
    field is read as text and parsed per record, so a column of words (given to ``--value`` by mistake) is read
    as no value at all, and its release is noise; a Parquet column of text is refused before any charge."""
    return Note(f"count, the rows with a number in {column}, is mostly noise: few rows hold one (a CSV or NDJSON "
                f"field is read as text and dropped unless it parses as a number); check that {column} holds numbers")


#: A released mean within this fraction of the bounds' width from a bound gets a note (clamping bias).
NEAR_BOUND = 0.025


def mean_near_bounds(column: str, values: Sequence[Any], lo: float, hi: float) -> list[Note]:
    """A note for each bound that released means lie within :data:`NEAR_BOUND` of the width of.

    Values beyond the bounds are clamped to them, and a mean close to a bound says many values lie
    close to it, so likely some beyond it too: the mean is then pulled inwards. Decided from the
    released means and the public bounds only."""
    near = NEAR_BOUND * (hi - lo)
    means = [float(v) for v in values if v is not None]
    notes = []
    for edge, count in ((lo, sum(m <= lo + near for m in means)), (hi, sum(m >= hi - near for m in means))):
        if count:
            notes.append(Note(
                f"{column}: {count} released mean(s) lie within {NEAR_BOUND:.1%} of the bounds' width of {edge:g}; "
                f"values beyond {{0}} are clamped to it, which may bias these means inwards: widen {{0}} if values "
                f"can lie beyond {edge:g}", "bounds"))
    return notes


def _mostly_noise_columns(query: Any, plan: Any, table: Any) -> list[Note]:
    """A note for each count or sum column whose values are mostly within their noise's margin."""
    notes = []
    for column, values, margin in _noisy_columns(query, plan, table):
        note = mostly_noise(column, values, margin)
        if note:
            notes.append(note)
    return notes


def _noisy_columns(query: Any, plan: Any, table: Any) -> list[tuple[str, list[Any], float]]:
    """A histogram release's count and sum columns released, each with its values and its noise's 95% margin."""
    out = []
    granularity = float(query.grid.granularity) if query.value is not None and query.grid is not None else 1.0
    columns = {"count": ("rows", 1.0), "count_units": ("units", 1.0), f"sum_{query.value}": ("sum", granularity)}
    for column, (name, scale) in columns.items():
        measurement = plan.measurements.get(name)
        if column in table.columns and measurement is not None and measurement.noise is not None and table.height:
            out.append((column, table[column].to_list(), measurement.noise.margin95() * scale))
    return out


#: Why a topk release's counts need not fall with its ranks (its notes, when they do not, and its plots' captions).
TOPK_ORDER = "ranks and counts carry separate noise: a count may top the one above it"


def topk_notes(query: Any, plan: Any, table: Any, defaulted: Iterable[str] = (), unit: str | None = None) -> list[Note]:
    """Notes for a top-k release: mostly-noise counts, counts out of rank order (the ranks are chosen with noise
    of their own: :data:`TOPK_ORDER`), a row cap left at 1 with ``count = rows`` (``unit``: how notes name the
    privacy unit; default: its column). Every one is read from the released table and public inputs."""
    notes: list[Note] = []
    if "count" in table.columns and plan.count_noise is not None and table.height:
        note = mostly_noise("count", table["count"].to_list(), plan.count_noise.margin95())
        if note:
            notes.append(note)
        counts = table.sort("rank")["count"].to_list() if "rank" in table.columns else []
        if any(b > a for a, b in itertools.pairwise(counts)):
            notes.append(Note(f"counts out of rank order: {TOPK_ORDER}"))
    if query.count == "rows" and "max_contributions" in set(defaulted):
        notes += default_caps(unit or query.unit, True, False)
    return notes


def bias_report(unit: str, bias: Mapping[str, Any] | None, in_force: dict[str, Any]) -> list[Note]:
    """The bias report in words (:mod:`dpcli.tasks.bias_report`): the noisy average shares of each unit's rows
    that each bound cut or clamped, with their 95% margin. ``in_force`` holds the bounds as they were used
    (``max_partitions``, ``max_contributions``, ``bounds``). A report of an older kind (counts of units, as
    a stream state may keep) is shown as it is."""
    if not bias:
        return []
    if "moe95" not in bias or "units" not in bias:
        return []
    from dpcli.tasks.bias_report import margin_text, percent_text

    k, c, bounds = in_force.get("max_partitions"), in_force.get("max_contributions"), in_force.get("bounds")
    said = {"share_cut_by_max_partitions": f"in groups beyond --max-partitions {k}",
            "share_cut_by_max_contributions": f"beyond --max-contributions {c} in a group",
            "share_clamped_below": f"kept but clamped below {bounds[0]:g}" if bounds else "",
            "share_clamped_above": f"kept but clamped above {bounds[1]:g}" if bounds else ""}
    if float(bias["moe95"]) >= 1:  # a margin of more than every row: the shares say nothing
        return [Note(f"bounds cut: too few {unit}s for the bias report to tell (its margin exceeds 100%); "
                     "--no-report-bias leaves its share to the release")]
    parts = [f"{percent_text(float(bias[name]))} {what}" for name, what in said.items() if name in bias]
    return [Note(f"bounds cut (noisy average shares of each {unit}'s rows, {margin_text(float(bias['moe95']))} at "
                 f"95%, over about {bias['units']:,} {unit}s): " + "; ".join(parts))]


def bias_beyond_margin(query: Any, plan: Any, table: Any, unit: str, bias: Mapping[str, Any] | None,
                       quantiles: dict[str, float], chosen: Collection[str] = ()) -> list[Note]:
    """Notes where the bias report says the bounds may move a released statistic by more than its margin
    (``quantiles``: the level of each quantile aggregation, by name; ``chosen``: the bounds dpcli chose from the
    data, by field name, which the note does not ask to leave out).

    Counts and sums: rows cut by the caps (a share s of a unit's rows, on average) leave a released total v of
    the rows kept, so the raw total is about v / (1 − s): short by v·s/(1 − s). When that exceeds the column's
    95% margin for its typical (median) released value, the note says so. Only shares beyond the report's own
    margin count (a share within it is not told from no cut). Quantiles: a share of values
    clamped below LO (above HI) that reaches the quantile's level p (1 − p) puts the quantile at the bound.
    Means: clamped values on 5% or more of the rows pull the means towards the bounds. All of it from the
    released report, the released table and the public plan. The shares are averages over units, which
    under caps usually understate the share of all rows cut (:mod:`dpcli.tasks.bias_report`): a note is a
    floor, never a bound."""
    if not bias or "moe95" not in bias:
        return []
    from dpcli.tasks.bias_report import percent_text

    notes: list[Note] = []
    by_k = float(bias.get("share_cut_by_max_partitions", 0))
    by_c = float(bias.get("share_cut_by_max_contributions", 0))
    cut = min(by_k + by_c, 1.0)
    noise = float(bias["moe95"])  # a share within the report's own margin is not told from no cut at all
    shares = {"--max-partitions": by_k, "--max-contributions": by_c}
    for column, values, margin in _noisy_columns(query, plan, table):
        typical = _typical(values)
        if column == "count_units" or typical is None or cut <= noise:
            continue
        short = typical * cut / (1 - cut) if cut < 1 else math.inf
        if short > margin:
            # the caps to raise: each whose own cut exceeds the margin (else the one that cut more)
            named = [o for o, share in shares.items() if share > noise and (cut >= 1 or typical * share / (1 - cut)
                                                                             > margin)]
            named = named or [max(shares, key=shares.__getitem__)]
            given = [o for o in named if o.removeprefix("--").replace("-", "_") not in chosen]
            raise_ = " and ".join(named)
            if given:
                raise_ += (", or leave them out" if len(given) > 1 else ", or leave it out") + " for dpcli to choose"
            else:  # dpcli chose them: a larger cap cuts less but adds noise, which its choice weighed at this ε
                raise_ += " (chosen from the data: a larger one cuts less and adds noise)"
            by = f"about {quantity_text(short)}" if math.isfinite(short) else "most"
            notes.append(Note(
                f"{column}: the caps cut about {percent_text(cut)} of each {unit}'s rows, so a typical {column} "
                f"({quantity_text(typical)}) may be short by {by} of the raw total, beyond its margin "
                f"(±{quantity_text(margin)}): raise {raise_}"))
    below = float(bias.get("share_clamped_below", 0))
    above = float(bias.get("share_clamped_above", 0))
    if query.bounds is None or not (below or above):
        return notes
    lo, hi = query.bounds
    below, above = (share if share > noise else 0.0 for share in (below, above))
    for name, level in quantiles.items():
        if below >= level or above >= 1 - level:
            edge = lo if below >= level else hi
            notes.append(Note(f"{name}: about {percent_text(below if edge == lo else above)} of the kept values "
                              f"were clamped to {edge:g}, enough to put this quantile at the bound: widen {{}}",
                              "bounds"))
    if ("mean" in query.aggregations or "variance" in query.aggregations) and below + above >= CLAMPED_MEANS:
        notes.append(Note(f"about {percent_text(below + above)} of the kept values were clamped to {lo:g}:{hi:g}, "
                          "which pulls means towards the bounds (and shrinks variances): widen {}", "bounds"))
    return notes



#: The share of clamped values from which :func:`bias_beyond_margin` says means lean towards the bounds.
CLAMPED_MEANS = 0.05
