"""``dpcli stream-replay``: parse options, call :mod:`dpcli.tasks.stream_replay`, charge, write."""

from __future__ import annotations

import base64
import io
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import polars as pl

import typer

from dpcli.cli._common import emit_json, handles_errors, resolve_analyst, settings, working
from dpcli.cli._options import (
    DeltaOpt,
    EpsilonOpt,
    FormatOpt,
    InputArg,
    InputFormatOpt,
    JsonOpt,
    OutputOpt,
    UnitOpt,
    columns,
    positive,
    probability,
)
from dpcli.cli._release import ReleaseSeed, charge_and_write, output_plan, release_seed, write_and_report
from dpcli.errors import UsageError
from dpcli.state import documents, ledger
from dpcli.state.paths import ensure_state_dir
from dpcli.tables import InputTable, open_input, require_columns
from dpcli.tasks import stream_replay as sr


@handles_errors
def stream_replay(
    ctx: typer.Context,
    input: InputArg,
    time: Annotated[str, typer.Option("--time", help="Event-time column (timestamps, ISO strings or epoch seconds).")],
    key: Annotated[str, typer.Option("--key", help="Group-by key column(s), comma-separated.")],
    privacy_unit: UnitOpt,
    window: Annotated[str, typer.Option("--window", help="Event-time window size, e.g. 1d, 6h, 3600.")],
    max_records: Annotated[int, typer.Option("--max-records", help="C: records kept per unit over the whole stream.", max=10**6)],
    epsilon: EpsilonOpt = None,
    delta: DeltaOpt = None,
    triggers: Annotated[int | None, typer.Option("--triggers", help="Triggers (micro-batches) per window.", max=10**6)] = None,
    trigger_every: Annotated[
        str | None, typer.Option("--trigger-every", help="Trigger interval, e.g. 15m (instead of --triggers).")
    ] = None,
    value: Annotated[str | None, typer.Option("--value", help="Numeric column to sum (with --clamp).")] = None,
    clamp: Annotated[float | None, typer.Option("--clamp", help="L: values are clamped to [-L, L].")] = None,
    mu: Annotated[int, typer.Option("--mu", help="μ: a key needs more than μ units before it can be selected.", max=10**9)] = 0,
    state: Annotated[
        str | None,
        typer.Option("--state", help="Incremental mode: keep the stream in FILE between runs (cron); each run "
                     "feeds the events after the last run and emits the triggers they complete."),
    ] = None,
    through: Annotated[
        str | None,
        typer.Option("--through", help="With --state: run every trigger ending at or before TIME (ISO or epoch "
                     "seconds), even with no events."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the calibration and cost; read no data.")] = False,
    input_format: InputFormatOpt = None,
    output: OutputOpt = None,
    out_format: FormatOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a file of events as micro-batches and emit continual DP histograms (DP-SQLP).

    At every trigger of every event-time window, the keys released then get
    their window's noisy cumulative count (and sum), under one (ε, δ)
    user-level guarantee for the whole output stream.

    With --state FILE the stream persists between runs: the first run creates
    FILE (0600) and debits the whole stream's (ε, δ) once; each later run takes
    only events after the last trigger already run, and a run repeated with the
    same input returns the same rows again.
    """
    s = settings(ctx)
    analyst = resolve_analyst(None, ctx)
    size = sr.parse_duration(window)
    if (triggers is None) == (trigger_every is None):
        raise UsageError("give exactly one of --triggers N or --trigger-every DURATION")
    n_triggers = triggers if triggers is not None else size // sr.parse_duration(trigger_every or "")
    if trigger_every is not None and size % sr.parse_duration(trigger_every):
        raise UsageError(f"--trigger-every {trigger_every} does not divide --window {window}")
    query = sr.StreamQuery(
        time=time, keys=columns("--key", key), unit=privacy_unit, window=size, triggers=int(n_triggers),
        max_records=max_records, epsilon=positive("--epsilon", epsilon, required=True),  # type: ignore[arg-type]
        delta=probability("--delta", delta, required=True, allow_zero=False),  # type: ignore[arg-type]
        value=value, clamp=clamp, mu=mu,
    )
    plan = sr.plan_stream(query)
    if dry_run:
        emit_json({"query": query.canonical(), **plan.summary, "cost": [e.to_json() for e in plan.events]})
        return
    ledger.read_ledger(ensure_state_dir(s.state_dir), analyst)  # fail early (exit 77) without a ledger
    fmt = output_plan(output, out_format, as_json)
    table = open_input(input, input_format)
    wanted = {privacy_unit: "key", time: "temporal", **{k: "key" for k in query.keys}}
    if value:
        wanted[value] = "numeric"
    require_columns(table, wanted)  # type: ignore[arg-type]
    if state is not None:
        _incremental(ctx, analyst, Path(state), through, query, plan, table, output, fmt, as_json)
        return
    if through is not None:
        raise UsageError("--through needs --state FILE")
    seed = release_seed(s.state_dir, {"command": "stream-replay", "v": 1, **query.canonical()}, {"data": table.fingerprint})
    with working(ctx, f"replaying {table.name}"):
        release = sr.run_stream(table, query, plan, seed.seed)
    line = (f"stream-replay of {table.name}: {release.metadata['releases']} release row(s) over "
            f"{release.metadata['keys_seen']} key(s)")
    charge_and_write(s, analyst, "stream-replay", seed, list(plan.events), release.table, output, fmt,
                     {"command": "stream-replay", **release.metadata}, as_json, line)


def _parse_time(text: str) -> datetime:
    try:
        if text.strip().lstrip("-").isdigit():
            return datetime.fromtimestamp(int(text), tz=timezone.utc)
        moment = datetime.fromisoformat(text.strip())
    except (ValueError, OverflowError):
        raise UsageError(f"cannot read --through {text!r} (use e.g. 2026-11-02T00:00:00 or epoch seconds)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _incremental(
    ctx: typer.Context, analyst: str, path: Path, through: str | None, query: sr.StreamQuery, plan: sr.StreamPlan,
    table: InputTable, output: str | None, fmt: str, as_json: bool,
) -> None:
    """One cron run against a state file: check it, run the new triggers, charge (first run), save, write."""
    s = settings(ctx)
    moment = _parse_time(through) if through is not None else None
    schema = sr.key_schema_of(table, query)
    with documents.locked(path, s.lock_timeout):
        body = documents.read(path, sr.STATE_KIND)
        if body is not None:
            sr.check_state_body(body, query, analyst, schema, str(path))
            last = body.get("last")
            if last and last["input"] == table.fingerprint and last["through"] == through:
                cached = pl.read_parquet(io.BytesIO(base64.b64decode(last["release"])))
                write_and_report(s, cached, output, fmt, {**last["metadata"], "charged": False, "retry": True},
                                 as_json, f"stream-replay: repeated run, same rows as before (state {path}, free)")
                return
        else:
            seed = release_seed(s.state_dir, {"command": "stream-replay", "v": 1, **query.canonical(),
                                              "state": secrets.token_hex(16)}, {})
            body = sr.new_state_body(query, analyst, seed.seed, seed.id, schema,
                                     datetime.now(timezone.utc).isoformat(timespec="seconds"))
        stream = sr.load_state(body, query, plan)
        with working(ctx, f"feeding {table.name} to {path}"):
            release = sr.advance_stream(table, stream, moment)
        reservation = f"stream:{body['seed_id']}"
        if body["stream"] is None:  # a new stream: debit all of it before anything is written
            ledger.charge(s.state_dir, analyst, command="stream-replay --state", query_id=reservation,
                          seed_id=reservation, reserve=list(plan.events), lock_timeout=s.lock_timeout,
                          summary=f"stream {path.name} reserves its whole (ε, δ)")
        buf = io.BytesIO()
        release.table.write_parquet(buf)
        metadata = {"command": "stream-replay", "state": str(path), **release.metadata}
        last = {"input": table.fingerprint, "through": through, "metadata": metadata,
                "release": base64.b64encode(buf.getvalue()).decode("ascii")}
        documents.write(path, sr.STATE_KIND, sr.state_body(body, stream, last))  # before output: a trigger runs once
    run_id = ReleaseSeed(b"", f"{body['seed_id']}/{release.metadata['through']}", reservation)
    line = (f"stream-replay of {table.name} into {path}: {release.metadata['releases']} release row(s), "
            f"triggers run through {release.metadata['through']}")
    charge_and_write(s, analyst, "stream-replay --state", run_id, list(plan.events), release.table, output, fmt,
                     metadata, as_json, line, covered_by=reservation)
