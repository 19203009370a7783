"""The pld parts of ``dpcli budget``: ``compose --mode pld``, ``migrate``, what ``verify`` recomputes, and the
series ``show`` lists (docs/accounting.md, "The pld mode")."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dpcli.access import gate
from dpcli.cli._common import emit_json, handles_errors, resolve_analyst, settings
from dpcli.cli._options import positive, probability
from dpcli.core.display import parameter_text, parameters_text
from dpcli.core.exact import float_up
from dpcli.errors import BudgetError, UsageError
from dpcli.state import ledger

if TYPE_CHECKING:
    from dpcli.state.ledger.costs import CostCheck


def compose_pld(epsilon: str | None, delta_per: str | None, rho: str | None, delta: str | None,
                count: int) -> dict[str, Any]:
    """``count`` mechanisms composed by their privacy loss distributions, stated at ``delta``: randomized response
    at ``epsilon`` (every ε-DP mechanism, the discrete Laplace of a count among them), with ``delta_per`` the
    (ε, δ) pair, or with ``rho`` the discrete Gaussian of that ρ on a count. As a ledger composes one series."""
    from dpcli.core.accounting import pld
    from dpcli.core.accounting.budget import ChargeRefused
    from dpcli.core.events import PrivacyEvent

    target = probability("--delta", delta, required=True, allow_zero=False)
    if (epsilon is None) == (rho is None):
        raise UsageError("--mode pld composes --epsilon (Laplace, any ε-DP mechanism) or --rho (discrete Gaussian "
                         "counts): give one of them")
    if rho is not None:
        if delta_per is not None:
            raise UsageError("--delta-per is each (ε, δ) mechanism's δ: a discrete Gaussian has none")
        r = positive("--rho", rho, required=True)
        event = PrivacyEvent("zcdp", "compose/discrete-gaussian", rho=r, rdp_curve="discrete_gaussian")
    else:
        e = positive("--epsilon", epsilon, required=True)
        d = probability("--delta-per", delta_per) or Fraction(0)
        event = PrivacyEvent("approx" if d else "pure", "compose", epsilon=e, delta=d)
    if count > pld.MAX_COUNT:
        raise UsageError(f"--count must be at most {pld.MAX_COUNT:,} with --mode pld")
    try:
        eps, dlt = pld.block_cost([event], count, target)
    except pld.PldUnavailable:
        raise BudgetError(pld.MISSING) from None
    except ChargeRefused as exc:
        raise UsageError(str(exc)) from None
    out: dict[str, Any] = {"epsilon": float_up(eps), "delta": float_up(dlt)}
    if rho is None:
        out["basic_epsilon"] = float_up(event.epsilon * count)
    else:
        out["sigma"] = pld.gaussian_sigma(event.rho)
    return out


@handles_errors
def migrate(
    ctx: typer.Context,
    analyst: Annotated[str | None, typer.Argument(help="Analyst whose ledger to migrate (default: --analyst / "
                                                       "DPCLI_ANALYST).", metavar="ANALYST")] = None,
    to: Annotated[str, typer.Option("--to", help="The new accounting mode: pld (from an approx ledger).")] = "pld",
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")] = False,
) -> None:
    """Operator only: turn an approx ledger into a pld ledger with the same limits; every earlier charge keeps its
    (ε, δ), and an entry records the migration."""
    gate().require_operator("budget migrate")
    s = settings(ctx)
    led, carried = ledger.migrate(s.state_dir, resolve_analyst(analyst, ctx), to, s.lock_timeout)
    if as_json:
        emit_json({"analyst": led.analyst, "mode": led.limits.mode, "carried": carried, "entries": len(led.entries)})
    else:
        typer.echo(f"ledger {led.analyst!r}: now a {led.limits.mode} ledger ({carried} earlier charge(s) keep their "
                   "(ε, δ); the last entry records the migration)")


def verify_costs(led: ledger.Ledger) -> CostCheck | None:
    """A pld ledger's recorded costs, recomputed (exit 78 if one of the installed accounting differs)."""
    if led.limits.mode != "pld":
        return None
    from dpcli.state.ledger.costs import verify_costs as check

    return check(led)


def costs_text(check: CostCheck) -> str:
    """What ``budget verify`` says of a pld ledger's costs."""
    if check.accounting is None:
        return f"; {check.other} recorded cost(s) not recomputed: {_missing()}"
    other = f", {check.other} of another accounting (recosted when this one first charged)" if check.other else ""
    return f"; {check.equal} recorded cost(s) recomputed, all equal{other}"


def _missing() -> str:
    from dpcli.core.accounting.pld import MISSING

    return MISSING


def cost_text(cost: dict[str, Any] | None) -> str:
    """A pld entry's recorded cost for ``budget history`` (its block's (ε, δ), rounded up)."""
    if not cost:
        return ""
    return " (pld: " + parameters_text({"epsilon": cost["epsilon"], "delta": cost["delta"]}, "up") + ")"


def series_lines(series: list[dict[str, Any]]) -> list[str]:
    """``budget show``'s lines for a pld ledger's series."""
    lines = []
    for s in series:
        cost = s["cost"] or {}
        each = " + ".join(f"{ev.get('mechanism', 'release')} ("
                          + parameters_text({k: v for k, v in ev.items() if k in ("epsilon", "delta", "rho")}, "up")
                          + ")" for ev in s["each"])
        lines.append(f"series       #{s['entry']} ({s['command']}): {s['taken']} of {s['runs']} run(s) taken, "
                     f"{each} each; the series costs ε {parameter_text(cost.get('epsilon', '0'), 'up')} "
                     f"at δ {parameter_text(cost.get('delta', '0'), 'up')}")
    return lines
