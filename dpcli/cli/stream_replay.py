"""``dpcli stream-replay``: declare the options, build the query, call :mod:`dpcli.tasks.stream_replay`,
charge, write."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dpcli.access import Source, gate
from dpcli.cli._common import handles_errors, resolve_analyst, settings, working
from dpcli.cli._options import (
    DelimiterOpt,
    DeltaOpt,
    EngineOpt,
    EpsilonOpt,
    FormatOpt,
    InputArg,
    InputFormatOpt,
    JsonOpt,
    MasterOpt,
    OutputOpt,
    RemoteOpt,
    SparkConfOpt,
    UnitOpt,
    bounds,
    columns,
    positive,
    probability,
)
from dpcli.cli._sources import data_source
from dpcli.errors import UsageError
from dpcli.io.opening import EarlyInput, hash_early

if TYPE_CHECKING:  # the library is imported inside the command: `dpcli --help` stays fast
    from dpcli.io.inputs import InputTable
    from dpcli.release import Calibration
    from dpcli.tasks import stream_replay as sr


@handles_errors
def stream_replay(
    ctx: typer.Context,
    input: InputArg,
    time: Annotated[str, typer.Option("--time", help="Event-time column (timestamps, ISO strings or epoch seconds).")],
    by: Annotated[str, typer.Option("--by", help="Group-by column(s), comma-separated.")],
    window: Annotated[str, typer.Option("--window", help="Event-time window size, e.g. 1d, 6h, 3600.")],
    max_contributions: Annotated[
        int, typer.Option("--max-contributions", help="C: records kept per unit over the whole stream.", max=10**6)
    ],
    privacy_unit: UnitOpt = None,
    epsilon: EpsilonOpt = None,
    delta: DeltaOpt = None,
    triggers: Annotated[int | None, typer.Option("--triggers", help="Triggers (micro-batches) per window.", max=10**6)] = None,
    trigger_every: Annotated[
        str | None, typer.Option("--trigger-every", help="Trigger interval, e.g. 15m (instead of --triggers).")
    ] = None,
    value: Annotated[str | None, typer.Option("--value", help="Numeric column to sum (with --bounds).")] = None,
    bounds_text: Annotated[
        str | None, typer.Option("--bounds", help="-L:L bounds of --value (symmetric); values outside are clamped.")
    ] = None,
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
    with_error: Annotated[
        bool, typer.Option("--with-error", help="Add 95% margins (_moe95 columns; normal approximation, worst trigger).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the noise and 95% margins, the cost and whether the ledger would "
                           "accept it; read no data, charge nothing.")
    ] = False,
    input_format: InputFormatOpt = None,
    delimiter: DelimiterOpt = None,
    engine: EngineOpt = "polars",
    master: MasterOpt = None,
    remote: RemoteOpt = None,
    spark_conf: SparkConfOpt = None,
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
    source = data_source(input, privacy_unit, input_format, delimiter)
    early = hash_early(source, read=not dry_run and engine == "polars")  # hashed while the rest loads
    from dpcli.cli._engine import bounding_engine, check_engine, open_spark_input
    from dpcli.cli._release import charge_and_write, output_plan, show_dry_run
    from dpcli.cli._times import parse_moment
    from dpcli.io.outputs import check_path_is_not_protected
    from dpcli.release import Calibration, release_seed
    from dpcli.state import ledger
    from dpcli.state.paths import ensure_state_dir
    from dpcli.tasks import stream_replay as sr
    from dpcli.tasks.stream.plan import margins95, with_margins

    s = settings(ctx)
    analyst = resolve_analyst(None, ctx)
    query = _query(time, by, source.privacy_unit, window, triggers, trigger_every, max_contributions, epsilon, delta, value,
                   bounds_text, mu)
    plan = sr.plan_stream(query)
    if dry_run:
        ledger.read_ledger(ensure_state_dir(s.state_dir), analyst)  # exit 77 without a ledger
        margins = margins95(query, plan)
        doc = {"query": query.canonical(), **plan.summary, "moe95": margins, "cost": [e.to_json() for e in plan.events]}
        show_dry_run(s, analyst, doc, list(plan.events), as_json)
        return
    led = ledger.read_ledger(ensure_state_dir(s.state_dir), analyst)  # fail early (exit 77) without a ledger
    calibration = Calibration(led.limits.mode, plan)
    moment = parse_moment(through) if through is not None else None
    if moment is not None:
        sr.trigger_through(moment, query.step)  # a bad --through fails before any data is read
    state_path = gate().stream_state(state) if state is not None else None
    if state_path is not None and not gate().service:  # written: never into the state dir, never over an input
        check_path_is_not_protected(state_path, s.state_dir, (source.location,), what="--state file", state_file=True)
    fmt = output_plan(output, out_format, as_json, state_dir=s.state_dir, inputs=(source.location, state_path))
    spark = check_engine(engine, master, remote, spark_conf, source)
    table = _open(source, query, open_spark_input(s, spark, source), early)
    bounder = bounding_engine(s, spark, table, source.delimiter or ",")
    events = bounder.stream_events if bounder else None
    margins = (lambda t: with_margins(t, query, plan)) if with_error else (lambda t: t)
    if state_path is not None:
        _incremental(ctx, analyst, state_path, state or "", moment, query, calibration, table, output, fmt, as_json,
                     margins, events)
        return
    # v2: records that cannot count are dropped (v1 refused the file or counted null values as 0).
    seed = release_seed(s.state_dir, {"command": "stream-replay", "v": 2, **query.canonical()}, {"data": table},
                        calibration, bounder)
    with working(ctx, f"replaying {table.name}"):
        release = sr.run_stream(table.frame, query, plan, seed.seed, moment, name=table.name, engine=events)
    line = (f"stream-replay of {table.name}: {release.metadata['releases']} release row(s), "
            f"triggers run through {release.metadata['through']}")
    charge_and_write(s, analyst, "stream-replay", seed, list(plan.events), margins(release.table), output, fmt,
                     {"command": "stream-replay", **release.metadata}, as_json, line, inputs=(table,))


def _query(
    time: str, by: str, unit: str, window: str, triggers: int | None, trigger_every: str | None, max_contributions: int,
    epsilon: str | None, delta: str | None, value: str | None, bounds_text: str | None, mu: int,
) -> sr.StreamQuery:
    """The query the options describe (window and trigger spacing as durations)."""
    from dpcli.cli._times import parse_duration
    from dpcli.tasks import stream_replay as sr

    size = parse_duration(window)
    if (triggers is None) == (trigger_every is None):
        raise UsageError("give exactly one of --triggers N or --trigger-every DURATION")
    n_triggers = triggers if triggers is not None else size // parse_duration(trigger_every or "")
    if trigger_every is not None and size % parse_duration(trigger_every):
        raise UsageError(f"--trigger-every {trigger_every} does not divide --window {window}")
    clamp = None
    lo_hi = bounds("--bounds", bounds_text)
    if lo_hi is not None:
        if lo_hi[0] != -lo_hi[1]:
            raise UsageError(f"--bounds of stream-replay must be symmetric, -L:L (DP-SQLP clamps |value| ≤ L), got {bounds_text!r}")
        clamp = lo_hi[1]
    return sr.StreamQuery(
        time=time, keys=columns("--by", by), unit=unit, window=size, triggers=int(n_triggers),
        max_records=max_contributions, epsilon=positive("--epsilon", epsilon, required=True),  # type: ignore[arg-type]
        delta=probability("--delta", delta, required=True, allow_zero=False),  # type: ignore[arg-type]
        value=value, clamp=clamp, mu=mu,
    )


def _open(source: Source, query: sr.StreamQuery, table: InputTable | None = None,
          early: EarlyInput | None = None) -> InputTable:
    """The input (``table`` if Spark listed it already), its schema checked. CSV columns the query reads
    are taken as text: their types (and the keys' spelling and order) must not depend on what one
    record holds; times and values are parsed per record by the task."""
    from dpcli.io.inputs import open_input, require_columns

    value = [query.value] if query.value else []
    if table is None:
        table = open_input(source, text_columns=(query.time, query.unit, *query.keys, *value), early=early)
    wanted = {query.unit: "key", query.time: "temporal", **{k: "key" for k in query.keys}}
    if query.value:
        wanted[query.value] = "any"  # numeric or text (parsed per record; unparsable values are dropped)
    require_columns(table, wanted)  # type: ignore[arg-type]
    return table


def _incremental(
    ctx: typer.Context, analyst: str, path: Path, label: str, moment: datetime | None, query: sr.StreamQuery,
    calibration: Calibration, table: InputTable, output: str | None, fmt: str, as_json: bool,
    margins: Callable[[Any], Any], events: Any = None,
) -> None:
    """One cron run against a state file (:func:`dpcli.tasks.stream_replay.state_run`): charge, save, write.

    A new stream's seed binds its query, a fresh reservation id and ``calibration``; it has no
    inputs (it is made once, for every run): each run's input, with its reading, is bound by the
    run's digest in the ledger."""
    from dpcli.cli._release import charge_and_write, write_and_report
    from dpcli.release import ReleaseSeed, release_seed
    from dpcli.tasks import stream_replay as sr

    s = settings(ctx)
    plan = calibration.plan
    data = sr.StateInput(table.frame, table.fingerprint, table.name, events, reading=table.reading_material())
    with sr.state_run(path, query, plan, data, analyst=analyst, state_dir=s.state_dir, lock_timeout=s.lock_timeout,
                      new_seed=lambda material: release_seed(s.state_dir, material, {}, calibration), through=moment,
                      busy=lambda: working(ctx, f"feeding {table.name} to {label}")) as run:
        if run.repeat:
            write_and_report(s, margins(run.table), output, fmt, run.metadata, as_json,
                             f"stream-replay: repeated run, same rows as before (state {label}, free)")
            return
        line = (f"stream-replay of {table.name} into {label}: {run.metadata['releases']} release row(s), "
                f"triggers run through {run.metadata['through']}")
        charge_and_write(s, analyst, "stream-replay --state", ReleaseSeed(b"", run.run_id, run.reservation),
                         list(plan.events), margins(run.table), output, fmt, run.metadata, as_json, line, step=run.step,
                         inputs=(table,), before_output=run.save)
