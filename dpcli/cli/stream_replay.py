"""``dpcli stream-replay``: parse options, call :mod:`dpcli.tasks.stream_replay`, charge, write."""

from __future__ import annotations

import base64
import io
import secrets
from datetime import datetime, timedelta, timezone
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
from dpcli.errors import StateError, UsageError
from dpcli.state import documents, ledger
from dpcli.state.paths import ensure_state_dir
from dpcli.files import InputTable, check_path_is_not_protected, open_input, require_columns
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
                     "feeds the events after the last trigger already run and runs the triggers up to --through."),
    ] = None,
    through: Annotated[
        str | None,
        typer.Option("--through", help="Run every trigger ending at or before TIME (ISO 8601 or epoch seconds; "
                     "default: now); events after it are ignored."),
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

    Windows are aligned to the epoch; a run executes every trigger ending at
    or before --through (default: now), whatever the data, and ignores events
    after it. Records with a missing or unparsable time, a null unit or a
    missing or non-finite value are dropped before the per-unit cap, never
    counted or reported.

    With --state FILE the stream persists between runs: the first run creates
    FILE (0600) and debits the whole stream's (ε, δ) once; each later run takes
    only events after the last trigger already run (late events are dropped),
    and a run repeated with the same input returns the same rows again.
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
    moment = _parse_time(through) if through is not None else None
    if moment is not None:
        sr.trigger_through(moment, query.window // query.triggers)  # a bad --through fails before any data is read
    if state is not None:  # the state file is written: never into the state dir, never over an input
        check_path_is_not_protected(state, s.state_dir, (input,), what="--state file")
    fmt = output_plan(output, out_format, as_json, state_dir=s.state_dir, inputs=(input, state))
    # CSV columns the query reads are taken as text: their types (and the keys' spelling and order) must
    # not depend on what one record holds; times and values are parsed per record by the task.
    table = open_input(input, input_format, text_columns=(time, privacy_unit, *query.keys, *([value] if value else [])))
    wanted = {privacy_unit: "key", time: "temporal", **{k: "key" for k in query.keys}}
    if value:
        wanted[value] = "any"  # numeric or text (parsed per record; unparsable values are dropped)
    require_columns(table, wanted)  # type: ignore[arg-type]
    if state is not None:
        _incremental(ctx, analyst, Path(state), through, query, plan, table, output, fmt, as_json)
        return
    # v2: records that cannot count are dropped (v1 refused the file or counted null values as 0).
    seed = release_seed(s.state_dir, {"command": "stream-replay", "v": 2, **query.canonical()}, {"data": table.fingerprint})
    with working(ctx, f"replaying {table.name}"):
        release = sr.run_stream(table, query, plan, seed.seed, moment)
    line = (f"stream-replay of {table.name}: {release.metadata['releases']} release row(s), "
            f"triggers run through {release.metadata['through']}")
    charge_and_write(s, analyst, "stream-replay", seed, list(plan.events), release.table, output, fmt,
                     {"command": "stream-replay", **release.metadata}, as_json, line, inputs=(table,))


def _parse_time(text: str) -> datetime:
    """``--through``: ISO 8601 (naive means UTC) or integer epoch seconds; a usage error otherwise."""
    try:
        if text.strip().lstrip("-").isdigit():
            return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=int(text))
        moment = datetime.fromisoformat(text.strip())
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"cannot read --through {text!r} (use e.g. 2026-11-02T00:00:00 or epoch seconds)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _incremental(
    ctx: typer.Context, analyst: str, path: Path, through: str | None, query: sr.StreamQuery, plan: sr.StreamPlan,
    table: InputTable, output: str | None, fmt: str, as_json: bool,
) -> None:
    """One cron run against a state file: check it, run the new triggers, record in the ledger, save, write.

    The state is bound to the ledger (:class:`ledger.Step`): it carries a
    random reservation id and its step (runs recorded); a run is accepted at
    the ledger's latest step, or as an exact repeat of a recorded step (same
    step, same input and ``--through``: the same rows, free). A forked, rolled
    back or foreign copy is refused (exit 78), so the stream's seed and noise
    never meet other data. Order: compute in memory; a new stream's state (step
    0) on disk; the ledger (reservation and step); the state; the output.
    """
    s = settings(ctx)
    # The run's last trigger, from public inputs only (--through, default now): it identifies the step.
    moment = _parse_time(through) if through is not None else datetime.now(timezone.utc)
    last_trigger = sr.trigger_through(moment, query.window // query.triggers)
    schema = sr.key_schema_of(table, query)
    label = f"state file {path}"
    with documents.locked(path, s.lock_timeout):
        body = documents.read(path, sr.STATE_KIND)
        if body is not None:
            if body.get("analyst") != analyst:  # a state moved to another analyst: bound to another ledger
                raise StateError(f"{label} belongs to analyst {body.get('analyst')!r}, not {analyst!r}")
            sr.check_state_body(body, query, analyst, schema, str(path))
            if not isinstance(body.get("reservation"), str) or not isinstance(body.get("step"), int):
                raise StateError(f"{label} was written by an older dpcli (not bound to the ledger); start a new one")
            fresh = False
        else:
            rid = secrets.token_hex(12)
            seed = release_seed(s.state_dir, {"command": "stream-replay", "v": 1, **query.canonical(),
                                              "reservation": rid}, {})
            body = sr.new_state_body(query, analyst, seed.seed, seed.id, schema,
                                     datetime.now(timezone.utc).isoformat(timespec="seconds"))
            body.update(reservation=rid, step=0,
                        ledger_id=ledger.read_ledger(s.state_dir, analyst, s.lock_timeout).ledger_id)
            fresh = True
        secret = bytes.fromhex(body["seed"])
        digest = ledger.step_digest(secret, {"input": table.fingerprint, "through": last_trigger})
        last = body.get("last")
        if last and last["input"] == table.fingerprint and last["through"] == last_trigger:
            ledger.check_recorded(s.state_dir, analyst, body["reservation"], body["step"], digest, label,
                                  s.lock_timeout)
            cached = pl.read_parquet(io.BytesIO(base64.b64decode(last["release"])))
            write_and_report(s, cached, output, fmt, {**last["metadata"], "charged": False, "retry": True},
                             as_json, f"stream-replay: repeated run, same rows as before (state {path}, free)")
            return
        stream = sr.load_state(body, query, plan)
        with working(ctx, f"feeding {table.name} to {path}"):
            release = sr.advance_stream(table, stream, moment)
        reservation = f"stream:{body['reservation']}"
        create = None
        if body["step"] == 0:
            create = ledger.Reservation(
                id=body["reservation"], kind="stream", key=body["seed_id"], ledger_id=body.get("ledger_id", ""),
                events=tuple(plan.events), command="stream-replay --state",
                summary=f"stream {path.name} reserves its whole (ε, δ)",
            )
        if fresh:  # on disk before its reservation: a crash in between is retried with the same seed
            documents.write(path, sr.STATE_KIND, body)
        buf = io.BytesIO()
        release.table.write_parquet(buf)
        metadata = {"command": "stream-replay", "state": str(path), **release.metadata}
        last = {"input": table.fingerprint, "through": last_trigger, "metadata": metadata,
                "release": base64.b64encode(buf.getvalue()).decode("ascii")}
        new_body = {**sr.state_body(body, stream, last), "step": body["step"] + 1}
        run_id = ReleaseSeed(b"", f"{body['seed_id']}/{release.metadata['through']}", reservation)
        line = (f"stream-replay of {table.name} into {path}: {release.metadata['releases']} release row(s), "
                f"triggers run through {release.metadata['through']}")
        step = ledger.Step(reservation=body["reservation"], start=body["step"], digest=digest, label=label,
                           create=create)
        charge_and_write(s, analyst, "stream-replay --state", run_id, list(plan.events), release.table, output, fmt,
                         metadata, as_json, line, step=step, inputs=(table,),
                         before_output=lambda: documents.write(path, sr.STATE_KIND, new_body))

