"""``dpcli budget plan -- COMMAND ARGS``: how many more releases like one fit the ledger, and with ``--runs N``
what each may spend for N more (issue 42, item 3).

The release is the command line after ``--``, planned by that command's own dry run (its options, checks and
refusals are the command's: nothing is read but schemas and public lists, nothing is charged); the counts are the
ledger's (:mod:`dpcli.state.ledger.planning`), in its mode and refresh period.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dpcli.cli._common import emit_json, fail, handles_errors, one_line, resolve_analyst, settings
from dpcli.core.display import parameter_text, quantity_text, utc_text
from dpcli.core.exact import fraction_text
from dpcli.errors import BudgetError, UsageError
from dpcli.state import ledger
from dpcli.state.ledger.format import utc_now
from dpcli.state.ledger.planning import (
    MAX_COUNTED,
    Fit,
    largest_budget,
    refresh_period,
    releases_that_fit,
    round_down,
    smallest_searched,
)

if TYPE_CHECKING:
    from dpcli.core.events import PrivacyEvent
    from dpcli.release.steps import Planned
    from dpcli.tasks.dry_runs import DryRun, StreamStanding

#: The commands a plan can count (those that release).
PLANNED = ("histogram", "topk", "tabulate", "sql", "stream-replay")
#: The options ``--runs`` scales, the first the command line gives (a release's whole ε; top-k's ε per step; ρ).
BUDGET_OPTIONS = ("--epsilon", "--epsilon-per", "--rho")


@handles_errors
def plan(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The release, after --: a histogram, topk, tabulate, sql or stream-replay command line "
                            "as you would run it (without 'dpcli').", metavar="-- COMMAND [ARGS]...",
                       show_default=False),
    ] = None,
    runs: Annotated[
        int | None, typer.Option("--runs", min=1, max=MAX_COUNTED, help="Plan N more releases: the largest "
                                 "--epsilon (or --epsilon-per, --rho) of the command at which N fit, and its "
                                 "margins (the command may leave its budget out).", show_default=False)
    ] = None,
    reserve: Annotated[
        bool, typer.Option("--reserve", help="With --runs N, on a pld ledger: reserve the N releases now as one "
                           "series at the largest budget that fits (their N-fold PLD, at all the δ left); each later "
                           "release of that cost takes one of its runs.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")] = False,
) -> None:
    """How many more releases like this one the ledger accepts (now, and in a fresh refresh period), or with
    --runs N what each may spend for N more. Plans with the command's own dry run: reads no record, charges
    nothing (but --reserve, which debits the series). A free replay of an earlier identical release costs
    nothing; the counts are of new releases."""
    if reserve and runs is None:
        raise UsageError("--reserve reserves --runs N releases: give --runs")
    if not command or command[0] not in PLANNED:
        raise UsageError("give the release after --, e.g. dpcli budget plan -- histogram DATA --by COL ... "
                         f"(one of {', '.join(PLANNED)})")
    name, args = command[0], list(command[1:])
    s = settings(ctx)
    analyst = resolve_analyst(None, ctx)
    led = ledger.read_ledger(s.state_dir, analyst, s.lock_timeout)
    now = utc_now()
    spent = led.spend(now)
    assumed = None
    if runs is not None and name != "tabulate" and _given_budget(args) is None:
        assumed = _share_of_what_is_left(led, spent, runs)
        args += [assumed[0], fraction_text(assumed[1])]
    planned = _dry_run(ctx, name, args, as_json)
    description = planned.description
    stream: StreamStanding = (description["stream"] or {}) if "stream" in description else {}
    reserves = bool(stream.get("state")) and bool(planned.events)  # a new state: its first run reserves them all
    doc: dict[str, Any] = {"analyst": analyst, "mode": led.limits.mode, "command": name,
                           "cost": [e.to_json() for e in planned.events], "unit": "stream" if reserves else "release",
                           "fit": _fit_json(_fit_now(led, planned, spent))}
    if assumed is not None:
        doc["assumed"] = {"option": assumed[0], "value": fraction_text(assumed[1])}
    period = refresh_period(led, planned.events, now)
    if period is not None:
        fresh = period.fresh
        if not planned.events:  # covered by a reservation, which holds in its own period only
            fresh = Fit(0, refusal="a reservation does not carry over to the next period: a new --state file reserves "
                                   "again there")
        doc["period"] = {"ends": utc_text(period.ends), "fresh": _fit_json(fresh)}
    if reserve and (led.limits.mode != "pld" or reserves or not planned.events):
        raise UsageError("--reserve reserves a series of releases in a pld ledger (not of a stream's state, nor in "
                         f"a {led.limits.mode} ledger)")
    if runs is not None:
        doc["runs"] = _runs_part(ctx, led, spent, name, args, runs, planned, stream, as_json, reserve)
        doc["runs"]["within"] = "the current period" if period is not None else "the ledger"
    if as_json:
        emit_json(doc)
    else:
        typer.echo("\n".join(_lines(doc)))


def _runs_part(ctx: typer.Context, led: ledger.Ledger, spent: Any, name: str, args: list[str], runs: int,
               planned: Planned, stream: StreamStanding, as_json: bool, reserve: bool) -> dict[str, Any]:
    """``--runs N``: the largest budget at which N more fit (a stream's state fixes its own), and on a pld ledger
    the same as one series (reserved with ``reserve``)."""
    fixed = bool(stream.get("state")) and bool(stream.get("runs_recorded"))  # the state fixes its budget
    reserves = bool(stream.get("state")) and bool(planned.events)
    if planned.refusal is not None and (fixed or not planned.events):
        return {"runs": runs, "value": None, "refused": planned.refusal}
    if fixed or not planned.events:
        return _covered_runs(args, runs)
    out = _runs(ctx, led, spent, name, args, 1 if reserves else runs, as_json) | {"runs": runs}
    if led.limits.mode == "pld" and not reserves:
        out["series"] = _series(ctx, led, spent, name, args, runs, as_json, reserve)
    return out


def _dry_run(ctx: typer.Context, name: str, args: list[str], as_json: bool) -> Planned:
    """The command's dry run of ``args``, its plan handed back (:data:`dpcli.cli.render.PLAN_CAPTURE`) instead of
    printed. Its refusals are its own: a bad option ends the plan as it would end the command."""
    from dpcli.cli.render import PLAN_CAPTURE

    command = _commands(name)
    captured: list[Planned] = []
    token = PLAN_CAPTURE.set(captured)
    try:  # the command itself, under this run's settings (state directory, analyst, gate: the root's, not anew);
        # the flags go first, so no option of the command line can take --dry-run as its value
        code = command.main(args=["--dry-run", *(["--json"] if as_json else []), *args], prog_name=f"dpcli {name}",
                            obj=settings(ctx), standalone_mode=False)
    except typer.TyperException as exc:  # a usage error found before the command started: one line, as the root's
        fail(f"dpcli: error: {one_line(exc.format_message())}", exc.exit_code, as_json)
    finally:
        PLAN_CAPTURE.reset(token)
    if isinstance(code, int) and code != 0:
        raise typer.Exit(code)  # the command's own ending (its line, and its JSON object with --json)
    if not captured and any(a in ("--help", "-h") for a in args):
        raise typer.Exit(0)  # the command's help, asked for
    if len(captured) != 1:
        raise UsageError(f"{name} planned no release for these options (see: dpcli {name} --help)")
    return captured[0]


@functools.cache
def _commands(name: str) -> Any:
    """The command ``name`` as typer builds it, without the root's callback (which would read the global options
    again: the plan's ``--state-dir`` and ``--analyst`` are the command's)."""
    from dpcli.cli.app import build_app

    return typer.main.get_command(build_app(name)).commands[name]  # type: ignore[attr-defined]


def _fit_now(led: ledger.Ledger, planned: Planned, spent: Any) -> Fit:
    """The count now (the runs a pld ledger's open series cover first); 0 when the dry run refuses for a reason the
    balance does not show (a stream's state from an older backup, a schedule's reservation missing): the command's
    refusal is the plan's."""
    covered = 0
    if led.limits.mode == "pld":
        from dpcli.state.ledger import series

        covered = series.runs_left(series.open_series(led, utc_now()), planned.events)
    fit = releases_that_fit(led, planned.events, spent, covered=covered)
    if planned.refusal is not None and fit.count != 0:
        return Fit(0, refusal=planned.refusal)
    return fit


def _given_budget(args: list[str]) -> tuple[str, Fraction] | None:
    """The command line's budget option and its value (the first of :data:`BUDGET_OPTIONS` it gives), if any."""
    from dpcli.cli._options import positive

    for option in BUDGET_OPTIONS:
        for i, arg in enumerate(args):
            if arg == option and i + 1 < len(args):
                return option, positive(option, args[i + 1], required=True)
            if arg.startswith(option + "="):
                return option, positive(option, arg.split("=", 1)[1], required=True)
    return None


def _budget_option(args: list[str]) -> tuple[str, Fraction]:
    """The command line's budget option and its value; a usage error when it gives none."""
    found = _given_budget(args)
    if found is None:
        raise UsageError(f"--runs scales the release's budget: give the command's {' or '.join(BUDGET_OPTIONS)}")
    return found


def _share_of_what_is_left(led: ledger.Ledger, spent: Any, runs: int) -> tuple[str, Fraction]:
    """A command line without a budget, planned with ``--runs N``: the search starts at the ledger's ρ (zcdp) or ε
    left over N (public: the ledger's own figures), or at 1 when the ledger states none."""
    option, key = ("--rho", "rho") if led.limits.mode == "zcdp" else ("--epsilon", "epsilon")
    try:
        left = Fraction(led.accountant.remaining(spent).get(key, "1"))
    except (ValueError, ZeroDivisionError):
        left = Fraction(1)
    start = left / runs if left > 0 else Fraction(1)
    return option, max(round_down(start, 4), Fraction(1, 10**12))


def _with_budget(args: list[str], option: str, value: Fraction) -> list[str]:
    """``args`` with ``option``'s value replaced by ``value``."""
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == option and i + 1 < len(args):
            out += [option, fraction_text(value)]
            skip = True
        elif arg.startswith(option + "="):
            out.append(f"{option}={fraction_text(value)}")
        else:
            out.append(arg)
    return out


def _runs(ctx: typer.Context, led: ledger.Ledger, spent: Any, name: str, args: list[str], runs: int,
          as_json: bool) -> dict[str, Any]:
    """``--runs N``: the largest budget (4 significant digits, rounded down) at which N more fit, its cost and
    the margins its dry run states."""
    option, given = _budget_option(args)

    def events_at(value: Fraction) -> list[PrivacyEvent]:
        return _dry_run(ctx, name, _with_budget(args, option, value), as_json).events

    best = largest_budget(led, spent, runs, given, events_at)
    out: dict[str, Any] = {"runs": runs, "option": option, "value": None if best is None else fraction_text(best)}
    if best is None:  # why not even the smallest value searched fits
        smallest = smallest_searched(given)
        fit = releases_that_fit(led, events_at(smallest), spent)
        out.update(smallest=fraction_text(smallest), fits_at_smallest=_fit_json(fit))
    else:
        at = _dry_run(ctx, name, _with_budget(args, option, best), as_json)
        out.update(cost=[e.to_json() for e in at.events], moe95=_margins(at.description))
    return out


def _series(ctx: typer.Context, led: ledger.Ledger, spent: Any, name: str, args: list[str], runs: int,
            as_json: bool, reserve: bool) -> dict[str, Any]:
    """A pld ledger's ``--runs N`` as one series: the largest budget at which the N-fold PLD fits, and with
    ``reserve`` the series reserved at it (debited now)."""
    from dpcli.state.ledger.planning import largest_series_budget

    option, given = _budget_option(args)

    def events_at(value: Fraction) -> list[PrivacyEvent]:
        return _dry_run(ctx, name, _with_budget(args, option, value), as_json).events

    best = largest_series_budget(led, spent, runs, given, events_at)
    out: dict[str, Any] = {"option": option, "value": None if best is None else fraction_text(best)}
    if best is None:
        if reserve:
            raise BudgetError(f"budget refused for analyst {led.analyst!r}: no {option} lets {runs:,} releases fit "
                              "as a series")
        return out
    at = _dry_run(ctx, name, _with_budget(args, option, best), as_json)
    out.update(cost=[e.to_json() for e in at.events], moe95=_margins(at.description))
    if reserve:
        s = settings(ctx)
        receipt = ledger.reserve_series(
            s.state_dir, led.analyst, at.events, runs, command=name, lock_timeout=s.lock_timeout,
            summary=f"series of {runs:,} {name} releases at {option} {fraction_text(best)} each, reserved by budget "
                    "plan")
        out["reserved"] = {"entry": receipt.seq, "spent": led.accountant.spent_json(receipt.spent)}
    return out


def _covered_runs(args: list[str], runs: int) -> dict[str, Any]:
    """``--runs`` of a stream whose runs its state's reservation covers: any number, at the budget it has."""
    option, given = _budget_option(args)
    return {"runs": runs, "option": option, "value": fraction_text(given), "covered": True}


def _margins(description: DryRun) -> dict[str, Any]:
    """The 95% margins a dry run states, by column (where the command states them in output units)."""
    found: dict[str, Any] = {}
    if "calibration" in description:
        for key, m in (description["calibration"] or {}).items():
            if "moe95" in m:
                found[m.get("column", key)] = m["moe95"]
    if "moe95" in description:  # a stream's
        found.update(description["moe95"] or {})
    return found


def _fit_json(fit: Fit) -> dict[str, Any]:
    return {"count": fit.count, "at_least": fit.at_least, "next_refused": fit.refusal}


def _count_text(fit: dict[str, Any], unit: str = "release") -> str:
    if fit["count"] is None:
        return "any number of runs (covered by the state's reservation: they cost nothing more)"
    count = f"at least {fit['count']:,}" if fit["at_least"] else f"{fit['count']:,}"
    return f"{count} more {unit}{'' if fit['count'] == 1 and not fit['at_least'] else 's'} like it"


def _lines(doc: dict[str, Any]) -> list[str]:
    """The plan for people (ε, δ and ρ to 4 significant digits, as every figure dpcli prints)."""
    from dpcli.core.events import PrivacyEvent
    from dpcli.release.steps import cost_text

    cost = cost_text([PrivacyEvent.from_json(e) for e in doc["cost"]]) or "nothing"
    unit = doc["unit"]
    what = ("stream (its first run reserves the whole stream; later runs are covered)" if unit == "stream"
            else "release")
    lines = [f"budget plan for analyst {doc['analyst']!r} ({doc['mode']} ledger): one {doc['command']} {what} "
             f"costs {cost}",
             f"  fits now: {_count_text(doc['fit'], unit)}"]
    if "assumed" in doc:
        a = doc["assumed"]
        value = parameter_text(Fraction(a["value"]), "down")
        lines[0] += (f" (the command gives no budget: planned at {a['option']} {value}, what the ledger has left "
                     f"over {doc['runs']['runs']:,})")
    if doc["fit"]["next_refused"]:  # the ledger's answer to the release after those that fit (new-user trial)
        after = "one more after those" if doc["fit"]["count"] else "the next"
        lines.append(f"  {after} would be refused: {doc['fit']['next_refused']}")
    if "period" in doc:
        fresh = doc["period"]["fresh"]
        said = _count_text(fresh, unit) if fresh["count"] else f"none: {fresh['next_refused']}"
        lines.append(f"  the ledger refreshes: this period ends {doc['period']['ends']}; a fresh period fits {said}")
    if "runs" in doc:
        lines.append(_runs_line(doc["runs"], unit))
        if "series" in doc["runs"]:
            lines.append(_series_line(doc["runs"]["runs"], doc["runs"]["series"]))
    charged = ("the series reserved is charged" if "reserved" in doc.get("runs", {}).get("series", {})
               else "nothing charged")
    lines.append(f"  nothing read, {charged}; a free replay of an earlier identical release costs nothing")
    return lines


def _series_line(runs: int, s: dict[str, Any]) -> str:
    """A pld ledger's ``--runs N`` as one series, in one line (and what ``--reserve`` did)."""
    if s["value"] is None:
        return f"  as one series of {runs:,} (--reserve): no {s['option']} lets them fit"
    value = parameter_text(Fraction(s["value"]), "down")
    shown = {c: m for c, m in s["moe95"].items() if isinstance(m, (int, float))}
    margins = "; 95% margins: " + "; ".join(f"{c} ±{quantity_text(m)}" for c, m in shown.items()) if shown else ""
    if "reserved" in s:
        return (f"  reserved: series #{s['reserved']['entry']} of {runs:,} releases at {s['option']} {value} each "
                f"(run the command with {s['option']} {value}: each new release takes one run, nothing more to pay)"
                f"{margins}")
    return (f"  as one series of {runs:,} (--reserve, their N-fold PLD): {s['option']} {value} each{margins}")


def _runs_line(r: dict[str, Any], unit: str) -> str:
    """``--runs N``'s answer in one line."""
    head = f"  {r['runs']:,} more runs within {r['within']}"
    if r.get("refused"):
        return f"{head}: none, as the command refuses: {r['refused']}"
    if r.get("covered"):
        return f"{head}: covered by the state's reservation, at {r['option']} {r['value']} (nothing more to pay)"
    if r["value"] is None:
        at = r["fits_at_smallest"]
        return (f"{head}: no {r['option']} lets them fit (at {r['option']} "
                f"{parameter_text(Fraction(r['smallest']), 'down')}: {_count_text(at, unit)}"
                + (f"; then: {at['next_refused']})" if at["next_refused"] else ")"))
    shown = {c: m for c, m in r["moe95"].items() if isinstance(m, (int, float))}
    margins = "; ".join(f"{c} ±{quantity_text(m)}" for c, m in shown.items())
    each = "for the stream (one reservation covers its runs)" if unit == "stream" else "each"
    return (f"{head}: {r['option']} {parameter_text(Fraction(r['value']), 'down')} {each} (the largest of 4 "
            "significant digits that fits)" + (f"; 95% margins: {margins}" if margins else ""))
