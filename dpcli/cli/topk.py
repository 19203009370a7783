"""``dpcli topk``: parse options, call :mod:`dpcli.tasks.topk`, charge (reserve, settle), write."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import typer

from dpcli import release
from dpcli.cli._common import emit_json, handles_errors, info, resolve_analyst, settings, working
from dpcli.cli._options import (
    DeltaOpt,
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
from dpcli.cli._release import output_plan, write_release
from dpcli.cli._schedule import (
    BetaOpt,
    GammaOpt,
    ImproverCOpt,
    ScheduleOpt,
    SchedulerOpt,
    TotalDeltaOpt,
    TotalEpsilonOpt,
    run_scheduled,
    schedule_spec,
)
from dpcli.errors import UsageError
from dpcli.state import ledger
from dpcli.state.paths import ensure_state_dir
from dpcli.tasks import topk as tk


@handles_errors
def topk(
    ctx: typer.Context,
    input: InputArg,
    by: Annotated[str, typer.Option("--by", help="Group-by column(s), comma-separated.")],
    k: Annotated[int, typer.Option("-k", "--k", help="How many groups to return.", max=10**4)],
    privacy_unit: UnitOpt,
    count: Annotated[
        str, typer.Option("--count", help="units (distinct privacy units, τ = 1) or rows (capped at τ per unit and group).")
    ] = "units",
    max_contributions: Annotated[
        int, typer.Option("--max-contributions", help="τ: rows per unit per group counted with --count rows.", max=10**6)
    ] = 1,
    domain: Annotated[
        str | None, typer.Option("--domain", help="Public list of candidate groups (known domain, KnownGumb).")
    ] = None,
    dbar: Annotated[
        int | None, typer.Option("--dbar", help="Unknown domain: look at the top d̄ groups (default max(10k, 1000)).", max=10**5)
    ] = None,
    no_counts: Annotated[bool, typer.Option("--no-counts", help="Ranking only: no counts, cheaper.")] = False,
    epsilon_per: Annotated[
        str | None, typer.Option("--epsilon-per", help="ε_per of each selection and count (br ledgers: from the ledger).")
    ] = None,
    delta: DeltaOpt = None,
    with_error: Annotated[bool, typer.Option("--with-error", help="Add the 95% margin of the count noise.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show calibration and cost; read no data, charge nothing.")] = False,
    schedule: ScheduleOpt = None,
    scheduler: SchedulerOpt = "bbscheduler",
    total_epsilon: TotalEpsilonOpt = None,
    total_delta: TotalDeltaOpt = None,
    gamma: GammaOpt = None,
    beta: BetaOpt = "0.05",
    improver_c: ImproverCOpt = "0.25",
    epsilon: Annotated[
        str | None, typer.Option("--epsilon", help="--scheduler fixed: the ε of each run (3kε_per/2).")
    ] = None,
    input_format: InputFormatOpt = None,
    output: OutputOpt = None,
    out_format: FormatOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The k most frequent groups with noisy counts, protecting each privacy unit as a whole.

    Units may touch any number of groups; only k groups are released. With
    --domain the list always has k rows; otherwise groups are discovered and
    the list may end early (⊥) when the remaining groups are too rare.
    """
    s = settings(ctx)
    analyst = resolve_analyst(None, ctx)
    led = ledger.read_ledger(ensure_state_dir(s.state_dir), analyst)
    query = tk.TopKQuery(
        by=columns("--by", by),
        unit=privacy_unit,
        k=k,
        count=count,  # type: ignore[arg-type]
        max_contributions=max_contributions,
        known_domain=domain is not None,
        dbar=dbar,
        with_counts=not no_counts,
        epsilon_per=positive("--epsilon-per", epsilon_per),
        delta=probability("--delta", delta) or 0,
        with_error=with_error,
    )
    if dbar is not None and dbar < 1:
        raise UsageError(f"--dbar must be ≥ 1, got {dbar}")
    spec = schedule_spec(schedule, scheduler, total_epsilon, total_delta, gamma, beta, improver_c,
                         positive("--epsilon", epsilon) if schedule else None, dry_run=dry_run)
    if spec is not None:
        if not query.known_domain:
            raise UsageError("a schedule runs pure ε-DP releases: give the candidates with --domain")
        if query.epsilon_per is not None:
            raise UsageError("with --schedule each run's ε comes from the schedule; drop --epsilon-per")
        query.validate()
    elif epsilon is not None:
        raise UsageError("--epsilon is the per-run ε of --scheduler fixed; use --epsilon-per")
    elif dry_run:
        emit_json(tk.describe_plan(query, tk.plan_topk(query, led.limits.mode, led.limits.values)))
        return
    else:
        tk.plan_topk(query, led.limits.mode, led.limits.values)  # refuse a bad query before reading data
    fmt = output_plan(output, out_format, as_json, state_dir=s.state_dir, inputs=(input, domain))
    inputs = release.open_query_inputs(input, input_format, privacy_unit, query.by, None, domain, "domain")
    runner = release.topk_runner(s.state_dir, inputs, led.limits)

    def run(q: tk.TopKQuery, mode: str) -> release.Prepared:
        with working(ctx, f"counting groups in {inputs.table.name}"):
            return runner(q, mode)

    if spec is not None:
        # The run's whole ε: 3kε_per/2 with counts (Lemma 5.2), kε_per without.
        per = (lambda eps: eps * 2 / (3 * query.k)) if query.with_counts else (lambda eps: eps / query.k)
        scheduled = {k: v for k, v in query.canonical().items() if k != "epsilon_per"}
        run_scheduled(s, analyst, "topk", spec, {"command": "topk", **scheduled, "domain": inputs.fingerprints["domain"]},
                      inputs.table, lambda eps: run(replace(query, epsilon_per=per(eps)), "pure"), output, fmt, as_json)
        return
    prepared = run(query, led.limits.mode)
    found, bottom = prepared.metadata["found"], prepared.metadata.get("bottom", False)
    line = f"top-{query.k} of {inputs.table.name}: {found} group(s)"
    if bottom:
        line += f", ⊥ reached (only {found} of {query.k} could be released)"
    done = release.charge(s.state_dir, analyst, "topk", prepared, line, lock_timeout=s.lock_timeout, inputs=inputs.tables)
    write_release(s, done, output, fmt, as_json)
    if bottom and not as_json:
        info(ctx, f"dpcli: note: fewer than k = {query.k} groups pass the threshold (⊥)")
