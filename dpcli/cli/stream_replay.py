"""``dpcli stream-replay``: parse options, call :mod:`dpcli.tasks.stream_replay`, charge, write."""

from __future__ import annotations

from typing import Annotated

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
from dpcli.cli._release import charge_and_write, output_plan, release_seed
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.state import ledger
from dpcli.state.paths import ensure_state_dir
from dpcli.tables import open_input, require_columns
from dpcli.tasks import stream_replay as sr


@handles_errors
def stream_replay(
    ctx: typer.Context,
    input: InputArg,
    time: Annotated[str, typer.Option("--time", help="Event-time column (timestamps, ISO strings or epoch seconds).")],
    key: Annotated[str, typer.Option("--key", help="Group-by key column(s), comma-separated.")],
    privacy_unit: UnitOpt,
    window: Annotated[str, typer.Option("--window", help="Event-time window size, e.g. 1d, 6h, 3600.")],
    max_records: Annotated[int, typer.Option("--max-records", help="C: records kept per unit over the whole stream.")],
    epsilon: EpsilonOpt = None,
    delta: DeltaOpt = None,
    triggers: Annotated[int | None, typer.Option("--triggers", help="Triggers (micro-batches) per window.")] = None,
    trigger_every: Annotated[
        str | None, typer.Option("--trigger-every", help="Trigger interval, e.g. 15m (instead of --triggers).")
    ] = None,
    value: Annotated[str | None, typer.Option("--value", help="Numeric column to sum (with --clamp).")] = None,
    clamp: Annotated[float | None, typer.Option("--clamp", help="L: values are clamped to [-L, L].")] = None,
    mu: Annotated[int, typer.Option("--mu", help="μ: a key needs more than μ units before it can be selected.")] = 0,
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
    seed = release_seed(s.state_dir, {"command": "stream-replay", "v": 1, **query.canonical()}, {"data": table.fingerprint})
    with working(ctx, f"replaying {table.name}"):
        release = sr.run_stream(table, query, plan, KeyedStream(seed.seed, "stream-replay"))
    line = (f"stream-replay of {table.name}: {release.metadata['releases']} release row(s) over "
            f"{release.metadata['keys_seen']} key(s)")
    charge_and_write(s, analyst, "stream-replay", seed, list(plan.events), release.table, output, fmt,
                     {"command": "stream-replay", **release.metadata}, as_json, line)
