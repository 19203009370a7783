"""How many more releases like one fit a ledger, and what each may cost for N more (``dpcli budget plan``).

The answers are the ledger's own: a release fits when :func:`dpcli.state.ledger.refusal` would accept it after the
ones before it were charged, and the spend after ``k`` charges is composed as the ledger composes it (one charge at
a time onto its running total: :meth:`dpcli.core.accounting.accountants.Accountant.spend` with a ``base``). Only
public inputs enter: the release's planned events (from its dry run) and the ledger's balances. A release that is a
free replay of an earlier identical one costs nothing; these counts are of new releases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from fractions import Fraction
from typing import TYPE_CHECKING

from dpcli.core.accounting.budget import ChargeRefused, Spend

if TYPE_CHECKING:
    from dpcli.core.events import PrivacyEvent
    from dpcli.state.ledger.model import Ledger

#: The largest count searched: beyond it a plan says "at least" (a release of ε 10⁻⁹ on a ledger of ε 10 would
#: otherwise be counted into the billions).
MAX_COUNTED = 100_000


@dataclass(frozen=True)
class Fit:
    """How many more releases fit: ``count`` (None: the release costs nothing, so any number), ``at_least``: the
    count reached :data:`MAX_COUNTED`; ``refusal``: why the next one would be refused (None with ``count`` None or
    ``at_least``)."""

    count: int | None
    at_least: bool = False
    refusal: str | None = None


def _scaled(spend: Spend, k: int) -> Spend:
    """``k`` times ``spend`` (exact for every field but an RDP curve, which :func:`releases_that_fit` checks)."""
    return Spend(spend.epsilon * k, spend.delta * k, spend.rho * k, spend.units * k, spend.calls * k,
                 tuple(c * k for c in spend.rdp_curve))


def _costs_nothing(need: Spend) -> bool:
    return not (need.epsilon or need.delta or need.rho or need.units or need.calls or any(need.rdp_curve))


#: An RDP ledger's counts up to this many are checked charge by charge, as the ledger adds its curves (floating
#: sums that the scaled curves may round differently at the boundary); a larger count is given one lower, as "at
#: least" (never more than the ledger accepts), so a plan's work stays bounded whatever fits.
SEQUENTIAL_LIMIT = 1_000


def releases_that_fit(led: Ledger, events: list[PrivacyEvent], spent: Spend, enough: int | None = None,
                      covered: int = 0) -> Fit:
    """How many more releases costing ``events`` the ledger ``led`` accepts after ``spent`` (its spend now, or a
    fresh period's ``Spend()``), and why the one after them would be refused; with ``enough``, counting stops there
    (``Fit(enough, at_least=True)``: that many fit, perhaps more). ``covered``: how many a pld ledger's open
    series take first, at no cost (:func:`dpcli.state.ledger.series.runs_left`)."""
    if covered:
        if enough is not None and covered >= enough:
            return Fit(enough, at_least=True)
        rest = releases_that_fit(led, events, spent, None if enough is None else enough - covered)
        return rest if rest.count is None else replace(rest, count=rest.count + covered)
    accountant = led.accountant
    try:
        need = accountant.spend(events)
    except ChargeRefused as exc:
        return Fit(0, refusal=f"analyst {led.analyst!r} ({led.limits.mode} ledger): {exc}")
    if _costs_nothing(need):
        return Fit(None)
    cap = min(MAX_COUNTED, enough) if enough is not None else MAX_COUNTED

    def fits_after(k: int) -> bool:  # one more fits after k more (scaled: exact but for RDP's float curves)
        return accountant.fits(_add(spent, _scaled(need, k)), need) is None

    if not fits_after(0):
        return Fit(0, refusal=accountant.fits(spent, need))
    count, at_least = _largest(fits_after, cap)
    if led.limits.mode != "rdp":  # sums of fractions (and integers): k charges are exactly k times one
        return Fit(count, at_least, None if at_least else accountant.fits(_add(spent, _scaled(need, count)), need))
    if count > SEQUENTIAL_LIMIT:
        return Fit(count - 1, at_least=True)
    count, total = _sequential_count(led, events, spent, need, count, cap)
    if at_least and count == cap:
        return Fit(count, at_least=True)
    return Fit(count, refusal=accountant.fits(total, need))


def _largest(fits_after: Callable[[int], bool], cap: int) -> tuple[int, bool]:
    """(the count k + 1 for the largest k with ``fits_after(k)``, or ``cap``; whether it reached ``cap``), by
    doubling then bisection (``fits_after(0)`` holds)."""
    lo, hi = 0, 1  # fits_after(lo), and hi unknown
    while hi < cap and fits_after(hi):
        lo, hi = hi, hi * 2
    if hi >= cap and fits_after(cap - 1):
        return cap, True
    hi = min(hi, cap - 1)
    while hi - lo > 1:  # fits_after(lo), not fits_after(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_after(mid) else (lo, mid)
    return lo + 1, False


def _add(a: Spend, b: Spend) -> Spend:
    curve: tuple[float, ...] = ()
    if a.rdp_curve or b.rdp_curve:
        n = max(len(a.rdp_curve), len(b.rdp_curve))
        left, right = a.rdp_curve or (0.0,) * n, b.rdp_curve or (0.0,) * n
        curve = tuple(x + y for x, y in zip(left, right, strict=True))
    return Spend(a.epsilon + b.epsilon, a.delta + b.delta, a.rho + b.rho, a.units + b.units, a.calls + b.calls, curve)


def _sequential(led: Ledger, events: list[PrivacyEvent], spent: Spend, k: int) -> Spend:
    """The ledger's running total after ``k`` more charges of ``events``, composed one charge at a time."""
    total = spent
    for _ in range(k):
        total = led.accountant.spend(events, total)
    return total


def _sequential_count(led: Ledger, events: list[PrivacyEvent], spent: Spend, need: Spend,
                      guess: int, upto: int) -> tuple[int, Spend]:
    """The count the ledger reaches charging one at a time, from ``guess`` (found on scaled curves, which may round
    differently at the boundary), at most ``upto``, and the running total after that many: composed once, then
    stepped."""
    accountant = led.accountant
    count = guess
    total = _sequential(led, events, spent, count)
    while count > 0 and accountant.fits(_sequential(led, events, spent, count - 1), need) is not None:
        count -= 1  # (rare: one step at the boundary)
        total = _sequential(led, events, spent, count)
    while count < min(upto, guess + SEQUENTIAL_LIMIT) and accountant.fits(total, need) is None:
        count += 1
        total = accountant.spend(events, total)
    return count, total


@dataclass(frozen=True)
class Period:
    """A ledger's refresh period: when the current one ends, and how many releases a fresh one fits."""

    ends: datetime
    fresh: Fit


def refresh_period(led: Ledger, events: list[PrivacyEvent], now: datetime) -> Period | None:
    """The current period's end and a fresh period's count (None: the ledger never refreshes)."""
    if not led.refresh_days:
        return None
    ends = led.created + timedelta(days=led.refresh_days * (led.period(now) + 1))
    return Period(ends, releases_that_fit(led, events, Spend()))


#: How far below the command line's budget ``--runs`` searches (a millionth of it, and never below 10⁻¹²: the
#: smallest ε or ρ dpcli's samplers take).
SEARCH_DEPTH = 10**6
SMALLEST_BUDGET = Fraction(1, 10**12)


def largest_budget(led: Ledger, spent: Spend, runs: int, start: Fraction,
                   events_at: Callable[[Fraction], list[PrivacyEvent]], digits: int = 4) -> Fraction | None:
    """The largest budget (the release's ε, ε_per or ρ, of ``digits`` significant digits, rounded down) at which
    ``runs`` more releases fit, searched from ``start`` (``events_at(b)``: the release's cost at budget ``b``, from
    its dry run); None when not even the smallest budget searched (:data:`SEARCH_DEPTH`) lets them fit (a δ that
    ``runs`` releases spend beyond the ledger's, whatever their ε)."""

    def fits(b: Fraction) -> bool:
        fit = releases_that_fit(led, events_at(b), spent, enough=runs)
        return fit.count is None or fit.count >= runs

    return _largest_budget(fits, start, digits)


def series_delta(led: Ledger, spent: Spend) -> Fraction:
    """The δ a series reserved now is stated at: all the δ the pld ledger has left."""
    return max(led.limits["delta"] - spent.delta, Fraction(0))


def largest_series_budget(led: Ledger, spent: Spend, runs: int, start: Fraction,
                          events_at: Callable[[Fraction], list[PrivacyEvent]], digits: int = 4) -> Fraction | None:
    """:func:`largest_budget` for ``runs`` releases reserved as one series in a pld ledger: their ``runs``-fold
    PLD at the δ left (:func:`series_delta`) must fit what is left of ε."""
    from dpcli.state.ledger.costs import pld_accountant

    accountant = pld_accountant(led)
    delta = series_delta(led, spent)

    def fits(b: Fraction) -> bool:
        try:
            need = accountant.series(events_at(b), runs, delta)
        except ChargeRefused:
            return False
        return accountant.fits(spent, need) is None

    return _largest_budget(fits, start, digits)


def _largest_budget(fits: Callable[[Fraction], bool], start: Fraction, digits: int) -> Fraction | None:
    """The largest budget of ``digits`` significant digits with ``fits``, searched from ``start`` (doubling or
    halving, then bisection), never below :func:`smallest_searched`; None if not even that fits."""
    floor = max(smallest_searched(start), SMALLEST_BUDGET)
    if fits(start):
        lo, hi = start, start * 2
        while fits(hi) and hi < start * 10**12:
            lo, hi = hi, hi * 2
    else:
        if not fits(floor):
            return None
        lo, hi = start, start
        while not fits(lo):
            lo, hi = max(round_down(lo / 2, 9), floor), lo
    while hi / lo > Fraction(100001, 100000):  # fits(lo), not fits(hi)
        mid = round_down((lo + hi) / 2, 9)  # short texts for the command line (it takes decimals)
        if mid <= lo:
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    for best in (round_down(hi, digits), round_down(lo, digits)):  # the boundary itself may fit (50 × 0.02 = 1)
        if fits(best):
            return best
    return None


def smallest_searched(start: Fraction) -> Fraction:
    """The smallest budget ``--runs`` tries from ``start``."""
    return max(round_down(start / SEARCH_DEPTH, 4), SMALLEST_BUDGET)


def round_down(x: Fraction, digits: int) -> Fraction:
    """``x`` to ``digits`` significant digits, rounded down (never above ``x``)."""
    exponent = 0
    while x >= 10 ** (exponent + 1):
        exponent += 1
    while x < 10**exponent:
        exponent -= 1
    unit = Fraction(10) ** (exponent - digits + 1)
    return (x // unit) * unit
