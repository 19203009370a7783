"""Opening a release's inputs, as its task needs them (:class:`dpcli.tasks.Needs`), once and checked.

Every column a task reads is read as text from CSV and NDJSON, so its type comes from the query,
never from what one record holds (values are parsed per record while bounding; unparsable ones
are dropped). Parquet keeps its declared types. A public list of groups is read as text too and
cast to the data's types (text matches text exactly: "01" is not "1"); a block list stays text.
Each input is hashed as read: with how it was read, it enters the seed under its role, and what the
task reads of it (:class:`dpcli.release.seeds.Reads`: its Needs whole, and each list of groups'
digest as the release uses it) enters it too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli.access import Source
from dpcli.errors import DataError
from dpcli.frames import cheap_row_count, collect
from dpcli.io.inputs import open_input
from dpcli.io.opening import EarlyInput, EarlyInputs
from dpcli.io.schemas import TYPED_FORMATS, read_group_list, require_columns
from dpcli.io.tables import InputTable
from dpcli.release.seeds import Reads
from dpcli.tasks import Frames, Needs

if TYPE_CHECKING:
    from dpcli.tasks import P, Task


@dataclass(frozen=True)
class Sources:
    """The inputs a release reads, resolved through the gate (:mod:`dpcli.access`): its data, and its
    public lists by role (``keys``, ``domain``, ``blocks``)."""

    data: Source
    lists: Mapping[str, Source] = field(default_factory=dict)
    #: Paths read before the release (a tabulation's spec): an output must not overwrite them either.
    read_before: tuple[str, ...] = ()

    @property
    def locations(self) -> tuple[str, ...]:
        """Every path read (an output must be none of them)."""
        return (self.data.location, *(s.location for s in self.lists.values()), *self.read_before)


@dataclass(frozen=True)
class Opened:
    """The opened inputs: the data, its checked schema, and each public list (its table and its frame:
    a list of groups cast to the data's types, a block list as read)."""

    data: InputTable
    schema: pl.Schema
    lists: Mapping[str, tuple[InputTable, pl.DataFrame | pl.LazyFrame]] = field(default_factory=dict)
    documents: Mapping[str, Any] = field(default_factory=dict)
    #: What the task reads of them (None: opened without a task, e.g. by a test).
    needs: Needs | None = None

    @property
    def reads(self) -> Reads | None:
        """What the release reads of its inputs, for the seed: the task's Needs and each list of groups' digest."""
        if self.needs is None:
            return None
        partitions = {role: partition_digest(frame, self.needs.lists[role].columns)
                      for role, (_, frame) in self.lists.items()
                      if role in self.needs.lists and self.needs.lists[role].groups}
        return Reads(self.needs, partitions)

    @property
    def tables(self) -> tuple[InputTable, ...]:
        """Every input table (checked unchanged before the charge)."""
        return (self.data, *(table for table, _ in self.lists.values()))

    @property
    def seed_inputs(self) -> dict[str, Any]:
        """Every input by its role in the seed material: ``data``, the lists, the documents."""
        return {"data": self.data, **{role: table for role, (table, _) in self.lists.items()}, **self.documents}

    @property
    def fingerprints(self) -> dict[str, str]:
        """Each list's fingerprint by role (part of a schedule's name: :func:`dpcli.release.schedules.schedule_key`)."""
        return {role: table.fingerprint for role, (table, _) in self.lists.items()}

    def frames(self, counted: bool = True) -> Frames:
        """The inputs as a task computes on them; ``counted``: with a Parquet input's row count (from its metadata,
        but through a collect: a check before the debit reads none, :func:`dpcli.release.steps.prepare`)."""
        typed = {role for role, table in (("data", self.data), *((r, t) for r, (t, _) in self.lists.items()))
                 if table.format in TYPED_FORMATS}
        return Frames(self.data.frame, self.data.name, cheap_row_count(self.data) if counted else None, self.schema,
                      {role: frame for role, (_, frame) in self.lists.items()}, frozenset(typed))


def open_sources(needs: Needs, sources: Sources, *, early: EarlyInput | EarlyInputs | None = None,
                 data: InputTable | None = None) -> Opened:
    """Open ``sources`` as ``needs`` says: the data (``data`` if another engine listed it already: a URI
    Spark reads), its columns checked, then each public list; ``early``: the data file already opened
    and being hashed (:func:`dpcli.io.opening.hash_early`), or several inputs so (any of the data and the
    lists: ``sql``'s tables)."""
    table = data or open_input(sources.data, text_columns=tuple(needs.columns), early=early)
    schema = require_columns(table, dict(needs.columns)) if needs.check_columns else table.frame.collect_schema()
    lists: dict[str, tuple[InputTable, pl.DataFrame | pl.LazyFrame]] = {}
    for role, wanted in needs.lists.items():
        source = sources.lists.get(role)
        if source is None:
            if wanted.missing is not None:
                raise DataError(wanted.missing)
            continue
        several = early if isinstance(early, EarlyInputs) else None  # (one early input is the data's)
        listed = open_input(source, text_columns=wanted.columns, early=several)
        frame = read_group_list(listed, wanted.columns, schema) if wanted.cast_to_data else listed.frame
        lists[role] = (listed, frame)
    return Opened(table, schema, lists, dict(needs.documents), needs)


def partition_digest(frame: pl.DataFrame | pl.LazyFrame, columns: tuple[str, ...]) -> str:
    """A digest of a list of groups as the release uses it: its ``columns`` in that order (the i-th is the
    i-th group), distinct rows, sorted, with their types (a list cast to the data's types: the cast
    table; ``sql``'s list, as read, in the GROUP BY keys' order: its cast is a function of it and of the
    query). Two 64-bit row hashes per row (polars' ``hash_rows``, whose version the seed binds), so it is
    computed without a Python loop over the rows. A list that lacks one of the columns is ``missing``
    (its release then fails before any noise is drawn)."""
    lazy = frame.lazy() if isinstance(frame, pl.DataFrame) else frame
    if any(c not in lazy.collect_schema() for c in columns):
        return "missing"
    try:
        table = lazy.select(list(columns)).unique().sort(list(columns), nulls_last=True).collect()
    except pl.exceptions.PolarsError:
        return "unreadable"
    h = hashlib.sha256(repr([(n, str(t)) for n, t in table.schema.items()]).encode())
    for salt in (0, 1):
        h.update(table.hash_rows(seed=salt).to_numpy().tobytes())
    return "sha256:" + h.hexdigest()


def list_groups(needs: Needs, sources: Sources) -> dict[str, int]:
    """A dry run's count of the groups of each public list (its distinct rows over the columns the release needs,
    as the release opens it): public, read through the gate; no data read."""
    out: dict[str, int] = {}
    for role, wanted in needs.lists.items():
        source = sources.lists.get(role)
        if source is None:
            continue
        table = open_input(source, text_columns=wanted.columns)
        out[role] = int(collect(table.frame.select(list(wanted.columns)).unique().select(pl.len()),
                                f"cannot read {table.name}").item())
        table.verify_unchanged()
    return out


def check_data_schema(needs: Needs, sources: Sources) -> tuple[pl.Schema, str] | None:
    """A dry run's check of the data's schema (public: a CSV header, a Parquet footer, read through the gate,
    no record read), by the rule a release applies (:func:`dpcli.io.schemas.check_schema`): a missing column,
    or a Parquet column of a type the query cannot use (text given to ``--value``), is refused now, as the
    release would refuse it before its debit. The schema with the format, or None when the data declares
    none or is not there yet (NDJSON, standard input, a URI, a file still to come:
    :func:`dpcli.io.columns.declared_schema`)."""
    from dpcli.io.columns import declared_schema
    from dpcli.io.inputs import csv_delimiter
    from dpcli.io.schemas import SchemaOf, check_schema

    declared = declared_schema(sources.data)
    if declared is None:
        return None
    schema, fmt = declared
    if needs.check_columns:
        delimiter = csv_delimiter(sources.data.delimiter, sources.data.location) if fmt == "csv" else None
        check_schema(schema, dict(needs.columns), SchemaOf(sources.data.name, fmt, delimiter))
    return declared


def check_list_headers(needs: Needs, sources: Sources) -> None:
    """A dry run's check of each public list's header (public: read through the gate, no record read):
    a list without the columns the release needs is refused now, as the release would refuse it."""
    from dpcli.io.columns import column_names

    for role, wanted in needs.lists.items():
        source = sources.lists.get(role)
        names = column_names(source) if source is not None else None
        missing = [c for c in wanted.columns if names is not None and c not in names]
        if source is not None and missing:
            raise DataError(f"{source.name} lacks column {missing[0]!r} (a list of groups needs: "
                            f"{', '.join(wanted.columns)})")


def check_task_inputs(task: Task[P], frames: Frames, planned: P) -> None:
    """A task's own check of its inputs' schemas (:meth:`dpcli.tasks.Task.check_inputs`: ``dpcli sql``'s types
    from its per-user stage built lazily, ``stream-replay``'s value column, ``tabulate``'s spec columns), before
    the debit or in a dry run. Its messages follow the service-mode rule themselves (no column type named to an
    analyst)."""
    task.check_inputs(frames, planned)


def declared_frames(needs: Needs, sources: Sources, data: tuple[pl.Schema, str] | None) -> Frames | None:
    """The inputs as empty frames of their declared schemas (a dry run's: no record read), for
    :func:`check_task_inputs`; None when one of them declares none (NDJSON, standard input, a file to come)."""
    from dpcli.io.columns import declared_schema

    if data is None:
        return None
    data_schema, fmt = data
    lists: dict[str, pl.DataFrame | pl.LazyFrame] = {}
    typed = {"data"} if fmt in TYPED_FORMATS else set()
    for role, wanted in needs.lists.items():
        source = sources.lists.get(role)
        declared = declared_schema(source) if source is not None and not wanted.groups else None
        if source is not None and not wanted.groups:
            if declared is None:
                return None
            lists[role] = pl.LazyFrame(schema=declared[0])
            typed |= {role} if declared[1] in TYPED_FORMATS else set()
    return Frames(pl.LazyFrame(schema=data_schema), sources.data.name, None, data_schema, lists, frozenset(typed))
