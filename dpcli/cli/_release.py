"""The tail every releasing command shares: debit the ledger, then write, then report.

Order matters: the output is computed in memory first (so bad data fails
before any debit), the ledger is charged durably, and only then is anything
written. A failed write after the debit loses the output but never
under-counts the budget; the identical re-run is then a free replay.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import typer

from dpcli import bounding
from dpcli.cli._common import Settings, emit_json
from dpcli.core.events import PrivacyEvent
from dpcli.core.prf import canonical_json, derive_seed, seed_id
from dpcli.state import keys, ledger
from dpcli.errors import UsageError
from dpcli.files import InputTable, check_output_path, output_format_for, verify_unchanged, write_output


@dataclass(frozen=True)
class ReleaseSeed:
    """The seed of one release and its public id."""

    seed: bytes
    id: str
    query_id: str


def release_seed(root: Any, query: dict[str, Any], data: dict[str, Any]) -> ReleaseSeed:
    """seed = HMAC(key, query + data fingerprints + polars and bounding versions); query id = hash of the query."""
    material = {"query": query, **data, "engine": f"polars {pl.__version__}; bounding {bounding.SEMANTICS}"}
    seed = derive_seed(keys.load_or_create_key(root), material)
    qid = "q:" + hashlib.sha256(canonical_json(query)).hexdigest()[:16]
    return ReleaseSeed(seed, seed_id(seed), qid)


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
    """Debit ``events`` (free if this seed was already released), write, report.

    ``inputs`` (the tables the release read) are first checked to be unchanged since they were
    hashed: a file rewritten while it was read is refused (exit 66) with no debit and no output.

    With ``step`` the release is a run against a stream's or schedule's state
    file, paid by its reservation (which ``step.create`` debits on the first
    run: the report then says ``"charged": true`` and lists it as ``reserved``).
    ``before_output`` runs after the debit and before anything is written
    (the state file's own write: ledger first, so a crash in between is
    retried as an exact, free repeat, never under-counted).
    """
    verify_unchanged(*inputs)
    receipt = ledger.charge(
        s.state_dir,
        analyst,
        command=command,
        query_id=seed.query_id,
        seed_id=seed.id,
        reserve=events,
        actual=actual,
        summary=summary_line,
        lock_timeout=s.lock_timeout,
        step=step,
    )
    if before_output is not None:
        before_output()
    charged = actual if actual is not None else events
    report = {
        **metadata,
        "cost": [] if step else [e.to_json() for e in charged],
        "charged": not receipt.replay and (step is None or bool(receipt.reserved)),
        "seed_id": seed.id,
        "ledger": {**receipt.to_json(), "remaining": receipt.remaining},
    }
    if receipt.reserved:
        report["reserved"] = [e.to_json() for e in receipt.reserved]
    if receipt.replay:
        cost = "free replay of an earlier identical release"
    elif receipt.reserved:
        cost = "reserved " + _cost_text(list(receipt.reserved)) + ", which covers this run"
    elif step:
        cost = "covered by the reservation"
    else:
        cost = "charged " + _cost_text(charged)
    remaining = ", ".join(f"{k}={v}" for k, v in report["ledger"]["remaining"].items())
    write_and_report(s, table, output, out_format, report, as_json, f"{summary_line}; {cost}; remaining {remaining}")
    return report


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


def _cost_text(events: list[PrivacyEvent]) -> str:
    parts = []
    for e in events:
        bits = [f"{k}={v}" for k, v in e.to_json().items() if k in ("epsilon", "delta", "rho", "units", "calls")]
        parts.append(f"{e.mechanism} ({', '.join(bits)})")
    return " + ".join(parts)
