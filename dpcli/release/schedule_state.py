"""A ``--schedule``'s state: loaded or started, checked, bound to its ledger reservation, and which calls an
earlier release answers.

A new schedule's state holds a random reservation id and input-digest secret (:func:`load_or_start`); a state of
other settings, another analyst or an older dpcli is refused (:func:`check_state`). Whether a call is answered by
a release made before is decided from public facts only, the input's fingerprint and ``--through``, before any
record is read (:func:`earlier`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpcli.core import schedules as sch
from dpcli.core.events import PrivacyEvent
from dpcli.core.schedules import ScheduleSpec
from dpcli.errors import DataError, StateError, UsageError
from dpcli.state import ledger
from dpcli.state import schedules as store


@dataclass(frozen=True)
class Again:
    """A call answered with a release the schedule made before (free): run ``run``'s (1, 2, …), as a
    ``replay`` (the same input as a call answered before), ``cached`` (bbscheduler's test said "not yet")
    or ``in force`` (a backfill of bbscheduler: the release in force at that moment)."""

    run: int
    kind: str


def answered(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every call the schedule has answered: its runs (``run``: their number), then the calls answered with an
    earlier release (``answers``), each with its input's fingerprint and ``--through`` (if it was given)."""
    runs = [{"fingerprint": r["fingerprint"], "through": r.get("through"), "run": i}
            for i, r in enumerate(state["runs"], 1)]
    return [*runs, *state.get("answers", [])]


def earlier(spec: ScheduleSpec, state: dict[str, Any], fingerprint: str, through: datetime | None) -> Again | None:
    """Whether this call is answered by a release made before, from public facts only (the input's fingerprint
    and ``--through``), before any record is read:

    * a moment already answered: the same input is a free replay; another input is refused (exit 65, a
      release is never rewritten: a correction is a new release);
    * an input already answered (any earlier run, not only the last): a free replay of that answer;
    * bbscheduler, a moment before one already answered (a backfill): the release in force at that moment
      (its epochs follow the data's growth forward only); fixed and bbimprover run a backfill as a new run.
    """
    steps = answered(state)
    if through is not None:
        text = moment_text(through)
        same = [s for s in steps if s.get("through") == text]
        retried = next((s for s in same if s["fingerprint"] == fingerprint), None)
        if retried is not None:
            return Again(retried["run"], "replay")
        if same:
            raise DataError(f"schedule {spec.name!r} already released its run through {text} from another input, "
                            "and a release is never rewritten: publish a correction as a new run (a later "
                            "--through), or once without --schedule")
    match = next((s for s in reversed(steps) if s["fingerprint"] == fingerprint), None)
    if match is not None:
        return Again(match["run"], "replay")
    if through is not None and spec.scheduler == "bbscheduler":
        return _in_force(spec, steps, through)
    return None


def _in_force(spec: ScheduleSpec, steps: list[dict[str, Any]], through: datetime) -> Again | None:
    """A bbscheduler backfill (``through`` before a moment already answered): the run in force then, the latest
    answered through an earlier moment; refused (exit 2) before the schedule's first moment."""
    dated = sorted((_moment(s["through"]), s["run"]) for s in steps if s.get("through"))
    if not dated or dated[-1][0] < through:
        return None
    before = [run for moment, run in dated if moment < through]
    if not before:
        raise UsageError(f"schedule {spec.name!r} (bbscheduler) began through {moment_text(dated[0][0])}, after "
                         f"{moment_text(through)}: it has no release for that moment; release that snapshot once "
                         "without --schedule, or use --scheduler fixed or bbimprover for jobs that backfill")
    return Again(before[-1], "in force")


def moment_text(moment: datetime) -> str:
    """A ``--through`` moment as the state records it and messages show it: UTC, a day alone at midnight
    (``2026-11-05``), else to the second (``2026-11-05T06:00:00Z``)."""
    utc = moment.astimezone(UTC)
    if utc.time() == datetime.min.time():
        return utc.date().isoformat()
    return utc.isoformat(timespec="seconds").replace("+00:00", "Z")


def _moment(text: str) -> datetime:
    """A moment :func:`moment_text` wrote, read back (UTC)."""
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def load_or_start(
    state_dir: Path, directory: Path, analyst: str, command: str, spec: ScheduleSpec, query: dict[str, Any],
    key: str, lock_timeout: float,
) -> tuple[dict[str, Any], bool]:
    """The schedule's checked state, or a new one (not yet saved) if the ledger has no reservation for it."""
    label = f"schedule {spec.name!r}"
    state = store.load(directory, key)
    if state is not None:
        check_state(state, spec.as_in(state["spec"]), analyst, label)
        return state, False
    if spec.scheduler == "bbimprover" and spec.index == "rows":
        raise UsageError("--improver-index rows would need each snapshot's exact row count, which dpcli no longer "
                         "uses: use --improver-index runs (the default) for a new schedule")
    led = ledger.read_ledger(state_dir, analyst, lock_timeout)
    seq = led.find_reservation("schedule", key)
    if seq is not None:
        raise StateError(
            f"{label} already has reservation #{seq} in this ledger but no state file (deleted?): "
            "restore its state from a backup, or use a new --schedule name"
        )
    return _new_state(analyst, led.ledger_id, command, spec, query, key), True


def check_state(state: dict[str, Any], spec: ScheduleSpec, analyst: str, label: str) -> None:
    """Refuse a state of other settings (exit 2), of another analyst or of an older dpcli (exit 78)."""
    if sch.stored_spec(state["spec"]) != spec.to_json():
        raise UsageError(f"schedule {spec.name!r} already exists with other settings; use a new --schedule name")
    if "reservation" not in state or "secret" not in state:
        raise StateError(f"{label}: state written by an older dpcli (not bound to the ledger); "
                         "use a new --schedule name")
    if state.get("analyst") != analyst:
        raise StateError(f"{label}: the state file belongs to analyst {state.get('analyst')!r}, not {analyst!r}")


def _new_state(
    analyst: str, ledger_id: str, command: str, spec: ScheduleSpec, query: dict[str, Any], key: str,
) -> dict[str, Any]:
    """A new schedule's state (not yet saved): a random reservation id and input-digest secret.

    A bbscheduler's noisy start and γ are added by its first run (``schedule_runs._first_epoch``)."""
    return {
        "key": key,
        "analyst": analyst,
        "ledger_id": ledger_id,
        "reservation": secrets.token_hex(12),
        "secret": secrets.token_hex(32),
        "command": command,
        "query": query,
        "spec": spec.to_json(),
        "gamma": None,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": [],
    }


def reservation_event(spec: ScheduleSpec) -> PrivacyEvent:
    """What the whole schedule costs, debited once with its first run."""
    if spec.total_delta:
        return PrivacyEvent("approx", f"schedule/{spec.scheduler}", epsilon=spec.total_epsilon,
                            delta=spec.total_delta)
    return PrivacyEvent("pure", f"schedule/{spec.scheduler}", epsilon=spec.total_epsilon)


def schedule_reservation(state: dict[str, Any], spec: ScheduleSpec, command: str) -> ledger.Reservation:
    """The whole schedule's debit, made with its first run."""
    return ledger.Reservation(
        id=state["reservation"], kind="schedule", key=state["key"], ledger_id=state["ledger_id"],
        events=(reservation_event(spec),),
        command=f"{command} --schedule",
        summary=f"schedule {spec.name!r} ({spec.scheduler}) reserves its whole budget",
    )
