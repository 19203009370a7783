"""``dpcli histogram``: declare the options, build the task, run the release path, render."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Annotated

import typer

from dpcli.cli._common import busy, handles_errors, payer, settings, unit_word
from dpcli.cli._groups import (
    CHOICE_GIVEN,
    ENGINE_GIVEN,
    INPUT_GIVEN,
    OUTPUT_GIVEN,
    SCHEDULE_GIVEN,
    ChoiceOptions,
    InputOptions,
    OutputOptions,
    ScheduleOptions,
    choice_options,
    engine_options,
    input_options,
    output_options,
    schedule_options,
    schedule_spec,
    schedule_through,
)
from dpcli.cli._options import (
    BoundOptions,
    DeltaOpt,
    EpsilonOpt,
    InputArg,
    LeftOutContributionsOpt,
    LeftOutPartitionsOpt,
    RowsOpt,
    RunsOpt,
    TargetMoeOpt,
    TargetRelativeMoeOpt,
    UnitOpt,
    UnitsOpt,
    bounds_or_auto,
    cap,
    columns,
    expected_size,
    margin_target,
    positive,
    probability,
)
from dpcli.cli._sources import data_source, public_source
from dpcli.io.opening import hash_early

if TYPE_CHECKING:
    from dpcli.spark.engine import EngineRequest

# The library (polars, numpy) is imported inside the command: `dpcli --help` stays fast.


@handles_errors
@output_options
@choice_options
@input_options
@engine_options
@schedule_options
def histogram(
    ctx: typer.Context,
    input: InputArg,
    by: Annotated[str, typer.Option("--by", help="Group-by column(s), comma-separated.")],
    privacy_unit: UnitOpt = None,
    agg: Annotated[
        str,
        typer.Option("--agg", help="Aggregations, comma-separated: count, count-units, sum, mean, variance, median, "
                                   "pNN."),
    ] = "count",
    value: Annotated[
        str | None, typer.Option("--value", help="Numeric column for sum, mean, variance, quantiles.")
    ] = None,
    bounds_text: Annotated[
        str | None, typer.Option("--bounds", metavar="LO:HI|auto",
                                 help="Bounds of --value (values outside are clamped), or auto: chosen privately "
                                      "from the data (left out: auto, where the caps would be).")
    ] = None,
    granularity: Annotated[
        str | None,
        typer.Option("--granularity", help="Grid spacing values are snapped to (default: a power of two, ≥ 4096 "
                                           "steps; ≥ 65,536 when the values feed quantiles only)."),
    ] = None,
    max_partitions: LeftOutPartitionsOpt = None,
    max_contributions: LeftOutContributionsOpt = None,
    choice: ChoiceOptions = CHOICE_GIVEN,  # --auto-share, --report-bias, --bias-share (choice_options)
    epsilon: EpsilonOpt = None,
    delta: DeltaOpt = None,
    rho: Annotated[str | None, typer.Option("--rho", help="ρ (zCDP) for Gaussian noise, instead of ε/δ.")] = None,
    target_moe: TargetMoeOpt = None,
    target_relative_moe: TargetRelativeMoeOpt = None,
    noise: Annotated[
        str | None,
        typer.Option("--noise", help="laplace or gaussian (default: gaussian for zcdp ledgers, else laplace)."),
    ] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Public list of groups (file with the --by columns): known domain.")
    ] = None,
    selection: Annotated[
        str,
        typer.Option("--selection", help="Without --keys: threshold (min. units, paper 002) "
                                         "or unklap (LinkedIn Alg. 3)."),
    ] = "threshold",
    max_groups: Annotated[
        int, typer.Option("--max-groups", help="--selection unklap: consider the top d̄ groups.", min=1, max=10**7)
    ] = 1000,
    with_error: Annotated[
        bool, typer.Option("--with-error", help="Add 95% margins of error: a _moe95 column after each count, "
                           "sum, mean, variance and quantile (a quantile's is a 95% interval released with it, from "
                           "half of its share: a different release).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show each measurement's noise and 95% margin, the cost and whether the "
                           "ledger would accept it; read the schema but no record, charge nothing.")
    ] = False,
    schedule: ScheduleOptions = SCHEDULE_GIVEN,  # --schedule … --through (schedule_options)
    rows: RowsOpt = None,
    units: UnitsOpt = None,
    runs: RunsOpt = None,
    reading: InputOptions = INPUT_GIVEN,  # --input-format, --delimiter (input_options)
    engine: EngineRequest = ENGINE_GIVEN,  # --engine, --master, --remote, --spark-conf (engine_options)
    out: OutputOptions = OUTPUT_GIVEN,  # -o, --format, --json (output_options)
) -> None:
    """Differentially private group-by: counts, sums, means, variances and quantiles per group.

    Every privacy unit is protected as a whole: contributions are bounded
    (groups per unit, rows per unit and group, value bounds) before noise.
    Without --keys, groups are discovered from the data and only released
    when enough units support them.
    """
    source = data_source(input, privacy_unit, reading.input_format, reading.delimiter)
    early = hash_early(source, read=not dry_run and engine.engine == "polars")  # hashed while the rest loads
    from dpcli import release
    from dpcli.cli.render import output_target, show_plan, write_release
    from dpcli.tasks.histogram import HistogramQuery, HistogramTask

    caps = BoundOptions.given(cap("--max-partitions", max_partitions), cap("--max-contributions", max_contributions),
                              bounds_or_auto("--bounds", bounds_text), choice)
    query = HistogramQuery(
        by=columns("--by", by), unit=source.unit, aggregations=columns("--agg", agg),
        value=value, bounds=caps.value_bounds, granularity=positive("--granularity", granularity),
        max_partitions=caps.max_partitions, max_contributions=caps.max_contributions,
        epsilon=positive("--epsilon", epsilon), delta=probability("--delta", delta) or Fraction(0),
        rho=positive("--rho", rho),
        noise=noise or "laplace", domain="keys" if keys else selection,
        max_groups=max_groups, with_error=with_error, auto=caps.auto_bounds(), bias_share=caps.bias)
    caps.check_engine(engine.engine)
    options = replace(schedule, runs=runs)
    spec = schedule_spec(options, query.epsilon, dry_run)
    size = expected_size(rows, dry_run, spec is not None, relative=target_relative_moe is not None,
                         targeted=target_moe is not None, units=units)
    stays = "--engine spark" if engine.engine != "polars" else "--schedule" if spec is not None else None
    task = HistogramTask(query, noise_given=noise is not None,
                         defaulted=_defaulted(max_contributions, max_partitions, bounds_text),
                         unit_label=unit_word(), target=margin_target(target_moe, target_relative_moe, size,
                                                                      spec is not None),
                         choose_left_out=stays is None, left_out_stays=stays,
                         report_bias_left_out=choice.report_bias is None and stays is None)
    ledger = payer(ctx)
    sources = release.Sources(source, {"keys": public_source(keys, "--keys")} if keys else {})
    if dry_run:  # (a dry run reads no snapshot: no --through)
        planned = release.plan(task, ledger, sources, runs=runs,
                               continuation=release.Scheduled(spec, None, size) if spec else None)
        show_plan(planned, ledger.analyst, out.as_json)
        return
    target = output_target(out)  # refused before --through is parsed, as always
    continuation = release.Scheduled(spec, schedule_through(options)) if spec else None
    done = release.run(task, sources, ledger, output=target, engine=engine,
                       early=early, busy=busy(ctx), continuation=continuation)
    write_release(settings(ctx), done, target, out.as_json)


def _defaulted(max_contributions: str | None, max_partitions: str | None, bounds: str | None) -> tuple[str, ...]:
    """The bounds left out (chosen from the data where dpcli can: :meth:`HistogramTask.with_defaults`; else the
    caps stay at 1, and the notes say when a cap of 1 may bias the release)."""
    return tuple(f for f, v in (("max_contributions", max_contributions), ("max_partitions", max_partitions),
                                ("bounds", bounds)) if v is None)
