"""Scheduled releases on growing snapshots with one total budget (paper 004), as a library.

The whole schedule's total is debited from the analyst's ledger at its first
run; each later run is recorded in the ledger as covered by that
reservation, and calls that fall inside an epoch already run return the
cached release (post-processing: free). The state is bound to the ledger
(see :func:`run_scheduled`). :mod:`dpcli.core.schedules` holds the
arithmetic; the CLI options are in :mod:`dpcli.cli._schedule`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any

import polars as pl

from dpcli.core import schedules as sch
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.errors import BudgetError, DataError, StateError, UsageError
from dpcli.files import InputTable, collect
from dpcli.release import Prepared, Release, charge
from dpcli.state import ledger
from dpcli.state import schedules as store

#: A run's black box: ε for this run → the release computed at that ε (not yet charged).
RunRelease = Callable[[Fraction], Prepared]


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule's fixed parameters (validated)."""

    name: str
    scheduler: str
    total_epsilon: Fraction
    total_delta: Fraction
    gamma: Fraction | None
    beta: float
    c: float
    run_epsilon: Fraction | None  # fixed only
    index: str = "runs"  # bbimprover: what t counts (runs or rows)
    #: Options left at their defaults, which an existing schedule replaces by its own (c, index).
    defaulted: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        doc = {
            "name": self.name,
            "scheduler": self.scheduler,
            "total_epsilon": fraction_text(self.total_epsilon),
            "total_delta": fraction_text(self.total_delta),
            "gamma": fraction_text(self.gamma) if self.gamma is not None else None,
            "beta": self.beta,
            "c": self.c,
            "run_epsilon": fraction_text(self.run_epsilon) if self.run_epsilon is not None else None,
        }
        if self.scheduler == "bbimprover":
            doc["index"] = self.index
        return doc

    def as_in(self, stored: dict[str, Any]) -> ScheduleSpec:
        """This spec with the defaulted options replaced by an existing schedule's values.

        The migration rule: a schedule keeps the c and index it was made with. A state written
        before the ``runs`` index existed has no ``index``: it counts rows. Options given on the
        command line are kept, and must match the stored ones (else "other settings", exit 2).
        """
        spec = self
        if "c" in self.defaulted and "c" in stored:
            spec = replace(spec, c=float(stored["c"]))
        if "index" in self.defaulted and self.scheduler == "bbimprover" and stored.get("scheduler") == "bbimprover":
            spec = replace(spec, index=stored.get("index", "rows"))
        return spec


def stored_spec(stored: dict[str, Any]) -> dict[str, Any]:
    """A state's spec as :meth:`ScheduleSpec.to_json` writes it today (a pre-0.3 bbimprover counts rows)."""
    if stored.get("scheduler") == "bbimprover" and "index" not in stored:
        return {**stored, "index": "rows"}
    return stored


def snapshot_size(table: InputTable) -> int:
    """Rows in the snapshot (treated as public, as in the paper)."""
    return int(collect(table.frame.select(pl.len()), f"cannot read {table.name}").item())


def run_scheduled(
    state_dir: Path,
    analyst: str,
    command: str,
    spec: ScheduleSpec,
    query: dict[str, Any],
    table: InputTable,
    run: RunRelease,
    lock_timeout: float = 30.0,
) -> Release:
    """One call of a scheduled query: reserve (first call), run a new epoch or return the cached one.

    The schedule's state is bound to the ledger (:class:`ledger.Step`): its
    reservation id is random per creation and every run is recorded with a
    keyed digest of its snapshot, so an older copy of the state, a deleted and
    re-created one or one from another analyst is refused (exit 78), never
    given fresh releases for free. Order: compute in memory, debit or record
    in the ledger, write the state and cached release, then the output.
    """
    size = snapshot_size(table)
    key = store.schedule_key(spec.name, query)
    label = f"schedule {spec.name!r}"
    with store.locked(state_dir, analyst, key, lock_timeout) as directory:
        state, fresh = _load_or_start(state_dir, directory, analyst, command, spec, query, size, key, lock_timeout)
        spec = spec.as_in(state["spec"])
        runs: list[dict[str, Any]] = state["runs"]
        last = runs[-1] if runs else None
        if last is not None and size < last["size"]:
            raise DataError(
                f"snapshot has {size} rows, fewer than the {last['size']} of schedule {spec.name!r}'s last run: "
                "schedules are for growing databases; start a new --schedule name for a replaced dataset"
            )
        step, epsilon = _next_step(spec, state, size, table.fingerprint, last)
        if step is None:
            assert last is not None
            ledger.check_recorded(state_dir, analyst, state["reservation"], len(runs), None, label, lock_timeout)
            cached = store.cached_release(directory, key, len(runs))
            report = {**last["metadata"], "schedule": _label(spec, state, last, cached=True), "charged": False,
                      "seed_id": last["seed_id"]}
            return Release(cached, report, f"{command}: cached release of {_where(spec, last)} (free)")
        if epsilon <= 0:
            raise BudgetError(f"schedule {spec.name!r}: the ε for {step} is below 10^-15; the schedule is spent")
        prepared = run(epsilon)
        seed, events, result, metadata = prepared.seed, prepared.events, prepared.table, prepared.metadata
        if any(e.kind != "pure" for e in events) or sum(e.epsilon for e in events) > epsilon:
            raise UsageError("a schedule's runs must be pure ε-DP releases (histogram --keys, topk --domain)")
        if fresh:  # on disk before its reservation: a crash in between is retried with the same id
            store.save(directory, key, state)
        record = ledger.Step(
            reservation=state["reservation"],
            start=len(runs),
            # the run's seed too: an older copy of the state recomputing this run is free only if it
            # draws the same noise (same dpcli noise, polars and bounding versions), else it is refused
            digest=ledger.step_digest(bytes.fromhex(state["secret"]), {"input": table.fingerprint, "seed": seed.id}),
            label=label,
            create=_reservation(state, spec, command) if not runs else None,
        )
        entry = {
            **step_fields(spec, step),
            "size": size,
            "fingerprint": table.fingerprint,
            "epsilon": fraction_text(epsilon),
            "seed_id": seed.id,
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "metadata": metadata,
        }
        table.verify_unchanged()  # the run read the bytes it hashed (else exit 66: nothing saved or charged)
        runs.append(entry)  # in memory; saved once the ledger has recorded the run
        labelled = Prepared(seed, events, result, {**metadata, "schedule": _label(spec, state, entry, cached=False)})
        return charge(state_dir, analyst, command, labelled,
                      f"{command}: {_where(spec, entry)} of schedule {spec.name!r} (ε = {fraction_text(epsilon)})",
                      lock_timeout=lock_timeout, step=record, before_output=lambda: store.save(directory, key, state, result))


def _load_or_start(
    state_dir: Path, directory: Path, analyst: str, command: str, spec: ScheduleSpec, query: dict[str, Any],
    size: int, key: str, lock_timeout: float,
) -> tuple[dict[str, Any], bool]:
    """The schedule's checked state, or a new one (not yet saved) if the ledger has no reservation for it."""
    label = f"schedule {spec.name!r}"
    state = store.load(directory, key)
    if state is not None:
        _check_state(state, spec.as_in(state["spec"]), analyst, label)
        return state, False
    led = ledger.read_ledger(state_dir, analyst, lock_timeout)
    seq = led.find_reservation("schedule", key)
    if seq is not None:
        raise StateError(
            f"{label} already has reservation #{seq} in this ledger but no state file (deleted?): "
            "restore its state from a backup, or use a new --schedule name"
        )
    return _new_state(analyst, led.ledger_id, command, spec, query, size, key), True


def _check_state(state: dict[str, Any], spec: ScheduleSpec, analyst: str, label: str) -> None:
    """Refuse a state of other settings (exit 2), of another analyst or of an older dpcli (exit 78)."""
    if stored_spec(state["spec"]) != spec.to_json():
        raise UsageError(f"schedule {spec.name!r} already exists with other settings; use a new --schedule name")
    if "reservation" not in state or "secret" not in state:
        raise StateError(f"{label}: state written by an older dpcli (not bound to the ledger); use a new --schedule name")
    if state.get("analyst") != analyst:
        raise StateError(f"{label}: the state file belongs to analyst {state.get('analyst')!r}, not {analyst!r}")


def _new_state(
    analyst: str, ledger_id: str, command: str, spec: ScheduleSpec, query: dict[str, Any], size: int, key: str,
) -> dict[str, Any]:
    """A new schedule's state (not yet saved): a random reservation id and input-digest secret."""
    if size < 1:
        raise DataError("the first snapshot of a schedule is empty")
    gamma = spec.gamma
    if spec.scheduler == "bbscheduler" and gamma is None:
        gamma = sch.default_gamma(float(spec.total_epsilon), size, float(spec.total_delta), spec.beta)
    return {
        "key": key,
        "analyst": analyst,
        "ledger_id": ledger_id,
        "reservation": secrets.token_hex(12),
        "secret": secrets.token_hex(32),
        "command": command,
        "query": query,
        "spec": spec.to_json(),
        "n0": size,
        "gamma": fraction_text(gamma) if gamma is not None else None,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": [],
    }


def _reservation(state: dict[str, Any], spec: ScheduleSpec, command: str) -> ledger.Reservation:
    """The whole schedule's debit, made with its first run."""
    if spec.total_delta:
        ev = PrivacyEvent("approx", f"schedule/{spec.scheduler}", epsilon=spec.total_epsilon, delta=spec.total_delta)
    else:
        ev = PrivacyEvent("pure", f"schedule/{spec.scheduler}", epsilon=spec.total_epsilon)
    return ledger.Reservation(
        id=state["reservation"], kind="schedule", key=state["key"], ledger_id=state["ledger_id"], events=(ev,),
        command=f"{command} --schedule",
        summary=f"schedule {spec.name!r} ({spec.scheduler}) reserves its whole budget",
    )


def _next_step(
    spec: ScheduleSpec, state: dict[str, Any], size: int, fingerprint: str, last: dict[str, Any] | None
) -> tuple[Any, Fraction]:
    """(None, 0) to return the cached release; else (the step id, its ε)."""
    total = spec.total_epsilon
    if spec.scheduler == "bbscheduler":
        gamma = Fraction(state["gamma"])
        epoch = sch.epoch_of(size, state["n0"], gamma)
        if last is not None and epoch == last["epoch"]:
            return None, Fraction(0)
        return epoch, sch.bbscheduler_epsilon(epoch, gamma, total, float(spec.total_delta))
    if last is not None and last["fingerprint"] == fingerprint:
        return None, Fraction(0)
    if spec.scheduler == "bbimprover":
        if spec.index == "rows" and last is not None and size == last["size"]:
            raise DataError(
                f"snapshot changed but still has {size} rows: bbimprover runs once per database size; wait for growth"
            )
        if spec.index == "runs":  # t = k, the number of this run
            k = len(state["runs"]) + 1
            return k, sch.bbimprover_epsilon(k, total, float(spec.total_delta), spec.c)
        return size, sch.bbimprover_epsilon(size, total, float(spec.total_delta), spec.c)
    spent = sum(Fraction(r["epsilon"]) for r in state["runs"])
    assert spec.run_epsilon is not None
    if spent + spec.run_epsilon > total:
        raise BudgetError(
            f"schedule {spec.name!r} (fixed) has spent {fraction_text(spent)} of {fraction_text(total)}: no more runs"
        )
    return len(state["runs"]), spec.run_epsilon


def step_fields(spec: ScheduleSpec, step: Any) -> dict[str, Any]:
    if spec.scheduler == "bbscheduler":
        return {"epoch": step}
    if spec.scheduler == "bbimprover" and spec.index == "rows":
        return {"t": step}
    return {"run": step}


def _where(spec: ScheduleSpec, run: dict[str, Any]) -> str:
    if spec.scheduler == "bbscheduler":
        return f"epoch {run['epoch']} (computed on {run['size']} rows)"
    if spec.scheduler == "bbimprover" and spec.index == "runs":
        return f"run {run['run']} at {run['size']} rows"
    return f"run at {run['size']} rows"


def _label(spec: ScheduleSpec, state: dict[str, Any], run: dict[str, Any], cached: bool) -> dict[str, Any]:
    spent = sum(Fraction(r["epsilon"]) for r in state["runs"])
    label = {
        "name": spec.name,
        "scheduler": spec.scheduler,
        "cached": cached,
        "computed_on_rows": run["size"],
        "run_epsilon": run["epsilon"],
        "runs": len(state["runs"]),
        "epsilon_spent": fraction_text(spent),
        "epsilon_reserved": fraction_text(spec.total_epsilon),
    }
    label.update(step_fields(spec, run.get("epoch", run.get("t", run.get("run")))))
    if state.get("gamma"):
        label["gamma"] = state["gamma"]
    if spec.scheduler == "bbimprover":
        label.update({"index": spec.index, "c": spec.c})
    if spec.scheduler == "bbscheduler":
        alpha, beta_i = sch.bbscheduler_accuracy(
            run["epoch"], Fraction(run["epsilon"]), Fraction(state["gamma"]), state["n0"], spec.beta
        )
        label.update({"alpha": alpha, "beta": beta_i})
    return label
