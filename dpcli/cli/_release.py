"""The CLI tail every releasing command shares: plan the output, charge (library), then write and report.

The release logic (seed, debit, report) is :mod:`dpcli.release`; this module only checks the
output plan before any data is read and renders: the result to stdout or ``-o``, the summary as
``--json`` or one line on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import polars as pl
import typer

from dpcli.cli._common import Settings, emit_json, notice, render_note
from dpcli.core.events import PrivacyEvent
from dpcli.errors import UsageError
from dpcli.io.inputs import InputTable, fingerprint_bytes
from dpcli.io.outputs import (
    check_output_path,
    output_format_for,
    render,
    rounded,
    write_output,
)
from dpcli.release import Prepared, Release, ReleaseSeed, charge, cost_text
from dpcli.state import ledger


def output_plan(
    output: str | None,
    out_format: str | None,
    as_json: bool,
    *,
    state_dir: Path,
    inputs: Sequence[str | Path | None],
) -> str:
    """The output format, checked (with the -o path) before any data is read or budget spent.

    ``-o`` must not lie inside ``state_dir`` nor be one of ``inputs`` (every file the run reads:
    data, public lists, spec, block list, a --state file): exit 73.
    """
    to_stdout = not output or output == "-"
    if out_format is None and to_stdout and not as_json and sys.stdout.isatty():
        out_format = "table"  # a person is reading: a table; pipes and files get CSV
    fmt = output_format_for(output, out_format)
    if as_json and to_stdout and out_format not in (None, "json"):
        raise UsageError("--json without -o prints one JSON document; drop --format or write the data with -o FILE")
    if fmt == "table" and not to_stdout:
        raise UsageError("--format table is for reading on a terminal; write files as csv, parquet or json")
    check_output_path(output, state_dir, inputs)
    return fmt


def show_dry_run(s: Settings, analyst: str, plan: dict[str, Any], events: list[PrivacyEvent], as_json: bool) -> None:
    """``--dry-run``: the calibration (each measurement's noise and 95% margin in output units), the
    cost and whether the analyst's ledger would accept it now; text, or JSON with ``--json``."""
    led = ledger.read_ledger(s.state_dir, analyst, s.lock_timeout)
    refused = ledger.refusal(led, events)
    doc = {**plan, "ledger": {"analyst": analyst, "accepts": refused is None, "refusal": refused}}
    if as_json:
        emit_json(doc)
        return
    lines = ["dry run: no data read, nothing charged"]
    for name, m in (plan.get("calibration") or {}).items():
        lines.append(f"  {m.get('column', name)}: " + _noise_text(m))
    for column, margin in (plan.get("moe95") or {}).items():
        lines.append(f"  {column}: 95% margin ±{margin:.4g} (normal approximation, worst trigger)")
    if plan.get("count_noise"):
        lines.append("  count: " + _noise_text({**plan["count_noise"], "moe95": plan.get("count_moe95")}))
    if plan.get("threshold") is not None:
        lines.append(f"  threshold: groups need more than {plan['threshold']} noisy units")
    lines.append("  cost: " + (cost_text(events) or "nothing"))
    if refused is None:
        lines.append(f"  ledger {analyst!r}: would accept this release")
    else:
        lines.append(f"  ledger {analyst!r}: would refuse it: {refused}")
    typer.echo("\n".join(lines))


def _noise_text(m: dict[str, Any]) -> str:
    """``discrete_laplace, scale 20, 95% margin ±60`` from a noise description."""
    if "noise" not in m:
        return str(m.get("mechanism", "exponential")) + " mechanism"
    bits = [str(m["noise"]).replace("_", " ")]
    bits += [f"{k.replace('_', ' ')} {v}" for k, v in m.items() if k not in ("noise", "moe95", "column")]
    if m.get("moe95") is not None:
        bits.append(f"95% margin ±{m['moe95']:g}")
    return ", ".join(bits)


def charge_and_write(
    s: Settings,
    analyst: str,
    command: str,
    seed: ReleaseSeed,
    events: list[PrivacyEvent],
    table: pl.DataFrame,
    output: str | None,
    out_format: str,
    metadata: dict[str, Any],
    as_json: bool,
    summary_line: str,
    actual: list[PrivacyEvent] | None = None,
    step: ledger.Step | None = None,
    before_output: Callable[[], None] | None = None,
    inputs: Sequence[InputTable | None] = (),
    notes: Sequence[Any] = (),
) -> dict[str, Any]:
    """Debit the release (:func:`dpcli.release.charge`), then write it, report and add ``notes``; the report."""
    prepared = Prepared(seed, events, table, metadata, actual)
    release = charge(s.state_dir, analyst, command, prepared, summary_line, lock_timeout=s.lock_timeout,
                     step=step, before_output=before_output, inputs=inputs,
                     output_digest=output_digest(table, output, out_format, metadata))
    write_release(s, release, output, out_format, as_json, notes)
    return release.report


def _grid_step(report: dict[str, Any]) -> float | None:
    """The grid released values were snapped to (it sets how floats are rounded in text outputs)."""
    return float(Fraction(report["granularity"])) if report.get("granularity") else None


def output_digest(table: pl.DataFrame, output: str | None, out_format: str, metadata: dict[str, Any]) -> str | None:
    """The digest of the file a release is about to be written to (``-o FILE``), recorded in the ledger
    before it is written; None for standard output."""
    if not output or output == "-" or out_format == "table":
        return None
    return fingerprint_bytes(render(table, out_format, _grid_step(metadata)))


def write_release(s: Settings, release: Release, output: str | None, out_format: str, as_json: bool,
                  notes: Sequence[Any] = ()) -> None:
    """Write a charged release, its report and its notes."""
    write_and_report(s, release.table, output, out_format, release.report, as_json, release.summary, notes)


def write_and_report(
    s: Settings,
    table: pl.DataFrame,
    output: str | None,
    out_format: str,
    report: dict[str, Any],
    as_json: bool,
    line: str,
    notes: Sequence[Any] = (),
) -> None:
    """Write the result (stdout or -o), the summary (--json, or one line on stderr on a terminal) and
    the notes that change how to read it (stderr unless -q, also in pipes)."""
    step = _grid_step(report)
    if as_json and (not output or output == "-"):
        emit_json({"result": json.loads(rounded(table, step).write_json()), "summary": report})
    else:
        if out_format == "table":
            typer.echo(table_text(table, step))
        else:
            write_output(table, output, out_format, step=step)
        if as_json:
            emit_json(report)
        elif s.chatty:
            typer.echo(f"dpcli: {line}", err=True)
    for note in notes:
        notice(s, render_note(note))


def table_text(table: pl.DataFrame, step: float | None = None) -> str:
    """The result as a readable table (rich), floats rounded as in CSV; empty results say so."""
    from rich.console import Console
    from rich.table import Table

    shown = rounded(table, step)
    view = Table(show_edge=False, header_style="bold")
    for column, dtype in shown.schema.items():
        view.add_column(column, justify="right" if dtype.is_numeric() else "left")
    for row in shown.iter_rows():
        view.add_row(*("" if v is None else str(v) for v in row))
    cells = [[c, *("" if v is None else str(v) for v in shown[c].to_list())] for c in shown.columns]
    needed = sum(max(len(x) for x in col) + 3 for col in cells)  # never truncate a header or a value
    console = Console(width=max(needed, Console().width), highlight=False)
    with console.capture() as captured:
        console.print(view if shown.height else f"(no rows; columns: {', '.join(shown.columns)})")
    return captured.get().rstrip("\n")
