"""``dpcli topk``: parse options, call :mod:`dpcli.tasks.topk`, charge (reserve, settle), write."""

from __future__ import annotations

from typing import Annotated

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
from dpcli.cli._release import charge_and_write, output_plan, release_seed
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.state import ledger
from dpcli.state.paths import ensure_state_dir
from dpcli.tables import open_input, read_group_list, require_columns
from dpcli.tasks import topk as tk


@handles_errors
def topk(
    ctx: typer.Context,
    input: InputArg,
    by: Annotated[str, typer.Option("--by", help="Group-by column(s), comma-separated.")],
    k: Annotated[int, typer.Option("-k", "--k", help="How many groups to return.")],
    privacy_unit: UnitOpt,
    count: Annotated[
        str, typer.Option("--count", help="units (distinct privacy units, τ = 1) or rows (capped at τ per unit and group).")
    ] = "units",
    max_contributions: Annotated[
        int, typer.Option("--max-contributions", help="τ: rows per unit per group counted with --count rows.")
    ] = 1,
    domain: Annotated[
        str | None, typer.Option("--domain", help="Public list of candidate groups (known domain, KnownGumb).")
    ] = None,
    dbar: Annotated[
        int | None, typer.Option("--dbar", help="Unknown domain: look at the top d̄ groups (default max(10k, 1000)).")
    ] = None,
    no_counts: Annotated[bool, typer.Option("--no-counts", help="Ranking only: no counts, cheaper.")] = False,
    epsilon_per: Annotated[
        str | None, typer.Option("--epsilon-per", help="ε_per of each selection and count (br ledgers: from the ledger).")
    ] = None,
    delta: DeltaOpt = None,
    with_error: Annotated[bool, typer.Option("--with-error", help="Add the 95% margin of the count noise.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show calibration and cost; read no data, charge nothing.")] = False,
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
    plan = tk.plan_topk(query, led.limits.mode, led.limits.values)
    if dry_run:
        emit_json({"query": query.canonical(), "guarantee": plan.guarantee,
                   "reserve": [e.to_json() for e in plan.reserve],
                   "count_noise": plan.count_noise.describe() if plan.count_noise else None})
        return
    fmt = output_plan(output, out_format, as_json)
    table = open_input(input, input_format)
    schema = require_columns(table, {privacy_unit: "key", **{c: "key" for c in query.by}})
    data = {"data": table.fingerprint}
    cand = None
    if domain:
        domain_table = open_input(domain)
        cand = read_group_list(domain_table, query.by, schema)
        data["domain"] = domain_table.fingerprint
    seed = release_seed(s.state_dir, {"command": "topk", "v": 1, **query.canonical()}, data)
    with working(ctx, f"counting groups in {table.name}"):
        release = tk.run_topk(table, query, plan, KeyedStream(seed.seed, "topk"), cand)
    found = release.metadata["found"]
    line = f"top-{query.k} of {table.name}: {found} group(s)"
    if release.bottom:
        line += f", ⊥ reached (only {found} of {query.k} could be released)"
    metadata = {"command": "topk", **release.metadata, "guarantee": plan.guarantee}
    charge_and_write(s, analyst, "topk", seed, plan.reserve, release.table, output, fmt, metadata, as_json, line,
                     actual=release.actual)
    if release.bottom and not as_json:
        info(ctx, f"dpcli: note: fewer than k = {query.k} groups pass the threshold (⊥)")
