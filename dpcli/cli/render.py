"""Rendering what a release path hands back: the output's format, a dry run's plan, and a charged
release (its table to standard output or ``-o``, its summary as ``--json`` or one line on stderr,
its notes on stderr). Nothing here computes or charges: :mod:`dpcli.release` does.
"""

from __future__ import annotations

import json
import sys
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import polars as pl
import typer

from dpcli.cli._common import Settings, emit_json, notice, render_note
from dpcli.core.display import parameter_text, parameters_text, quantity_text
from dpcli.errors import UsageError
from dpcli.io.outputs import output_format_for, shown, write_output
from dpcli.release.steps import Output, Planned, Release, cost_text, grid_step
from dpcli.state import progress

if TYPE_CHECKING:
    from dpcli.cli._groups import OutputOptions
    from dpcli.tasks.dry_runs import (
        DryRun,
        LargestCaps,
        MeasurementPlan,
        RunMargins,
        RunPlan,
        ScheduleDryRun,
        StreamDryRun,
    )


def output_target(out: OutputOptions) -> Output:
    """Where and how the release goes (``-o``, ``--format``, ``--json``): a table for a person on a
    terminal, CSV in pipes and files unless the extension or ``--format`` says otherwise. The path
    itself is checked by the release path before any data is read."""
    output, out_format, as_json = out.output, out.out_format, out.as_json
    to_stdout = not output or output == "-"
    if out_format is None and to_stdout and not as_json and sys.stdout.isatty():
        out_format = "table"  # a person is reading: a table; pipes and files get CSV
    fmt = output_format_for(output, out_format)
    _refuse_conflicts(fmt, out_format, to_stdout, as_json)
    return Output(output, fmt)


def _refuse_conflicts(fmt: str, out_format: str | None, to_stdout: bool, as_json: bool) -> None:
    """``--json`` on standard output is one JSON document; a table is for a terminal, never a file."""
    if as_json and to_stdout and out_format not in (None, "json"):
        raise UsageError("--json without -o prints one JSON document; drop --format or write the data with -o FILE")
    if fmt == "table" and not to_stdout:
        raise UsageError("--format table is for reading on a terminal; write files as csv, parquet or json")


def target_line(target: dict[str, Any]) -> str:
    """``target: count ±50 → epsilon=0.04232 (count ±50)``: what a margin target chose, in one line."""
    parameter = "rho" if "rho" in target else "epsilon"
    rows = {c: " rows" if c.endswith("_rank") else "" for c in target["columns"]}  # a quantile's rank margin
    wanted = ", ".join(f"{c} ±{m['target']}{rows[c]}" for c, m in target["columns"].items())
    got = ", ".join(f"{c} ±{m['moe95']:.6g}{rows[c]}" for c, m in target["columns"].items())
    return (f"  target: {wanted} → {parameter}={target[parameter]}, which gives {got} (the smallest {parameter} "
            f"of {target['digits']} significant digits that does)")


#: Set by ``dpcli budget plan`` while it runs a command's dry run: the plan is handed here instead of printed.
PLAN_CAPTURE: ContextVar[list[Planned] | None] = ContextVar("plan_capture", default=None)


def show_plan(planned: Planned, analyst: str, as_json: bool) -> None:
    """``--dry-run``: the calibration (each measurement's noise and 95% margin in output units), the
    cost and whether the analyst's ledger would accept it now; text, or JSON with ``--json`` (or, inside
    ``budget plan``, handed to :data:`PLAN_CAPTURE`)."""
    captured = PLAN_CAPTURE.get()
    if captured is not None:
        captured.append(planned)
    else:
        _print_plan(planned, analyst, as_json)


def _print_plan(planned: Planned, analyst: str, as_json: bool) -> None:
    plan = planned.description
    refused = planned.refusal
    doc: dict[str, Any] = {**plan, "ledger": {"analyst": analyst, "accepts": refused is None, "refusal": refused}}
    if as_json:
        emit_json(doc)
        return
    if "schedule" in plan:
        typer.echo("\n".join(schedule_plan_lines(plan, analyst, refused)))
        return
    lines = ["dry run: no data read, nothing charged", *_measurement_lines(plan), *_threshold_and_parts(plan)]
    if "stream" in plan and plan.get("stream"):
        lines += _stream_plan_lines(plan)
    lines.append("  cost: " + (cost_text(planned.events) or "nothing"))
    if refused is None:
        lines.append(f"  ledger {analyst!r}: would accept this release")
    else:
        lines.append(f"  ledger {analyst!r}: would refuse it: {refused}")
    typer.echo("\n".join(lines))


def _measurement_lines(plan: DryRun) -> list[str]:
    """A task's dry run in words: a margin target's choice, each measurement's noise and 95% margin, a stream's margins
    and a top-k's count noise and selection. (A key that only some dry runs have is read after ``"key" in plan``,
    which tells mypy which dry run it is: :mod:`dpcli.tasks.dry_runs`.)"""
    lines = []
    if "target" in plan and (target := plan.get("target")):
        lines.append(target_line(target))
    if "calibration" in plan:
        for name, m in (plan.get("calibration") or {}).items():
            lines.append(f"  {m.get('column', name)}: " + _noise_text(m))
    if "moe95" in plan:  # a stream's, by column
        for column, margin in (plan.get("moe95") or {}).items():
            lines.append(f"  {column}: 95% margin ±{quantity_text(margin)} (normal approximation, worst trigger)")
    if "count_noise" in plan and (noise := plan.get("count_noise")):
        count: MeasurementPlan = {"moe95": plan.get("count_moe95")}
        lines.append("  count: " + _noise_text({**noise, **count}))
    if "selection" in plan and (selection := plan.get("selection")):  # topk without a list: its threshold, or ⊥
        from dpcli.tasks.topk.threshold import selection_lines

        lines += selection_lines(selection)
    return lines


def _stream_plan_lines(plan: StreamDryRun) -> list[str]:
    """A stream-replay dry run (:meth:`dpcli.release.stream_runs.StreamRuns.plan`): margins over a window's triggers,
    the state, the triggers the next run executes and the runs' costs."""
    stream = plan["stream"]
    lines = []
    for column, margins in (plan.get("moe95_by_trigger") or {}).items():
        shown = sorted({1, (len(margins) + 1) // 2, len(margins)})
        each = ", ".join(f"±{quantity_text(margins[t - 1])} at trigger {t}" for t in shown)
        lines.append(f"  {column}: 95% margin {each} of {len(margins)}")
    lines += [f"  {column}: 95% margin chosen at run time (it depends on a bound chosen from the data)"
              for column in plan.get("moe95_chosen_at_run_time") or ()]
    if plan.get("parts"):
        lines.append("  parts: " + ", ".join(f"{name} {cost}" for name, cost in plan["parts"].items()))
    triggers = stream["triggers"]
    rho = (plan["key_selection"]["rho_total"], plan["perturbation"]["rho_total"])
    lines.append(f"  per trigger: no cost of its own, the stream's (ε, δ) covers every trigger (as zCDP: key "
                 f"selection ρ = {parameter_text(rho[0], 'up')}, perturbation ρ = {parameter_text(rho[1], 'up')})")
    if stream["state"] is None:
        lines.append(f"  triggers: every one ending at or before {triggers['through']}; each run over new data is a "
                     "new release (with --state the first run pays for all)")
    else:
        runs = stream["runs_recorded"]
        lines.append(f"  state {stream['state']}: " + (f"{runs} run(s) recorded, covered by ledger entry "
                                                        f"#{stream['covered_by']}" if stream["covered_by"]
                                                        else "its next run reserves the stream's (ε, δ)"))
        if triggers.get("count") == 0:
            lines.append(f"  triggers: none due until {triggers['next']} (events fed now are kept until then)")
        elif "after" in triggers:
            lines.append(f"  triggers: those ending after {triggers['after']} up to {triggers['through']}")
        else:
            lines.append(f"  triggers: every one ending at or before {triggers['through']}")
        if triggers.get("new_input_accepted") is False:
            lines.append(f"  the last run ended at {triggers['last_run_end']}: only its input again (a retry) is "
                         "accepted before a later --through")
    for run in stream["runs"]:
        lines.append(f"  run {run['run']}: " + (_cost_of(run["cost"]) or "covered, nothing more to pay"))
    if stream["spend"] is not None:
        lines.append(f"  spend over {len(stream['runs'])} run(s): " + parameters_text(stream["spend"], "up"))
    return lines


def _cost_of(events: list[dict[str, Any]]) -> str:
    """``epsilon=6, delta=1e-09`` from a cost as JSON (several events joined by ``+``), rounded up."""
    return " + ".join(parameters_text({k: v for k, v in e.items() if k in ("epsilon", "delta", "rho")}, "up")
                      for e in events)


#: A schedule's dry run shows this many of its first runs, then its last.
SHOWN_RUNS = 7


def schedule_plan_lines(plan: ScheduleDryRun, analyst: str, refused: str | None) -> list[str]:
    """A schedule's dry run in words: the schedule, the stated sizes, a table of its next runs (ε, margins),
    the ε they use of the reservation, the fixed alternative, and the ledger's answer."""
    sc, spend = plan["schedule"], plan["spend"]
    standing = "new" if sc["new"] else f"{sc['runs_so_far']} run(s) so far"
    budget = f"ε = {parameter_text(sc['total_epsilon'], 'up')}" + (
        f", δ = {parameter_text(sc['total_delta'], 'up')}" if sc["total_delta"] != "0" else "")
    lines = ["dry run: no data read, nothing charged",
             f"schedule {sc['name']!r} ({sc['scheduler']}, {standing}): {budget} for all its runs, reserved once"
             + (f"; γ = {sc['gamma']}" if sc.get("gamma") else "")]
    counts = "units" if plan.get("units") else "rows"
    r = plan.get("units") if counts == "units" else plan.get("rows")
    if r:
        if r.get("each"):
            grown = "; the later runs as stated, run by run"
        elif r["last"] != r["first"]:
            grown = (f", growing to {r['last']:,} at run {plan['runs'][-1]['run']} by a constant factor per run "
                     "(geometric: state each run's size as N1,N2,… if the data grow otherwise)")
        else:
            grown = ""
        lines.append(f"  sizes stated with --{counts} (never read from the data): {r['first']:,} at the next run"
                     + grown)
    lines += _runs_table(plan["runs"], counts)
    lines.append(f"  after run {plan['runs'][-1]['run']} ({spend['runs']} planned): "
                 f"ε used {parameter_text(spend['epsilon_used'], 'up')} of {parameter_text(spend['reserved'], 'up')}"
                 + (f" (size estimates {parameter_text(spend['size_estimates'], 'up')})"
                    if spend["size_estimates"] else "")
                 + f"; unused {parameter_text(spend['unused'], 'down')}")
    alt = plan.get("fixed_alternative")
    if alt:
        lines.append(f"  known number of runs? --scheduler fixed --epsilon {alt['epsilon']} spends the total evenly "
                     f"over {alt['runs']} runs: " + _margins_text(alt) + " each")
    if refused is None:
        what = "the reservation" if sc["new"] else f"these runs (covered by reservation #{plan.get('reservation')})"
        lines.append(f"  ledger {analyst!r}: would accept {what}")
    else:
        lines.append(f"  ledger {analyst!r}: would refuse it: {refused}")
    return lines


def _runs_table(runs: list[RunPlan], counts: str = "rows") -> list[str]:
    """One line per planned run (the first :data:`SHOWN_RUNS` and the last): size (``counts``: rows or units),
    release, ε, margins."""
    shown: list[RunPlan | None] = list(runs) if len(runs) <= SHOWN_RUNS + 1 else [*runs[:SHOWN_RUNS], None, runs[-1]]
    sized = any(_size(r, counts) is not None for r in runs)
    lines = ["     run" + (f"{counts:>12}" if sized else "") + "  release (95% margins)"]
    for r in shown:
        if r is None:
            lines.append("    …")
            continue
        size = f"{_size(r, counts):>12,}" if sized else ""
        if r["release"] == "new":
            step = f"epoch {r['epoch']}" if "epoch" in r else "new release"
            what = f"{step}, ε = {parameter_text(r['epsilon'], 'up')}" + (
                f" (ρ = {parameter_text(r['rho'], 'up')})" if "rho" in r else "")
            if r.get("parts"):  # the run that chooses the auto bounds, from its own ε
                what += " (" + ", ".join(f"{part} {budget}" for part, budget in r["parts"].items()) + ")"
            what += "; " + _margins_text(r)
        elif r["release"] == "cached":
            what = "the epoch's release again (free)"
        else:
            what = f"refused: {r['refused']}"
        lines.append(f"    {r['run']:>4}{size}  {what}")
    return lines


def _size(run: RunPlan, counts: str) -> int | None:
    """A planned run's stated size (``counts``: rows or units)."""
    return run.get("units") if counts == "units" else run.get("rows")


def _threshold_and_parts(plan: DryRun) -> list[str]:
    """A dry run's threshold (a number, or chosen at run time with the partition bound), the budget's parts and the
    largest caps ``auto`` can choose."""
    lines = []
    threshold = plan.get("threshold") if "threshold" in plan else None
    if isinstance(threshold, str):
        lines.append(f"  threshold: {threshold} (it grows with the partition bound)")
    elif threshold is not None:
        lines.append(f"  threshold: groups need at least {threshold} noisy units")
    if "parts" in plan and (parts := plan.get("parts")):
        lines.append("  parts: " + ", ".join(f"{part} {budget}" for part, budget in parts.items()))
    if "owned" in plan and (tables := plan.get("owned")):  # sql's owned tables and the stability the noise covers
        owned = ", ".join(f"{name} through {o['through']} ({o['max_keys_per_owner']} keys per owner)"
                          for name, o in tables.items())
        others = (plan["stability"] - 1) // 2
        lines.append(f"  owned: {owned}; noise ×{plan['stability']}: one unit may change the rows of {others} others")
    if "largest_caps" in plan and (caps := plan.get("largest_caps")):
        lines.append(_largest_caps_line(caps))
    return lines


def _margins_text(doc: RunMargins) -> str:
    """``count ±4,204 (×1.2 an average group's count)``: a release's 95% margins."""
    relative = doc.get("moe95_relative") or {}
    bits = []
    for column, margin in (doc.get("moe95") or {}).items():
        if isinstance(margin, str):  # "chosen at run time": it depends on an auto bound not chosen yet
            bits.append(f"{column} {margin}")
            continue
        bit = f"{column} ±{quantity_text(margin)}"
        if column in relative:
            bit += f" ({quantity_text(relative[column])}× an average group's count)"
        bits.append(bit)
    return ", ".join(bits) or "no margin"


def _largest_caps_line(caps: LargestCaps) -> str:
    """``largest caps auto can choose: K 50, C 65,536``: where a dry run's "at the largest caps" margins are."""
    line = (f"  largest caps auto can choose: --max-partitions {caps['max_partitions']:,}, --max-contributions "
            f"{caps['max_contributions']:,}")
    if not caps["sampleable"]:
        line += " (noise too large to sample there: shown, the most at caps it can sample)"
    return line


def _rank_text(m: MeasurementPlan) -> str:
    """``, 95% rank margin ±87.3 rows``: a quantile's error in rank (bounded rows), when the dry run knows it."""
    rank = m.get("rank_moe95")
    if rank is None:
        return ""
    if isinstance(rank, str):  # it depends on a bound chosen at run time
        return "".join([f", 95% rank margin {rank}", *_caps_text(m, True, " rows")])
    return f", 95% rank margin ±{quantity_text(rank)} rows"


def _caps_text(m: MeasurementPlan, rank: bool = False, unit: str = "") -> list[str]:
    """`` (±60 at caps of 1, at most ±3,900,000 at the largest caps)``: a run-time margin's range (``rank``: of a
    quantile's rank margin)."""
    if rank:
        low, high = m.get("rank_moe95_at_caps_of_1"), m.get("rank_moe95_at_largest_caps")
    else:
        low, high = m.get("moe95_at_caps_of_1"), m.get("moe95_at_largest_caps")
    shown = [f"±{quantity_text(low)}{unit} at caps of 1"] if low is not None else []
    if isinstance(high, float | int):
        shown.append(f"at most ±{quantity_text(high)}{unit} at the largest caps")
    elif low is not None:
        shown[-1] += ", more at the caps chosen"
    return [f" ({', '.join(shown)})"] if shown else []


def _noise_text(m: MeasurementPlan) -> str:
    """``discrete_laplace, scale 20, 95% margin ±60`` from a noise description."""
    if "noise" not in m:
        return str(m.get("mechanism", "exponential")) + " mechanism" + _rank_text(m)
    bits = [m["noise"].replace("_", " ")]
    bits += [f"{k.replace('_', ' ')} {v}" for k, v in m.items()
             if k not in ("noise", "moe95", "column", "moe95_at_caps_of_1", "moe95_at_largest_caps")]
    margin = m.get("moe95")
    if isinstance(margin, str):  # a margin that depends on a bound chosen at run time
        bits.append(f"95% margin {margin}" + "".join(_caps_text(m)))
    elif margin is not None:
        bits.append(f"95% margin ±{quantity_text(margin)}")
    return ", ".join(bits)


def write_release(s: Settings, release: Release, output: Output, as_json: bool) -> None:
    """Write a charged release (stdout or -o), its summary (--json, or one line on stderr on a terminal)
    and the notes that change how to read it (stderr unless -q, also in pipes)."""
    step = grid_step(release.report)
    table = release.table
    if as_json and not (output.path and output.path != "-"):
        emit_json({"result": json.loads(shown(table, step, release.times).write_json()), "summary": release.report})
        progress.written("standard output")
    else:
        if output.format == "table":
            typer.echo(table_text(table, step, release.times))
            progress.written("standard output")
        else:
            write_output(table, output.path, output.format, step=step, times=release.times)
        if as_json:
            emit_json(release.report)
        elif s.chatty:
            typer.echo(f"dpcli: {release.summary}", err=True)
    for note in release.notes:
        notice(s, render_note(note))


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def _width_needed(shown: pl.DataFrame) -> int:
    """The table's width with every header and value whole (never truncated)."""
    return sum(max([len(c), *(len(_cell(v)) for v in shown[c].to_list())]) + 3 for c in shown.columns)


def table_text(table: pl.DataFrame, step: float | None = None, times: tuple[str, ...] = ()) -> str:
    """The result as a readable table (rich), its numbers and times as in CSV (:func:`dpcli.io.outputs.shown`);
    empty results say so."""
    from rich.console import Console
    from rich.table import Table

    view_of = shown(table, step, times)
    view = Table(show_edge=False, header_style="bold")
    for column, dtype in view_of.schema.items():
        view.add_column(column, justify="right" if dtype.is_numeric() else "left")
    for row in view_of.iter_rows():
        view.add_row(*(_cell(v) for v in row))
    console = Console(width=max(_width_needed(view_of), Console().width), highlight=False)
    with console.capture() as captured:
        console.print(view if view_of.height else f"(no rows; columns: {', '.join(view_of.columns)})")
    return captured.get().rstrip("\n")
