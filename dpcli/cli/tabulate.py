"""``dpcli tabulate``: SafeTab-style adaptive tabulation (and its plan, ``--dry-run``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from dpcli.access import Source, gate
from dpcli.cli._common import (
    busy,
    emit_json,
    handles_errors,
    payer,
    resolve_analyst,
    settings,
)
from dpcli.cli._groups import (
    ENGINE_GIVEN,
    INPUT_GIVEN,
    OUTPUT_GIVEN,
    InputOptions,
    OutputOptions,
    engine_options,
    input_options,
    output_options,
)
from dpcli.cli._options import (
    probability,
)
from dpcli.cli._sources import block_list_source, refuse_owned
from dpcli.core.display import parameter_text
from dpcli.errors import UsageError
from dpcli.io.opening import hash_early

if TYPE_CHECKING:
    from dpcli.spark.engine import EngineRequest
    from dpcli.tasks.dry_runs import TabulateDryRun
    from dpcli.tasks.tabulate import GaussianLevel, GaussianTotals, GeometricLevel, GeometricTotals, PlanDocument

# The library (polars, numpy) is imported inside the command: `dpcli --help` stays fast.


@handles_errors
@output_options
@input_options
@engine_options
def tabulate(
    ctx: typer.Context,
    input: Annotated[
        str | None,
        typer.Argument(help="Person file (CSV/Parquet/NDJSON, '-' for CSV on stdin); not read with --dry-run.",
                       show_default=False, metavar="PERSONS"),
    ] = None,
    spec_path: Annotated[str, typer.Option("--spec", help="The tabulation spec (TOML).", show_default=False)] = "",
    delta: Annotated[
        str, typer.Option("--delta", help="--dry-run: δ at which the (ε, δ) totals are stated.")
    ] = "1e-10",
    with_error: Annotated[
        bool, typer.Option("--with-error", help="Add each count's 95% margin of error (moe95).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="The plan: per-level parameters (MOE targets → ε or ρ) and total privacy "
                           "loss under pure DP, RDP and zCDP; read no data, charge nothing.")
    ] = False,
    reading: InputOptions = INPUT_GIVEN,  # --input-format, --delimiter (input_options)
    engine: EngineRequest = ENGINE_GIVEN,  # --engine, --master, --remote, --spark-conf (engine_options)
    out: OutputOptions = OUTPUT_GIVEN,  # -o, --format, --json (output_options)
) -> None:
    """Noisy totals and adaptive Sex × Age marginals for every population group of a spec.

    `dpcli tabulate --dry-run --spec SPEC` prints the per-level parameters
    (MOE targets → ε or ρ) and the total privacy loss under pure DP, RDP and
    zCDP, without reading data or charging.
    """
    source = gate().dataset(input) if input is not None else None
    if source is not None:
        refuse_owned(source)  # (before its bytes are hashed: no record of it is a person)
    early = hash_early(source, read=not dry_run and engine.engine == "polars")
    from dpcli import release
    from dpcli.cli.render import output_target, write_release
    from dpcli.release.seeds import DocumentInput
    from dpcli.tasks import tabulate as tab
    from dpcli.tasks.tabulate.query import read_spec

    if not spec_path:
        raise UsageError("--spec is required (the tabulation spec, TOML)")
    spec, spec_fingerprint = read_spec(spec_path)
    if dry_run:
        _show_plan(ctx, spec, delta, out.as_json)
        return
    source = _person_source(source, reading.input_format, reading.delimiter)
    blocks = block_list_source(spec)
    task = tab.TabulateTask(spec, DocumentInput(spec_fingerprint, "toml"), with_error)
    sources = release.Sources(source, {"blocks": blocks} if blocks else {}, read_before=(spec_path,))
    target = output_target(out)
    done = release.run(task, sources, payer(ctx), output=target,
                       engine=engine, early=early, busy=busy(ctx))
    write_release(settings(ctx), done, target, out.as_json)


def _person_source(source: Source | None, input_format: str | None, delimiter: str | None) -> Source:
    """The person file: a catalog dataset read as the operator declared it, or a path read as the
    options say (there is no privacy-unit column: a person is one record)."""
    if source is None:
        raise UsageError("give the person file (or --dry-run for the plan only)")
    if source.entry is not None and (input_format or delimiter) and gate().service:
        raise UsageError(f"dataset {source.name!r} is read as the operator declared it; drop --input-format and "
                         "--delimiter")
    if source.entry is None:
        return Source(source.name, source.location, input_format, delimiter)
    return source


def _show_plan(ctx: typer.Context, spec: Any, delta: str, as_json: bool) -> None:
    """``--dry-run``: Table 4 (per-level parameters) and Table 2 (total loss under each analysis), and
    whether the ledger would accept the spec's cost now."""
    from dpcli.cli.render import PLAN_CAPTURE
    from dpcli.tasks import tabulate as tab

    d = probability("--delta", delta, allow_zero=False)
    result = tab.plan_document(spec, float(d))
    result["ledger"] = _would_accept(ctx, tab.events(spec))
    captured = PLAN_CAPTURE.get()
    if captured is not None:  # inside budget plan
        from dpcli.release.steps import Planned

        captured.append(Planned(_as_dry_run(result), list(tab.events(spec)), result["ledger"]["refusal"]))
        return
    if as_json:
        emit_json(result)
    else:
        typer.echo(_plan_text(result))


def _as_dry_run(result: PlanDocument) -> TabulateDryRun:
    """The spec's plan document as a dry run (``dpcli budget plan`` reads its cost and the ledger's answer)."""
    described: TabulateDryRun = {"noise": result["noise"], "gamma": result["gamma"], "delta": result["delta"],
                                 "moe_calibration": result["moe_calibration"]}
    if "geometric" in result:
        described["geometric"] = result["geometric"]
    if "discrete_gaussian" in result:
        described["discrete_gaussian"] = result["discrete_gaussian"]
    if "ledger" in result:
        described["ledger"] = result["ledger"]
    return described


def _would_accept(ctx: typer.Context, events: list[Any]) -> dict[str, Any]:
    """Whether the analyst's ledger would accept the spec's cost now (a plan needs no ledger)."""
    from dpcli.errors import DpcliError
    from dpcli.state import ledger

    s = settings(ctx)
    analyst = resolve_analyst(None, ctx)
    try:
        refused = ledger.refusal(ledger.read_ledger(s.state_dir, analyst, s.lock_timeout), events)
    except DpcliError as exc:
        return {"analyst": analyst, "accepts": False, "refusal": str(exc)}
    return {"analyst": analyst, "accepts": refused is None, "refusal": refused}


def _plan_text(p: PlanDocument) -> str:
    """The dry run for people: Table 4, Table 2, and the ledger's verdict. Their ε, δ and ρ have 4 significant
    digits, rounded up (what the release costs: the ledger's line beside them says the same); ``--json`` is
    exact."""
    geo, dg = p.get("geometric"), p.get("discrete_gaussian")
    lines = [f"γ = {p['gamma']}, δ = {_up(p['delta'])} (spec noise: {p['noise']})", "",
             f"{'population group level':<26}{'MOE':>6}  {'ε step 2':>9}{'ε total':>9}  {'ρ step 2':>9}{'ρ total':>9}",
             *_level_lines(geo, dg), ""]
    if geo:
        lines.append(f"geometric, pure DP:             ε = {_up(geo['pure_epsilon'])}")
        lines.append(f"geometric, RDP (eq. 39-40):     ε = {_up(geo['rdp_epsilon'])}  (α = {geo['rdp_alpha']:g})")
    if dg:
        lines.append(f"discrete Gaussian, zCDP analytic:  ε = {_up(dg['zcdp_analytic_epsilon'])}  "
                     f"(ρ = {_up(dg['rho'])})")
        lines.append(f"discrete Gaussian, zCDP numerical: ε = {_up(dg['zcdp_numerical_epsilon'])}  (α = "
                     f"{dg['zcdp_numerical_alpha']:g})")
    led = p["ledger"]
    lines.append(f"ledger {led['analyst']!r}: " + ("would accept this release" if led["accepts"]
                                                   else f"would refuse it: {led['refusal']}"))
    return "\n".join(lines)


def _up(value: float) -> str:
    """An ε, δ or ρ of the plan as text for people: 4 significant digits, rounded up (a cost)."""
    return parameter_text(float(f"{value:.12g}"), "up")


def _level_lines(geo: GeometricTotals | None, dg: GaussianTotals | None) -> list[str]:
    """Table 4: one line per level, with its MOE and each noise's step-2 and total parameter."""
    n = len(geo["levels"]) if geo else len(dg["levels"]) if dg else 0
    return [_level_line(geo["levels"][i] if geo else None, dg["levels"][i] if dg else None) for i in range(n)]


def _level_line(g: GeometricLevel | None, d: GaussianLevel | None) -> str:
    row = g or d
    assert row is not None  # a level of at least one noise
    moe = f"{row['moe']:g}" if row["moe"] is not None else "-"
    eps = f"{_up(g['epsilon_step2']):>9}{_up(g['epsilon_total']):>9}" if g else f"{'':>18}"
    rho = f"{_up(d['rho_step2']):>9}{_up(d['rho_total']):>9}" if d else ""
    return f"{row['level']:<26}{moe:>6}  {eps}  {rho}"
