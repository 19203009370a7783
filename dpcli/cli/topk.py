"""``dpcli topk``: parse options, call :mod:`dpcli.tasks.topk`, charge (reserve, settle), write."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Annotated, Any

import polars as pl

import typer

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
from dpcli.cli._release import ReleaseSeed, charge_and_write, output_plan, release_seed
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
from dpcli.core.events import PrivacyEvent
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.state import ledger
from dpcli.state.paths import ensure_state_dir
from dpcli.files import open_input, read_group_list, require_columns
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
                         positive("--epsilon", epsilon) if schedule else None)
    if spec is not None:
        if not query.known_domain:
            raise UsageError("a schedule runs pure ε-DP releases: give the candidates with --domain")
        if query.epsilon_per is not None:
            raise UsageError("with --schedule each run's ε comes from the schedule; drop --epsilon-per")
        if dry_run:
            raise UsageError("--dry-run does not apply to --schedule (each run's ε depends on the data's growth)")
        query.validate()
    else:
        if epsilon is not None:
            raise UsageError("--epsilon is the per-run ε of --scheduler fixed; use --epsilon-per")
        plan = tk.plan_topk(query, led.limits.mode, led.limits.values)
        if dry_run:
            emit_json({"query": query.canonical(), "guarantee": plan.guarantee,
                       "reserve": [e.to_json() for e in plan.reserve],
                       "count_noise": plan.count_noise.describe() if plan.count_noise else None})
            return
    fmt = output_plan(output, out_format, as_json, state_dir=s.state_dir, inputs=(input, domain))
    # The unit and group columns are read as text from CSV/NDJSON (their type comes from the query, not
    # from one record); the candidate list too, then cast to the data's types (see histogram).
    table = open_input(input, input_format, text_columns=(privacy_unit, *query.by))
    schema = require_columns(table, {privacy_unit: "key", **{c: "key" for c in query.by}})
    data = {"data": table.fingerprint}
    cand = domain_table = None
    if domain:
        domain_table = open_input(domain, text_columns=query.by)
        cand = read_group_list(domain_table, query.by, schema)
        data["domain"] = domain_table.fingerprint

    def release_for(q: tk.TopKQuery, mode: str) -> tuple[ReleaseSeed, tk.TopKPlan, tk.TopKRelease]:
        plan = tk.plan_topk(q, mode, led.limits.values)
        seed = release_seed(s.state_dir, {"command": "topk", "v": 1, **q.canonical()}, data)
        with working(ctx, f"counting groups in {table.name}"):
            release = tk.run_topk(table, q, plan, KeyedStream(seed.seed, "topk"), cand)
        release.metadata.update({"command": "topk", "guarantee": plan.guarantee})
        return seed, plan, release

    if spec is not None:

        def scheduled_run(eps: Fraction) -> tuple[ReleaseSeed, list[PrivacyEvent], pl.DataFrame, dict[str, Any]]:
            # The run's whole ε: 3kε_per/2 with counts (Lemma 5.2), kε_per without.
            per = eps * 2 / (3 * query.k) if query.with_counts else eps / query.k
            seed, plan, release = release_for(replace(query, epsilon_per=per), "pure")
            return seed, plan.reserve, release.table, release.metadata

        scheduled = {k: v for k, v in query.canonical().items() if k != "epsilon_per"}
        run_scheduled(s, analyst, "topk", spec, {"command": "topk", **scheduled, "domain": data["domain"]},
                      table, scheduled_run, output, fmt, as_json)
        return
    seed, plan, release = release_for(query, led.limits.mode)
    found = release.metadata["found"]
    line = f"top-{query.k} of {table.name}: {found} group(s)"
    if release.bottom:
        line += f", ⊥ reached (only {found} of {query.k} could be released)"
    charge_and_write(s, analyst, "topk", seed, plan.reserve, release.table, output, fmt, release.metadata, as_json,
                     line, actual=release.actual, inputs=(table, domain_table))
    if release.bottom and not as_json:
        info(ctx, f"dpcli: note: fewer than k = {query.k} groups pass the threshold (⊥)")
