"""``auto`` bounds of a stream (C, records per unit; L, the symmetric value limit) and its bias report.

Both are chosen with :mod:`dpcli.tasks.auto_bounds` on the records a release would bound: those left after
the stream's own per-record drops (:mod:`.events`: missing or unparsable times, null units, unholdable keys,
missing or non-finite values; and for a whole replay, triggers after ``through``), before the per-unit cap.

* **C** (``--max-contributions auto``): each unit's record count is one entry (the ``DataShape(unit)`` of
  :func:`dpcli.tasks.auto_bounds.choose_bounds`, no group columns): sensitivity 1;
* **L** (``--bounds auto``): on the records the cap keeps (each unit's first C in time order), the |value| of
  each unit's first kept record is one entry: sensitivity 1 (:func:`dpcli.tasks.auto_bounds.choose_limit`).

The choice spends ``--auto-share`` of the stream's ε, split equally between the quantiles chosen (one or two).
The bias report (``--report-bias``, :mod:`dpcli.tasks.bias_report`) gives the noisy average shares of each unit's
records beyond C and kept with a value outside [−L, L], at ``--bias-share`` of ε. Both draw
their noise from the stream's keyed stream (children ``auto`` and ``bias``, apart from the windows' ``window/…``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from dpcli import bounding
from dpcli.bounding.stream_records import cap_records
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import DataError, UsageError, type_text
from dpcli.tasks import auto_bounds as ab
from dpcli.tasks import bias_report as br
from dpcli.tasks.reports import AutoReport, StreamReport
from dpcli.tasks.stream.events import record_exprs
from dpcli.tasks.stream.plan import StreamPlan, plan_stream
from dpcli.tasks.stream.query import CLAMP_RANGE, StreamQuery

#: The candidates of L that a stream accepts (:data:`CLAMP_RANGE`).
STREAM_LIMITS = tuple(c for c in ab.LIMIT_CANDIDATES if CLAMP_RANGE[0] <= c <= CLAMP_RANGE[1])


@dataclass(frozen=True)
class StreamChoice:
    """The bounds a stream chose (released, noisy) and its bias report, as kept in a ``--state`` file."""

    max_records: int | None  # chosen C (None: given)
    clamp: float | None  # chosen L (None: given)
    bias: dict[str, Any] | None = None  # BiasReport.to_json()
    #: The chosen bounds fell back to the placeholders the plan was checked with (their noise could not be drawn).
    reduced: bool = False

    def apply(self, q: StreamQuery) -> StreamQuery:
        """``q`` at these bounds (given ones kept)."""
        return q.resolved(self.max_records or q.max_records, self.clamp if self.clamp is not None else q.clamp)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_records is not None:
            out["max_contributions"] = self.max_records
        if self.clamp is not None:
            out["bounds"] = [-self.clamp, self.clamp]
        if self.bias is not None:
            out["bias"] = self.bias
        if self.reduced:
            out["reduced"] = True
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StreamChoice:
        bounds = doc.get("bounds")
        return cls(doc.get("max_contributions"), float(bounds[1]) if bounds else None, doc.get("bias"),
                   bool(doc.get("reduced", False)))

    def chosen(self) -> AutoReport:
        """The chosen bounds as a report's ``auto`` shows them (:meth:`to_json` without the bias report)."""
        out: AutoReport = {}
        if self.max_records is not None:
            out["max_contributions"] = self.max_records
        if self.clamp is not None:
            out["bounds"] = [-self.clamp, self.clamp]
        if self.reduced:
            out["reduced"] = True
        return out

    def metadata(self, q: StreamQuery) -> StreamReport:
        """The result's ``auto`` and ``bias`` parts (released values and the budget that released them)."""
        out: StreamReport = {}
        if q.auto is not None:
            out["auto"] = {**self.chosen(), "epsilon": fraction_text(q.epsilon * q.parts.auto)}
        if self.bias is not None:
            out["bias"] = self.bias
        return out


def chosen_line(metadata: StreamReport) -> str:
    """``; chosen: max_contributions 13, bounds -0.7071:0.7071`` from a result's metadata (empty without auto)."""
    auto = metadata.get("auto") or {}
    bits = [f"max_contributions {auto['max_contributions']}"] if "max_contributions" in auto else []
    if "bounds" in auto:
        bits.append(f"bounds {auto['bounds'][0]:g}:{auto['bounds'][1]:g}")
    return f"; chosen: {', '.join(bits)}" if bits else ""


def resolve(q: StreamQuery, events: Sequence[PrivacyEvent], choice: StreamChoice) -> tuple[StreamQuery, StreamPlan]:
    """``q`` and its plan at the chosen bounds; the plan's events are those planned before any data was read."""
    run_q = choice.apply(q)
    run_plan = plan_stream(run_q)
    assert run_plan.events == tuple(events), "the chosen bounds changed the stream's cost"
    return run_q, run_plan


def _choice_records(frame: pl.LazyFrame, q: StreamQuery, through: int | None, name: str) -> pl.LazyFrame:
    """The records a release would bound (before the cap): ``__t``, ``__unit``, the keys, and ``__x`` (the raw
    value, finite) with a value column."""
    cols, keep = record_exprs(frame, replace(q, value=None, clamp=None), name)
    if q.value is not None:
        dtype = frame.collect_schema()[q.value]
        if not (dtype.is_numeric() or dtype == pl.String):
            raise DataError(f"column {q.value!r} must be numeric but is {type_text(dtype)} in {name}")
        x = bounding.numeric_value(pl.col(q.value), dtype)
        cols.append(pl.when(x.is_finite()).then(x).alias("__x"))
        keep &= pl.col("__x").is_not_null()
    if through is not None:
        keep &= pl.col("__t") // q.step + 1 <= through
    return frame.select(cols).filter(keep)


def _order(q: StreamQuery) -> list[str]:
    return ["__t", "__unit", *q.keys, *(["__x"] if q.value is not None else [])]


def choose(frame: pl.LazyFrame, q: StreamQuery, seed: bytes, through: int | None, name: str) -> StreamChoice:
    """The bounds ``q`` leaves to dpcli (C first, then L on the records C keeps) and, if asked, the bias report
    at the bounds in force; ``seed`` is the release's (or the stream's) seed."""
    records = _choice_records(frame, q, through, name)
    root = KeyedStream(seed, "stream-replay")
    a = q.auto
    c = l_ = None
    if a is not None:
        quantiles = int(a.contributions) + int(a.values)
        eps = ab.pure_epsilon(q.epsilon, None, a.share, quantiles)
        if a.contributions:
            shape = ab.DataShape("__unit", ())
            c = ab.choose_bounds(records, shape, ab.AutoBounds(contributions=True, share=a.share),
                                 ab.ChosenBounds(None, 1, None), eps, root.child("auto"), 0, name).max_contributions
        if a.values:
            kept = cap_records(records, "__unit", _order(q), c or q.max_records).frame
            first = kept.group_by("__unit").agg(pl.col("__x").sort_by(_order(q)).first())
            l_ = ab.choose_limit(first, "__x", eps, root.child("auto"), name, STREAM_LIMITS)
    choice = _plannable(q, StreamChoice(c, l_))
    if q.report_bias is None:
        return choice
    return replace(choice, bias=_bias(records, choice.apply(q), root.child("bias"), name))


def _plannable(q: StreamQuery, choice: StreamChoice) -> StreamChoice:
    """``choice``, or the placeholders the plan was checked with before any data was read (C = 1, L = 1: reported
    as ``reduced``) when the chosen bounds' noise cannot be drawn: a run must not fail after the choice (a
    free, data-dependent exit)."""
    try:
        plan_stream(choice.apply(q))
    except UsageError:
        return StreamChoice(None if choice.max_records is None else 1, None if choice.clamp is None else 1.0,
                            reduced=True)
    return choice


def _bias(records: pl.LazyFrame, q: StreamQuery, stream: KeyedStream, name: str) -> dict[str, Any]:
    """The bias report at the bounds in force: records beyond C, records kept with a value outside [−L, L]."""
    assert q.report_bias is not None
    shape = ab.DataShape("__unit", (), "__x" if q.value is not None else None)
    bounds = ab.ChosenBounds(None, q.max_records, (-q.clamp, q.clamp) if q.clamp is not None else None)
    noise = br.bias_noise(q.epsilon, None, q.report_bias)
    return br.report_bias(records, shape, bounds, noise, stream, 0, name).to_json()
