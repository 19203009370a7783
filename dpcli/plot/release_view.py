"""A release file, recognised: which command wrote it, its group labels, values and margins.

dpcli's releases have fixed shapes (the column names are part of the interface):

* ``tabulate``: ``level, geo_id, iteration, sex, age, count`` (+ ``moe95``);
* ``stream-replay``: ``window_start, trigger, trigger_time``, the keys, ``count`` and
  ``sum_<value>`` (+ ``*_moe95``);
* ``topk``: ``rank``, the keys, ``count`` (+ ``count_moe95``);
* ``histogram``: the keys, then ``count``, ``count_units``, ``sum_x``, ``mean_x``, ``variance_x``,
  ``median_x``, ``pNN_x`` (+ ``*_moe95``);
* ``sql``: the query's own columns, told apart by its report (``columns``: its aggregates), so only with a
  summary (a ``--json`` document's, ``--summary``, or the ledger entry that wrote the file);
* ``diff`` (``dpcli diff``'s output): the keys, then per compared statistic ``<stat>_old``, ``<stat>_new``,
  ``<stat>_diff`` and ``<stat>_diff_moe95``, then ``p`` and ``changed``.

A summary saved from ``--json`` (``--summary``) adds what the file lacks: ε, δ (or ρ) and the
selection threshold. A release with no rows (nothing passed the threshold, no trigger due) is
recognised by its columns, or by a ``--json`` document's summary, and drawn as an empty chart.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, TypedDict

import polars as pl

from dpcli.advice import TOPK_ORDER
from dpcli.core.exact import fraction_text
from dpcli.errors import DataError, InputMissingError, UsageError

Kind = Literal["histogram", "topk", "stream-replay", "tabulate", "diff", "sql"]
_AGGREGATE = re.compile(r"\A(count|count_units|(sum|mean|variance|median|p\d{1,2})_.+)\Z")
_STREAM = ("window_start", "trigger", "trigger_time")
_KINDS: dict[str, Kind] = {"histogram": "histogram", "topk": "topk", "stream-replay": "stream-replay", "diff": "diff",
                           "tabulate": "tabulate", "sql": "sql"}
_TABULATE = ("level", "geo_id", "iteration", "sex", "age", "count")
_DIFF = "_diff_moe95"
_DIFF_PARTS = ("old", "new", "diff", "diff_moe95")


@dataclass(frozen=True)
class ReleaseView:
    """What a release file holds, as the plots need it."""

    kind: Kind
    table: pl.DataFrame
    keys: tuple[str, ...]  # the group columns (stream: the keys; tabulate: geo_id, iteration)
    values: tuple[str, ...]  # the released aggregate columns, in file order
    name: str
    summary: dict[str, Any] = field(default_factory=dict)
    shown: bool = True  # values as text outputs show them (CSV, JSON: rounded to their noise); False for Parquet

    def margin_of(self, value: str) -> str | None:
        """The 95% margin column of ``value``, if the file has one."""
        for name in (f"{value}_moe95", "moe95" if self.kind == "tabulate" else ""):
            if name and name in self.table.columns:
                return name
        return None

    def caption(self, marks: str | None) -> str:
        """The privacy parameters, from the summary ("not recorded" without one), what the drawn ``marks`` are
        (``"error bars"``, ``"bands"``, ``"±"``; None: nothing drawn around the values, and nothing said), and
        for topk, on a line of its own, that the counts shown need not fall with the ranks."""
        s = self.summary
        cost = s.get("cost") or []
        totals: dict[str, Fraction] = {}  # a release's parts (bounds chosen, bias report) are one charge: summed
        for event in cost:
            for key, sym in (("epsilon", "ε"), ("delta", "δ"), ("rho", "ρ")):
                if event.get(key) is not None:
                    totals[sym] = totals.get(sym, Fraction(0)) + Fraction(str(event[key]))
        parts = [f"{sym} = {_short(fraction_text(total))}" for sym, total in totals.items()]
        if not parts and s.get("epsilon") is not None:
            parts.append(f"ε = {_short(s['epsilon'])}")
        pieces = [self.kind, ", ".join(parts) if parts else "ε, δ not recorded (give --summary)"]
        if marks is not None:
            pieces.append(f"{marks}: 95% margins of the noise")
        return " · ".join(pieces) + (f"\n{TOPK_ORDER}" if self.kind == "topk" else "")

    @property
    def empty(self) -> bool:
        """Nothing was released: the chart says so instead of drawing."""
        return self.table.height == 0

    def empty_text(self) -> str:
        """The line an empty release is drawn as."""
        return f"{self.kind} release {self.name}: no rows were released, nothing to draw"

    @property
    def threshold(self) -> float | None:
        t = self.summary.get("threshold")
        return float(t) if t is not None else None


def _short(text: Any) -> str:
    try:
        return f"{float(text):.3g}"
    except (TypeError, ValueError):
        return str(text)


def read_release(path: str, summary_path: str | None = None,
                 accept: Callable[[str], None] | None = None) -> ReleaseView:
    """Read a release (CSV, Parquet or JSON records, by extension) and recognise it.

    The file is opened once through :func:`dpcli.io.opening.open_binary` (the caller's rights are asked
    there) and parsed from the bytes read; ``accept``, if given, is called with their fingerprint
    first and may refuse them (service mode: only releases a ledger recorded).
    """
    read = read_table(path, summary_path, accept)
    return recognise(read.table, path, read.summary, read.shown)


@dataclass(frozen=True)
class ReadTable:
    """A release file's table as read, with the summary that came with it (given, or a ``--json`` document's own;
    {} without one) and whether its values are rounded as text outputs show them."""

    table: pl.DataFrame
    summary: dict[str, Any]
    shown: bool


def read_table(path: str, summary_path: str | None = None,
               accept: Callable[[str], None] | None = None) -> ReadTable:
    """:func:`read_release` before it recognises the table (a caller that finds the report elsewhere, by the
    bytes' digest, recognises it with that report: an ``sql`` release is told by its report, not its columns)."""
    from dpcli.io.opening import open_binary
    from dpcli.io.tables import fingerprint_bytes

    gzipped = Path(path).suffix.lower() == ".gz"  # a .csv.gz or .json.gz dpcli wrote (io.outputs.compressed)
    suffix = Path(path).with_suffix("").suffix.lower() if gzipped else Path(path).suffix.lower()
    if suffix not in (".parquet", ".pq", ".json", ".csv", ".tsv", ".txt"):
        raise UsageError(f"cannot tell the format of {path!r} from its extension (.csv, .parquet or .json, "
                         "optionally .gz)")
    fh, _ = open_binary(path, "release")
    try:
        with fh:
            data = fh.read()
    except OSError:
        raise InputMissingError(f"release {path!r} is not readable") from None
    if accept is not None:
        accept(fingerprint_bytes(data))  # the bytes written (compressed, for a .gz): the digest a ledger recorded
    summary = read_summary(summary_path) if summary_path else {}
    try:
        table, doc = _parse_release(gzip.decompress(data) if gzipped else data, suffix, path)
    except (pl.exceptions.PolarsError, json.JSONDecodeError, UnicodeDecodeError, OSError, ValueError, TypeError,
            EOFError, zlib.error) as exc:
        raise DataError(f"cannot read {path!r} as a release ({type(exc).__name__})") from None
    if doc is not None and summary_path is None:
        summary = doc.get("summary") or {}
        if not isinstance(summary, dict):
            raise DataError(f"{path!r} is not a dpcli --json document (its summary is not an object)")
    return ReadTable(table, summary, suffix not in (".parquet", ".pq"))


def _parse_release(data: bytes, suffix: str, path: str) -> tuple[pl.DataFrame, dict[str, Any] | None]:
    """The release's table, and the whole ``--json`` document it came in (None for a table file)."""
    if suffix in (".parquet", ".pq"):
        return pl.read_parquet(io.BytesIO(data)), None
    if suffix != ".json":
        separator = "\t" if suffix == ".tsv" else ","
        return pl.read_csv(io.BytesIO(data), infer_schema_length=None, separator=separator), None
    doc = json.loads(data)
    rows = doc.get("result") if isinstance(doc, dict) else doc
    if not isinstance(rows, list):
        raise DataError(f"{path!r} is not a dpcli release (a JSON list of records)")
    table = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    return table, doc if isinstance(doc, dict) else None


def read_summary(path: str) -> dict[str, Any]:
    """A summary saved from ``--json`` (the whole document, or its ``summary``)."""
    from dpcli.io.opening import open_binary

    try:
        fh, _ = open_binary(path, "summary")
        with fh:
            doc = json.loads(fh.read())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the summary {path!r} ({type(exc).__name__})", field="summary") from None
    if isinstance(doc, dict) and isinstance(doc.get("summary"), dict):
        doc = doc["summary"]
    if not isinstance(doc, dict):
        raise UsageError(f"{path!r} is not a dpcli --json summary", field="summary")
    return doc


def recognise(table: pl.DataFrame, name: str, summary: dict[str, Any] | None = None,
              shown: bool = True) -> ReleaseView:
    """Which command wrote ``table`` (by its columns; see the module docstring); ``shown``: its values are rounded
    as text outputs show them."""
    view = _recognise(table, name, summary or {})
    return view if shown else replace(view, shown=False)


def _recognise(table: pl.DataFrame, name: str, summary: dict[str, Any]) -> ReleaseView:
    cols = table.columns
    if not cols:  # JSON records with no record: only a --json document's summary tells which command wrote it
        wrote: Kind | None = _KINDS.get(str(summary.get("command")))
        if table.height == 0 and wrote is not None:
            return ReleaseView(wrote, table, (), (), name, summary)
        raise DataError(f"{name!r} holds no rows and no columns: an empty release written as JSON records cannot be "
                        "recognised (CSV and Parquet keep their columns, --json its summary)")
    if "changed" in cols and (stats := tuple(c.removesuffix(_DIFF) for c in cols if c.endswith(_DIFF))):
        keys = tuple(c for c in cols if c not in ("p", "changed", "trigger_old", "trigger_new")
                     and not any(c.startswith(f"{st}_") and c.removeprefix(f"{st}_") in _DIFF_PARTS for st in stats))
        return ReleaseView("diff", table, keys, stats, name, summary)
    if all(c in cols for c in _TABULATE):
        return ReleaseView("tabulate", table, ("geo_id", "iteration"), ("count",), name, summary)
    if summary.get("command") == "sql":  # the query names its columns: its report says which are aggregates
        named = summary.get("columns")
        if not isinstance(named, dict):
            raise DataError(f"{name!r}: its sql summary does not name its aggregate columns (written by an older "
                            "dpcli)")
        values = tuple(c for c in cols if c in named)
        return ReleaseView("sql", table, _keys(cols, values, ()), values, name, summary)
    values = _released_values(cols)
    if not values:
        raise DataError(f"{name!r} has no column dpcli releases (count, count_units, sum_…, mean_…): "
                        "is it a dpcli release? (an sql release is told by its summary: its run's --json output)")
    if all(c in cols for c in _STREAM):
        return ReleaseView("stream-replay", table, _keys(cols, values, _STREAM), values, name, summary)
    kind: Kind = "topk" if "rank" in cols else "histogram"
    return ReleaseView(kind, table, _keys(cols, values, ("rank",)), values, name, summary)


def _released_values(cols: list[str]) -> tuple[str, ...]:
    """The released aggregate columns (count, count_units, sum_…, mean_…, …), their margins aside."""
    return tuple(c for c in cols if _AGGREGATE.match(c) and not c.endswith("_moe95"))


def _keys(cols: list[str], values: tuple[str, ...], other: tuple[str, ...]) -> tuple[str, ...]:
    """The group columns: every column but the released values, their margins and ``other``."""
    return tuple(c for c in cols if c not in other and c not in values and not c.endswith("_moe95"))


def label_of(row: dict[str, Any], keys: tuple[str, ...]) -> str:
    """A group's label: its key values joined with " · " (an empty key as ∅)."""
    return " · ".join("∅" if row[k] is None else str(row[k]) for k in keys)


def bars(view: ReleaseView, value: str | None, top: int | None) -> tuple[list[str], list[float], list[float] | None]:
    """(labels, values, margins) of a histogram or topk release, largest first, the first ``top``."""
    column = value or view.values[0]
    if column not in view.values:
        raise UsageError(f"{view.name!r} has no released column {column!r} (it has {', '.join(view.values)})",
                         field="value")
    margin = view.margin_of(column)
    t = view.table.filter(pl.col(column).is_not_null())
    t = t.sort("rank") if view.kind == "topk" else t.sort(column, descending=True, nulls_last=True)
    if top is not None:
        t = t.head(top)
    labels = [label_of(r, view.keys) for r in t.select(list(view.keys)).to_dicts()]
    margins: list[float] | None
    if margin:
        margins = t[margin].cast(pl.Float64).to_list()
    else:
        recorded = recorded_margin(view, column)
        margins = None if recorded is None else [recorded] * t.height
    return labels, t[column].cast(pl.Float64).to_list(), margins


def recorded_margin(view: ReleaseView, column: str) -> float | None:
    """A count's 95% noise margin from the summary's recorded noise (when the file has no ``*_moe95``)."""
    from fractions import Fraction

    from dpcli.core.mechanisms import Noise

    name = {"count": "rows", "count_units": "units"}.get(column, "")
    measurement = (view.summary.get("measurements") or {}).get(name)
    if not isinstance(measurement, dict):
        return None
    try:
        if measurement.get("noise") == "discrete_laplace":
            noise = Noise("laplace", Fraction(str(measurement["scale"])))
        elif measurement.get("noise") == "discrete_gaussian":
            noise = Noise("gaussian", Fraction(str(measurement["sigma"])) ** 2)
        else:
            return None
    except (KeyError, ValueError, ZeroDivisionError):
        return None
    return float(noise.margin95())


def stream_lines(view: ReleaseView, value: str | None, keys: list[str] | None, top: int) -> dict[str, Any]:
    """Per key, its released ``value`` over the triggers (time order), for ``keys`` or the ``top`` by total:
    (trigger times, values, margins or None, window starts). Values are running totals within a window."""
    column = value or view.values[0]
    if column not in view.values:
        raise UsageError(f"{view.name!r} has no released column {column!r} (it has {', '.join(view.values)})",
                         field="value")
    t = view.table.with_columns(pl.col("trigger_time").cast(pl.String), pl.col("window_start").cast(pl.String))
    labelled = t.with_columns(pl.Series("__label", [label_of(r, view.keys) for r in t.select(list(view.keys))
                                                    .to_dicts()]))
    if keys:
        missing = [k for k in keys if k not in set(labelled["__label"].to_list())]
        if missing:
            raise UsageError(f"no released rows for {', '.join(missing)} in {view.name!r}", field="keys")
        chosen = keys
    else:
        totals = labelled.group_by("__label").agg(pl.col(column).sum()).sort([column, "__label"],
                                                                            descending=[True, False])
        chosen = totals["__label"].head(top).to_list()
    margin = view.margin_of(column)
    lines = {}
    for label in chosen:
        part = labelled.filter(pl.col("__label") == label).sort("trigger_time")
        lines[label] = (part["trigger_time"].to_list(), part[column].cast(pl.Float64).to_list(),
                        part[margin].cast(pl.Float64).to_list() if margin else None, part["window_start"].to_list())
    return {"value": column, "lines": lines}


#: A released count and its 95% margin (None without margins).
Cell = tuple[float, float | None]


class Pyramid(TypedDict):
    """A population group's Sex × Age cells (``cells`` by (sex, age)), or its total alone (no ``ages``)."""

    level: str
    group: str
    sexes: list[str]
    ages: list[str]
    cells: dict[tuple[str, str], Cell]
    total: Cell | None


def pyramid(view: ReleaseView, group: str | None, level: str | None) -> Pyramid:
    """A population group's Sex × Age cells (or its total, if only that was released).

    ``group`` is ``GEO_ID:ITERATION`` (default: the first group with cells); ``level`` a level
    name as the file writes it (default: the first level).
    """
    t = view.table
    chosen_level = _chosen_level(t, level, view.name)
    t = t.filter(pl.col("level") == chosen_level)
    geo, it = _group_of(t, group)
    rows = t.filter((pl.col("geo_id").cast(pl.String) == geo) & (pl.col("iteration").cast(pl.String) == it))
    if not rows.height:
        raise UsageError(f"no population group {geo}:{it} at level {chosen_level!r} in {view.name!r}", field="group")
    margin = "moe95" if "moe95" in rows.columns else None
    sexes = [s for s in dict.fromkeys(rows["sex"].cast(pl.String).to_list()) if s is not None]
    ages = [a for a in dict.fromkeys(rows["age"].to_list()) if a != "total"]
    cells = {(str(r["sex"]), r["age"]): _cell(r, margin) for r in rows.iter_rows(named=True)}
    total = next((_cell(r, margin) for r in rows.iter_rows(named=True) if r["age"] == "total"), None)
    return {"level": chosen_level, "group": f"{geo}:{it}", "sexes": sexes, "ages": ages, "cells": cells,
            "total": total}


def _chosen_level(t: pl.DataFrame, level: str | None, name: str) -> Any:
    """``level`` if the file has it, else (None) the file's first level."""
    levels = list(dict.fromkeys(t["level"].to_list()))
    if not levels:
        raise DataError(f"{name!r} holds no rows")
    chosen_level = level or levels[0]
    if chosen_level not in levels:
        raise UsageError(f"no level {chosen_level!r} in {name!r} (it has {', '.join(levels)})", field="level")
    return chosen_level


def _group_of(t: pl.DataFrame, group: str | None) -> tuple[str, str]:
    """(geo id, iteration) of ``GEO_ID:ITERATION``, or of the level's first group with cells (else its first)."""
    if group is not None:
        geo, _, it = group.partition(":")
        return geo, it
    with_cells = t.filter(pl.col("age") != "total")
    first = (with_cells if with_cells.height else t).row(0, named=True)
    return str(first["geo_id"]), str(first["iteration"])


def _cell(row: dict[str, Any], margin: str | None) -> Cell:
    return float(row["count"]), float(row[margin]) if margin else None


def sex_cells(p: Pyramid, sex: str) -> tuple[list[float], list[float] | None]:
    """One sex's counts by age (0 where a cell is missing), and their margins (None unless every cell has one)."""
    cells = [p["cells"].get((sex, age), (0.0, None)) for age in p["ages"]]
    margins = [m for _, m in cells if m is not None]
    return [v for v, _ in cells], margins if len(margins) == len(cells) else None


def released_total(p: Pyramid) -> Cell:
    """The total of a group whose cells were not released (no ``ages``: its only row is its total)."""
    assert p["total"] is not None, p["group"]
    return p["total"]


def level_totals(view: ReleaseView, level: str | None, top: int | None) -> tuple[str | None, list[str], list[float],
                                                                               list[float] | None]:
    """A tabulate level's released totals (groups released as a total only), largest first:
    (level, labels ``GEO_ID:ITERATION``, values, margins)."""
    t = view.table
    levels = list(dict.fromkeys(t["level"].to_list()))
    chosen = level or (levels[0] if levels else None)
    if chosen not in levels:
        raise UsageError(f"no level {chosen!r} in {view.name!r} (it has {', '.join(levels)})", field="level")
    rows = t.filter((pl.col("level") == chosen) & (pl.col("age") == "total")).sort("count", descending=True)
    if not rows.height:
        raise UsageError(f"level {chosen!r} of {view.name!r} released no totals (every group has sex × age cells)",
                         field="level")
    if top is not None:
        rows = rows.head(top)
    labels = [f"{g}:{i}" for g, i in
              zip(rows["geo_id"].cast(pl.String), rows["iteration"].cast(pl.String), strict=True)]
    margins = rows["moe95"].cast(pl.Float64).to_list() if "moe95" in rows.columns else None
    return chosen, labels, rows["count"].cast(pl.Float64).to_list(), margins
