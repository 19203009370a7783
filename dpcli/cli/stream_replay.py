"""``dpcli stream-replay``: declare the options, build the task, run the release path (once, or against a
``--state`` stream), render."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dpcli.access import gate
from dpcli.cli._common import busy, handles_errors, payer, settings
from dpcli.cli._groups import (
    CHOICE_GIVEN,
    ENGINE_GIVEN,
    INPUT_GIVEN,
    OUTPUT_GIVEN,
    ChoiceOptions,
    InputOptions,
    OutputOptions,
    choice_options,
    engine_options,
    input_options,
    output_options,
)
from dpcli.cli._options import (
    BoundOptions,
    DeltaOpt,
    EpsilonOpt,
    InputArg,
    RunsOpt,
    UnitOpt,
    bounds_or_auto,
    cap,
    columns,
    positive,
    probability,
)
from dpcli.cli._sources import data_source
from dpcli.errors import UsageError
from dpcli.io.opening import hash_early

if TYPE_CHECKING:
    from dpcli.spark.engine import (
        EngineRequest,  # the library is imported inside the command: `dpcli --help` stays fast
    )
    from dpcli.tasks import stream as sr


@handles_errors
@output_options
@choice_options
@input_options
@engine_options
def stream_replay(
    ctx: typer.Context,
    input: InputArg,
    time: Annotated[str, typer.Option("--time", help="Event-time column (timestamps, ISO strings or epoch seconds).")],
    by: Annotated[str, typer.Option("--by", help="Group-by column(s), comma-separated.")],
    window: Annotated[str, typer.Option("--window", help="Event-time window size, e.g. 1d, 6h, 3600.")],
    max_contributions: Annotated[
        str, typer.Option("--max-contributions", metavar="N|auto",
                          help="C: records kept per unit over the whole stream, or auto: chosen privately from "
                               "the data (docs/choosing-parameters.md).")
    ],
    privacy_unit: UnitOpt = None,
    epsilon: EpsilonOpt = None,
    delta: DeltaOpt = None,
    triggers: Annotated[
        int | None, typer.Option("--triggers", help="Triggers (micro-batches) per window.", max=10**6)
    ] = None,
    trigger_every: Annotated[
        str | None, typer.Option("--trigger-every", help="Trigger interval, e.g. 15m (instead of --triggers).")
    ] = None,
    value: Annotated[str | None, typer.Option("--value", help="Numeric column to sum (with --bounds).")] = None,
    bounds_text: Annotated[
        str | None, typer.Option("--bounds", metavar="-L:L|auto",
                                 help="-L:L bounds of --value (symmetric); values outside are clamped; or auto: L "
                                      "chosen privately from the data.")
    ] = None,
    mu: Annotated[
        int, typer.Option("--mu", help="μ: a key needs more than μ units before it can be selected.", max=10**9)
    ] = 0,
    state: Annotated[
        str | None,
        typer.Option("--state", help="Incremental mode: keep the stream in FILE between runs (cron); each run "
                     "feeds the events not fed before and runs the triggers up to --through; events of later "
                     "triggers are kept in FILE until their trigger runs."),
    ] = None,
    through: Annotated[
        str | None,
        typer.Option("--through", help="Run every trigger ending at or before TIME (ISO 8601 or epoch seconds; "
                     "default: now); events of later triggers are ignored (kept, with --state)."),
    ] = None,
    with_error: Annotated[
        bool, typer.Option("--with-error", help="Add 95% margins (_moe95 columns; normal approximation, the "
                                                "largest noise a value at that trigger can have).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the noise and 95% margins per trigger, the triggers the next run "
                           "executes (with --state), the cost of the next --runs runs and whether the ledger would "
                           "accept it; read the schema but no record, charge nothing.")
    ] = False,
    runs: RunsOpt = None,
    choice: ChoiceOptions = CHOICE_GIVEN,  # --auto-share, --report-bias, --bias-share (choice_options)
    reading: InputOptions = INPUT_GIVEN,  # --input-format, --delimiter (input_options)
    engine: EngineRequest = ENGINE_GIVEN,  # --engine, --master, --remote, --spark-conf (engine_options)
    out: OutputOptions = OUTPUT_GIVEN,  # -o, --format, --json (output_options)
) -> None:
    """Replay a file of events as micro-batches and emit continual DP histograms (DP-SQLP).

    At every trigger of every event-time window, the keys released then get
    their window's noisy cumulative count (and sum), under one (ε, δ)
    user-level guarantee for the whole output stream.

    The window_start and trigger_time columns are UTC: ISO 8601 with Z in
    CSV, JSON and tables (2026-11-01T06:00:00Z), datetimes in Parquet.

    Windows are aligned to the epoch; a run executes every trigger ending at
    or before --through (default: now), whatever the data, and ignores events
    after it. Records with a missing or unparsable time, a null unit or a
    missing or non-finite value are dropped before the per-unit cap, never
    counted or reported.

    With --state FILE the stream persists between runs: the first run creates
    FILE (0600) and debits the whole stream's (ε, δ) once. Each run's input
    holds the events not fed before; events whose trigger has not run yet are
    kept in FILE and counted when it runs, so none is lost to timing. Only late
    events (their trigger already ran) are dropped. The last run's input again
    is a retry: the rows it released then, free. Another input must come with a
    later --through (a correction is a new release, not a rewrite).
    """
    source = data_source(input, privacy_unit, reading.input_format, reading.delimiter)
    early = hash_early(source, read=not dry_run and engine.engine == "polars")  # hashed while the rest loads
    from dpcli import release
    from dpcli.cli._times import parse_moment
    from dpcli.cli.render import output_target, show_plan, write_release
    from dpcli.io.outputs import check_path_is_not_protected
    from dpcli.tasks.stream.algorithm import trigger_through
    from dpcli.tasks.stream.task import StreamTask

    query = _with_auto(_query(time, by, source.unit, window, triggers, trigger_every, max_contributions, epsilon,
                              delta, value, bounds_text, mu), max_contributions, bounds_text, choice, engine.engine)
    moment = parse_moment(through) if through is not None else None
    task, ledger = StreamTask(query, moment, with_error), payer(ctx)
    if moment is not None:
        trigger_through(moment, query.step)  # a bad --through fails before any data is read
    state_path = gate().stream_state(state) if state is not None else None
    if runs is not None and not dry_run:
        raise UsageError("--runs goes with --dry-run (the spend over N runs)")
    if state_path is not None and not gate().service:  # never a private file or an input, read (dry run) or written
        check_path_is_not_protected(state_path, ledger.state_dir, (source.location,), what="--state file",
                                    state_file=True)
    continuation = release.StreamRuns(state_path, label=state or "", through=moment)
    if dry_run:
        show_plan(release.plan(task, ledger, release.Sources(source), continuation=continuation, runs=runs),
                  ledger.analyst, out.as_json)
        return
    target = output_target(out)
    done = release.run(task, release.Sources(source), ledger, output=target,
                       engine=engine, early=early, busy=busy(ctx),
                       continuation=continuation)
    write_release(settings(ctx), done, target, out.as_json)


def _query(
    time: str, by: str, unit: str, window: str, triggers: int | None, trigger_every: str | None, max_contributions: str,
    epsilon: str | None, delta: str | None, value: str | None, bounds_text: str | None, mu: int,
) -> sr.StreamQuery:
    """The query the options describe (window and trigger spacing as durations)."""
    from dpcli.cli._times import parse_duration
    from dpcli.tasks import stream as sr

    size = parse_duration(window)
    if (triggers is None) == (trigger_every is None):
        raise UsageError("give exactly one of --triggers N or --trigger-every DURATION")
    n_triggers = triggers if triggers is not None else size // parse_duration(trigger_every or "")
    if trigger_every is not None and size % parse_duration(trigger_every):
        raise UsageError(f"--trigger-every {trigger_every} does not divide --window {window}")
    clamp = None
    lo_hi = bounds_or_auto("--bounds", bounds_text)
    if lo_hi is not None and lo_hi != "auto":
        if lo_hi[0] != -lo_hi[1]:
            raise UsageError(f"--bounds of stream-replay must be symmetric, -L:L (DP-SQLP clamps |value| ≤ L), got "
                             f"{bounds_text!r}")
        clamp = lo_hi[1]
    return sr.StreamQuery(
        time=time, keys=columns("--by", by), unit=unit, window=size, triggers=int(n_triggers),
        max_records=_records_cap(max_contributions), epsilon=positive("--epsilon", epsilon, required=True),
        delta=probability("--delta", delta, required=True, allow_zero=False),
        value=value, clamp=clamp, mu=mu,
    )


def _records_cap(text: str) -> int:
    """C as given (0 while ``auto``: chosen at run time, :func:`_with_auto`)."""
    c = cap("--max-contributions", text)
    return 0 if c == "auto" or c is None else c


def _with_auto(q: sr.StreamQuery, max_contributions: str, bounds_text: str | None, choice: ChoiceOptions,
               engine: str) -> sr.StreamQuery:
    """``q`` with the bounds left to dpcli (``auto``: C and L), the share choosing them and the bias report's
    share (:class:`dpcli.cli._options.BoundOptions`)."""
    from dataclasses import replace

    options = BoundOptions.given(None, cap("--max-contributions", max_contributions),
                                 bounds_or_auto("--bounds", bounds_text), choice)
    options.check_engine(engine)
    return replace(q, auto=options.auto_bounds(), report_bias=options.bias)
