"""``dpcli budget``: create, inspect and verify ledgers; compose guarantees; manage the key."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Annotated, Any

import typer

from dpcli.access import gate
from dpcli.cli import budget_plan, budget_pld
from dpcli.cli._common import emit_json, handles_errors, info, resolve_analyst, settings
from dpcli.cli._options import positive, probability
from dpcli.core.accounting import budget as bud
from dpcli.core.accounting import composition as acc
from dpcli.core.display import figure_text, parameter_text, parameters_text
from dpcli.core.exact import float_up, fraction_text
from dpcli.errors import BudgetError, UsageError
from dpcli.state import keys, ledger
from dpcli.state.ledger.format import utc_now
from dpcli.state.paths import ensure_state_dir

app = typer.Typer(help="Privacy-budget ledgers, composition calculator and the secret key.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
AnalystArg = Annotated[str | None, typer.Argument(help="Analyst name (default: --analyst / DPCLI_ANALYST).",
                                                                  metavar="ANALYST")]


@app.command("init")
@handles_errors
def init(
    ctx: typer.Context,
    analyst: Annotated[str, typer.Argument(help="Analyst whose ledger to create.", metavar="ANALYST")],
    mode: Annotated[str, typer.Option("--mode", help="Accounting mode: pure, approx, zcdp, rdp, br or pld.")] = "pure",
    epsilon: Annotated[str | None, typer.Option("--epsilon", help="ε limit (pure, approx, rdp, pld).")] = None,
    delta: Annotated[str | None, typer.Option("--delta", help="δ limit (approx, zcdp, rdp, pld); per-call δ in "
                                                               "br.")] = None,
    rho: Annotated[str | None, typer.Option("--rho", help="ρ limit (zcdp).")] = None,
    epsilon_per: Annotated[str | None, typer.Option("--epsilon-per", help="ε_per of every release (br).")] = None,
    info_budget: Annotated[int | None, typer.Option("--info-budget", help="Information budget k* (br).")] = None,
    call_budget: Annotated[int | None, typer.Option("--call-budget", help="Call budget ℓ* (br).")] = None,
    delta_prime: Annotated[str | None, typer.Option("--delta-prime", help="δ′ of the composition bound (br).")] = None,
    refresh_days: Annotated[
        int | None, typer.Option("--refresh-days", help="Budget resets every N days (only if the data is replaced as "
                                                        "often).")
    ] = None,
    report_delta: Annotated[
        str, typer.Option("--report-delta", help="δ used to state zcdp ledgers' guarantee as (ε, δ).")
    ] = "1e-9",
    as_json: JsonOpt = False,
) -> None:
    """Create a budget ledger for ANALYST with limits in one accounting mode (the operator's, in service mode)."""
    gate().require_operator("budget init")
    gate().require_public_interpreter("budget init")
    s = settings(ctx)
    analyst = resolve_analyst(analyst, ctx)
    if mode not in bud.MODES:
        raise UsageError(f"--mode must be one of {', '.join(bud.MODES)}, got {mode!r}")
    given: dict[str, Fraction | None] = {
        "epsilon": positive("--epsilon", epsilon),
        "delta": probability("--delta", delta),
        "rho": positive("--rho", rho),
        "epsilon_per": positive("--epsilon-per", epsilon_per),
        "info_budget": Fraction(info_budget) if info_budget is not None else None,
        "call_budget": Fraction(call_budget) if call_budget is not None else None,
        "delta_prime": probability("--delta-prime", delta_prime),
    }
    try:
        limits = bud.Limits(mode, _limit_values(mode, given))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    rd = probability("--report-delta", report_delta, allow_zero=False)
    _check_extra(mode)
    led = ledger.init_ledger(s.state_dir, analyst, limits, refresh_days, float(rd), s.lock_timeout)
    if as_json:
        emit_json(_show_json(led))
    else:
        info(ctx, f"created {mode} ledger for {analyst!r} at {led.path}")


def _check_extra(mode: str) -> None:
    """A pld ledger needs the ``pld`` extra to cost its charges: refused at its creation without it (exit 77)."""
    if mode == "pld":
        from dpcli.core.accounting import pld

        if not pld.available():
            raise BudgetError(pld.MISSING)


def _limit_values(mode: str, given: dict[str, Fraction | None]) -> dict[str, Fraction]:
    """The limits ``mode`` takes, in its order, from the options given (a zcdp ledger's δ defaults to 0);
    refuses an option the mode needs and lacks, then one it does not use."""
    wanted = bud.LIMIT_FIELDS[mode]
    if mode == "zcdp" and given["delta"] is None:
        given["delta"] = Fraction(0)
    _check_limit_options(mode, wanted, given)
    return {k: v for k in wanted if (v := given[k]) is not None}


def _check_limit_options(mode: str, wanted: tuple[str, ...], given: dict[str, Fraction | None]) -> None:
    flags = {k: "--" + k.replace("_", "-") for k in given}
    missing = [flags[k] for k in wanted if given[k] is None]
    if missing:
        raise UsageError(f"--mode {mode} needs {', '.join(missing)}")
    extra = [flags[k] for k, v in given.items() if v is not None and k not in wanted]
    if extra:
        raise UsageError(f"--mode {mode} does not use {', '.join(extra)}")


def _show_json(led: ledger.Ledger) -> dict[str, Any]:
    spend = led.spend()
    eps, dlt = led.guarantee()
    # releases charged: those with events (a pld series' own entry is not one) and the runs its series covered
    charged = [e for e in led.current_entries() if (e["events"] and "series" not in e) or "series_run" in e]
    return {
        "analyst": led.analyst,
        "mode": led.limits.mode,
        "limits": led.limits.to_json(),
        "refresh_days": led.refresh_days,
        "spent": led.accountant.spent_json(spend),
        "remaining": ledger.remaining_text(led),
        "guarantee": {"epsilon": eps, "delta": dlt},
        "releases": len(charged),
        "replays": sum(1 for e in led.current_entries() if e.get("replay_of")),
        "entries": len(led.entries),
        "schedules": _schedule_summaries(led),
        "streams": ledger.stream_summaries(led),
        **({"series": _series(led)} if led.limits.mode == "pld" else {}),
    }


def _series(led: ledger.Ledger) -> list[dict[str, Any]]:
    from dpcli.state.ledger import series

    return series.summaries(led)


@app.command("show")
@handles_errors
def show(
    ctx: typer.Context,
    analyst: AnalystArg = None,
    as_json: JsonOpt = False,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Draw the spending over time to FILE.png or FILE.svg (needs "
                                 "'dpcli[plot]'); '-' draws it as text.")
    ] = None,
) -> None:
    """Spent and remaining budget, and the overall (ε, δ) guarantee so far (ε, δ and ρ to 4 significant digits:
    spent and the guarantee rounded up, remaining down; --json exact)."""
    if plot not in (None, "-"):
        from dpcli.plot.figure import check_target

        check_target(plot, "plot")
    led = ledger.read_ledger(settings(ctx).state_dir, resolve_analyst(analyst, ctx))
    data = _show_json(led)
    if plot is not None:
        _plot_spending(led, data, plot)
    elif as_json:
        emit_json(data)
    else:
        typer.echo("\n".join(_show_lines(led, data)))


def _plot_spending(led: ledger.Ledger, data: dict[str, Any], plot: str) -> None:
    """``--plot``: the spending over time drawn to a file, or as text (``-``)."""
    from dpcli.plot.budget_view import timeline

    tl = timeline(led, data["schedules"])
    if plot == "-":
        from dpcli.cli.plot import terminal_width
        from dpcli.plot.terminal import budget_text

        typer.echo(budget_text(tl, terminal_width(None)))
        return
    from dpcli.plot.figure import budget_figure, save

    save(budget_figure(tl), plot)


def _show_lines(led: ledger.Ledger, data: dict[str, Any]) -> list[str]:
    """``budget show`` for people: limits, spend, guarantee, schedules (and a chart on a terminal). ε, δ and ρ
    to 4 significant digits (:func:`dpcli.core.display.parameter_text`): what is spent, reserved and the
    guarantee rounded up, what remains (and a long limit) down; ``--json`` has them exact."""
    guarantee = data["guarantee"]
    lines = [
        f"analyst      {data['analyst']}",
        f"mode         {data['mode']}",
        "limits       " + parameters_text({k: v for k, v in data["limits"].items() if k != "mode"}, "down"),
        "spent        " + parameters_text(data["spent"], "up"),
        "remaining    " + parameters_text(data["remaining"], "down"),
        f"guarantee    (ε, δ) = ({parameter_text(guarantee['epsilon'], 'up')}, "
        f"{parameter_text(guarantee['delta'], 'up')})",
        f"releases     {data['releases']} charged, {data['replays']} free replay{'' if data['replays'] == 1 else 's'}",
    ]
    if led.refresh_days:
        lines.append(f"refresh      every {led.refresh_days} days (current period {led.period(utc_now())})")
    for sc in data["schedules"]:
        epochs = f", epochs {sc['epochs']}" if sc["epochs"] is not None else ""
        answered = f", {sc['answered']} more answered with an earlier release (free)" if sc.get("answered") else ""
        lines.append(
            f"schedule     {sc['name']} ({sc['scheduler']}, {sc['command']}): {sc['runs']} run(s) released{epochs}"
            f"{answered}, "
            f"ε spent {parameter_text(sc['epsilon_spent'], 'up')} of {parameter_text(sc['epsilon_reserved'], 'up')} "
            "reserved"
        )
    for st in data["streams"]:
        reserved = "; ".join(parameters_text({k: v for k, v in ev.items() if k in ("epsilon", "delta", "rho")}, "up")
                             for ev in st["reserved"])
        retries = f", {st['retries']} retr{'y' if st['retries'] == 1 else 'ies'}" if st["retries"] else ""
        lines.append(f"stream       {st['name'] or 'reserved'} (entry #{st['entry']}): {st['runs']} run(s){retries}, "
                     f"{reserved} reserved")
    lines += budget_pld.series_lines(data.get("series", []))
    if sys.stdout.isatty():  # on a terminal, the spending as a chart too (--plot - draws it anywhere)
        from dpcli.cli.plot import terminal_width
        from dpcli.plot.budget_view import timeline
        from dpcli.plot.terminal import budget_text

        lines += ["", budget_text(timeline(led, data["schedules"]), terminal_width(None))]
    return lines


@app.command("history")
@handles_errors
def history(ctx: typer.Context, analyst: AnalystArg = None, as_json: JsonOpt = False) -> None:
    """Every ledger entry: time (ISO 8601, UTC), command, cost (ε, δ and ρ rounded up to 4 significant digits;
    --json exact), seed id (a release's completion shown on its debit's line; a stream's or schedule's run marked
    as begun shown only while it has not ended, or if the mark was charged)."""
    led = ledger.read_ledger(settings(ctx).state_dir, resolve_analyst(analyst, ctx))
    done = ledger.completions(led)
    quiet = led.ended_marks()
    rows = [
        {
            "seq": e["seq"],
            "time": e["time"],
            "command": e["command"],
            "query_id": e["query_id"],
            "seed_id": e["seed_id"],
            "replay_of": e.get("replay_of"),
            "covered_by": e.get("covered_by"),
            "reservation": e.get("reservation"),
            "step": e.get("step"),
            "events": e["events"],
            **({"cost": e["cost"]} if "cost" in e else {}),
            **{k: e[k] for k in ("series", "series_run") if k in e},
            "summary": done[e["seq"]].get("summary", "") if e["seq"] in done else e.get("summary", ""),
            **({"completed_by": done[e["seq"]]["seq"] if e["seq"] in done else None}
               if ledger.debited_before_reading(e) else {}),
        }
        for e in led.entries if "completes" not in e and e["seq"] not in quiet
    ]
    if as_json:
        emit_json(rows)
        return
    for r in rows:  # each charge's ε, δ and ρ rounded up to 4 significant digits (--json: exact)
        cost = "; ".join(
            ",".join(f"{k}={figure_text(k, v, 'up')}" for k, v in ev.items() if k not in ("kind", "detail"))
            for ev in r["events"]
        )
        if r.get("completed_by", 0) is None:
            tag = f"{cost}, charged; no output recorded (run stopped, or still running)"
        elif r["replay_of"]:
            tag = f"replay of #{r['replay_of']}"
        elif r["covered_by"]:
            tag = f"covered by reservation #{r['covered_by']}"
        else:
            tag = (cost or "free") + budget_pld.cost_text(r.get("cost"))
        typer.echo(f"#{r['seq']:<4} {r['time']}  {r['command']:<10} {tag}  {r['summary']}".rstrip())


@app.command("verify")
@handles_errors
def verify(
    ctx: typer.Context,
    analyst: AnalystArg = None,
    reseal: Annotated[
        bool,
        typer.Option("--reseal", help="Operator only: accept the ledger file as it is now, after a deliberate move or "
                     "restore, or to upgrade a schema-1 ledger; recorded in its history. Edited entries are never "
                     "accepted."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check a ledger's keyed seal (header and entries) and high-water mark (exit 78 if tampered, rolled back or replaced); a pld ledger's costs are recomputed."""  # noqa: E501 (the command's help, one line)
    s = settings(ctx)
    name = resolve_analyst(analyst, ctx)
    reason = None
    if reseal:
        gate().require_operator("budget verify --reseal")
        led, reason = ledger.reseal(s.state_dir, name, s.lock_timeout)
    else:
        led = ledger.read_ledger(s.state_dir, name, s.lock_timeout)
    costs = budget_pld.verify_costs(led)
    if as_json:
        emit_json({"analyst": led.analyst, "ok": True, "entries": len(led.entries), "resealed": reason,
                   **({"costs": vars(costs)} if costs is not None else {})})
    elif reason:
        typer.echo(f"ledger {led.analyst!r}: resealed ({reason}); {len(led.entries)} entries, the last records this")
    else:
        said = budget_pld.costs_text(costs) if costs is not None else ""
        typer.echo(f"ledger {led.analyst!r}: OK ({len(led.entries)} entries, keyed seal and high-water mark verified"
                   f"{said})")


@app.command("compose")
@handles_errors
def compose(
    mode: Annotated[str, typer.Option("--mode", help="br, zcdp, pure, approx, rdp (geometric mechanisms) or pld.")],
    epsilon: Annotated[str | None, typer.Option("--epsilon", help="ε of each mechanism (pure, approx, rdp, "
                                                                  "pld).")] = None,
    epsilon_per: Annotated[str | None, typer.Option("--epsilon-per", help="ε_per (br).")] = None,
    count: Annotated[int, typer.Option("--count", help="How many mechanisms (k* in br).", min=1, max=10**12)] = 1,
    calls: Annotated[int, typer.Option("--call-budget", help="Call budget ℓ* (br).", min=0, max=10**12)] = 0,
    delta_per: Annotated[str | None, typer.Option("--delta-per", help="δ of each unknown-domain call (br) or "
                                                                      "mechanism (approx, pld).")] = None,
    delta_prime: Annotated[str | None, typer.Option("--delta-prime", help="δ′ of the composition bound (br, "
                                                                          "approx).")] = None,
    rho: Annotated[str | None, typer.Option("--rho", help="Total ρ (zcdp); each discrete Gaussian count's ρ "
                                                          "(pld).")] = None,
    delta: Annotated[str | None, typer.Option("--delta", help="Target δ of the (ε, δ) statement (zcdp, rdp, "
                                                              "pld).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Compose privacy guarantees (a calculator; no ledger is touched)."""
    composer = _COMPOSERS.get(mode)
    if composer is None:
        raise UsageError(f"--mode must be br, zcdp, pure, approx, rdp or pld, got {mode!r}")
    given = _Composition(epsilon, epsilon_per, count, calls, delta_per, delta_prime, rho, delta)
    given.refuse_unused(mode)
    out: dict[str, Any] = {"mode": mode, **composer(given)}
    if as_json:
        emit_json(out)
    else:
        # a composed ε or δ is a guarantee: rounded up, as what is spent (--json keeps it exact), from 12 digits
        # (the float composition's own accuracy: 14 × 0.1 is 1.4, not 1.4000000000000001 rounded up to 1.401)
        typer.echo(", ".join(f"{k} = {parameter_text(float(f'{v:.12g}'), 'up')}" if isinstance(v, float)
                             else f"{k} = {figure_text(k, v, 'up')}" for k, v in out.items()))


@dataclass(frozen=True)
class _Composition:
    """``budget compose``'s options, as typed (each mode parses the ones it uses)."""

    epsilon: str | None
    epsilon_per: str | None
    count: int
    calls: int
    delta_per: str | None
    delta_prime: str | None
    rho: str | None
    delta: str | None

    def refuse_unused(self, mode: str) -> None:
        """One meaning per option: an option the mode does not use is refused, naming the one it does (a
        silently ignored ``--delta`` in approx read as each release's δ, while the answer said δ = 0)."""
        used = _COMPOSE_OPTIONS[mode]
        given = {"--epsilon": self.epsilon, "--epsilon-per": self.epsilon_per, "--delta-per": self.delta_per,
                 "--delta-prime": self.delta_prime, "--rho": self.rho, "--delta": self.delta,
                 "--call-budget": self.calls or None}
        for flag, value in given.items():
            if value is not None and flag not in used:
                instead = " (each mechanism's δ is --delta-per here)" if flag == "--delta" and mode == "approx" else ""
                raise UsageError(f"--mode {mode} does not use {flag}{instead}; it takes {', '.join(sorted(used))}")


#: The options each mode of ``budget compose`` reads (besides --count).
_COMPOSE_OPTIONS: dict[str, frozenset[str]] = {
    "br": frozenset({"--epsilon-per", "--delta-per", "--delta-prime", "--call-budget"}),
    "zcdp": frozenset({"--rho", "--delta"}),
    "pure": frozenset({"--epsilon"}),
    "approx": frozenset({"--epsilon", "--delta-per", "--delta-prime"}),
    "rdp": frozenset({"--epsilon", "--delta"}),
    "pld": frozenset({"--epsilon", "--delta-per", "--rho", "--delta"}),
}


def _compose_br(o: _Composition) -> dict[str, Any]:
    """k* ε_per-BR mechanisms and ℓ* unknown-domain calls (LinkedIn's Theorem 2), and basic composition."""
    e = float(positive("--epsilon-per", o.epsilon_per, required=True))
    dp = float(probability("--delta-per", o.delta_per, required=True, allow_zero=False))
    dq = float(probability("--delta-prime", o.delta_prime, required=True, allow_zero=False))
    eps, dlt = acc.br_budget_guarantee(e, o.count, o.calls, dp, dq)
    return {"epsilon": eps, "delta": dlt, "basic_epsilon": acc.k_fold(e, o.count)}


def _compose_zcdp(o: _Composition) -> dict[str, Any]:
    """ρ-zCDP as (ε, δ): the optimal conversion and the analytic one."""
    r = float(positive("--rho", o.rho, required=True))
    d = float(probability("--delta", o.delta, required=True, allow_zero=False))
    return {"epsilon": acc.zcdp_to_approx(r, d), "epsilon_analytic": acc.zcdp_to_approx_analytic(r, d), "delta": d}


def _compose_pure(o: _Composition) -> dict[str, Any]:
    e = positive("--epsilon", o.epsilon, required=True)
    return {"epsilon": fraction_text(e * o.count), "delta": 0}


def _compose_approx(o: _Composition) -> dict[str, Any]:
    """Basic composition, exactly (count copies; no list of count tuples), δ capped at 1; with δ′ the
    advanced composition theorem too."""
    ef = positive("--epsilon", o.epsilon, required=True)
    df = probability("--delta-per", o.delta_per) or Fraction(0)
    e, dp = float(ef), float(df)
    out: dict[str, Any] = {"epsilon": float_up(ef * o.count), "delta": float_up(min(df * o.count, Fraction(1)))}
    if o.delta_prime is not None:
        dq = float(probability("--delta-prime", o.delta_prime, allow_zero=False))
        ae, ad = acc.advanced_composition(e, dp, o.count, dq)
        out.update(advanced_epsilon=ae, advanced_delta=ad)
    return out


def _compose_rdp(o: _Composition) -> dict[str, Any]:
    """``count`` discrete Laplace mechanisms by their RDP curve, converted to (ε, δ)."""
    e = float(positive("--epsilon", o.epsilon, required=True))
    d = float(probability("--delta", o.delta, required=True, allow_zero=False))
    eps, alpha = acc.rdp_to_approx(o.count * acc.discrete_laplace_rdp(e), d)
    return {"epsilon": eps, "delta": d, "alpha": alpha, "pure_epsilon": acc.k_fold(e, o.count)}


def _compose_pld(o: _Composition) -> dict[str, Any]:
    """``count`` mechanisms by their privacy loss distributions (:func:`dpcli.cli.budget_pld.compose_pld`)."""
    return budget_pld.compose_pld(o.epsilon, o.delta_per, o.rho, o.delta, o.count)


_COMPOSERS: dict[str, Callable[[_Composition], dict[str, Any]]] = {
    "br": _compose_br, "zcdp": _compose_zcdp, "pure": _compose_pure, "approx": _compose_approx, "rdp": _compose_rdp,
    "pld": _compose_pld,
}


#: ``budget plan -- COMMAND ARGS``: how many more such releases fit (:mod:`dpcli.cli.budget_plan`).
app.command("plan")(budget_plan.plan)

#: ``budget migrate ANALYST --to pld``: an approx ledger becomes a pld ledger (:mod:`dpcli.cli.budget_pld`).
app.command("migrate")(budget_pld.migrate)


@app.command("key")
@handles_errors
def key(
    ctx: typer.Context,
    rotate: Annotated[
        bool, typer.Option("--rotate", help="Replace the key (old one kept, renamed, for audits).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show the secret key's fingerprint (never the key), or rotate it."""
    root = ensure_state_dir(settings(ctx).state_dir)
    if rotate:
        gate().require_operator("budget key --rotate")
        old, new, archive = keys.rotate_key(root)
        data = {"old_fingerprint": old, "fingerprint": new, "archived_as": str(archive)}
    else:
        data = {"fingerprint": keys.key_fingerprint(keys.load_or_create_key(root))}
        if gate().operator:  # where the key lies is the operator's business
            data["path"] = str(keys.key_path(root))
    if as_json:
        emit_json(data)
    else:
        typer.echo("\n".join(f"{k}: {v}" for k, v in data.items()))


def _schedule_summaries(led: ledger.Ledger) -> list[dict[str, Any]]:
    from dpcli.state import schedules

    return schedules.summaries(led.path.parent.parent, led.analyst)
