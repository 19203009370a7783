"""Runs of a ``--schedule``: one release path over growing snapshots with one total budget (paper 004).

The whole schedule's total is debited from the analyst's ledger at its first
run; each later run is recorded in the ledger as covered by that
reservation, and calls that fall inside an epoch already run return the
cached release (post-processing: free). A call on an input the schedule has
answered before, or for a ``--through`` moment it has answered, gets that
answer again (a retry never unpublishes; another input for a released moment
is refused): see :func:`earlier`. The state is bound to the ledger
(see :func:`run_scheduled`). :mod:`dpcli.core.schedules` holds the
arithmetic; the CLI options are in :mod:`dpcli.cli._options`.

No exact size of a snapshot decides anything or leaves a run: bbscheduler
decides its epochs from noisy counts of distinct privacy units, paid from its
reservation (:func:`_bbscheduler_plan`); bbimprover counts runs; fixed needs no
size. The exact count (:func:`count_units`) is only ever used under noise.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.core import schedules as sch
from dpcli.core.display import parameter_text
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.core.schedules import ScheduleSpec
from dpcli.errors import BudgetError, DataError, StateError, UsageError
from dpcli.frames import collect
from dpcli.io.tables import InputTable
from dpcli.release.seeds import Calibration, ReleaseSeed, release_seed
from dpcli.release.steps import BeforeRun, LedgerRef, Prepared, Release, charge
from dpcli.state import ledger
from dpcli.state import schedules as store
from dpcli.tasks import Result
from dpcli.tasks.auto_bounds import chosen_text

if TYPE_CHECKING:
    from dpcli.tasks import P, SchedulableTask

#: A run's black box: (ε for this run, the ``auto`` bounds the schedule's first run chose and its state keeps, or
#: None before they are chosen, a check of the run's seed and cost before it reads a record) → the release
#: computed at that ε, at those bounds (not yet recorded).
RunRelease = Callable[[Fraction, dict[str, Any] | None, BeforeRun], Prepared]
#: (released table, report) → the digest of the file it is about to be written to (None: stdout).
OutputDigest = Callable[[pl.DataFrame, dict[str, Any]], str | None]


#: What a bbscheduler state made since issue 29 records in ``sizes``: its sizes are noisy unit counts.
#: A state without it (dpcli before issue 29) decided epochs on exact row counts and cannot go on.
NOISY_SIZES = "noisy-units-v1"


@dataclass
class Plan:
    """What a new run does: its step (epoch or run number), its release's ε, and what it records.

    ``fields`` go into the run's entry; ``state`` into the schedule's state, both only once the
    ledger has recorded the run."""

    step: int
    epsilon: Fraction
    fields: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


class Sizes:
    """One run's access to its snapshot's size: the exact count of distinct privacy units, computed
    only when a noisy estimate needs it, and the keyed stream that noise comes from.

    The stream's seed is ``HMAC(key, schedule key + reservation id + the snapshot (its bytes and how
    they were read) + the schedule's spec)``:
    the same snapshot gets the same noise within a schedule (asking again reveals nothing new), a
    new snapshot or a new schedule fresh noise."""

    def __init__(self, state_dir: Path, state: dict[str, Any], table: InputTable, unit: str,
                 read: tuple[str, ...] = (), before_read: Callable[[], None] = lambda: None) -> None:
        self._state_dir, self._state, self._table, self._unit, self._read = state_dir, state, table, unit, read
        self._before_read = before_read  # the run's mark in the ledger (:class:`_Begun`), before the count
        self._units: int | None = None
        self._stream: KeyedStream | None = None

    @property
    def asked(self) -> bool:
        """Whether this run has looked at the data's size (then its answer came from noise the state holds)."""
        return self._units is not None

    @property
    def units(self) -> int:
        if self._units is None:
            self._before_read()
            self._units = count_units(self._table, self._unit, self._read)
        return self._units

    @property
    def stream(self) -> KeyedStream:
        if self._stream is None:
            material = {"command": "schedule-sizes", "v": 1, "schedule": self._state["key"],
                        "reservation": self._state["reservation"]}
            # The calibration is the schedule's spec: its ε and γ set every size noise's scale.
            calibration = Calibration("schedule", {"spec": self._state["spec"], "gamma": self._state.get("gamma")})
            seed = release_seed(self._state_dir, material, {"data": self._table}, calibration)
            self._stream = KeyedStream(seed.seed, "schedule-sizes")
        return self._stream


def count_units(table: InputTable, unit: str, read: tuple[str, ...] = ()) -> int:
    """Distinct non-null privacy units in the snapshot (one unit moves it by at most 1).

    Exact and private: only ever used with noise added (:mod:`dpcli.core.schedules`). The columns a
    release reads (``read``) are read too, so a file that fails to parse fails here as a release on it would
    (exit 65), whatever the crossing test would have said."""
    others = [pl.col(c).n_unique().alias(f"_read_{i}") for i, c in enumerate(dict.fromkeys(read)) if c != unit]
    frame = table.frame.select(pl.col(unit).drop_nulls().n_unique().alias("_units"), *others)
    units = int(collect(frame, f"cannot read {table.name}")["_units"].item())
    table.verify_unchanged()  # the count is of the bytes whose fingerprint seeds its noise
    return units


@dataclass(frozen=True)
class _Call:
    """One call of a scheduled query: whose schedule, where its state lies, and its state as loaded."""

    state_dir: Path
    directory: Path
    analyst: str
    command: str
    spec: ScheduleSpec
    state: dict[str, Any]
    lock_timeout: float

    @property
    def label(self) -> str:
        return f"schedule {self.spec.name!r}"


@dataclass(frozen=True)
class Again:
    """A call answered with a release the schedule made before (free): run ``run``'s (1, 2, …), as a
    ``replay`` (the same input as a call answered before), ``cached`` (bbscheduler's test said "not yet")
    or ``in force`` (a backfill of bbscheduler: the release in force at that moment)."""

    run: int
    kind: str


def run_scheduled(
    state_dir: Path,
    analyst: str,
    command: str,
    spec: ScheduleSpec,
    query: dict[str, Any],
    table: InputTable,
    run: RunRelease,
    lock_timeout: float = 30.0,
    output_digest: OutputDigest | None = None,
    through: datetime | None = None,
) -> Release:
    """One call of a scheduled query: reserve (first call), run a new epoch, or answer with an earlier release.

    The schedule's state is bound to the ledger (:class:`ledger.Step`): its
    reservation id is random per creation and every run is recorded with a
    keyed digest of its snapshot, so an older copy of the state, a deleted and
    re-created one or one from another analyst is refused (exit 78), never
    given fresh releases for free. Order: a new schedule's state on disk and its
    whole budget debited (before anything is read), compute in memory, record the
    run in the ledger, write the state and cached release, then the output.
    ``query["unit"]`` names the privacy unit, whose distinct values are the size bbscheduler estimates.
    ``output_digest(table, report)``: the digest of the file a new run's release is written to, for its
    ledger entry (see :func:`dpcli.release.charge`). ``through``: the public moment the snapshot holds data
    through (``--through``), which makes retries, corrections and backfills recognisable (:func:`earlier`).
    """
    key = store.schedule_key(spec.name, query)
    with store.locked(state_dir, analyst, key, lock_timeout) as directory:
        state, fresh = _load_or_start(state_dir, directory, analyst, command, spec, query, key, lock_timeout)
        call = _Call(state_dir, directory, analyst, command, spec.as_in(state["spec"]), state, lock_timeout)
        spec = call.spec
        again = earlier(spec, state, table.fingerprint, through)
        if again is not None:
            return _again(call, again, table.fingerprint, through)
        table.verify_unchanged()  # a file changed since it was hashed: refused before anything is debited
        reserved = _reserve_first(call, fresh)  # before the size test or the run reads a record
        began = _Begun(call, table.fingerprint, through)
        read = (query["unit"], *query.get("by", ()), *([query["value"]] if query.get("value") else []))
        sizes = Sizes(state_dir, state, table, query["unit"], read, began.mark)
        plan = _plan(spec, state, sizes)
        if plan is None:
            began.close()
            return _again(call, Again(len(state["runs"]), "cached"), table.fingerprint, through, current=sizes.asked)
        if plan.epsilon <= 0:
            raise BudgetError(f"schedule {spec.name!r}: the ε for {plan.step} is below 10^-15; the schedule is spent")
        epsilon = plan.epsilon

        def before_run(seed: ReleaseSeed, events: list[PrivacyEvent]) -> None:
            _check_run_cost(events, epsilon)
            began.mark()

        prepared = run(plan.epsilon, state.get("auto"), before_run)
        if "auto" not in state and "auto" in prepared.metadata:
            plan.state["auto"] = chosen_bounds(prepared.metadata["auto"])
        if through is not None:
            plan.fields["through"] = moment_text(through)
        return _record(call, table, prepared, plan, output_digest, reserved)


def _reserve_first(call: _Call, fresh: bool) -> tuple[PrivacyEvent, ...]:
    """Before a schedule's first run reads anything: its state on disk (a crash after is retried with the same
    reservation id), then its whole budget debited (:func:`ledger.reserve`); the events debited now, if any."""
    if call.state["runs"]:
        return ()
    if fresh:
        store.save(call.directory, call.state["key"], call.state)
    reservation = _reservation(call.state, call.spec, call.command)
    debited = ledger.reserve(call.state_dir, call.analyst, reservation, call.lock_timeout)
    return reservation.events if debited else ()


class _Begun:
    """A call's run marked as begun in the ledger (:func:`ledger.start_step`), once, just before its size test
    or its release reads a record: a second input at a step whose run never ended pays the whole schedule's
    cost again, so no timing probe is free. A call answered from the cache closes its mark."""

    def __init__(self, call: _Call, fingerprint: str, through: datetime | None) -> None:
        self._call, self._made = call, False
        self._step = len(call.state["runs"])
        self._digest = ledger.step_digest(bytes.fromhex(call.state["secret"]),
                                          {"begins": fingerprint, "through": moment_text(through) if through else None})

    def mark(self) -> None:
        if self._made:
            return
        c = self._call
        ledger.start_step(c.state_dir, c.analyst, c.state["reservation"], self._step, self._digest, c.label,
                          [reservation_event(c.spec)], c.lock_timeout)
        self._made = True

    def close(self) -> None:
        if self._made:
            c = self._call
            ledger.close_start(c.state_dir, c.analyst, c.state["reservation"], self._step, self._digest,
                               c.lock_timeout)


def _check_run_cost(events: list[PrivacyEvent], epsilon: Fraction) -> None:
    """A schedule's run must be a pure release of at most its ε (checked from its plan, before it reads)."""
    if any(e.kind != "pure" for e in events) or sum(e.epsilon for e in events) > epsilon:
        raise UsageError("a schedule's runs must be pure ε-DP releases (histogram --keys, topk --domain)")


def chosen_bounds(auto: dict[str, Any]) -> dict[str, Any]:
    """What a schedule keeps of the ``auto`` bounds its first run chose (its metadata's ``"auto"``): the chosen
    values, released like the rest of that run, without the budget of the choice. Every later run gives them
    as its bounds (issue 33: a schedule chooses once, from its first run's ε, and keeps its choice)."""
    return {k: v for k, v in auto.items() if k in ("max_partitions", "max_contributions", "bounds")}


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


def _steps(state: dict[str, Any]) -> list[dict[str, Any]]:
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
    steps = _steps(state)
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


def _record(call: _Call, table: InputTable, prepared: Prepared, plan: Plan,
            output_digest: OutputDigest | None = None, reserved: tuple[PrivacyEvent, ...] = ()) -> Release:
    """Record a new run in the ledger as a step of the reservation (``reserved``: debited by this call, before
    it read), then save the state and output."""
    spec, state = call.spec, call.state
    runs: list[dict[str, Any]] = state["runs"]
    seed = prepared.seed
    record = ledger.Step(
        reservation=state["reservation"],
        start=len(runs),
        # the run's seed too: an older copy of the state recomputing this run is free only if it
        # draws the same noise (same dpcli noise, polars and bounding versions), else it is refused
        digest=ledger.step_digest(bytes.fromhex(state["secret"]), {"input": table.fingerprint, "seed": seed.id}),
        label=call.label,
        create=_reservation(state, spec, call.command) if not runs else None,
    )
    entry = {
        **step_fields(spec, plan.step),
        **plan.fields,
        "fingerprint": table.fingerprint,
        "epsilon": fraction_text(plan.epsilon),
        "seed_id": seed.id,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "metadata": prepared.metadata,
    }
    table.verify_unchanged()  # the run read the bytes it hashed (else exit 66: no run recorded or saved)
    runs.append(entry)  # in memory; saved once the ledger has recorded the run
    state.update(plan.state)
    label = _label(spec, state, entry, cached=False)
    labelled = Prepared(seed, prepared.events, Result(prepared.table, {**prepared.metadata, "schedule": label}))
    through = f" through {entry['through']}" if "through" in entry else ""
    line = (f"{call.command}: {_where(spec, state, entry)} of schedule {spec.name!r}{through} "
            f"(ε = {parameter_text(plan.epsilon, 'up')}){_auto_text(prepared.metadata.get('auto'))}")
    digest = output_digest(labelled.table, labelled.metadata) if output_digest is not None else None
    return charge(LedgerRef(call.state_dir, call.analyst, call.lock_timeout), call.command, labelled, line,
                  step=record, before_output=lambda: store.save(call.directory, state["key"], state, prepared.table),
                  output_digest=digest, reserved=reserved)


def _auto_text(auto: dict[str, Any] | None) -> str:
    """A run's line names its ``auto`` bounds: chosen now (the first run), or kept from the first run."""
    text = chosen_text(auto)
    return f"{text} (kept from its first run)" if text and auto and auto.get("kept") else text


def _again(call: _Call, again: Again, fingerprint: str, through: datetime | None, current: bool = False) -> Release:
    """Run ``again.run``'s release once more, free, after checking the ledger recorded that run (with its input);
    with ``current`` (a crossing test said "not yet") the state must also be the newest the ledger knows: an
    older copy would answer from a test that has since passed. A call not answered before (a new input, or a
    new ``--through``) is added to the state's answers first, so that its retry gets the same release."""
    spec, state = call.spec, call.state
    run = state["runs"][again.run - 1]
    digest = ledger.step_digest(bytes.fromhex(state["secret"]), {"input": run["fingerprint"], "seed": run["seed_id"]})
    ledger.check_recorded(call.state_dir, call.analyst, state["reservation"], again.run, digest, call.label,
                          call.lock_timeout, current=current)
    cached = store.cached_release(call.directory, state["key"], again.run)
    moment = moment_text(through) if through is not None else None
    if not any(s["fingerprint"] == fingerprint and s.get("through") == moment for s in _steps(state)):
        answer = {"fingerprint": fingerprint, "run": again.run, **({"through": moment} if moment else {})}
        state.setdefault("answers", []).append(answer)
        store.save(call.directory, state["key"], state)
    label = _label(spec, state, run, cached=True)
    if again.kind == "replay":
        label["replay_of_run"] = again.run
    elif again.kind == "in force":
        label.update({"in_force_through": moment, "made_through": run.get("through")})
    report = {**run["metadata"], "schedule": label, "charged": False, "seed_id": run["seed_id"]}
    where = _where(spec, state, run)
    summary = {"replay": f"the release of {where} again, for the same input (free)",
               "cached": f"cached release of {where} (free)",
               "in force": f"the release in force through {moment}: {where} (free)"}[again.kind]
    return Release(cached, report, f"{call.command}: {summary}")


def _load_or_start(
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

    A bbscheduler's noisy start and γ are added by its first run (:func:`_first_epoch`)."""
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


def _reservation(state: dict[str, Any], spec: ScheduleSpec, command: str) -> ledger.Reservation:
    """The whole schedule's debit, made with its first run."""
    return ledger.Reservation(
        id=state["reservation"], kind="schedule", key=state["key"], ledger_id=state["ledger_id"],
        events=(reservation_event(spec),),
        command=f"{command} --schedule",
        summary=f"schedule {spec.name!r} ({spec.scheduler}) reserves its whole budget",
    )


def _plan(spec: ScheduleSpec, state: dict[str, Any], sizes: Sizes) -> Plan | None:
    """None to return the cached release (no new epoch); else the new run (a new input: :func:`earlier` first)."""
    runs = state["runs"]
    if spec.scheduler == "bbscheduler":
        return _bbscheduler_plan(spec, state, sizes)
    if spec.scheduler == "bbimprover":  # t = k, the number of this run (a schedule made with rows goes on so)
        k = len(runs) + 1
        return Plan(k, sch.bbimprover_epsilon(k, spec.total_epsilon, float(spec.total_delta), spec.c))
    spent = sum((Fraction(r["epsilon"]) for r in runs), Fraction(0))
    assert spec.run_epsilon is not None
    if spent + spec.run_epsilon > spec.total_epsilon:
        raise BudgetError(f"schedule {spec.name!r} (fixed) has spent {fraction_text(spent)} of "
                          f"{fraction_text(spec.total_epsilon)}: no more runs")
    return Plan(len(runs), spec.run_epsilon)


def _bbscheduler_plan(spec: ScheduleSpec, state: dict[str, Any], sizes: Sizes) -> Plan | None:
    """Epoch 0 at the first run; later, a new epoch only when the open crossing test passes on this snapshot."""
    if not state["runs"]:
        return _first_epoch(spec, sizes)
    if state.get("sizes") != NOISY_SIZES:
        raise StateError(f"schedule {spec.name!r} was made by an older dpcli, whose epochs came from exact row "
                         "counts; it can only return its last release: start a new --schedule name")
    test = state.get("crossing")
    if test is None:
        raise BudgetError(f"schedule {spec.name!r} has no budget left for a new epoch; start a new --schedule name")
    k, eps, start, gamma = test["epoch"], Fraction(test["epsilon"]), state["n0_noisy"], Fraction(state["gamma"])
    threshold = sch.epoch_threshold(k, start, gamma)
    if not sch.crossed(sizes.stream.child(f"crossed/{k}"), sizes.units, threshold, test["noise"], eps):
        return None
    estimate = sch.crossing_count(sizes.stream.child(f"count/{k}"), sizes.units, eps)
    epoch = max(k, sch.epoch_of(max(estimate, start), start, gamma))
    return _epoch_plan(spec, epoch, estimate, gamma, start, sizes, Fraction(0))


def _first_epoch(spec: ScheduleSpec, sizes: Sizes) -> Plan:
    """Epoch 0: the noisy start ñ (ε/50) and γ from it (Algorithm 1 with the releases' ε), unless given."""
    total = spec.total_epsilon
    start = sch.noisy_start(sizes.stream.child("start"), sizes.units, total)
    gamma = spec.gamma or sch.default_gamma(float(sch.release_total(total)), start, float(spec.total_delta), spec.beta)
    plan = _epoch_plan(spec, 0, start, gamma, start, sizes, sch.start_epsilon(total))
    plan.state.update({"sizes": NOISY_SIZES, "n0_noisy": start, "gamma": fraction_text(gamma)})
    return plan


def _epoch_plan(
    spec: ScheduleSpec, epoch: int, estimate: int, gamma: Fraction, start: int, sizes: Sizes, paid: Fraction,
) -> Plan:
    """Epoch ``epoch``'s release (ε_i of the releases' share) and the crossing test of the next epoch it opens.

    The run records the size ε it commits: ``paid`` (the start estimate at epoch 0) plus the new test's."""
    eps = sch.bbscheduler_epsilon(epoch, gamma, sch.release_total(spec.total_epsilon), float(spec.total_delta))
    nxt = epoch + 1
    eps_next = sch.crossing_epsilon(nxt, gamma, spec.total_epsilon)
    test = None
    if eps_next >= sch.MIN_TEST_EPSILON:
        noise = sch.threshold_noise(sizes.stream.child(f"threshold/{nxt}"), eps_next)
        test = {"epoch": nxt, "epsilon": fraction_text(eps_next), "noise": noise}
        paid += eps_next
    return Plan(epoch, eps, {"units_noisy": estimate, "size_epsilon": fraction_text(paid)}, {"crossing": test})


def step_fields(spec: ScheduleSpec, step: Any) -> dict[str, Any]:
    if spec.scheduler == "bbscheduler":
        return {"epoch": step}
    return {"run": step}


def _where(spec: ScheduleSpec, state: dict[str, Any], run: dict[str, Any]) -> str:
    if spec.scheduler == "bbscheduler":
        return f"epoch {run['epoch']}"
    return f"run {_number(state, run)}"


def _number(state: dict[str, Any], run: dict[str, Any]) -> int:
    """The run's number in its schedule (1, 2, …)."""
    return next(i for i, r in enumerate(state["runs"], 1) if r is run)


def _spent(runs: list[dict[str, Any]]) -> tuple[Fraction, Fraction]:
    """(ε of the releases, ε committed to size estimates) of a schedule's runs so far."""
    releases = sum((Fraction(r["epsilon"]) for r in runs), Fraction(0))
    return releases, sum((Fraction(r.get("size_epsilon", 0)) for r in runs), Fraction(0))


def _label(spec: ScheduleSpec, state: dict[str, Any], run: dict[str, Any], cached: bool) -> sch.ScheduleLabel:
    """The ``schedule`` part of a run's summary: public parameters and noisy estimates only."""
    releases, sizes = _spent(state["runs"])
    label: sch.ScheduleLabel = {
        "name": spec.name,
        "scheduler": spec.scheduler,
        "cached": cached,
        "run_epsilon": run["epsilon"],
        "runs": len(state["runs"]),
        "epsilon_spent": fraction_text(releases + sizes),
        "epsilon_reserved": fraction_text(spec.total_epsilon),
    }
    if spec.scheduler == "bbscheduler":
        label.update(_bbscheduler_label(spec, state, run, sizes))
    elif spec.scheduler == "bbimprover":
        label.update({"run": _number(state, run), "index": "runs", "c": spec.c})
        if spec.index == "rows":
            label["made_with_index"] = "rows"
    else:
        label["run"] = run["run"]
    return label


def _bbscheduler_label(
    spec: ScheduleSpec, state: dict[str, Any], run: dict[str, Any], sizes: Fraction,
) -> sch.ScheduleLabel:
    """Epoch, γ, the noisy unit count the epoch was decided on, and (α_i, β_i) from the noisy start."""
    label: sch.ScheduleLabel = {"epoch": run["epoch"], "gamma": state["gamma"]}
    if state.get("sizes") != NOISY_SIZES:  # made by an older dpcli: its sizes were exact, none is shown
        return label
    label.update({"units_noisy": run["units_noisy"], "size_epsilon_spent": fraction_text(sizes)})
    alpha, beta_i = sch.bbscheduler_accuracy(
        run["epoch"], Fraction(run["epsilon"]), Fraction(state["gamma"]), state["n0_noisy"], spec.beta
    )
    label.update({"alpha": alpha, "beta": beta_i})
    return label


def scheduled_run(task: SchedulableTask[P], epsilon: Fraction, kept: dict[str, Any] | None) -> SchedulableTask[P]:
    """The task of one run of a schedule: at the run's ε and, once the schedule's first run has chosen its
    ``auto`` bounds (``kept``, from the schedule's state), at those bounds
    (:meth:`dpcli.tasks.SchedulableTask.keeping`)."""
    run_task = task.at_epsilon(epsilon)
    return run_task if kept is None else run_task.keeping(kept)
