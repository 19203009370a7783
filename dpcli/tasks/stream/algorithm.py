"""The DP-SQLP algorithm (paper 001): event-time windows, their keys' trees, and the triggers.

Each event-time window of ``window`` seconds has ``triggers`` equally spaced
triggering times; micro-batch t of a window holds its events with time in
[start + (t−1)Δ, start + tΔ). At every trigger the keys released then get the
window's noisy cumulative count (and sum) so far. Per key and window:

* **key selection** (Alg. 2, restart of Sec. 4.4): a round's tree counts the
  round's distinct units per trigger; once the true count exceeds μ the tree
  exists, and the key is released when its prefix estimate exceeds μ + τ(t)
  (τ: the selection threshold). A release empties the key's buffer into the
  perturbation tree and starts a new round, so a unit (≤ C records, at most
  once per key and round) takes part in at most C rounds;
* **hierarchical perturbation** (Alg. 3): one tree per aggregation column whose
  leaf t receives the buffered value released at trigger t; the output is its
  bottom-up Honaker prefix estimate. A unit moves the leaves by at most C·L;
* **empty-key release prediction** (Alg. 4): after a key is evaluated and not
  released, the first future trigger where it would be released with no new
  data is computed once (from the tree's fixed noise) and indexed; triggers
  only ever touch keys in their micro-batch plus keys indexed for them.

All trees a trigger creates draw their node noise in one vectorised call from
the window's keyed stream for that trigger (keys in sorted order), and a key
keeps running totals plus its trees' noise-only prefix estimates (linear, see
:func:`dpcli.core.tree.honaker_prefixes`). Trees start at the trigger where
they are created and span the rest of the window (the same guarantee as
running them from the window's start on zeros).

The triggers a run executes depend only on public inputs: windows are aligned
to the epoch and every trigger up to the public ``through`` runs; a window
without events has no keys and releases nothing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import polars as pl

from dpcli.core import tree
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks.stream.plan import StreamPlan
from dpcli.tasks.stream.query import MAX_SECONDS, MIN_SECONDS, StreamQuery

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

Key = tuple[Any, ...]


def naive_utc(seconds: int) -> datetime:
    """Epoch seconds as a naive UTC datetime (any second of years 1 … 9999)."""
    return (_EPOCH + timedelta(seconds=seconds)).replace(tzinfo=None)


def trigger_through(moment: datetime, step: int) -> int:
    """The global index of the last trigger (of ``step`` seconds) ending at or before ``moment`` (naive: UTC).

    Raises :class:`UsageError` (field ``through``) when that trigger's end is
    not a showable date (before 0001-01-01 or after 9999-12-31 UTC):
    ``moment`` is a public option.
    """
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
    seconds = (aware - _EPOCH) // timedelta(seconds=1)
    g = seconds // step
    if not MIN_SECONDS <= g * step <= MAX_SECONDS:
        raise UsageError(f"{moment.isoformat()} is outside 0001-01-01 … 9999-12-31 (UTC) "
                         "once rounded down to a trigger", field="through")
    return g


def key_label(key: Key) -> str:
    """A key as sortable text (the order predicted releases are emitted in)."""
    return json.dumps(list(key), default=str, separators=(",", ":"))


@dataclass
class KeyState:
    """One key's state within a window.

    Estimates use linearity: a tree's bottom-up Honaker prefix estimate is the
    true prefix sum plus the estimate its noise gives on all-zero leaves (the
    Honaker weights of a node add up to one, so noise-free nodes give exact
    sums). So a key keeps running totals, and per tree only that noise-only
    prefix vector (drawn for all trees created at one trigger in one call).
    """

    round_users: set[Any] = field(default_factory=set)  # distinct units of the current selection round
    round_start: int | None = None  # trigger where the current selection tree starts (None: no tree yet)
    buffer_count: int = 0  # records not yet released
    buffer_sum: int = 0
    pert_start: int | None = None  # trigger where the perturbation trees start
    pert_count: int = 0  # records released so far (the perturbation tree's true prefix)
    pert_sum: int = 0
    predicted: int | None = None  # Alg. 4: trigger of the predicted release with no new data
    rounds: int = 0
    select_margin: np.ndarray | None = None  # noise-only prefix − μ − τ, per leaf of the selection tree
    select_best: np.ndarray | None = None  # its suffix maxima (derived, not saved)
    pert_noise: tuple[np.ndarray, np.ndarray | None] | None = None  # noise-only prefixes: count, sum


class WindowRun:
    """One event-time window: its keys' trees and buffers, and the index of predicted releases."""

    def __init__(self, start: int, q: StreamQuery, plan: StreamPlan, stream: KeyedStream) -> None:
        self.start = start
        self.q = q
        self.plan = plan
        self.stream = stream.child(f"window/{start}")
        self.fired = 0  # triggers of this window already run
        self.states: dict[Key, KeyState] = {}
        self.predicted: dict[int, set[Key]] = defaultdict(set)
        self._start_time = naive_utc(start)

    # -- noise: every tree created at trigger t is drawn in one call from the window's stream for t --
    def _new_selection_trees(self, keys: list[Key], t: int) -> None:
        n = self.q.triggers - t + 1
        noise = tree.noise_prefixes(self.stream.child(f"select/{t}"), self.plan.sigma2_select, len(keys), n)
        margins = noise - self.q.mu - self.plan.selection_threshold(n, self.q.triggers)
        for key, margin in zip(keys, margins, strict=True):
            self.states[key].select_margin = margin

    def _new_perturbation_trees(self, keys: list[Key], t: int) -> None:
        n = self.q.triggers - t + 1
        counts = tree.noise_prefixes(self.stream.child(f"pert-count/{t}"), self.plan.sigma2_count, len(keys), n)
        sums: Any = [None] * len(keys)
        if self.q.value is not None:
            sums = tree.noise_prefixes(self.stream.child(f"pert-sum/{t}"), self.plan.sigma2_sum, len(keys), n)  # type: ignore[arg-type]
        for key, c, sm in zip(keys, counts, sums, strict=True):
            st = self.states[key]
            st.pert_start, st.pert_noise = t, (c, sm)

    # -- Alg. 2-4 ------------------------------------------------------------------------------
    def _selected(self, key: Key, st: KeyState, t: int) -> bool:
        """Alg. 2 at trigger t: is the noisy distinct-unit prefix above μ + τ? If not, Alg. 4's prediction."""
        i = t - st.round_start  # type: ignore[operator]
        margin = st.select_margin
        units = len(st.round_users)  # the selection tree's true prefix
        if units + margin[i] > 0:  # type: ignore[index]
            return True
        if st.select_best is None:  # suffix maxima: most keys have no future release, decided in O(1)
            st.select_best = np.maximum.accumulate(margin[::-1])[::-1]  # type: ignore[index]
        if i + 1 < margin.size and st.select_best[i + 1] > -units:  # type: ignore[union-attr]
            # the first future trigger that would release with no new data
            st.predicted = t + 1 + int(np.argmax(margin[i + 1 :] > -units))  # type: ignore[index]
            self.predicted[st.predicted].add(key)
        else:
            st.predicted = None
        return False

    def _release(self, key: Key, st: KeyState, t: int) -> tuple[Any, ...]:
        """Alg. 3: move the buffer into leaf t of the perturbation trees, emit their prefix estimates, restart."""
        noise_count, noise_sum = st.pert_noise  # type: ignore[misc]
        i = t - st.pert_start  # type: ignore[operator]
        st.pert_count += st.buffer_count
        row: list[Any] = [self._start_time, t, self._start_time + timedelta(seconds=t * self.q.step), *key,
                          int(round(st.pert_count + noise_count[i]))]
        if noise_sum is not None:
            st.pert_sum += st.buffer_sum
            row.append(round(st.pert_sum + noise_sum[i]) * float(self.q.grid.granularity))  # type: ignore[union-attr]
        st.buffer_count = st.buffer_sum = 0
        st.round_users = set()
        st.round_start = st.select_margin = st.select_best = st.predicted = None
        st.rounds += 1
        return tuple(row)

    def _feed(self, batch: pl.DataFrame, t: int) -> tuple[list[Key], list[Key]]:
        """Add trigger t's micro-batch to its keys' buffers and rounds.

        Returns the batch's keys that have a selection tree (in batch order) and
        those whose tree starts now (their round has just passed μ units).
        """
        q = self.q
        evaluate: list[Key] = []
        new_trees: list[Key] = []
        keys = list(zip(*(batch[k].to_list() for k in q.keys)))
        users = batch["units"].to_list()
        ns = batch["n"].to_list()
        sums = batch["s"].to_list() if q.value is not None else None
        for idx, key in enumerate(keys):
            st = self.states.get(key)
            if st is None:
                st = self.states[key] = KeyState()
            st.round_users.update(users[idx])
            st.buffer_count += ns[idx]
            if sums is not None:
                st.buffer_sum += sums[idx]
            if st.round_start is None:
                if len(st.round_users) <= q.mu:
                    continue  # not in S(t): too few units for a tree yet
                st.round_start = t
                new_trees.append(key)
            evaluate.append(key)
        return evaluate, new_trees

    def fire(self, t: int, batch: pl.DataFrame | None) -> list[tuple[Any, ...]]:
        """Run trigger t on its micro-batch (grouped by key): the rows released.

        Evaluates only the batch's keys that have a selection tree plus the keys
        whose predicted release is t (no count of them is kept: it depends on the data).
        """
        if t != self.fired + 1:
            raise ValueError(f"window {self.start}: trigger {t} out of order (last {self.fired})")
        self.fired = t
        evaluate, new_trees = self._feed(batch, t) if batch is not None else ([], [])
        if new_trees:
            self._new_selection_trees(new_trees, t)
        touched = set(evaluate)
        released = [key for key in evaluate if self._selected(key, self.states[key], t)]
        predicted = [key for key in sorted(self.predicted.pop(t, set()), key=key_label)
                     if key not in touched and self.states[key].predicted == t]  # else outdated or re-evaluated
        released += predicted
        first = [key for key in released if self.states[key].pert_start is None]
        if first:
            self._new_perturbation_trees(first, t)
        return [self._release(key, self.states[key], t) for key in released]


def micro_batches(events: pl.DataFrame, q: StreamQuery) -> dict[tuple[int, int], pl.DataFrame]:
    """Per (window, trigger): the micro-batch grouped by key (sorted), with its units, rows and sum."""
    keys = list(q.keys)
    aggs = [pl.col("__unit").alias("units"), pl.len().alias("n")]
    if q.value is not None:
        aggs.append(pl.col("__v").sum().alias("s"))
    return {
        (int(w), int(t)): part.group_by(keys, maintain_order=True).agg(aggs).sort(keys, nulls_last=True)
        for (w, t), part in events.partition_by(["__window", "__trigger"], as_dict=True, maintain_order=True).items()
    }


class StreamState:
    """Everything a stream needs between micro-batches: per-unit record counts, open windows, watermark.

    ``watermark`` is the global index (trigger end time / trigger length) of the
    last trigger run, the public ``through`` of the last run; later runs drop
    events at or before it (late events).
    """

    def __init__(self, q: StreamQuery, plan: StreamPlan, seed: bytes, track_units: bool = True) -> None:
        self.q, self.plan, self.seed = q, plan, seed
        self.stream = KeyedStream(seed, "stream-replay")
        self.track_units = track_units
        self.used: dict[Any, int] = {}
        self.windows: dict[int, WindowRun] = {}
        self.watermark: int | None = None  # no trigger run yet

    @property
    def step(self) -> int:
        return self.q.step

    def time_of(self, g: int) -> datetime:
        """The end time of global trigger g (naive UTC)."""
        return naive_utc(g * self.step)

    def trigger_through(self, moment: datetime) -> int:
        """The last global trigger that ends at or before ``moment`` (naive: UTC); see :func:`trigger_through`."""
        return trigger_through(moment, self.step)

    def check_through(self, through: int) -> None:
        """Refuse to run up to a trigger before the watermark (public: the ``through`` of an earlier run)."""
        if self.watermark is not None and through < self.watermark:
            raise UsageError(f"the state has already run the triggers up to {self.time_of(self.watermark).isoformat()}")

    def advance(self, events: pl.DataFrame, through: int) -> list[tuple[Any, ...]]:
        """Run every trigger after the watermark up to global trigger ``through`` on ``events``.

        ``events`` come from :func:`dpcli.tasks.stream.events.prepare_events`
        with the same bounds (no event after ``through`` or at or before the
        watermark). Returns the release rows, window by window, trigger by trigger.
        """
        self.check_through(through)
        batches = micro_batches(events, self.q) if events.height else {}
        rows: list[tuple[Any, ...]] = []
        for start in sorted(set(self.windows) | {w for w, _ in batches}):
            run = self.windows.get(start) or WindowRun(start, self.q, self.plan, self.stream)
            last_t = min(self.q.triggers, through - start // self.step)
            for t in range(run.fired + 1, last_t + 1):
                rows.extend(run.fire(t, batches.get((start, t))))
            if run.fired >= self.q.triggers:
                self.windows.pop(start, None)
            else:
                self.windows[start] = run
        if self.track_units and events.height:
            counts = events.group_by("__unit").len()
            for unit, n in zip(counts["__unit"].to_list(), counts["len"].to_list(), strict=True):
                self.used[unit] = self.used.get(unit, 0) + n
        self.watermark = through
        return rows

    def release_table(self, rows: list[tuple[Any, ...]], key_schema: dict[str, Any]) -> pl.DataFrame:
        """The release rows as a long-format table (the key columns keep their input types)."""
        schema: dict[str, Any] = {"window_start": pl.Datetime("us"), "trigger": pl.Int64,
                                  "trigger_time": pl.Datetime("us")}
        for k in self.q.keys:
            schema[k] = key_schema[k]
        schema["count"] = pl.Int64
        if self.q.value:
            schema[f"sum_{self.q.value}"] = pl.Float64
        return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
