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

All trees a trigger creates draw their node noise in one vectorised call from
the window's keyed stream for that trigger (keys in sorted order), and a key
keeps running totals plus its trees' noise-only prefix estimates (the
estimates are linear, see :func:`dpcli.core.tree.honaker_prefixes`).

Trees start at the trigger where they are created and span the rest of the
window (the same guarantee as running them from the window's start on zeros,
without the noise of the empty prefix).

Which records count (the bounded transformation, per record and then per
unit, so one unit's records never change which records of others count):

* a record is dropped when its time is missing, does not parse (ISO 8601 with
  an optional offset, or epoch seconds; the layout is fixed, never inferred
  from the data) or lies in a window not wholly within 0001-01-01 … 9999-12-31
  UTC; when its unit is null; when ``--value`` is given and its value is
  missing, unparsable or not finite; when its trigger ends after the run's
  public ``through`` time; with ``--state``, when its trigger has already run
  (a late event);
* then each unit keeps its first C remaining records in time order, over the
  whole stream.

Dropped records are never counted or reported. The triggers a run executes
depend only on public inputs: windows are aligned to the epoch and every
trigger ending at or before ``through`` (default: now) runs; a window without
events has no keys and releases nothing.

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
from datetime import date, datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

import numpy as np
import polars as pl

from dpcli import bounding
from dpcli.core import accounting as acc
from dpcli.core import tree
from dpcli.core.exact import floor_parameter, fraction_text
from dpcli.core.events import PrivacyEvent
from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import effective_sigma2
from dpcli.errors import DataError, StateError, UsageError
from dpcli.files import InputTable, collect

#: Event times (epoch seconds, UTC) that dates can show: 0001-01-01T00:00:00 … 9999-12-31T23:59:59.
MIN_SECONDS = -62_135_596_800
MAX_SECONDS = 253_402_300_799
#: Largest public parameters: beyond them the float calibration over- or underflows, or one key's
#: trees (``triggers`` floats each) and the threshold cache (up to triggers²/2 floats) grow too large.
MAX_WINDOW_DAYS = 36_500
MAX_TRIGGERS = 4096
MAX_RECORDS = 1_000_000
MAX_MU = 1_000_000_000
MAX_EPSILON = 100
MIN_DELTA = Fraction(1, 10**100)
CLAMP_RANGE = (1e-9, 1e15)
#: ISO 8601 layouts accepted in text timestamps (a trailing Z counts as +00:00); anything else that is
#: not a number of epoch seconds is unparsable.
_ISO_LAYOUTS = ("%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


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
        """Refuse parameters that cannot be honoured (all public: exit 2, before any data is read)."""
        if self.unit in self.keys:
            raise UsageError("the privacy unit cannot also be a --key column")
        if self.window < 1 or self.triggers < 1:
            raise UsageError("--window and the number of triggers must be positive")
        if self.window > MAX_WINDOW_DAYS * 86400:
            raise UsageError(f"--window must be at most {MAX_WINDOW_DAYS}d")
        if self.triggers > MAX_TRIGGERS:
            raise UsageError(f"at most {MAX_TRIGGERS} triggers per window (got {self.triggers})")
        if self.window % self.triggers:
            raise UsageError(f"--window {self.window}s does not split into {self.triggers} equal triggers")
        if not 1 <= self.max_records <= MAX_RECORDS:
            raise UsageError(f"--max-records must be between 1 and {MAX_RECORDS}")
        if not 0 < self.epsilon <= MAX_EPSILON or not MIN_DELTA <= self.delta < 1:
            raise UsageError(f"stream-replay needs --epsilon in (0, {MAX_EPSILON}] and --delta in [1e-100, 1)")
        if (self.value is None) != (self.clamp is None):
            raise UsageError("--value and --clamp go together")
        if self.clamp is not None and not (math.isfinite(self.clamp) and CLAMP_RANGE[0] <= self.clamp <= CLAMP_RANGE[1]):
            raise UsageError(f"--clamp must be between {CLAMP_RANGE[0]:g} and {CLAMP_RANGE[1]:g}")
        if not 0 <= self.mu <= MAX_MU:
            raise UsageError(f"--mu must be between 0 and {MAX_MU}")

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


#: The discrete Gaussian proposes from a discrete Laplace with scale ⌊σ⌋ + 1 ≤ 2^44 (the samplers' limit).
_MAX_SIGMA2 = Fraction((1 << 44) - 1) ** 2


def _floor(x: float, digits: int = 12) -> Fraction:
    """``x`` rounded down to ``digits`` decimals, or to 12 significant digits below 1e-12; never 0 for x > 0."""
    rho = floor_parameter(x, digits)
    if rho <= 0:
        raise UsageError("--epsilon is too small to calibrate stream-replay's Gaussian noise")
    return rho


def plan_stream(q: StreamQuery) -> StreamPlan:
    """Split (ε, δ) as Sec. 5 and calibrate the trees (Sec. 4.4, App. B)."""
    q.validate()
    eps, delta, c = float(q.epsilon), float(q.delta), q.max_records
    lv = tree.levels(q.triggers)
    eps_k, delta_k = eps / 2, 2 * delta / 3
    eps_m, delta_m = eps / 2, delta / 3
    # β = (δ_k/2)/((e^{ε_k} + 1)·C), in log space: e^{ε_k} overflows for ε_k > 709.
    log_beta = math.log(delta_k / 2) - (eps_k + math.log1p(math.exp(-eps_k))) - math.log(c)
    if log_beta < -700.0:
        raise UsageError(f"--epsilon {fraction_text(q.epsilon)} is too large for key selection's failure "
                         f"probability (below 1e-300); use a smaller --epsilon")
    beta = math.exp(log_beta)
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
    for sigma2 in (sigma2_select, sigma2_count, sigma2_sum):
        if sigma2 is not None and sigma2 > _MAX_SIGMA2:
            raise UsageError(f"stream-replay noise too large to sample (σ = {math.sqrt(float(sigma2)):.3g}); "
                             "use a larger --epsilon, a smaller --max-records or --clamp")
    events = (PrivacyEvent("approx", "stream-replay/dp-sqlp", epsilon=q.epsilon, delta=q.delta,
                           detail={"C": str(c), "triggers": str(q.triggers)}),)
    summary = {
        "key_selection": {"epsilon": eps_k, "delta": delta_k, "rho_total": float(rho_k), "rounds": c,
                          "beta": beta, "sigma": math.sqrt(float(sigma2_select))},
        "perturbation": {"epsilon": eps_m, "delta": delta_m, "rho_total": float(rho_m),
                         "sigma_count": math.sqrt(float(sigma2_count)),
                         "sigma_sum": math.sqrt(float(sigma2_sum)) * float(grid.granularity) if grid and sigma2_sum else None},
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


def prepare_events(table: InputTable, q: StreamQuery, through: int | None = None) -> pl.DataFrame:
    """Events in time order with their window, trigger and global trigger index ``__g``.

    Records that cannot count are dropped first (see the module docstring; with
    ``through``, also those whose trigger ends after global trigger
    ``through``); then each unit keeps its first C records in time order (ties
    broken by content); values are clamped and converted to grid units.
    """
    return _prepare(table, q, None, None, through)


def _event_seconds(table: InputTable, q: StreamQuery) -> pl.Expr:
    """The time column as integer epoch seconds (UTC), null where it is missing, unparsable or out of range.

    Text is read as ISO 8601 (:data:`_ISO_LAYOUTS`, naive times are UTC) or
    as epoch seconds, each value on its own: the layout is never inferred from
    other rows. Numbers are epoch seconds (floored); dates are midnight UTC.
    """
    dtype = table.frame.collect_schema()[q.time]
    t = pl.col(q.time)
    if dtype == pl.String:
        text = t.str.strip_chars()
        iso = text.str.replace(r"[zZ]$", "+00:00")
        parsed = [iso.str.to_datetime(f, time_unit="us", strict=False, exact=True).dt.epoch("s") for f in _ISO_LAYOUTS]
        parsed += [iso.str.to_datetime(f + "%z", time_unit="us", strict=False, exact=True).dt.epoch("s")
                   for f in _ISO_LAYOUTS[:-1]]
        seconds = pl.coalesce(*parsed, _float_seconds(text.cast(pl.Float64, strict=False)))
    elif dtype == pl.Date:
        seconds = t.cast(pl.Int32).cast(pl.Int64) * 86400
    elif isinstance(dtype, pl.Datetime):
        seconds = t.dt.epoch("s")
    elif dtype.is_numeric():
        seconds = _float_seconds(t.cast(pl.Float64, strict=False))
    else:  # the column's type, not its values, decides: the same for every dataset of this schema
        raise DataError(f"column {q.time!r} must hold timestamps, but is {dtype}")
    start = seconds // q.window * q.window  # the window, which must start and end on showable dates
    return pl.when((start >= MIN_SECONDS) & (start + q.window <= MAX_SECONDS)).then(seconds)


def _float_seconds(x: pl.Expr) -> pl.Expr:
    """Floored epoch seconds of a float, null unless finite and (loosely) in range."""
    ok = x.is_finite() & (x.abs() <= 1e12)
    return pl.when(ok).then(x.floor()).cast(pl.Int64, strict=False)


def _prepare(table: InputTable, q: StreamQuery, used: dict[Any, int] | None, after: int | None,
             through: int | None) -> pl.DataFrame:
    """:func:`prepare_events`, with the records ``used`` by units in earlier runs counting towards C and
    events whose trigger is at or before global trigger ``after`` (already run) dropped."""
    step = q.window // q.triggers
    schema = table.frame.collect_schema()
    cols = [_event_seconds(table, q).alias("__t"), pl.col(q.unit).alias("__unit"), *[pl.col(k) for k in q.keys]]
    keep = pl.col("__t").is_not_null() & pl.col("__unit").is_not_null()
    grid = q.grid
    if grid is not None and q.value is not None:
        dtype = schema[q.value]
        if not (dtype.is_numeric() or dtype == pl.String):
            raise DataError(f"column {q.value!r} must be numeric but is {dtype} in {table.name}")
        raw = pl.col(q.value).str.strip_chars() if dtype == pl.String else pl.col(q.value)
        x = raw.cast(pl.Float64, strict=False)
        # Snapped, then clamped to the grid's exact integers (|units| ≤ 2^10 per record: the grid has
        # ≥ 2^9 steps per L), so Int64 sums stay exact up to 2^53 records; totals across triggers are
        # Python integers (no wrap-around). Non-finite values are dropped like unparsable ones.
        cols += [pl.when(x.is_finite()).then(bounding.grid_units(x, grid)).alias("__v")]
        keep &= pl.col("__v").is_not_null()
    g = pl.col("__t") // step + 1
    if after is not None:
        keep &= g > after
    if through is not None:
        keep &= g <= through
    lf = table.frame.select(cols).filter(keep)
    df = collect(lf, f"cannot read {table.name}")
    # Time order, ties broken by the record's content (not its position in the file), so which of a
    # unit's records are its first C never depends on row order.
    df = df.sort(["__t", "__unit", *q.keys, *(["__v"] if "__v" in df.columns else [])], nulls_last=True)
    rank = pl.int_range(pl.len()).over("__unit")
    if used:
        prior = pl.DataFrame({"__unit": pl.Series(list(used), dtype=df["__unit"].dtype),
                              "__used": pl.Series(list(used.values()), dtype=pl.Int64)})
        df = df.join(prior, on="__unit", how="left", maintain_order="left")
        df = df.filter(rank + pl.col("__used").fill_null(0) < q.max_records).drop("__used")
    else:
        df = df.filter(rank < q.max_records)  # global bound: first C per unit
    return df.with_columns(
        (pl.col("__t") // q.window * q.window).alias("__window"),
        ((pl.col("__t") % q.window) // step + 1).cast(pl.Int64).alias("__trigger"),
        (pl.col("__t") // step + 1).alias("__g"),
    )


def _batches(events: pl.DataFrame, q: StreamQuery) -> dict[tuple[int, int], pl.DataFrame]:
    """Per (window, trigger): the micro-batch grouped by key (sorted), with its units, rows and sum."""
    keys = list(q.keys)
    aggs = [pl.col("__unit").alias("units"), pl.len().alias("n")]
    if q.value is not None:
        aggs.append(pl.col("__v").sum().alias("s"))
    return {
        (int(w), int(t)): part.group_by(keys, maintain_order=True).agg(aggs).sort(keys, nulls_last=True)
        for (w, t), part in events.partition_by(["__window", "__trigger"], as_dict=True, maintain_order=True).items()
    }


def _key_label(key: tuple[Any, ...]) -> str:
    return json.dumps(list(key), default=str, separators=(",", ":"))


def _encode(v: Any) -> Any:
    """A key or unit value as JSON (temporal values tagged, so they come back with their type)."""
    if isinstance(v, datetime):
        return {"$dt": v.isoformat()}
    if isinstance(v, date):
        return {"$d": v.isoformat()}
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    raise UsageError(f"--state cannot store values of type {type(v).__name__} (use string, integer or date columns)")


def _decode(v: Any) -> Any:
    if isinstance(v, dict):
        if "$dt" in v:
            return datetime.fromisoformat(v["$dt"])
        return date.fromisoformat(v["$d"])
    return v


def _floats(values: np.ndarray | None) -> list[float] | None:
    return None if values is None else values.tolist()  # JSON floats round-trip exactly


def _array(values: list[float] | None) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=np.float64)


@dataclass
class _KeyState:
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
    pert_noise: tuple[np.ndarray, np.ndarray | None] | None = None  # noise-only prefixes: count, sum

    def to_json(self) -> dict[str, Any]:
        pert = None if self.pert_noise is None else [_floats(self.pert_noise[0]), _floats(self.pert_noise[1])]
        return {
            "round_users": [_encode(u) for u in self.round_users], "round_start": self.round_start,
            "buffer_count": self.buffer_count, "buffer_sum": self.buffer_sum, "pert_start": self.pert_start,
            "pert_count": self.pert_count, "pert_sum": self.pert_sum, "predicted": self.predicted,
            "rounds": self.rounds, "select_margin": _floats(self.select_margin), "pert_noise": pert,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> _KeyState:
        pert = doc["pert_noise"]
        return cls(
            round_users={_decode(u) for u in doc["round_users"]}, round_start=doc["round_start"],
            buffer_count=int(doc["buffer_count"]), buffer_sum=int(doc["buffer_sum"]), pert_start=doc["pert_start"],
            pert_count=int(doc["pert_count"]), pert_sum=int(doc["pert_sum"]), predicted=doc["predicted"],
            rounds=int(doc["rounds"]), select_margin=_array(doc["select_margin"]),
            pert_noise=None if pert is None else (_array(pert[0]), _array(pert[1])),  # type: ignore[arg-type]
        )


class WindowRun:
    """One event-time window: its keys' trees and buffers, and the index of predicted releases."""

    def __init__(self, start: int, q: StreamQuery, plan: StreamPlan, stream: KeyedStream) -> None:
        self.start = start
        self.q = q
        self.plan = plan
        self.stream = stream.child(f"window/{start}")
        self.fired = 0  # triggers of this window already run
        self.states: dict[tuple[Any, ...], _KeyState] = {}
        self.predicted: dict[int, set[tuple[Any, ...]]] = defaultdict(set)
        self._start_time = _naive_utc(start)

    # -- persistence ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "fired": self.fired,
                "keys": [[[_encode(v) for v in k], st.to_json()] for k, st in self.states.items()]}

    @classmethod
    def from_json(cls, doc: dict[str, Any], q: StreamQuery, plan: StreamPlan, stream: KeyedStream) -> WindowRun:
        run = cls(int(doc["start"]), q, plan, stream)
        run.fired = int(doc["fired"])
        for k, st_doc in doc["keys"]:
            key = tuple(_decode(v) for v in k)
            st = run.states[key] = _KeyState.from_json(st_doc)
            if st.predicted is not None:
                run.predicted[st.predicted].add(key)
        return run

    # -- noise: every tree created at trigger t is drawn in one call from the window's stream for t --
    def _new_selection_trees(self, keys: list[tuple[Any, ...]], t: int) -> None:
        n = self.q.triggers - t + 1
        noise = tree.noise_prefixes(self.stream.child(f"select/{t}"), self.plan.sigma2_select, len(keys), n)
        margins = noise - self.q.mu - self.plan.tau(n, self.q.triggers)
        for key, margin in zip(keys, margins, strict=True):
            self.states[key].select_margin = margin

    def _new_perturbation_trees(self, keys: list[tuple[Any, ...]], t: int) -> None:
        n = self.q.triggers - t + 1
        counts = tree.noise_prefixes(self.stream.child(f"pert-count/{t}"), self.plan.sigma2_count, len(keys), n)
        sums: Any = [None] * len(keys)
        if self.q.value is not None:
            sums = tree.noise_prefixes(self.stream.child(f"pert-sum/{t}"), self.plan.sigma2_sum, len(keys), n)  # type: ignore[arg-type]
        for key, c, sm in zip(keys, counts, sums, strict=True):
            st = self.states[key]
            st.pert_start, st.pert_noise = t, (c, sm)

    # -- Alg. 2-4 ------------------------------------------------------------------------------
    def _selected(self, key: tuple[Any, ...], st: _KeyState, t: int) -> bool:
        """Alg. 2 at trigger t: is the noisy distinct-unit prefix above μ + τ? If not, Alg. 4's prediction."""
        i = t - st.round_start  # type: ignore[operator]
        margin = st.select_margin
        units = len(st.round_users)  # the selection tree's true prefix
        if units + margin[i] > 0:  # type: ignore[index]
            return True
        future = np.flatnonzero(margin[i + 1 :] > -units)  # type: ignore[index]
        if future.size:  # the first future trigger that would release with no new data
            st.predicted = t + 1 + int(future[0])
            self.predicted[st.predicted].add(key)
        else:
            st.predicted = None
        return False

    def _release(self, key: tuple[Any, ...], st: _KeyState, t: int) -> tuple[Any, ...]:
        """Alg. 3: move the buffer into leaf t of the perturbation trees, emit their prefix estimates, restart."""
        noise_count, noise_sum = st.pert_noise  # type: ignore[misc]
        i = t - st.pert_start  # type: ignore[operator]
        st.pert_count += st.buffer_count
        step = self.q.window // self.q.triggers
        row: list[Any] = [self._start_time, t, self._start_time + timedelta(seconds=t * step), *key,
                          int(round(st.pert_count + noise_count[i]))]
        if noise_sum is not None:
            st.pert_sum += st.buffer_sum
            row.append(round(st.pert_sum + noise_sum[i]) * float(self.q.grid.granularity))  # type: ignore[union-attr]
        st.buffer_count = st.buffer_sum = 0
        st.round_users = set()
        st.round_start = st.select_margin = st.predicted = None
        st.rounds += 1
        return tuple(row)

    def fire(self, t: int, batch: pl.DataFrame | None) -> list[tuple[Any, ...]]:
        """Run trigger t on its micro-batch (grouped by key): the rows released.

        Evaluates only the batch's keys that have a selection tree plus the keys
        whose predicted release is t (no count of them is kept: it depends on the data).
        """
        if t != self.fired + 1:
            raise ValueError(f"window {self.start}: trigger {t} out of order (last {self.fired})")
        self.fired = t
        q = self.q
        evaluate: list[tuple[Any, ...]] = []  # keys of the batch with a selection tree, in batch order
        new_trees: list[tuple[Any, ...]] = []
        if batch is not None:
            cols = [batch[k].to_list() for k in q.keys]
            users = batch["units"].to_list()
            ns = batch["n"].to_list()
            sums = batch["s"].to_list() if q.value is not None else None
            for idx in range(batch.height):
                key = tuple(c[idx] for c in cols) if len(cols) > 1 else (cols[0][idx],)
                st = self.states.get(key)
                if st is None:
                    st = self.states[key] = _KeyState()
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
        if new_trees:
            self._new_selection_trees(new_trees, t)
        touched = set(evaluate)
        released = [key for key in evaluate if self._selected(key, self.states[key], t)]
        predicted = [key for key in sorted(self.predicted.pop(t, set()), key=_key_label)
                     if key not in touched and self.states[key].predicted == t]  # else outdated or re-evaluated
        released += predicted
        first = [key for key in released if self.states[key].pert_start is None]
        if first:
            self._new_perturbation_trees(first, t)
        return [self._release(key, self.states[key], t) for key in released]


@dataclass
class StreamRelease:
    table: pl.DataFrame
    metadata: dict[str, Any]


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
        return self.q.window // self.q.triggers

    def to_json(self) -> dict[str, Any]:
        return {
            "watermark": self.watermark,
            "used": {"units": [_encode(u) for u in self.used], "records": list(self.used.values())},
            "windows": [w.to_json() for _, w in sorted(self.windows.items())],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], q: StreamQuery, plan: StreamPlan, seed: bytes) -> StreamState:
        state = cls(q, plan, seed)
        state.watermark = doc["watermark"]
        state.used = {_decode(u): int(n) for u, n in zip(doc["used"]["units"], doc["used"]["records"], strict=True)}
        for w in doc["windows"]:
            run = WindowRun.from_json(w, q, plan, state.stream)
            state.windows[run.start] = run
        return state

    def time_of(self, g: int) -> datetime:
        """The end time of global trigger g (naive UTC)."""
        return _naive_utc(g * self.step)

    def trigger_through(self, moment: datetime) -> int:
        """The last global trigger that ends at or before ``moment`` (naive: UTC); see :func:`trigger_through`."""
        return trigger_through(moment, self.step)

    def advance(self, events: pl.DataFrame, through: int) -> list[tuple[Any, ...]]:
        """Run every trigger after the watermark up to global trigger ``through`` on ``events``.

        ``events`` come from :func:`_prepare` with the same bounds (no event
        after ``through`` or at or before the watermark). Returns the release
        rows, window by window, trigger by trigger.
        """
        if self.watermark is not None and through < self.watermark:
            raise UsageError(f"the state has already run the triggers up to {self.time_of(self.watermark).isoformat()}")
        batches = _batches(events, self.q) if events.height else {}
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
        schema: dict[str, Any] = {"window_start": pl.Datetime("us"), "trigger": pl.Int64,
                                  "trigger_time": pl.Datetime("us")}
        for k in self.q.keys:
            schema[k] = key_schema[k]
        schema["count"] = pl.Int64
        if self.q.value:
            schema[f"sum_{self.q.value}"] = pl.Float64
        return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


def _naive_utc(seconds: int) -> datetime:
    """Epoch seconds as a naive UTC datetime (any second of years 1 … 9999)."""
    return (_EPOCH + timedelta(seconds=seconds)).replace(tzinfo=None)


def trigger_through(moment: datetime, step: int) -> int:
    """The global index of the last trigger (of ``step`` seconds) ending at or before ``moment`` (naive: UTC).

    Raises :class:`UsageError` when that trigger's end is not a showable date
    (before 0001-01-01 or after 9999-12-31 UTC): ``moment`` is a public option.
    """
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
    seconds = (aware - _EPOCH) // timedelta(seconds=1)
    g = seconds // step
    if not MIN_SECONDS <= g * step <= MAX_SECONDS:
        raise UsageError(f"--through {moment.isoformat()} is outside 0001-01-01 … 9999-12-31 (UTC) "
                         "once rounded down to a trigger")
    return g


def _metadata(table: pl.DataFrame, plan: StreamPlan, through: datetime) -> dict[str, Any]:
    """The public summary: the released row count (post-processing of noisy output), the public
    ``through`` time and the calibration. Nothing computed from the data without noise."""
    return {"releases": table.height, "through": through.isoformat(), **plan.summary}


def run_stream(table: InputTable, q: StreamQuery, plan: StreamPlan, seed: bytes,
               through: datetime | None = None) -> StreamRelease:
    """Replay the whole file: every trigger ending at or before ``through`` (default: now); long-format releases.

    Events whose trigger ends after ``through`` are dropped (before the
    per-unit cap), so the rows are exactly those a replay with a later
    ``through`` gives up to this time: same seed, same noise, a prefix.
    """
    state = StreamState(q, plan, seed, track_units=False)
    g = state.trigger_through(through if through is not None else datetime.now(timezone.utc))
    events = prepare_events(table, q, g)
    rows = state.advance(events, g)
    result = state.release_table(rows, dict(table.frame.collect_schema()))
    return StreamRelease(result, _metadata(result, plan, state.time_of(g)))


def advance_stream(table: InputTable, state: StreamState, through: datetime | None = None) -> StreamRelease:
    """Feed the next micro-batch(es) to a persisted stream (``--state``) and run their triggers.

    Runs every trigger after the state's watermark that ends at or before
    ``through`` (default: now). Events in triggers already run (late) or
    ending after ``through`` are dropped before the per-unit cap; a
    ``through`` before the watermark is a usage error (the watermark is the
    ``through`` of an earlier run, so this depends on public inputs only).
    """
    g = state.trigger_through(through if through is not None else datetime.now(timezone.utc))
    if state.watermark is not None and g < state.watermark:
        raise UsageError(f"the state has already run the triggers up to {state.time_of(state.watermark).isoformat()}")
    events = _prepare(table, state.q, state.used, state.watermark, g)
    rows = state.advance(events, g)
    result = state.release_table(rows, dict(table.frame.collect_schema()))
    return StreamRelease(result, _metadata(result, state.plan, state.time_of(g)))


#: The ``format`` of a ``--state`` file (see :mod:`dpcli.state.documents`).
STATE_KIND = "dpcli-stream-state"


def key_schema_of(table: InputTable, q: StreamQuery) -> dict[str, str]:
    """The dtypes of the unit and key columns, as recorded in a state file."""
    schema = table.frame.collect_schema()
    return {c: str(schema[c]) for c in (q.unit, *q.keys)}


def new_state_body(q: StreamQuery, analyst: str, seed: bytes, seed_id: str, key_schema: dict[str, str],
                   created: str) -> dict[str, Any]:
    """The body of a fresh ``--state`` file (its stream part is filled in by :func:`state_body`)."""
    return {"query": q.canonical(), "analyst": analyst, "seed": seed.hex(), "seed_id": seed_id,
            "key_schema": key_schema, "created": created, "stream": None, "last": None}


def check_state_body(body: dict[str, Any], q: StreamQuery, analyst: str, key_schema: dict[str, str], name: str) -> None:
    """Refuse a state file created for another query, analyst or column types."""
    if body.get("query") != q.canonical():
        old = body.get("query") or {}
        diff = [k for k in sorted(set(old) | set(q.canonical())) if old.get(k) != q.canonical().get(k)]
        shown = ", ".join(f"{k} (state: {old.get(k)!r}, now: {q.canonical().get(k)!r})" for k in diff)
        raise UsageError(f"state file {name} was created with other parameters: {shown}")
    if body.get("analyst") != analyst:
        raise UsageError(f"state file {name} belongs to analyst {body.get('analyst')!r}, not {analyst!r}")
    if body.get("key_schema") != key_schema:
        raise DataError(f"column types differ from those of state file {name}: "
                        f"{body.get('key_schema')} then, {key_schema} now")


def state_body(body: dict[str, Any], state: StreamState, last: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the stream's current state and the record of the invocation that produced it."""
    return {**body, "stream": state.to_json(), "last": last}


def load_state(body: dict[str, Any], q: StreamQuery, plan: StreamPlan) -> StreamState:
    """The stream state held by a verified state-file body."""
    seed = bytes.fromhex(body["seed"])
    if body["stream"] is None:
        return StreamState(q, plan, seed)
    try:
        return StreamState.from_json(body["stream"], q, plan, seed)
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"stream state is malformed ({type(exc).__name__}: {exc})") from None
