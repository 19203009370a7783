"""Debiting a release: lock → read and verify once → check → append durably → unlock.

A release is debited before its first private record is read (:func:`debit`), so a run killed or
timed out still pays and its rerun is a free replay; once computed, :func:`charge` records its
completion (the output's digest and its summary, no cost) beside that debit. A stream's or
schedule's whole budget is reserved the same way, before its first run reads anything
(:func:`reserve`).
"""

from __future__ import annotations

from datetime import datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpcli.core.accounting import budget as bud
from dpcli.core.events import PrivacyEvent
from dpcli.errors import BudgetError
from dpcli.state import progress
from dpcli.state.ledger import costs, series
from dpcli.state.ledger.document import (
    document_of,
    ledger_of,
    load_ledger,
    remaining_text,
    write_ledger,
)
from dpcli.state.ledger.format import (
    SCHEMA_VERSION,
    append_at,
    iso_time,
    parse_time,
    same_mac,
    sealed_lines,
    utc_now,
)
from dpcli.state.ledger.mark import MarkTotals, from_mark, write_mark
from dpcli.state.ledger.model import Ledger, Receipt, Reservation, Step, recorded_spend, refuse_unless_fits
from dpcli.state.ledger.steps import reservation_entry, step_entries
from dpcli.state.lock import exclusive_lock
from dpcli.state.paths import ensure_state_dir, lock_path


def check_payable(led: Ledger, events: list[PrivacyEvent]) -> None:
    """Refuse (BudgetError, exit 77) events this ledger's mode can never pay (δ in a pure ledger).

    Called before any data is read. Running out of budget is checked only when charging: the
    same release may be a free replay, which only the data's fingerprint can tell.
    """
    try:
        led.accountant.spend(events)
    except bud.ChargeRefused as exc:
        raise BudgetError(f"analyst {led.analyst!r} ({led.limits.mode} ledger): {exc}") from None


def refusal(led: Ledger, events: list[PrivacyEvent], when: datetime | None = None) -> str | None:
    """Why ``led`` would refuse a new release costing ``events`` now, or None if it would accept it.

    Reads only (``--dry-run``): a replay of an earlier identical release would be free anyway. A release a pld
    ledger's open series covers is accepted.
    """
    if led.limits.mode == "pld" and series.slot_for(series.open_series(led, when or utc_now()), events):
        return None
    try:
        refuse_unless_fits(led, led.analyst, led.spend(when), events, events)
    except BudgetError as exc:
        return str(exc)
    return None


def charge(
    root: Path,
    analyst: str,
    *,
    command: str,
    query_id: str,
    seed_id: str,
    reserve: list[PrivacyEvent],
    actual: list[PrivacyEvent] | None = None,
    summary: str = "",
    lock_timeout: float = 30.0,
    now: datetime | None = None,
    step: Step | None = None,
    output: str | None = None,
    completes: int | None = None,
    report: dict[str, Any] | None = None,
) -> Receipt:
    """Debit a release durably, before its output is written (the ledger is read and verified once).

    ``reserve`` is the largest cost the query can have, decided without looking
    at the data (so a refusal reveals nothing); ``actual`` (≤ reserve, default
    the same) is what the release really cost, e.g. UnkGumb's 2|o| + 1 - 1{⊥}.
    Under the lock: a seed already charged this period is a free replay;
    otherwise the reserve must fit the remaining budget and the actual cost is
    appended and fsynced. Raises :class:`BudgetError` when it does not fit.

    ``step`` records a run against a stream's or schedule's state file instead
    (its cost is covered by the reservation; see docs/ledger.md): a new
    step, an exact repeat (free, ``replay``), or :class:`StateError` for a
    state that is older, forked, re-created or foreign. ``step.create``
    debits the reservation itself in the same write.

    ``output`` is the digest of the release file about to be written (``-o``): recorded in the entry,
    so ``dpcli plot`` can tell a release dpcli wrote from any other file; ``report``, the release's public
    report (its ``--json`` summary without the receipt), is recorded beside it, so ``dpcli diff`` can read a
    file's calibration from the entry whose digest it has.

    ``completes``: the entry of this release's own :func:`debit`, made before it read any data: the
    entry appended now records its completion (output and summary) at no cost.
    """
    actual = reserve if actual is None else actual
    ensure_state_dir(root)
    when = now or utc_now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        led, cache = _open_for_charge(root, analyst, when, entries_needed=step is not None)
        base: dict[str, Any] = {"seq": 0, "time": iso_time(when), "period": cache.period, "command": command,
                                "query_id": query_id, "seed_id": seed_id, "events": []}
        if summary:
            base["summary"] = summary
        if output:
            base["output"] = output
            if report is not None:
                base["report"] = report
        reserved: tuple[PrivacyEvent, ...] = ()
        covered: int | None = None
        if step is not None:
            added, reserved, replay_of, covered = step_entries(led, analyst, step, base, when, cache.spent)
        elif completes is not None:
            replay_of, added = None, [{**base, "seq": cache.count + 1, "completes": completes}]
        else:
            replay_of = cache.replay_of(seed_id)
            entry = {**base, "seq": cache.count + 1}
            if replay_of is None:
                entry = _new_release(led, analyst, cache, entry, reserve, actual)
            else:
                entry["replay_of"] = replay_of
            added = [entry]
        after = _record(root, led, cache, added)
    return Receipt(
        analyst=analyst,
        replay=replay_of is not None,
        seq=completes if completes is not None else added[-1]["seq"],
        spent=after.spent,
        guarantee=led.accountant.guarantee(after.spent, led.report_delta),
        limits=led.limits,
        remaining=remaining_text(led, when, after.spent),
        reserved=reserved,
        covered_by=covered,
    )


def debit(
    root: Path,
    analyst: str,
    *,
    command: str,
    query_id: str,
    seed_id: str,
    events: list[PrivacyEvent],
    summary: str,
    lock_timeout: float = 30.0,
) -> Receipt:
    """Debit a release before it reads its first private record: a run killed or timed out has paid.

    Under the lock: a seed already charged this period needs nothing (``replay``: the receipt names
    the entry that paid); otherwise ``events`` (the most the release can cost, decided without the
    data) must fit what is left and are appended durably. The release, once computed, is recorded by
    :func:`charge` with ``completes`` set to this receipt's entry (a replay by a plain :func:`charge`).
    """
    ensure_state_dir(root)
    when = utc_now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        led, cache = _open_for_charge(root, analyst, when, entries_needed=False)
        paid = cache.replay_of(seed_id)
        if paid is None:
            entry = {"seq": cache.count + 1, "time": iso_time(when), "period": cache.period, "command": command,
                     "query_id": query_id, "seed_id": seed_id, "events": [], "summary": summary,
                     "before_reading": True}
            cache = _record(root, led, cache, [_new_release(led, analyst, cache, entry, events, events)])
    return Receipt(analyst=analyst, replay=paid is not None, seq=paid if paid is not None else cache.count,
                   spent=cache.spent, guarantee=led.accountant.guarantee(cache.spent, led.report_delta),
                   limits=led.limits, remaining=remaining_text(led, when, cache.spent))


def reserve(root: Path, analyst: str, reservation: Reservation, lock_timeout: float = 30.0) -> bool:
    """Debit a new stream's or schedule's whole budget before its first run reads any data (the run's
    step then finds it); True if debited now, False if the ledger already holds it (a retried first run)."""
    ensure_state_dir(root)
    when = utc_now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        led, cache = _open_full(root, analyst, when)
        if led.reservation(reservation.id) is not None:
            return False
        label = reservation.name or f"{reservation.kind} {reservation.key}"
        entry = reservation_entry(led, analyst, reservation, label, iso_time(when), when, cache.spent)
        _record(root, led, cache, [entry])
    return True


def start_step(root: Path, analyst: str, reservation: str, start: int, digest: str, label: str,
               cost: list[PrivacyEvent], lock_timeout: float = 30.0) -> None:
    """Mark a stream's or schedule's run at step ``start`` as begun, before it reads any record.

    The reservation pays for one computation per step. A mark with the same input ``digest`` as an
    open mark (a killed run retried on the same input), or at a step already recorded (a replay, checked
    by the step itself), writes nothing. A mark with another input while a run at that step is still
    open (begun, never recorded: killed, timed out, failed) is a second computation the reservation
    does not cover: it is debited ``cost`` (refused, exit 77, if that does not fit). So every run that
    began reading is paid for, and timing probes cannot be repeated for free over new inputs.
    """
    ensure_state_dir(root)
    when = utc_now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        led, cache = _open_full(root, analyst, when)
        created = led.reservation(reservation)
        if created is None or len(led.steps(created["seq"])) != start:
            return  # the step's own record refuses a foreign or older state, or recognises the replay
        open_marks = led.open_starts(created["seq"], start)
        if any(same_mac(m["starts"]["input"], digest) for m in open_marks):
            return
        events = cost if open_marks else []
        if events:
            refuse_unless_fits(led, analyst, cache.spent, events, events)
        entry = {"seq": cache.count + 1, "time": iso_time(when), "period": cache.period, "command": created["command"],
                 "query_id": created["query_id"], "seed_id": created["seed_id"], "covered_by": created["seq"],
                 "starts": {"from": start, "input": digest}, "events": [ev.to_json() for ev in events],
                 "summary": f"{label}: run {start + 1} began reading"
                            + (" (another input than an unfinished run: charged)" if events else "")}
        _record(root, led, cache, [entry])


def close_start(root: Path, analyst: str, reservation: str, start: int, digest: str,
                lock_timeout: float = 30.0) -> None:
    """Close the open mark of a run at step ``start`` that ended without a step of its own (a schedule's
    call answered with its cached release): the next input at that step is then a new run, not a second."""
    ensure_state_dir(root)
    when = utc_now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        led, cache = _open_full(root, analyst, when)
        created = led.reservation(reservation)
        if created is None:
            return
        mark = next((m for m in led.open_starts(created["seq"], start) if same_mac(m["starts"]["input"], digest)),
                    None)
        if mark is None:
            return
        entry = {"seq": cache.count + 1, "time": iso_time(when), "period": cache.period, "command": mark["command"],
                 "query_id": mark["query_id"], "seed_id": mark["seed_id"], "covered_by": created["seq"],
                 "closes": mark["seq"], "events": [], "summary": "answered with the schedule's earlier release"}
        _record(root, led, cache, [entry])


def _new_release(led: Ledger, analyst: str, cache: MarkTotals, entry: dict[str, Any], reserve: list[PrivacyEvent],
                 actual: list[PrivacyEvent]) -> dict[str, Any]:
    """``entry`` for a new release (not a replay): the next run of a pld ledger's open series whose release costs
    ``reserve`` (nothing more to pay), else ``actual`` charged once ``reserve`` fits (BudgetError if not)."""
    slot = series.slot_for(cache.series, reserve)
    if slot is not None:
        return series.covered(entry, slot)
    refuse_unless_fits(led, analyst, cache.spent, reserve, actual)
    return {**entry, "events": [ev.to_json() for ev in actual]}


def reserve_series(root: Path, analyst: str, events: list[PrivacyEvent], count: int, *, command: str, summary: str,
                   lock_timeout: float = 30.0) -> Receipt:
    """Reserve a series in a pld ledger: ``count`` releases costing ``events``, paid now as one block (their
    ``count``-fold PLD at all the δ the ledger has left); later releases of that cost take its runs
    (:mod:`dpcli.state.ledger.series`). BudgetError if it does not fit, or the ledger is not a pld ledger."""
    ensure_state_dir(root)
    when = utc_now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        led, cache = _open_full(root, analyst, when)
        if led.limits.mode != "pld":
            raise BudgetError(f"analyst {analyst!r} has a {led.limits.mode} ledger: a series is reserved in a pld "
                              "ledger (dpcli budget migrate converts an approx one)")
        delta = max(led.limits["delta"] - cache.spent.delta, Fraction(0))
        try:
            need = costs.pld_accountant(led).series(events, count, delta)
        except bud.ChargeRefused as exc:
            raise BudgetError(f"analyst {analyst!r} (pld ledger): {exc}") from None
        short = led.accountant.fits(cache.spent, need)
        if short is not None:
            raise BudgetError(f"budget refused for analyst {analyst!r}: {short} (see: dpcli budget show {analyst})")
        entry = series.series_entry(led, cache.count + 1, iso_time(when), cache.period, events, count, delta,
                                    command, summary)
        after = _record(root, led, cache, [entry])
    return Receipt(analyst=analyst, replay=False, seq=entry["seq"], spent=after.spent,
                   guarantee=led.accountant.guarantee(after.spent, led.report_delta), limits=led.limits,
                   remaining=remaining_text(led, when, after.spent))


def _open_for_charge(root: Path, analyst: str, when: datetime, entries_needed: bool) -> tuple[Ledger, MarkTotals]:
    """The ledger and its running totals for period ``when``: from the sealed mark if it vouches for the file
    as it is (O(1) in the number of entries), else by reading and verifying everything (O(n)). A pld ledger
    whose latest costs are of another accounting than the installed one is recosted first."""
    if not entries_needed:
        fast = from_mark(root, analyst, when)
        if fast is not None and not costs.needs_recost(fast[0], fast[1].accounting):
            return fast
    return _open_full(root, analyst, when)


def _open_full(root: Path, analyst: str, when: datetime) -> tuple[Ledger, MarkTotals]:
    """The ledger read and verified whole, and its totals; a pld ledger of another accounting recosted first (an
    entry of its own, written before the caller's)."""
    led = load_ledger(root, analyst)
    cache = MarkTotals.of(led, when)
    if costs.needs_recost(led, cache.accounting):
        _record(root, led, cache, [costs.recost_entry(led, when, cache.count + 1)])
        led = load_ledger(root, analyst)
        cache = MarkTotals.of(led, when)
    return led, cache


def _spent_after(led: Ledger, spent: bud.Spend, added: list[dict[str, Any]]) -> bud.Spend:
    """The running total once ``added`` are recorded: a pld ledger adds the costs its entries record (one block
    each), the other modes compose the entries' events onto it."""
    if led.limits.mode == "pld":
        extra = recorded_spend(led, added)
        return bud.Spend(epsilon=spent.epsilon + extra.epsilon, delta=spent.delta + extra.delta)
    return led.accountant.spend([PrivacyEvent.from_json(ev) for e in added for ev in e["events"]], base=spent)


def _record(root: Path, led: Ledger, cache: MarkTotals, added: list[dict[str, Any]]) -> MarkTotals:
    """Write ``added`` durably (append, or rewrite a schema-2 or old-key file whole), then the mark; new totals."""
    costs.annotate(led, added)  # a pld ledger seals each block's cost in its entry
    spent = _spent_after(led, cache.spent, added)
    if any(e["events"] for e in added):  # said before the first byte: an interruption from here on may leave it charged
        progress.charged(led.analyst)
    tail = led.tail
    if tail is None or tail.version != SCHEMA_VERSION or not tail.current_key:
        doc = document_of(led, [*led.entries, *added])
        write_ledger(root, led.path, doc, parse_time(added[-1]["time"]))
        return MarkTotals.of(ledger_of(led.path, doc), parse_time(added[-1]["time"]))
    lines = sealed_lines(root, cache.head, added)
    write_mark(root, led, cache, tail.size, pending=lines)  # intent first: a crash mid-append is completed
    size = append_at(led.path, tail.size, lines)
    after = cache.after(added, spent)
    write_mark(root, led, after, size)
    return after
