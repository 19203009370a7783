"""The CLI tail every releasing command shares: plan the output, charge (library), then write and report.

The release logic (seed, debit, report) is :mod:`dpcli.release`; this module only checks the
output plan before any data is read and renders: the result to stdout or ``-o``, the summary as
``--json`` or one line on stderr.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import typer

from dpcli.cli._common import Settings, emit_json
from dpcli.core.events import PrivacyEvent
from dpcli.errors import UsageError
from dpcli.files import InputTable, check_output_path, output_format_for, write_output
from dpcli.release import Prepared, Release, ReleaseSeed, charge
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
    fmt = output_format_for(output, out_format)
    if as_json and (not output or output == "-") and out_format not in (None, "json"):
        raise UsageError("--json without -o prints one JSON document; drop --format or write the data with -o FILE")
    check_output_path(output, state_dir, inputs)
    return fmt


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
) -> dict[str, Any]:
    """Debit the release (:func:`dpcli.release.charge`), then write it and report; the report."""
    prepared = Prepared(seed, events, table, metadata, actual)
    release = charge(s.state_dir, analyst, command, prepared, summary_line, lock_timeout=s.lock_timeout,
                     step=step, before_output=before_output, inputs=inputs)
    write_release(s, release, output, out_format, as_json)
    return release.report


def write_release(s: Settings, release: Release, output: str | None, out_format: str, as_json: bool) -> None:
    """Write a charged release and its report."""
    write_and_report(s, release.table, output, out_format, release.report, as_json, release.summary)


def write_and_report(
    s: Settings,
    table: pl.DataFrame,
    output: str | None,
    out_format: str,
    report: dict[str, Any],
    as_json: bool,
    line: str,
) -> None:
    """Write the result (stdout or -o) and the summary (--json) or one line on stderr."""
    if as_json and (not output or output == "-"):
        emit_json({"result": json.loads(table.write_json()), "summary": report})
        return
    write_output(table, output, out_format)
    if as_json:
        emit_json(report)
    elif s.chatty:
        typer.echo(f"dpcli: {line}", err=True)
