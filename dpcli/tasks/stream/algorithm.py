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
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from dpcli.core import tree
from dpcli.core.arrays import sorted_unique
from dpcli.core.display import utc_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks.stream.batches import KnownKeys, WindowBatches, window_batches
from dpcli.tasks.stream.plan import StreamPlan
from dpcli.tasks.stream.query import MAX_SECONDS, MIN_SECONDS, StreamQuery

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: The release table's columns of moments dpcli computes (naive datetimes in UTC): each row's window and trigger.
#: Text outputs show them as ISO 8601 with ``Z`` (:func:`dpcli.io.outputs.shown`); the key columns keep the data's.
TIME_COLUMNS = ("window_start", "trigger_time")

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
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
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
    """One key's state within a window, as a state file stores it (see :meth:`WindowRun.key_states`).

    Estimates use linearity: a tree's bottom-up Honaker prefix estimate is the
    true prefix sum plus the estimate its noise gives on all-zero leaves (the
    Honaker weights of a node add up to one, so noise-free nodes give exact
    sums). So a key keeps running totals, and per tree only that noise-only
    prefix vector.
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
    pert_noise: tuple[np.ndarray, np.ndarray | None] | None = None  # noise-only prefixes: count, sum


_NONE = -1  # "no trigger" in the integer arrays


def _grow(a: np.ndarray, extra: int, fill: int) -> np.ndarray:
    return np.concatenate([a, np.full(extra, fill, dtype=a.dtype)]) if extra else a


class WindowRun:
    """One event-time window: its keys' rounds, buffers and trees, and the index of predicted releases.

    Every key has a slot; per-key state lives in integer arrays indexed by slot,
    and the trees created at one trigger are the rows of one matrix (their
    noise-only prefixes, drawn in one call). A trigger's work is a few numpy
    operations on its batch's slots plus the keys predicted for it; only
    releases (and keys whose round restarted in this run) take Python per key.
    """

    def __init__(self, start: int, q: StreamQuery, plan: StreamPlan, stream: KeyedStream) -> None:
        self.start = start
        self.q = q
        self.plan = plan
        self.stream = stream.child(f"window/{start}")
        self.fired = 0  # triggers of this window already run
        self.keys = pl.DataFrame(schema=dict.fromkeys(q.keys, pl.Null))  # row i: the key of slot i
        self._key_rows: dict[int, Key] = {}
        i64 = np.zeros(0, dtype=np.int64)
        self.units = i64.copy()  # distinct units of the current round
        self.buffer_count, self.buffer_sum = i64.copy(), i64.copy()
        self.pert_count, self.pert_sum = i64.copy(), i64.copy()
        self.round_start, self.select_row = i64.copy(), i64.copy()  # _NONE: no selection tree
        self.pert_start, self.pert_row = i64.copy(), i64.copy()  # _NONE: no perturbation trees yet
        self.predicted = i64.copy()  # Alg. 4's predicted release trigger, _NONE if none
        self.rounds = i64.copy()
        self.restarted = np.zeros(0, dtype=bool)  # the key's round restarted in this run (see ``_restarted``)
        # trees by the trigger that created them: selection margins (noise-only prefix − μ − τ) and
        # their suffix maxima; perturbation noise-only prefixes of the count and the sum
        self.select: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.pert: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        self.predicted_at: dict[int, list[np.ndarray]] = defaultdict(list)
        # round units: ``_rounds`` (slot, unit) as of the start of this run's batches, plus ``_new_pairs``
        # (first appearances in this run); keys whose round restarted in this run keep theirs in ``_restarted``
        self._rounds = pl.DataFrame(schema={"__id": pl.Int64, "__unit": pl.Null})
        self._new_pairs: pl.DataFrame | None = None
        self._restarted: dict[int, set[Any]] = {}
        self._start_time = naive_utc(start)

    @property
    def size(self) -> int:
        """Keys with a slot in this window."""
        return self.units.size

    def key(self, slot: int) -> Key:
        """The key of a slot (as the input's values)."""
        if slot not in self._key_rows:
            self._key_rows[slot] = self.keys.row(slot)
        return self._key_rows[slot]

    # -- slots and round units -----------------------------------------------------------------
    def known(self) -> KnownKeys:
        """The keys and round units the next run's batches are computed against (settles the rounds)."""
        self._settle_rounds()
        return KnownKeys(self.keys, self._rounds)

    def _settle_rounds(self) -> None:
        """Fold this run's first appearances and restarted rounds into ``_rounds``."""
        if self._new_pairs is None and not self._restarted:
            return
        # one unit type (the input's): a restored state's units have the types JSON gives back, which
        # polars may not combine with the input's (time zones)
        dtype = (self._new_pairs if self._new_pairs is not None else self._rounds).schema["__unit"]
        parts = [self._rounds.cast({"__unit": dtype})] + ([self._new_pairs] if self._new_pairs is not None else [])
        rounds = pl.concat(parts, how="vertical_relaxed")
        if self._restarted:
            restarted = list(self._restarted)
            slots = [slot for slot, users in self._restarted.items() for _ in users]
            units = [u for users in self._restarted.values() for u in users]
            again = pl.DataFrame({"__id": pl.Series(slots, dtype=pl.Int64), "__unit": units}).cast({"__unit": dtype})
            rounds = pl.concat([rounds.filter(~pl.col("__id").is_in(restarted)), again], how="vertical_relaxed")
        self._rounds, self._new_pairs, self._restarted = rounds, None, {}
        self.restarted[:] = False

    def add_batches(self, b: WindowBatches) -> None:
        """Give the batches' new keys their slots."""
        extra = b.new_keys.height
        if extra:
            self.keys = pl.concat([self.keys.cast(b.new_keys.schema), b.new_keys]) if self.keys.height else b.new_keys
            for name in ("units", "buffer_count", "buffer_sum", "pert_count", "pert_sum", "rounds"):
                setattr(self, name, _grow(getattr(self, name), extra, 0))
            for name in ("round_start", "select_row", "pert_start", "pert_row", "predicted"):
                setattr(self, name, _grow(getattr(self, name), extra, _NONE))
            self.restarted = np.concatenate([self.restarted, np.zeros(extra, dtype=bool)])
        self._new_pairs = b.new_pairs

    # -- noise: every tree created at trigger t is drawn in one call from the window's stream for t --
    def _new_selection_trees(self, slots: np.ndarray, t: int) -> None:
        n = self.q.triggers - t + 1
        noise = tree.noise_prefixes(self.stream.child(f"select/{t}"), self.plan.sigma2_select, slots.size, n)
        margins = noise - self.q.mu - self.plan.selection_threshold(n, self.q.triggers)
        self.select[t] = (margins, np.maximum.accumulate(margins[:, ::-1], axis=1)[:, ::-1])
        self.round_start[slots] = t
        self.select_row[slots] = np.arange(slots.size)

    def _new_perturbation_trees(self, slots: np.ndarray, t: int) -> None:
        n = self.q.triggers - t + 1
        counts = tree.noise_prefixes(self.stream.child(f"pert-count/{t}"), self.plan.sigma2_count, slots.size, n)
        sums = None
        if self.q.value is not None:
            assert self.plan.sigma2_sum is not None  # planned with the value column
            sums = tree.noise_prefixes(self.stream.child(f"pert-sum/{t}"), self.plan.sigma2_sum, slots.size, n)
        self.pert[t] = (counts, sums)
        self.pert_start[slots] = t
        self.pert_row[slots] = np.arange(slots.size)

    # -- Alg. 2-4 ------------------------------------------------------------------------------
    def _check_selection(self, slots: np.ndarray, t: int) -> np.ndarray:
        """Alg. 2 at trigger t for keys with a selection tree: is the noisy distinct-unit prefix above
        μ + τ? For the others, Alg. 4: the first future trigger that would release with no new data."""
        selected = np.zeros(slots.size, dtype=bool)
        starts = self.round_start[slots]
        for start in sorted_unique(starts):
            part = starts == start
            g, units = slots[part], self.units[slots[part]]
            margins, best = self.select[int(start)]
            rows, i = self.select_row[g], t - int(start)
            hit = units + margins[rows, i] > 0  # the selection tree's true prefix plus its noise-only estimate
            selected[part] = hit
            g, rows, units = g[~hit], rows[~hit], units[~hit]
            self.predicted[g] = _NONE
            if i + 1 < margins.shape[1] and g.size:
                future = best[rows, i + 1] > -units  # suffix maxima: most keys have no future release
                g, rows, units = g[future], rows[future], units[future]
                if g.size:
                    when = t + 1 + np.argmax(margins[rows, i + 1:] > -units[:, None], axis=1)
                    self.predicted[g] = when
                    for p in sorted_unique(when):
                        self.predicted_at[int(p)].append(g[when == p])
        return selected

    def _release(self, slot: int, t: int) -> tuple[Any, ...]:
        """Alg. 3: move the buffer into leaf t of the perturbation trees, emit their prefix estimates, restart."""
        start = int(self.pert_start[slot])
        noise_count, noise_sum = self.pert[start]
        row_index, i = int(self.pert_row[slot]), t - start
        self.pert_count[slot] += self.buffer_count[slot]
        row: list[Any] = [self._start_time, t, self._start_time + timedelta(seconds=t * self.q.step), *self.key(slot),
                          round(int(self.pert_count[slot]) + float(noise_count[row_index, i]))]
        if noise_sum is not None:
            grid = self.q.grid
            assert grid is not None  # a sum tree exists only with --value and --clamp
            self.pert_sum[slot] += self.buffer_sum[slot]
            row.append(round(int(self.pert_sum[slot]) + float(noise_sum[row_index, i])) * float(grid.granularity))
        self.buffer_count[slot] = self.buffer_sum[slot] = 0
        self.units[slot] = 0
        self._restarted[slot] = set()
        self.restarted[slot] = True
        self.round_start[slot] = self.select_row[slot] = self.predicted[slot] = _NONE
        self.rounds[slot] += 1
        return tuple(row)

    def _feed(self, b: WindowBatches, t: int) -> np.ndarray:
        """Add trigger t's micro-batch to its keys' buffers and rounds; start the trees of keys whose
        round has just passed μ units. Returns the batch's slots (in batch order)."""
        lo, hi = b.span(t)
        slots = b.ids[lo:hi]
        if not slots.size:
            return slots
        self.buffer_count[slots] += b.n[lo:hi]
        if b.s is not None:
            self.buffer_sum[slots] += b.s[lo:hi]
        restarted = self.restarted[slots]
        self.units[slots[~restarted]] += b.new_units[lo:hi][~restarted]
        if restarted.any():
            for slot, users in b.units_of(t, slots[restarted]).items():
                self._restarted[slot].update(users)
                self.units[slot] = len(self._restarted[slot])
        new = slots[(self.round_start[slots] == _NONE) & (self.units[slots] > self.q.mu)]  # S(t) gains them
        if new.size:
            self._new_selection_trees(new, t)
        return slots

    def fire(self, t: int, batches: WindowBatches | None) -> list[tuple[Any, ...]]:
        """Run trigger t on its micro-batch: the rows released.

        Checks only the batch's keys that have a selection tree plus the keys
        whose predicted release is t (no count of them is kept: it depends on the data).
        """
        if t != self.fired + 1:
            raise ValueError(f"window {self.start}: trigger {t} out of order (last {self.fired})")
        self.fired = t
        slots = self._feed(batches, t) if batches is not None else np.zeros(0, dtype=np.int64)
        evaluate = slots[self.round_start[slots] != _NONE]
        released = evaluate[self._check_selection(evaluate, t)].tolist()
        due = self.predicted_at.pop(t, None)
        if due:  # predictions made for t; outdated ones (re-evaluated or released since) are skipped
            cand = sorted_unique(np.concatenate(due))
            cand = cand[(self.predicted[cand] == t) & ~np.isin(cand, slots)]
            released += sorted(cand.tolist(), key=lambda s: key_label(self.key(s)))
        first = [s for s in released if self.pert_start[s] == _NONE]
        if first:
            self._new_perturbation_trees(np.asarray(first, dtype=np.int64), t)
        return [self._release(s, t) for s in released]

    # -- the persisted form ----------------------------------------------------------------------
    def key_states(self) -> dict[Key, KeyState]:
        """Every key's state, as a state file stores it."""
        self._settle_rounds()
        users: dict[int, list[Any]] = {}
        if self._rounds.height:
            grouped = self._rounds.group_by("__id").agg(pl.col("__unit"))
            users = dict(zip(grouped["__id"].to_list(), grouped["__unit"].to_list(), strict=True))
        out: dict[Key, KeyState] = {}
        for slot, key in enumerate(self.keys.rows()):
            rs, ps, p = int(self.round_start[slot]), int(self.pert_start[slot]), int(self.predicted[slot])
            pert = None
            if ps != _NONE:
                counts, sums = self.pert[ps]
                row = int(self.pert_row[slot])
                pert = (counts[row], None if sums is None else sums[row])
            out[key] = KeyState(
                round_users=set(users.get(slot, ())), round_start=None if rs == _NONE else rs,
                buffer_count=int(self.buffer_count[slot]), buffer_sum=int(self.buffer_sum[slot]),
                pert_start=None if ps == _NONE else ps, pert_count=int(self.pert_count[slot]),
                pert_sum=int(self.pert_sum[slot]), predicted=None if p == _NONE else p,
                rounds=int(self.rounds[slot]),
                select_margin=None if rs == _NONE else self.select[rs][0][int(self.select_row[slot])], pert_noise=pert)
        return out

    @classmethod
    def restore(cls, start: int, fired: int, states: dict[Key, KeyState], q: StreamQuery, plan: StreamPlan,
                stream: KeyedStream) -> WindowRun:
        """The window a state file holds (``states`` as :meth:`key_states` gave them)."""
        run = cls(start, q, plan, stream)
        run.fired = fired
        keys = list(states)
        if not keys:
            return run
        # every row decides the types (a key column null in the first 100 keys is not a Null column)
        run.keys = pl.DataFrame(keys, schema=list(q.keys), orient="row", infer_schema_length=None)
        sts = list(states.values())
        run._restore_slots(sts)
        run._restore_selection_trees(sts)
        run._restore_perturbation_trees(sts)
        for p in sorted_unique(run.predicted[run.predicted != _NONE]).tolist():
            run.predicted_at[p].append(np.flatnonzero(run.predicted == p))
        rows = [(slot, u) for slot, st in enumerate(sts) for u in st.round_users]
        if rows:
            run._rounds = pl.DataFrame({"__id": [r[0] for r in rows], "__unit": [r[1] for r in rows]},
                                       schema_overrides={"__id": pl.Int64})
        return run

    def _restore_slots(self, sts: list[KeyState]) -> None:
        """The per-slot arrays from the keys' states, slot i holding key i."""
        m = len(sts)
        for name in ("buffer_count", "buffer_sum", "pert_count", "pert_sum", "rounds"):
            setattr(self, name, np.fromiter((getattr(st, name) for st in sts), dtype=np.int64, count=m))
        self.units = np.fromiter((len(st.round_users) for st in sts), dtype=np.int64, count=m)
        for name in ("round_start", "pert_start", "predicted"):
            setattr(self, name, np.fromiter((_NONE if getattr(st, name) is None else getattr(st, name) for st in sts),
                                            dtype=np.int64, count=m))
        self.restarted = np.zeros(m, dtype=bool)
        self.select_row = np.full(m, _NONE, dtype=np.int64)
        self.pert_row = np.full(m, _NONE, dtype=np.int64)

    def _restore_selection_trees(self, sts: list[KeyState]) -> None:
        """One matrix of selection margins (and their suffix maxima) per trigger that started trees."""
        for start_t in sorted_unique(self.round_start[self.round_start != _NONE]).tolist():
            slots = np.flatnonzero(self.round_start == start_t)
            margins = np.stack([_select_margin(sts[s]) for s in slots])
            self.select[start_t] = (margins, np.maximum.accumulate(margins[:, ::-1], axis=1)[:, ::-1])
            self.select_row[slots] = np.arange(slots.size)

    def _restore_perturbation_trees(self, sts: list[KeyState]) -> None:
        """One matrix of perturbation noise prefixes (count, and sum) per trigger that started trees."""
        for start_t in sorted_unique(self.pert_start[self.pert_start != _NONE]).tolist():
            slots = np.flatnonzero(self.pert_start == start_t)
            noise = [_pert_noise(sts[s]) for s in slots]
            counts = np.stack([c for c, _ in noise])
            sums = None if noise[0][1] is None else np.stack([_sum_noise(sm) for _, sm in noise])
            self.pert[start_t] = (counts, sums)
            self.pert_row[slots] = np.arange(slots.size)


def _select_margin(st: KeyState) -> np.ndarray:
    assert st.select_margin is not None  # a key with a selection round stores its tree's margins
    return st.select_margin


def _pert_noise(st: KeyState) -> tuple[np.ndarray, np.ndarray | None]:
    assert st.pert_noise is not None  # a key with perturbation trees stores their noise
    return st.pert_noise


def _sum_noise(sums: np.ndarray | None) -> np.ndarray:
    assert sums is not None  # with a value column every key has a sum tree
    return sums


class StreamState:
    """Everything a stream needs between micro-batches: per-unit record counts, open windows, watermark.

    ``watermark`` is the global index (trigger end time / trigger length) of the
    last trigger run, the public ``through`` of the last run; later runs drop
    events at or before it (late events). ``kept``: events fed to the stream whose
    trigger has not run yet (:func:`dpcli.tasks.stream.run.advance_stream` with ``keep``),
    each unit's first C − used of them, in the columns of
    :func:`dpcli.tasks.stream.events.record_columns`.
    """

    def __init__(self, q: StreamQuery, plan: StreamPlan, seed: bytes, track_units: bool = True) -> None:
        self.q, self.plan, self.seed = q, plan, seed
        self.stream = KeyedStream(seed, "stream-replay")
        self.track_units = track_units
        self.used: dict[Any, int] = {}
        self.windows: dict[int, WindowRun] = {}
        self.watermark: int | None = None  # no trigger run yet
        self.kept: pl.DataFrame | None = None  # events of triggers not yet run (None: none kept)

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
            raise UsageError(f"the state has already run the triggers up to {utc_text(self.time_of(self.watermark))}")

    def advance(self, events: pl.DataFrame, through: int) -> list[tuple[Any, ...]]:
        """Run every trigger after the watermark up to global trigger ``through`` on ``events``.

        ``events`` come from :func:`dpcli.tasks.stream.events.prepare_events`
        with the same bounds (no event after ``through`` or at or before the
        watermark). Returns the release rows, window by window, trigger by trigger.
        """
        self.check_through(through)
        batches = {}
        if events.height:
            known = {start: run.known() for start, run in self.windows.items()}
            batches = window_batches(events, list(self.q.keys), self.q.value is not None, known)
        rows: list[tuple[Any, ...]] = []
        for start in sorted(set(self.windows) | set(batches)):
            rows.extend(self._advance_window(start, batches.get(start), through))
        if self.track_units and events.height:
            counts = events.group_by("__unit").len()
            for unit, n in zip(counts["__unit"].to_list(), counts["len"].to_list(), strict=True):
                self.used[unit] = self.used.get(unit, 0) + n
        self.watermark = through
        return rows

    def _advance_window(self, start: int, b: WindowBatches | None, through: int) -> list[tuple[Any, ...]]:
        """Run one window's triggers up to ``through`` on its batches; a window whose triggers have
        all run is closed."""
        run = self.windows.get(start) or WindowRun(start, self.q, self.plan, self.stream)
        if b is not None:
            run.add_batches(b)
        last_t = min(self.q.triggers, through - start // self.step)
        rows: list[tuple[Any, ...]] = []
        for t in range(run.fired + 1, last_t + 1):
            rows.extend(run.fire(t, b))
        if run.fired >= self.q.triggers:
            self.windows.pop(start, None)
        else:
            self.windows[start] = run
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
