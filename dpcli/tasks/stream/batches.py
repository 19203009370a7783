"""A run's bounded events as micro-batch arrays: dense key ids per window, per-trigger totals, new units.

:class:`~dpcli.tasks.stream.algorithm.WindowRun` keeps one slot per key of its
window; this module gives every key of a run's events its slot (keys already
known keep theirs, new keys get the next ones, in key order) and turns the
events into arrays, batch by batch, in the order the algorithm reads them:
trigger, then key order (the order of ``sort(keys, nulls_last=True)``).

Distinct units per selection round are counted without Python sets: a unit
counts for a key at the first trigger of this run where it appears with the
key, unless it is already in the key's round (``rounds``). Keys whose round
restarts during the run (a release) are then counted from their batches'
units directly (:meth:`WindowBatches.units_of`). Units are compared as polars
compares values (``group_by``/joins).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

W, T, ID, UNIT = "__window", "__trigger", "__id", "__unit"


@dataclass(frozen=True)
class KnownKeys:
    """What a window already holds: its keys in slot order and its keys' current round units."""

    keys: pl.DataFrame  # the key columns, row i = slot i
    rounds: pl.DataFrame  # (__id, __unit): each key's distinct units in its current selection round


@dataclass
class WindowBatches:
    """One window's micro-batches of this run, as arrays in batch order (trigger, then key order)."""

    triggers: np.ndarray  # the batch row's trigger (sorted)
    ids: np.ndarray  # its key's slot
    n: np.ndarray  # records
    s: np.ndarray | None  # value sum in grid units (with a value column)
    new_units: np.ndarray  # units not in the key's round, first seen with it at this trigger in this run
    new_keys: pl.DataFrame  # keys given the next slots, in slot order
    new_pairs: pl.DataFrame  # (__id, __unit) of those first appearances (they join the rounds)
    events: pl.LazyFrame | pl.DataFrame  # (__trigger, __id, __unit): units of keys whose round restarts

    def span(self, t: int) -> tuple[int, int]:
        """The rows of trigger t's batch."""
        lo, hi = np.searchsorted(self.triggers, [t, t + 1])
        return int(lo), int(hi)

    def units_of(self, t: int, ids: np.ndarray) -> dict[int, list[Any]]:
        """The units of trigger t's records of the keys ``ids`` (called for restarted rounds only)."""
        if isinstance(self.events, pl.LazyFrame):  # collected when a round first restarts
            self.events = self.events.sort(T).collect()
        lo, hi = np.searchsorted(self.events[T].to_numpy(), [t, t + 1])
        part = self.events.slice(int(lo), int(hi - lo)).filter(pl.col(ID).is_in(ids.tolist()))
        grouped = part.group_by(ID).agg(pl.col(UNIT))
        return dict(zip(grouped[ID].to_list(), grouped[UNIT].to_list(), strict=True))


def _first_appearances(triggers: np.ndarray, ids: np.ndarray, first_t: np.ndarray, pair_ids: np.ndarray) -> np.ndarray:
    """Per batch row (trigger, slot): how many (slot, unit) pairs first appear then."""
    codes, counts = np.unique((first_t.astype(np.int64) << 32) | pair_ids, return_counts=True)
    rows = (triggers.astype(np.int64) << 32) | ids
    at = np.minimum(np.searchsorted(codes, rows), max(codes.size - 1, 0))
    return np.where(codes[at] == rows, counts[at], 0).astype(np.int64) if codes.size else np.zeros(rows.size, np.int64)


def window_batches(events: pl.DataFrame, keys: list[str], value: bool,
                   known: Mapping[int, KnownKeys]) -> dict[int, WindowBatches]:
    """Per window of ``events`` (from :func:`~dpcli.tasks.stream.events.prepare_events`): its batches."""
    ev = events.lazy().select(W, T, *keys, UNIT, *(["__v"] if value else []))
    slots = _slots(ev, pl.Schema({k: events.schema[k] for k in keys}), known)
    ev = ev.join(slots.select(W, *keys, ID, "__order"), on=[W, *keys], how="left", nulls_equal=True)

    aggs = [pl.col("__order").first(), pl.len().alias("n")] + ([pl.col("__v").sum().alias("s")] if value else [])
    batch = ev.group_by(W, T, ID).agg(aggs)
    pairs = _new_pairs(ev, events.schema[UNIT], known)
    new = slots.filter(pl.col("__new")).sort(W, ID).select(W, *keys)
    batch_df, pairs_df, new_df = pl.collect_all([batch.sort(W, T, "__order"), pairs.select(W, ID, UNIT, T), new])
    return _by_window(ev, keys, value, batch_df, pairs_df, new_df)


def _slots(ev: pl.LazyFrame, key_types: pl.Schema, known: Mapping[int, KnownKeys]) -> pl.LazyFrame:
    """Every (window, key) of the events with its slot: known keys keep theirs, new keys take the next
    ones in key order (``__new``). ``__order`` is a key's place in key order among this run's keys, so
    batches sort on one integer column."""
    keys = list(key_types)
    sizes = {w: kk.keys.height for w, kk in known.items()}
    distinct = ev.select(W, *keys).unique()
    held = [kk.keys.cast(key_types).with_row_index(ID).with_columns(pl.col(ID).cast(pl.Int64), pl.lit(w).alias(W))
            for w, kk in known.items() if kk.keys.height]
    if held:
        distinct = distinct.join(pl.concat(held, how="diagonal_relaxed").lazy().select(W, *keys, ID),
                                 on=[W, *keys], how="left", nulls_equal=True)
    else:
        distinct = distinct.with_columns(pl.lit(None, dtype=pl.Int64).alias(ID))
    is_new = pl.col(ID).is_null()
    return (distinct.sort(W, *keys, nulls_last=True)
            .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(W).alias("__order"),
                          (is_new.cast(pl.Int64).cum_sum().over(W) - 1
                           + pl.col(W).replace_strict(sizes, default=0, return_dtype=pl.Int64)).alias("__next"))
            .with_columns(pl.coalesce(ID, "__next").alias(ID), is_new.alias("__new")))


def _new_pairs(ev: pl.LazyFrame, unit_type: pl.DataType, known: Mapping[int, KnownKeys]) -> pl.LazyFrame:
    """(window, slot, unit) with the first trigger of this run where the unit appears with the key,
    for units not already in the key's round."""
    pairs = ev.group_by(W, ID, UNIT).agg(pl.col(T).min())
    rounds = [kk.rounds.with_columns(pl.lit(w).alias(W)) for w, kk in known.items() if kk.rounds.height]
    if rounds:
        held_rounds = pl.concat(rounds, how="diagonal_relaxed").lazy().select(
            W, pl.col(ID).cast(pl.Int64), pl.col(UNIT).cast(unit_type))
        pairs = pairs.join(held_rounds, on=[W, ID, UNIT], how="anti", nulls_equal=True)
    return pairs


def _by_window(ev: pl.LazyFrame, keys: list[str], value: bool, batch_df: pl.DataFrame, pairs_df: pl.DataFrame,
               new_df: pl.DataFrame) -> dict[int, WindowBatches]:
    """The collected batches, first appearances and new keys, split by window into arrays."""
    out: dict[int, WindowBatches] = {}
    new_by_window = new_df.partition_by(W, as_dict=True, include_key=False)
    pairs_by_window = pairs_df.partition_by(W, as_dict=True, include_key=False)
    no_pairs = pairs_df.drop(W).clear()  # a window whose units are all in their keys' rounds already
    for (w,), b in batch_df.partition_by(W, as_dict=True).items():
        nk, pairs_w = new_by_window.get((w,)), pairs_by_window.get((w,), no_pairs)
        triggers, ids = b[T].to_numpy(), b[ID].to_numpy()
        out[int(w)] = WindowBatches(
            triggers=triggers, ids=ids, n=b["n"].to_numpy().astype(np.int64),
            s=b["s"].to_numpy().astype(np.int64) if value else None,
            new_units=_first_appearances(triggers, ids, pairs_w[T].to_numpy(), pairs_w[ID].to_numpy()),
            new_keys=nk if nk is not None else new_df.select(keys).clear(),
            new_pairs=pairs_w.select(ID, UNIT), events=ev.filter(pl.col(W) == w).select(T, ID, UNIT),
        )
    return out
