"""``dpcli histogram``: parse options, call :mod:`dpcli.tasks.histogram`, charge, write."""

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
    bounds,
    columns,
    positive,
    probability,
)
from dpcli.cli._release import charge_and_write, output_plan, release_seed
from dpcli.core.events import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.state import ledger
from dpcli.state.paths import ensure_state_dir
from dpcli.tables import open_input, read_group_list, require_columns
from dpcli.tasks import histogram as hist


@handles_errors
def histogram(
    ctx: typer.Context,
    input: InputArg,
    by: Annotated[str, typer.Option("--by", help="Group-by column(s), comma-separated.")],
    privacy_unit: UnitOpt,
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
        int, typer.Option("--max-partitions", help="At most this many groups per unit (chosen at random).", min=1)
    ] = 1,
    max_contributions: Annotated[
        int, typer.Option("--max-contributions", help="At most this many rows per unit per group.", min=1)
    ] = 1,
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
        int, typer.Option("--max-groups", help="UnkLap: consider the top d̄ groups.", min=1)
    ] = 1000,
    with_error: Annotated[bool, typer.Option("--with-error", help="Add 95% margins of error (_moe95 columns).")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the calibration and cost without reading data or charging.")
    ] = False,
    input_format: InputFormatOpt = None,
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
    s = settings(ctx)
    analyst = resolve_analyst(None, ctx)
    if selection not in ("threshold", "unklap"):
        raise UsageError(f"--selection must be threshold or unklap, got {selection!r}")
    if noise not in (None, "laplace", "gaussian"):
        raise UsageError(f"--noise must be laplace or gaussian, got {noise!r}")
    led = ledger.read_ledger(ensure_state_dir(s.state_dir), analyst)
    query = hist.HistogramQuery(
        by=columns("--by", by),
        unit=privacy_unit,
        aggregations=columns("--agg", agg),
        value=value,
        bounds=bounds("--bounds", bounds_text),
        granularity=positive("--granularity", granularity),
        max_partitions=max_partitions,
        max_contributions=max_contributions,
        epsilon=positive("--epsilon", epsilon),
        delta=probability("--delta", delta) or 0,
        rho=positive("--rho", rho),
        noise=noise or ("gaussian" if led.limits.mode == "zcdp" else "laplace"),  # type: ignore[arg-type]
        domain="keys" if keys else selection,  # type: ignore[arg-type]
        max_groups=max_groups,
        with_error=with_error,
    )
    plan = hist.plan_histogram(query, led.limits.mode, led.limits.values)
    if dry_run:
        emit_json(
            {
                "query": query.canonical(),
                "measurements": {n: m.noise.describe() if m.noise else {"mechanism": "exponential"} for n, m in plan.measurements.items()},
                "threshold": plan.threshold,
                "cost": [e.to_json() for e in plan.events],
                **plan.summary,
            }
        )
        return
    fmt = output_plan(output, out_format, as_json)
    table = open_input(input, input_format)
    wanted = {privacy_unit: "key", **{c: "key" for c in query.by}}
    if value:
        wanted[value] = "numeric"
    schema = require_columns(table, wanted)  # type: ignore[arg-type]
    key_frame = None
    data = {"data": table.fingerprint}
    if keys:
        keys_table = open_input(keys)
        key_frame = read_group_list(keys_table, query.by, schema)
        data["keys"] = keys_table.fingerprint
    seed = release_seed(s.state_dir, {"command": "histogram", "v": 1, **query.canonical()}, data)
    with working(ctx, f"bounding contributions and aggregating {table.name}"):
        release = hist.run_histogram(table, query, plan, KeyedStream(seed.seed, "histogram"), key_frame)
    line = f"histogram of {table.name}: {release.groups_released} group(s) released"
    if plan.threshold is not None:
        line += f" (threshold {plan.threshold} noisy units)"
    metadata = {
        "command": "histogram",
        "groups": release.groups_released,
        "aggregations": list(query.aggregations),
        "max_partitions": query.max_partitions,
        "max_contributions": query.max_contributions,
        "split": plan.summary.get("split"),
        **release.metadata,
    }
    if query.epsilon is not None:
        metadata["epsilon"] = fraction_text(query.epsilon)
    charge_and_write(s, analyst, "histogram", seed, plan.events, release.table, output, fmt, metadata, as_json, line)
