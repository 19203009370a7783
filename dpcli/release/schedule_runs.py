"""Each scheduler's next run of a ``--schedule`` and how a summary names it (paper 004).

fixed spends its run ε until the total is reached; bbimprover's run k is planned from k alone; bbscheduler opens
a new epoch only when the crossing test passes on noisy counts of distinct privacy units, paid from its
reservation (:class:`Sizes`, whose exact count, :func:`count_units`, is only ever used under noise). A run's
``schedule`` label (:func:`label`) holds public parameters and noisy estimates only. The arithmetic is
:mod:`dpcli.core.schedules`; the call that runs a schedule is :mod:`dpcli.release.schedules`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import polars as pl

from dpcli.core import schedules as sch
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.core.schedules import ScheduleSpec
from dpcli.errors import BudgetError, StateError
from dpcli.frames import collect
from dpcli.io.tables import InputTable
from dpcli.release.seeds import schedule_sizes_seed

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
    they were read) + the schedule's spec)`` (:func:`dpcli.release.seeds.schedule_sizes_seed`):
    the same snapshot gets the same noise within a schedule (asking again reveals nothing new), a
    new snapshot or a new schedule fresh noise."""

    def __init__(self, state_dir: Path, state: dict[str, Any], table: InputTable, unit: str,
                 read: tuple[str, ...] = (), before_read: Callable[[], None] = lambda: None) -> None:
        self._state_dir, self._state, self._table, self._unit, self._read = state_dir, state, table, unit, read
        self._before_read = before_read  # the run's mark in the ledger (``schedules._Begun``), before the count
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
            seed = schedule_sizes_seed(self._state_dir, self._state, self._table)
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


def next_run(spec: ScheduleSpec, state: dict[str, Any], sizes: Sizes) -> Plan | None:
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


def run_name(spec: ScheduleSpec, state: dict[str, Any], run: dict[str, Any]) -> str:
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


def run_label(spec: ScheduleSpec, state: dict[str, Any], run: dict[str, Any], cached: bool) -> sch.ScheduleLabel:
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
