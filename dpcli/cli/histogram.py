"""``dpcli histogram``: parse options, call :mod:`dpcli.tasks.histogram`, charge, write."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Annotated

import typer

from dpcli.cli._common import (
    handles_errors,
    resolve_analyst,
    settings,
    unit_word,
    working,
)
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
from dpcli.cli._schedule import (
    BetaOpt,
    GammaOpt,
    ImproverCOpt,
    ImproverIndexOpt,
    ScheduleOpt,
    SchedulerOpt,
    TotalDeltaOpt,
    TotalEpsilonOpt,
)
from dpcli.cli._sources import data_source, public_source
from dpcli.errors import UsageError
from dpcli.io.opening import hash_early

# The library (polars, numpy) is imported inside the command: `dpcli --help` stays fast.


@handles_errors
def histogram(
    ctx: typer.Context,
    input: InputArg,
    by: Annotated[str, typer.Option("--by", help="Group-by column(s), comma-separated.")],
    privacy_unit: UnitOpt = None,
    agg: Annotated[
        str,
        typer.Option("--agg", help="Aggregations, comma-separated: count, count-units, sum, mean, variance, median, pNN."),
    ] = "count",
    value: Annotated[str | None, typer.Option("--value", help="Numeric column for sum, mean, variance, quantiles.")] = None,
    bounds_text: Annotated[
        str | None, typer.Option("--bounds", help="LO:HI bounds of --value; values outside are clamped.")
    ] = None,
    granularity: Annotated[
        str | None,
        typer.Option("--granularity", help="Grid spacing values are snapped to (default: a power of two, ≥ 4096 steps)."),
    ] = None,
    max_partitions: Annotated[
        int | None,
        typer.Option("--max-partitions", help="At most this many groups per unit (chosen at random). [default: 1]",
                     min=1, max=10**6, show_default=False),
    ] = None,
    max_contributions: Annotated[
        int | None,
        typer.Option("--max-contributions", help="At most this many rows per unit per group. [default: 1]",
                     min=1, max=10**6, show_default=False),
    ] = None,
    epsilon: EpsilonOpt = None,
    delta: DeltaOpt = None,
    rho: Annotated[str | None, typer.Option("--rho", help="ρ (zCDP) for Gaussian noise, instead of ε/δ.")] = None,
    noise: Annotated[
        str | None,
        typer.Option("--noise", help="laplace or gaussian (default: gaussian for zcdp ledgers, else laplace)."),
    ] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Public list of groups (file with the --by columns): known domain.")
    ] = None,
    selection: Annotated[
        str,
        typer.Option("--selection", help="Without --keys: threshold (min. units, paper 002) or unklap (LinkedIn Alg. 3)."),
    ] = "threshold",
    max_groups: Annotated[
        int, typer.Option("--max-groups", help="--selection unklap: consider the top d̄ groups.", min=1, max=10**7)
    ] = 1000,
    with_error: Annotated[bool, typer.Option("--with-error", help="Add 95% margins of error (_moe95 columns).")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show each measurement's noise and 95% margin, the cost and whether the "
                           "ledger would accept it; read no data, charge nothing.")
    ] = False,
    schedule: ScheduleOpt = None,
    scheduler: SchedulerOpt = "bbscheduler",
    total_epsilon: TotalEpsilonOpt = None,
    total_delta: TotalDeltaOpt = None,
    gamma: GammaOpt = None,
    beta: BetaOpt = "0.05",
    improver_c: ImproverCOpt = None,
    improver_index: ImproverIndexOpt = None,
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
    """Differentially private group-by: counts, sums, means, variances and quantiles per group.

    Every privacy unit is protected as a whole: contributions are bounded
    (groups per unit, rows per unit and group, value bounds) before noise.
    Without --keys, groups are discovered from the data and only released
    when enough units support them.
    """
    source = data_source(input, privacy_unit, input_format, delimiter)
    early = hash_early(source, read=not dry_run and engine == "polars")  # hashed while the rest loads
    from dpcli import advice, release
    from dpcli.cli._engine import bounding_engine, check_engine, open_spark_input
    from dpcli.cli._release import (
        output_digest,
        output_plan,
        show_dry_run,
        write_release,
    )
    from dpcli.cli._schedule import run_scheduled, schedule_spec
    from dpcli.state import ledger
    from dpcli.state.paths import ensure_state_dir
    from dpcli.tasks import histogram as hist

    s = settings(ctx)
    analyst = resolve_analyst(None, ctx)
    led = ledger.read_ledger(ensure_state_dir(s.state_dir), analyst)
    defaulted = [f for f, v in (("max_contributions", max_contributions), ("max_partitions", max_partitions)) if v is None]
    query = hist.HistogramQuery(
        by=columns("--by", by),
        unit=source.privacy_unit,  # type: ignore[arg-type]
        aggregations=columns("--agg", agg),
        value=value,
        bounds=bounds("--bounds", bounds_text),
        granularity=positive("--granularity", granularity),
        max_partitions=max_partitions or 1,
        max_contributions=max_contributions or 1,
        epsilon=positive("--epsilon", epsilon),
        delta=probability("--delta", delta) or 0,
        rho=positive("--rho", rho),
        noise=noise or ("gaussian" if led.limits.mode == "zcdp" else "laplace"),  # type: ignore[arg-type]
        domain="keys" if keys else selection,  # type: ignore[arg-type]
        max_groups=max_groups,
        with_error=with_error,
    )
    spec = schedule_spec(schedule, scheduler, total_epsilon, total_delta, gamma, beta, improver_c, query.epsilon,
                         dry_run=dry_run, index=improver_index)
    if spec is not None:
        if query.domain != "keys" or query.noise != "laplace":
            raise UsageError("a schedule runs pure ε-DP releases: give --keys (and Laplace noise)")
        query.validate()
    elif dry_run:
        plan = hist.plan_histogram(query, led.limits.mode, led.limits.values)
        show_dry_run(s, analyst, hist.describe_plan(query, plan), plan.events, as_json)
        return
    else:  # refuse a bad query, or one this ledger can never pay, before reading data
        plan = hist.plan_histogram(query, led.limits.mode, led.limits.values)
        ledger.check_payable(led, plan.events)
    key_list = public_source(keys, "--keys")
    fmt = output_plan(output, out_format, as_json, state_dir=s.state_dir,
                      inputs=(source.location, key_list.location if key_list else None))
    spark = check_engine(engine, master, remote, spark_conf, source)
    inputs = release.open_query_inputs(source, None, query.unit, query.by, value, key_list,
                                       table=open_spark_input(s, spark, source), early=early)
    bounder = bounding_engine(s, spark, inputs.table, source.delimiter or ",")
    runner = release.histogram_runner(s.state_dir, query, inputs, led.limits, bounder)

    def run(eps: Fraction | None) -> release.Prepared:
        with working(ctx, f"bounding contributions and aggregating {inputs.table.name}"):
            return runner(eps)

    if spec is not None:
        scheduled = {k: v for k, v in query.canonical().items() if k != "epsilon"}
        run_scheduled(s, analyst, "histogram", spec, {"command": "histogram", **scheduled,
                      "keys": inputs.fingerprints["keys"]}, inputs.table, run, output, fmt, as_json,
                      notes_for=lambda done, eps: advice.histogram_notes(
                          query, hist.plan_histogram(replace(query, epsilon=eps), led.limits.mode, led.limits.values),
                          done.table, defaulted, unit_word()))
        return
    prepared = run(query.epsilon)
    done = release.charge(s.state_dir, analyst, "histogram", prepared,
                          release.histogram_summary(inputs.table.name, prepared.metadata),
                          lock_timeout=s.lock_timeout, inputs=inputs.tables,
                          output_digest=output_digest(prepared.table, output, fmt, prepared.metadata))
    notes = advice.histogram_notes(query, plan, done.table, defaulted, unit_word())
    write_release(s, done, output, fmt, as_json, notes)
