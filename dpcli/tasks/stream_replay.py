"""Continual DP histograms over a timestamped stream (``dpcli stream-replay``), DP-SQLP (paper 001).

The file is replayed as micro-batches in time order: each event-time window
of ``window`` seconds has ``triggers`` equally spaced triggering times, and
micro-batch t of a window holds its events with time in [start + (t−1)Δ,
start + tΔ). At every trigger the command emits, for the keys released then,
the window's noisy cumulative count (and sum) so far.

Per unit and over the whole stream: at most C records count (later ones are
dropped), values are clamped to [−L, L]. Per key and window:

* **key selection** (Alg. 2, restart of Sec. 4.4): a round's tree counts the
  round's distinct units per trigger; once the true count exceeds μ the tree
  exists, and the key is released when its prefix estimate exceeds μ + τ(t).
  A release empties the key's buffer into the perturbation tree and starts a
  new round, so a unit (≤ C records, at most once per key and round) takes
  part in at most C rounds;
* **hierarchical perturbation** (Alg. 3): one tree per aggregation column whose
  leaf t receives the buffered value released at trigger t; the output is its
  bottom-up Honaker prefix estimate. A unit moves one leaf by at most C·L;
* **empty-key release prediction** (Alg. 4): after a key is evaluated and not
  released, the first future trigger where it would be released with no new
  data is computed once (from the tree's fixed noise) and indexed; triggers
  only ever touch keys in their micro-batch plus keys indexed for them.

Trees start at the trigger where they are created and span the rest of the
window (the same guarantee as running them from the window's start on zeros,
without the noise of the empty prefix).

Accounting (Sec. 4.4, Sec. 5 split): key selection gets ε/2 and 2δ/3, of which
half the δ converts its zCDP to (ε, δ) and half bounds the (e^ε + 1)·C·β
failure term of Theorem 3.1 over C rounds; perturbation gets ε/2 and δ/3
(zCDP → (ε, δ) by the optimal conversion), split equally between count and
sum; the two parts add up (basic composition) to the requested (ε, δ).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

import numpy as np
import polars as pl

from dpcli import bounding
from dpcli.core import accounting as acc
from dpcli.core import tree
from dpcli.core.events import PrivacyEvent, fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import effective_sigma2
from dpcli.errors import DataError, UsageError
from dpcli.tables import InputTable, collect


@dataclass(frozen=True)
class StreamQuery:
    """One stream-replay release (validated by :meth:`validate`)."""

    time: str
    keys: tuple[str, ...]
    unit: str
    window: int  # seconds
    triggers: int
    max_records: int  # C
    epsilon: Fraction
    delta: Fraction
    value: str | None = None
    clamp: float | None = None  # L
    mu: int = 0

    def validate(self) -> None:
        if self.unit in self.keys:
            raise UsageError("the privacy unit cannot also be a --key column")
        if self.window < 1 or self.triggers < 1:
            raise UsageError("--window and the number of triggers must be positive")
        if self.window % self.triggers:
            raise UsageError(f"--window {self.window}s does not split into {self.triggers} equal triggers")
        if self.max_records < 1:
            raise UsageError("--max-records must be ≥ 1")
        if not self.epsilon > 0 or not 0 < self.delta < 1:
            raise UsageError("stream-replay needs --epsilon > 0 and --delta in (0, 1)")
        if (self.value is None) != (self.clamp is None):
            raise UsageError("--value and --clamp go together")
        if self.clamp is not None and not (math.isfinite(self.clamp) and self.clamp > 0):
            raise UsageError("--clamp must be a positive number")
        if self.mu < 0:
            raise UsageError("--mu must be ≥ 0")

    def canonical(self) -> dict[str, Any]:
        return {
            "time": self.time, "keys": list(self.keys), "unit": self.unit, "window": self.window,
            "triggers": self.triggers, "max_records": self.max_records, "epsilon": fraction_text(self.epsilon),
            "delta": fraction_text(self.delta), "value": self.value, "clamp": self.clamp, "mu": self.mu,
        }

    @property
    def grid(self) -> bounding.ValueGrid | None:
        if self.clamp is None:
            return None
        return bounding.ValueGrid(-self.clamp, self.clamp, bounding.default_granularity(-self.clamp, self.clamp, 1 << 10))


@dataclass(frozen=True)
class StreamPlan:
    """Calibration of every tree (decided without the data)."""

    beta: float
    sigma2_select: Fraction
    sigma2_count: Fraction
    sigma2_sum: Fraction | None
    thresholds: dict[int, np.ndarray] = field(default_factory=dict, compare=False, hash=False)
    events: tuple[PrivacyEvent, ...] = ()
    summary: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def tau(self, n: int, horizon: int) -> np.ndarray:
        """Selection thresholds τ(i) of a tree over n leaves (cached)."""
        if n not in self.thresholds:
            self.thresholds[n] = tree.selection_thresholds(float(self.sigma2_select), n, self.beta, horizon)
        return self.thresholds[n]


def _floor(x: float, digits: int = 12) -> Fraction:
    return Fraction(math.floor(x * 10**digits), 10**digits)


def plan_stream(q: StreamQuery) -> StreamPlan:
    """Split (ε, δ) as Sec. 5 and calibrate the trees (Sec. 4.4, App. B)."""
    q.validate()
    eps, delta, c = float(q.epsilon), float(q.delta), q.max_records
    lv = tree.levels(q.triggers)
    eps_k, delta_k = eps / 2, 2 * delta / 3
    eps_m, delta_m = eps / 2, delta / 3
    beta = (delta_k / 2) / ((math.exp(eps_k) + 1) * c)
    rho_k = _floor(acc.rho_for_epsilon(eps_k, delta_k / 2))
    rho_round = rho_k / c
    sigma2_select = effective_sigma2(Fraction(lv) / (2 * rho_round))
    rho_m = _floor(acc.rho_for_epsilon(eps_m, delta_m))
    columns = 2 if q.value else 1
    rho_col = rho_m / columns
    sigma2_count = effective_sigma2(Fraction(c * c * lv) / (2 * rho_col))
    sigma2_sum = None
    grid = q.grid
    if grid is not None:
        l_units = grid.max_abs_units
        sigma2_sum = effective_sigma2(Fraction((c * l_units) ** 2 * lv) / (2 * rho_col))
    events = (PrivacyEvent("approx", "stream-replay/dp-sqlp", epsilon=q.epsilon, delta=q.delta,
                           detail={"C": str(c), "triggers": str(q.triggers)}),)
    summary = {
        "key_selection": {"epsilon": eps_k, "delta": delta_k, "rho_total": float(rho_k), "rounds": c,
                          "beta": beta, "sigma": math.sqrt(float(sigma2_select))},
        "perturbation": {"epsilon": eps_m, "delta": delta_m, "rho_total": float(rho_m),
                         "sigma_count": math.sqrt(float(sigma2_count)),
                         "sigma_sum": math.sqrt(float(sigma2_sum) * float(grid.granularity) ** 2) if grid and sigma2_sum else None},
        "levels": lv,
    }
    return StreamPlan(beta, sigma2_select, sigma2_count, sigma2_sum, {}, events, summary)


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``6h``, ``1d`` → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            value = int(t[:-1]) * units[t[-1]]
        else:
            value = int(t)
    except ValueError:
        raise UsageError(f"cannot read duration {text!r} (use e.g. 90s, 15m, 6h, 1d)") from None
    if value <= 0:
        raise UsageError(f"duration {text!r} must be positive")
    return value


def prepare_events(table: InputTable, q: StreamQuery) -> pl.DataFrame:
    """Events in time order with window, trigger, bounded to C per unit, values in grid units."""
    schema = table.frame.collect_schema()
    dtype = schema[q.time]
    t = pl.col(q.time)
    if dtype == pl.String:
        t = t.str.to_datetime(strict=False)
        seconds = t.dt.epoch("s")
    elif dtype.is_temporal():
        seconds = t.cast(pl.Datetime("us")).dt.epoch("s")
    elif dtype.is_numeric():
        seconds = t.cast(pl.Float64).floor().cast(pl.Int64)
    else:
        raise DataError(f"column {q.time!r} must hold timestamps, but is {dtype}")
    cols = [seconds.alias("__t"), pl.col(q.unit).alias("__unit"), *[pl.col(k) for k in q.keys]]
    grid = q.grid
    if grid is not None and q.value is not None:
        units = (pl.col(q.value).cast(pl.Float64).clip(grid.lo, grid.hi) / float(grid.granularity)).round(0)
        cols.append(units.cast(pl.Int64, strict=False).alias("__v"))
        cols.append(pl.col(q.value).cast(pl.Float64).is_finite().not_().alias("__bad"))
    lf = table.frame.select(cols)
    df = collect(lf, f"cannot read {table.name}")
    if df.height == 0:
        raise DataError(f"{table.name} has no events")
    bad_t = df["__t"].null_count()
    if bad_t:
        raise DataError(f"column {q.time!r} has {bad_t} missing or unparseable timestamp(s) in {table.name}")
    if df["__unit"].null_count():
        raise DataError(f"column {q.unit!r} (the privacy unit) has null values in {table.name}")
    if "__bad" in df.columns:
        if int(df["__bad"].sum()):
            raise DataError(f"column {q.value!r} has non-finite values in {table.name}")
        df = df.drop("__bad").with_columns(pl.col("__v").fill_null(0))
    step = q.window // q.triggers
    df = df.with_row_index("__row").sort(["__t", "__row"])
    df = df.filter(pl.int_range(pl.len()).over("__unit") < q.max_records)  # global bound: first C per unit
    return df.with_columns(
        (pl.col("__t") // q.window * q.window).alias("__window"),
        ((pl.col("__t") % q.window) // step + 1).cast(pl.Int64).alias("__trigger"),
    )


@dataclass
class _KeyState:
    """One key's state within a window."""

    round_users: set[Any] = field(default_factory=set)
    round_start: int | None = None  # trigger where the current selection tree starts
    select_leaves: np.ndarray | None = None
    select_noise: np.ndarray | None = None
    buffer_count: int = 0
    buffer_sum: int = 0
    pert_start: int | None = None
    pert_count: np.ndarray | None = None
    pert_sum: np.ndarray | None = None
    noise_count: np.ndarray | None = None
    noise_sum: np.ndarray | None = None
    predicted: int | None = None
    rounds: int = 0


@dataclass
class StreamRelease:
    table: pl.DataFrame
    metadata: dict[str, Any]


def run_stream(table: InputTable, q: StreamQuery, plan: StreamPlan, stream: KeyedStream) -> StreamRelease:
    """Replay the whole file; returns the long-format releases and counters."""
    events = prepare_events(table, q)
    out: list[tuple[Any, ...]] = []
    work: list[int] = []
    seen_total = 0
    for (window,), wdf in events.partition_by("__window", as_dict=True, maintain_order=True).items():
        w_out, w_work, seen = _run_window(int(window), wdf, q, plan, stream.child(f"window/{int(window)}"))
        out.extend(w_out)
        work.extend(w_work)
        seen_total += seen
    schema: dict[str, Any] = {"window_start": pl.Datetime("us"), "trigger": pl.Int64, "trigger_time": pl.Datetime("us")}
    key_schema = table.frame.collect_schema()
    for k in q.keys:
        schema[k] = key_schema[k]
    schema["count"] = pl.Int64
    if q.value:
        schema[f"sum_{q.value}"] = pl.Float64
    result = pl.DataFrame(out, schema=schema, orient="row") if out else pl.DataFrame(schema=schema)
    meta = {
        "events_used": events.height,
        "releases": result.height,
        "keys_seen": seen_total,
        "key_evaluations_per_trigger_max": max(work) if work else 0,
        "key_evaluations_total": int(sum(work)),
        **plan.summary,
    }
    return StreamRelease(result, meta)


def _key_label(key: tuple[Any, ...]) -> str:
    return json.dumps(list(key), default=str, separators=(",", ":"))


def _run_window(
    window: int, wdf: pl.DataFrame, q: StreamQuery, plan: StreamPlan, stream: KeyedStream
) -> tuple[list[tuple[Any, ...]], list[int], int]:
    T = q.triggers
    step = q.window // T
    keys = list(q.keys)
    has_value = q.value is not None
    g = float(q.grid.granularity) if q.grid else 1.0
    aggs = [pl.col("__unit").alias("units"), pl.len().alias("n")]
    if has_value:
        aggs.append(pl.col("__v").sum().alias("s"))
    per_trigger = {
        int(t): part.group_by(keys, maintain_order=True).agg(aggs).sort(keys, nulls_last=True)
        for (t,), part in wdf.partition_by("__trigger", as_dict=True, maintain_order=True).items()
    }
    states: dict[tuple[Any, ...], _KeyState] = {}
    predicted: dict[int, set[tuple[Any, ...]]] = defaultdict(set)
    rows: list[tuple[Any, ...]] = []
    work: list[int] = []
    start = datetime.fromtimestamp(window, tz=timezone.utc).replace(tzinfo=None)

    def release(key: tuple[Any, ...], st: _KeyState, t: int) -> None:
        if st.pert_start is None:
            st.pert_start = t
            n = T - t + 1
            st.pert_count = np.zeros(n, dtype=np.int64)
            st.noise_count = tree.draw_tree_noise(stream.child(f"pert-count/{_key_label(key)}"), plan.sigma2_count, n)
            if has_value:
                st.pert_sum = np.zeros(n, dtype=np.int64)
                st.noise_sum = tree.draw_tree_noise(stream.child(f"pert-sum/{_key_label(key)}"), plan.sigma2_sum, n)  # type: ignore[arg-type]
        i = t - st.pert_start
        st.pert_count[i] += st.buffer_count  # type: ignore[index]
        count = tree.prefix_estimates(st.pert_count, st.noise_count, float(plan.sigma2_count))[i]  # type: ignore[arg-type]
        row: list[Any] = [start, t, start + timedelta(seconds=t * step), *key, int(round(count))]
        if has_value:
            st.pert_sum[i] += st.buffer_sum  # type: ignore[index]
            s = tree.prefix_estimates(st.pert_sum, st.noise_sum, float(plan.sigma2_sum))[i]  # type: ignore[arg-type]
            row.append(round(s) * g)
        rows.append(tuple(row))
        st.buffer_count = st.buffer_sum = 0
        st.round_users = set()
        st.round_start = st.select_leaves = st.select_noise = None
        st.predicted = None
        st.rounds += 1

    def evaluate(key: tuple[Any, ...], st: _KeyState, t: int) -> None:
        i = t - st.round_start  # type: ignore[operator]
        est = tree.prefix_estimates(st.select_leaves, st.select_noise, float(plan.sigma2_select))  # type: ignore[arg-type]
        tau = plan.tau(st.select_leaves.size, T)  # type: ignore[union-attr]
        over = est > q.mu + tau
        if over[i]:
            release(key, st, t)
            return
        future = np.flatnonzero(over[i + 1 :])
        if future.size:  # Alg. 4: the first future trigger that would release with no new data
            p = t + 1 + int(future[0])
            st.predicted = p
            predicted[p].add(key)
        else:
            st.predicted = None

    for t in range(1, T + 1):
        evaluated = 0
        batch = per_trigger.get(t)
        touched: set[tuple[Any, ...]] = set()
        if batch is not None:
            cols = [batch[k].to_list() for k in keys]
            users = batch["units"].to_list()
            ns = batch["n"].to_list()
            sums = batch["s"].to_list() if has_value else [0] * batch.height
            for idx in range(batch.height):
                key = tuple(c[idx] for c in cols)
                st = states.get(key)
                if st is None:
                    st = states[key] = _KeyState()
                touched.add(key)
                new = set(users[idx]) - st.round_users
                st.round_users |= new
                st.buffer_count += ns[idx]
                st.buffer_sum += sums[idx]
                if st.select_leaves is None:
                    if len(st.round_users) <= q.mu:
                        continue  # not in S(t): too few units for a tree yet
                    st.round_start = t
                    n = T - t + 1
                    st.select_leaves = np.zeros(n, dtype=np.int64)
                    st.select_noise = tree.draw_tree_noise(
                        stream.child(f"select/{_key_label(key)}/{st.rounds}"), plan.sigma2_select, n
                    )
                    st.select_leaves[0] = len(st.round_users)
                else:
                    st.select_leaves[t - st.round_start] += len(new)  # type: ignore[operator]
                evaluate(key, st, t)
                evaluated += 1
        for key in sorted(predicted.pop(t, set()), key=_key_label):
            st = states[key]
            if key in touched or st.predicted != t:
                continue  # re-evaluated this trigger, or an outdated prediction
            release(key, st, t)
            evaluated += 1
        work.append(evaluated)
    return rows, work, len(states)
