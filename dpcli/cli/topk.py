"""``dpcli topk``: parse options, call :mod:`dpcli.tasks.topk`, charge (reserve, settle), write."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Annotated

import typer

from dpcli.cli._common import (
    handles_errors,
    notice,
    resolve_analyst,
    settings,
    unit_word,
    working,
)
from dpcli.cli._options import (
    DelimiterOpt,
    DeltaOpt,
    EngineOpt,
    FormatOpt,
    InputArg,
    InputFormatOpt,
    JsonOpt,
    MasterOpt,
    OutputOpt,
    RemoteOpt,
    SparkConfOpt,
    UnitOpt,
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
def topk(
    ctx: typer.Context,
    input: InputArg,
    by: Annotated[str, typer.Option("--by", help="Group-by column(s), comma-separated.")],
    k: Annotated[int, typer.Option("-k", "--k", help="How many groups to return.", max=10**4)],
    privacy_unit: UnitOpt = None,
    count: Annotated[
        str, typer.Option("--count", help="units (distinct privacy units, τ = 1) or rows (capped at τ per unit and group).")
    ] = "units",
    max_contributions: Annotated[
        int | None,
        typer.Option("--max-contributions", help="τ: rows per unit per group counted with --count rows. [default: 1]",
                     max=10**6, show_default=False),
    ] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Public list of candidate groups (known domain, KnownGumb).")
    ] = None,
    max_groups: Annotated[
        int | None,
        typer.Option("--max-groups", help="Unknown domain: look at the top d̄ groups (default max(10k, 1000)).",
                     min=1, max=10**5),
    ] = None,
    no_counts: Annotated[bool, typer.Option("--no-counts", help="Ranking only: no counts, cheaper.")] = False,
    epsilon: Annotated[
        str | None,
        typer.Option("--epsilon", help="ε of this release (pure composition of its k selections and counts); "
                     "with --scheduler fixed, of each run."),
    ] = None,
    epsilon_per: Annotated[
        str | None,
        typer.Option("--epsilon-per", help="Instead of --epsilon: ε_per of each selection and count "
                     "(br ledgers: from the ledger)."),
    ] = None,
    delta: DeltaOpt = None,
    with_error: Annotated[bool, typer.Option("--with-error", help="Add the 95% margin of the count noise.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the count noise and 95% margin, the cost and whether the ledger "
                           "would accept it; read no data, charge nothing.")
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
    """The k most frequent groups with noisy counts, protecting each privacy unit as a whole.

    Units may touch any number of groups; only k groups are released. With
    --keys the list always has k rows; otherwise groups are discovered and
    the list may end early (⊥) when the remaining groups are too rare.
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
    from dpcli.tasks import topk as tk

    s = settings(ctx)
    analyst = resolve_analyst(None, ctx)
    led = ledger.read_ledger(ensure_state_dir(s.state_dir), analyst)
    if epsilon is not None and epsilon_per is not None:
        raise UsageError("give --epsilon (the release's) or --epsilon-per (each step's), not both")
    per_step = positive("--epsilon-per", epsilon_per)
    whole = positive("--epsilon", epsilon)
    if whole is not None and schedule is None:
        per_step = tk.epsilon_per_for(whole, k, known_domain=keys is not None, with_counts=not no_counts)
    query = tk.TopKQuery(
        by=columns("--by", by),
        unit=source.privacy_unit,  # type: ignore[arg-type]
        k=k,
        count=count,  # type: ignore[arg-type]
        max_contributions=1 if max_contributions is None else max_contributions,
        known_domain=keys is not None,
        dbar=max_groups,
        with_counts=not no_counts,
        epsilon_per=per_step,
        delta=probability("--delta", delta) or 0,
        with_error=with_error,
    )
    defaulted = ["max_contributions"] if max_contributions is None else []
    spec = schedule_spec(schedule, scheduler, total_epsilon, total_delta, gamma, beta, improver_c,
                         whole if schedule else None, dry_run=dry_run, index=improver_index)
    if spec is not None:
        if not query.known_domain:
            raise UsageError("a schedule runs pure ε-DP releases: give the candidates with --keys")
        if query.epsilon_per is not None:
            raise UsageError("with --schedule each run's ε comes from the schedule; drop --epsilon-per")
        query.validate()
    elif dry_run:
        plan = tk.plan_topk(query, led.limits.mode, led.limits.values)
        show_dry_run(s, analyst, tk.describe_plan(query, plan), plan.reserve, as_json)
        return
    else:  # refuse a bad query, or one this ledger can never pay, before reading data
        plan = tk.plan_topk(query, led.limits.mode, led.limits.values)
        ledger.check_payable(led, plan.reserve)
    key_list = public_source(keys, "--keys")
    fmt = output_plan(output, out_format, as_json, state_dir=s.state_dir,
                      inputs=(source.location, key_list.location if key_list else None))
    spark = check_engine(engine, master, remote, spark_conf, source)
    inputs = release.open_query_inputs(source, None, query.unit, query.by, None, key_list, "domain",
                                       table=open_spark_input(s, spark, source), early=early)
    bounder = bounding_engine(s, spark, inputs.table, source.delimiter or ",")
    runner = release.topk_runner(s.state_dir, inputs, led.limits, bounder)

    def run(q: tk.TopKQuery, mode: str) -> release.Prepared:
        with working(ctx, f"counting groups in {inputs.table.name}"):
            return runner(q, mode)

    if spec is not None:
        def per(eps: Fraction) -> Fraction:  # the run's whole ε, split as for --epsilon
            return tk.epsilon_per_for(eps, query.k, known_domain=True, with_counts=query.with_counts)

        scheduled = {k: v for k, v in query.canonical().items() if k != "epsilon_per"}
        run_scheduled(s, analyst, "topk", spec, {"command": "topk", **scheduled, "domain": inputs.fingerprints["domain"]},
                      inputs.table, lambda eps: run(replace(query, epsilon_per=per(eps)), "pure"), output, fmt, as_json,
                      notes_for=lambda done, eps: advice.topk_notes(
                          query, tk.plan_topk(replace(query, epsilon_per=per(eps)), "pure", led.limits.values),
                          done.table, defaulted, unit_word()))
        return
    prepared = run(query, led.limits.mode)
    found, bottom = prepared.metadata["found"], prepared.metadata.get("bottom", False)
    line = f"top-{query.k} of {inputs.table.name}: {found} group(s)"
    if bottom:
        line += f", ⊥ reached (only {found} of {query.k} could be released)"
    done = release.charge(s.state_dir, analyst, "topk", prepared, line, lock_timeout=s.lock_timeout, inputs=inputs.tables,
                          output_digest=output_digest(prepared.table, output, fmt, prepared.metadata))
    notes = advice.topk_notes(query, plan, done.table, defaulted, unit_word())
    write_release(s, done, output, fmt, as_json, notes)
    if bottom:
        notice(ctx, f"fewer than k = {query.k} groups pass the threshold (⊥): only {found} released")
