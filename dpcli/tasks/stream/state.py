"""The JSON codec of a stream's state and the body of a ``--state`` document.

A state holds the stream's seed, its per-unit record counts, every open
window's trees (noise-only prefix estimates as JSON floats, which round-trip
exactly) and the events fed whose trigger has not run yet (``kept``: Parquet in
base64, so their columns come back with the input's types; absent in states
written before issue 31). Key and unit values are JSON scalars; dates and datetimes are
tagged so they come back with their type.
"""

from __future__ import annotations

import base64
import binascii
import io
from datetime import date, datetime
from typing import Any, overload
from zoneinfo import ZoneInfo

import numpy as np
import polars as pl

from dpcli.errors import DataError, StateError, UsageError, type_text
from dpcli.tasks.stream.algorithm import KeyState, StreamState, WindowRun
from dpcli.tasks.stream.plan import StreamPlan
from dpcli.tasks.stream.query import StreamQuery

#: The ``format`` of a ``--state`` file (see :mod:`dpcli.state.documents`).
STATE_KIND = "dpcli-stream-state"


def _encode(v: Any) -> Any:
    """A key or unit value as JSON (temporal values tagged, so they come back with their type)."""
    if isinstance(v, datetime):  # with its time zone's name: keys come back spelt (and sorted) as the input's
        tz = getattr(v.tzinfo, "key", None)
        return {"$dt": v.isoformat(), "tz": tz} if tz else {"$dt": v.isoformat()}
    if isinstance(v, date):
        return {"$d": v.isoformat()}
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    raise UsageError(f"cannot store values of type {type(v).__name__} (use string, integer or date columns)",
                     field="state")


def _decode(v: Any) -> Any:
    if isinstance(v, dict):
        if "$dt" in v:
            moment = datetime.fromisoformat(v["$dt"])
            return moment.astimezone(ZoneInfo(v["tz"])) if "tz" in v else moment
        return date.fromisoformat(v["$d"])
    return v


def _floats(values: np.ndarray | None) -> list[float] | None:
    return None if values is None else values.tolist()  # JSON floats round-trip exactly


@overload
def _array(values: list[float]) -> np.ndarray: ...
@overload
def _array(values: None) -> None: ...
def _array(values: list[float] | None) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=np.float64)


def _encode_key_state(st: KeyState) -> dict[str, Any]:
    pert = None if st.pert_noise is None else [_floats(st.pert_noise[0]), _floats(st.pert_noise[1])]
    return {
        "round_users": [_encode(u) for u in st.round_users], "round_start": st.round_start,
        "buffer_count": st.buffer_count, "buffer_sum": st.buffer_sum, "pert_start": st.pert_start,
        "pert_count": st.pert_count, "pert_sum": st.pert_sum, "predicted": st.predicted,
        "rounds": st.rounds, "select_margin": _floats(st.select_margin), "pert_noise": pert,
    }


def _decode_key_state(doc: dict[str, Any]) -> KeyState:
    pert = doc["pert_noise"]
    return KeyState(
        round_users={_decode(u) for u in doc["round_users"]}, round_start=doc["round_start"],
        buffer_count=int(doc["buffer_count"]), buffer_sum=int(doc["buffer_sum"]), pert_start=doc["pert_start"],
        pert_count=int(doc["pert_count"]), pert_sum=int(doc["pert_sum"]), predicted=doc["predicted"],
        rounds=int(doc["rounds"]), select_margin=_array(doc["select_margin"]),
        pert_noise=None if pert is None else (_array(pert[0]), _array(pert[1])),
    )


def _encode_window(run: WindowRun) -> dict[str, Any]:
    return {"start": run.start, "fired": run.fired,
            "keys": [[[_encode(v) for v in k], _encode_key_state(st)] for k, st in run.key_states().items()]}


def _decode_window(doc: dict[str, Any], state: StreamState) -> WindowRun:
    states = {tuple(_decode(v) for v in k): _decode_key_state(st_doc) for k, st_doc in doc["keys"]}
    return WindowRun.restore(int(doc["start"]), int(doc["fired"]), states, state.q, state.plan, state.stream)


def _encode_kept(kept: pl.DataFrame | None) -> str | None:
    """Events kept for triggers not yet run, as Parquet (their columns keep the input's types) in base64."""
    if kept is None:
        return None
    buf = io.BytesIO()
    kept.write_parquet(buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _decode_kept(text: str | None) -> pl.DataFrame | None:
    if text is None:
        return None
    try:
        return pl.read_parquet(io.BytesIO(base64.b64decode(text, validate=True)))
    except (pl.exceptions.PolarsError, OSError, binascii.Error):
        raise ValueError("kept events") from None


def encode_state(state: StreamState) -> dict[str, Any]:
    """A stream's state as JSON (the ``stream`` part of a state file)."""
    doc: dict[str, Any] = {
        "watermark": state.watermark,
        "used": {"units": [_encode(u) for u in state.used], "records": list(state.used.values())},
        "windows": [_encode_window(w) for _, w in sorted(state.windows.items())],
    }
    if state.kept is not None:  # states of dpcli before issue 31 kept no events
        doc["kept"] = _encode_kept(state.kept)
    return doc


def decode_state(doc: dict[str, Any], q: StreamQuery, plan: StreamPlan, seed: bytes) -> StreamState:
    """The stream state :func:`encode_state` wrote (raises KeyError/TypeError/ValueError if malformed)."""
    state = StreamState(q, plan, seed)
    state.watermark = doc["watermark"]
    state.used = {_decode(u): int(n) for u, n in zip(doc["used"]["units"], doc["used"]["records"], strict=True)}
    for w in doc["windows"]:
        run = _decode_window(w, state)
        state.windows[run.start] = run
    state.kept = _decode_kept(doc.get("kept"))
    return state


def _storable(dtype: pl.DataType) -> bool:
    """Values of this type come back from the state's JSON equal (as polars compares them) to the input's."""
    if isinstance(dtype, pl.Datetime):
        return dtype.time_unit != "ns"  # Python datetimes stop at microseconds: distinct units would merge
    if dtype in (pl.Int128, pl.UInt128):  # Python ints beyond 64 bits do not come back as one polars type
        return False
    return (dtype.is_integer() or dtype.is_float() or isinstance(dtype, (pl.Categorical, pl.Enum))
            or dtype in (pl.String, pl.Boolean, pl.Date, pl.Null))


def key_schema_of(schema: pl.Schema, q: StreamQuery) -> dict[str, str]:
    """The dtypes of the unit and key columns (from the input's ``schema``), as recorded in a state file.

    Refuses (from the schema alone, before any data is read) a column whose values the state
    cannot store exactly: otherwise the refusal would come only once a value is stored (whether
    any record counted: data-dependent), and a truncated unit would escape its record cap.
    """
    for c in (q.unit, *q.keys):
        if not _storable(schema[c]):
            raise UsageError(f"cannot store column {c!r} of type {type_text(schema[c])} (use text, integer, boolean, "
                             "date or datetime columns with at most microseconds)", field="state")
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
        raise DataError(f"column types differ from those of state file {name}: the data's schema changed since "
                        "the stream began")  # the types' own text is foreign: an Enum's lists its categories


def state_body(body: dict[str, Any], state: StreamState, last: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the stream's current state and the record of the invocation that produced it."""
    return {**body, "stream": encode_state(state), "last": last}


def load_state(body: dict[str, Any], q: StreamQuery, plan: StreamPlan) -> StreamState:
    """The stream state held by a verified state-file body."""
    seed = bytes.fromhex(body["seed"])
    if body["stream"] is None:
        return StreamState(q, plan, seed)
    try:
        return decode_state(body["stream"], q, plan, seed)
    except (KeyError, TypeError, ValueError) as exc:
        # the exception's own text may quote a stored unit or key (data): name its type only
        raise StateError(f"stream state is malformed ({type(exc).__name__})") from None
