"""The release seed: ``HMAC(key, seed material)``, the material built in one place for every command (and for the
seeds a release's continuation keeps: a stream state's, :func:`stream_seed`, and a schedule's size noise,
:func:`schedule_sizes_seed`).

The material (:func:`seed_material`) binds everything that shapes an output: the query, each
input's bytes with how they were read, the calibration (the accounting mode and the plan: noise
families, scales, thresholds) and the engine versions. So the same query on the same bytes, read
alike and calibrated alike, is the same release (and a free replay), and anything else is not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path, PurePath
from typing import Any, Protocol

import polars as pl

from dpcli import bounding
from dpcli.core.prf import NOISE_VERSION, canonical_json, derive_seed, seed_id
from dpcli.state import keys
from dpcli.tasks import Engine, auto_bounds, bias_report


@dataclass(frozen=True)
class ReleaseSeed:
    """The seed of one release and its public id."""

    seed: bytes
    id: str
    query_id: str


#: The shape of the seed material (:func:`seed_material`), in one place for every command. 1: the
#: query, the inputs' fingerprints and the engine versions. 2 (issue 29): each input with how it was
#: read, and the calibration. 3 (issue 37): what the task reads of every input (its
#: :class:`dpcli.tasks.Needs` whole: the data's columns, each list's columns in order, so which list
#: column became which group, for every format, Parquet too) and a digest of each public list as the
#: release uses it (the cast, deduplicated, sorted partition table), and the resolved task whole,
#: by construction (:func:`task_material`: every field but the free-replay ones, instead of each
#: task's hand-picked query). 4 (issue 38): the versions of the rules that choose bounds and report what they
#: cut, and a digest of the constants of the command's rule modules (:func:`rule_versions`). A new version gives
#: every release fresh noise (and a charge) once.
SEED_MATERIAL_VERSION = 4


class SeedInput(Protocol):
    """An input as it enters a seed (:class:`dpcli.io.tables.InputTable`, :class:`DocumentInput`)."""

    def seed_material(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class DocumentInput:
    """An input dpcli reads whole and parses itself (a tabulation spec, TOML): its fingerprint and format."""

    fingerprint: str
    format: str

    def seed_material(self) -> dict[str, Any]:
        """The bytes' fingerprint and how they were read (one parser, so its format is all of it)."""
        return {"fingerprint": self.fingerprint, "reading": {"format": self.format}}


def plan_material(value: Any) -> Any:
    """A task, its plan or anything they hold as plain data for the seed: every field, recursively.

    A dataclass becomes ``{"type": its class name, field: material…}`` over every field but those
    marked to stay out: ``compare=False`` (caches and display-only text, such as a stream plan's
    lazily filled threshold cache: two plans that compare equal calibrate the same noise) and
    :func:`dpcli.tasks.free_replay` (what acts only after the noise, listed in
    :data:`dpcli.tasks.FREE_REPLAY`) and :func:`dpcli.tasks.bound_elsewhere` (what acts only through
    another part of the material, bound by content: a spec's directory). Mappings and sequences keep
    their shape; numbers, text, booleans and None stay as they are (exact in
    :func:`dpcli.core.prf.canonical_json`); paths and moments become text. Any other type is
    refused, so a new field of a new kind fails loudly instead of staying out of the seed.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__, **_bound_fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plan_material(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plan_material(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str, Fraction, Decimal)):
        return value
    if isinstance(value, (PurePath, datetime)):
        return {type(value).__name__: str(value)}
    raise TypeError(f"a task or plan holds a {type(value).__name__}, which has no seed material")


def _bound_fields(value: Any) -> dict[str, Any]:
    """A dataclass instance's fields that enter the seed, as material."""
    return {f.name: plan_material(getattr(value, f.name)) for f in dataclasses.fields(value)
            if f.compare and "free_replay" not in f.metadata and "bound_elsewhere" not in f.metadata}


def task_material(task: Any) -> dict[str, Any]:
    """The resolved task as it enters the seed, by construction: every field of it (its query, options,
    tables, bounds, targets and choices), recursively, but the :data:`dpcli.tasks.FREE_REPLAY` ones."""
    return {"command": task.command, "task": plan_material(task)}


@dataclass(frozen=True)
class Calibration:
    """What turns a query into noise: the accounting mode its plan was made for, and the plan.

    ``plan`` is the task's plan object as the release runs it (:class:`dpcli.tasks.histogram.HistogramPlan`,
    :class:`dpcli.tasks.topk.TopKPlan`, :class:`dpcli.tasks.stream.plan.StreamPlan`,
    :class:`dpcli.tasks.tabulate.TabulatePlan`): noise families and scales, thresholds, the split of
    ε, a br ledger's ε_per. All of it enters the seed (:func:`plan_material`): two ledgers that
    calibrate one query differently (pure and br: Laplace scales 2 and 4) never share noise.
    """

    mode: str
    plan: Any

    def seed_material(self) -> dict[str, Any]:
        return {"mode": self.mode, "plan": plan_material(self.plan)}


def engine_versions(engine: Engine | None = None) -> str:
    """The versions of what computes a release: polars, the bounding semantics, the noise, another engine's tag."""
    versions = f"polars {pl.__version__}; bounding {bounding.SEMANTICS}; noise v{NOISE_VERSION}"
    if engine is not None and engine.seed_tag:
        versions += f"; {engine.seed_tag}"
    return versions


@dataclass(frozen=True)
class Reads:
    """What a release reads of its inputs, as it enters the seed (material v3).

    ``needs``: the task's :class:`dpcli.tasks.Needs`, whole (:func:`plan_material`: every
    field, so a new field of it enters the seed without being listed): which columns of the data
    are read and how they are checked, and for every public list which of its columns are read, in
    what order (the i-th column read is the i-th group: a list column → group map), for every
    format. ``partitions``: each public list's digest as the release uses it
    (:func:`dpcli.release.inputs.partition_digest`). Built once per release by
    :func:`dpcli.release.inputs.reads_of`.
    """

    needs: Any
    partitions: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def seed_material(self) -> dict[str, Any]:
        return {"needs": plan_material(self.needs), "partitions": dict(self.partitions)}


#: The modules whose module-level constants are rules a release of each command runs besides its mechanisms: the
#: choice of bounds (grids, levels, weights, slacks, the lean), the bias report, quantiles (their grid, the widening
#: of chosen limits, gap sampling's chunks, the interval's split), topk's selection, sql's and a stream's choices,
#: the targets' search, tabulate's spec rules. A command not listed binds all of them.
_SHARED = ("auto_bounds", "bias_report", "quantile_gaps", "targets")
RULE_MODULES: dict[str, tuple[str, ...]] = {
    "histogram": (*_SHARED, "histogram.query", "histogram.plan", "histogram.run", "histogram.auto",
                  "quantile_interval"),
    "topk": (*_SHARED, "topk.query", "topk.plan", "topk.run", "topk.auto", "topk.threshold", "topk.target"),
    "sql": (*_SHARED, "sql.auto", "sql.chosen", "sql.fixed", "sql.plan"),
    "stream-replay": (*_SHARED, "stream.auto", "stream.plan"),
    "tabulate": ("tabulate.query", "tabulate.plan", "tabulate.run"),
}


def rule_versions(command: str | None = None) -> dict[str, str]:
    """The rules a release may run besides its mechanisms, bound into every seed whether it runs them or not (so no
    rule can change while its releases keep their seeds and their free replays).

    By version (the choice of bounds, :data:`dpcli.tasks.auto_bounds.AUTO_VERSION` and
    :data:`dpcli.tasks.auto_bounds.BIAS_VARIANCE_RULE`, and the bias report, :data:`dpcli.tasks.bias_report.RULE`)
    and by construction: ``constants`` is a digest of every module-level constant (an UPPER_CASE name holding a
    number, a text, a fraction, or a tuple or mapping of them) of ``command``'s :data:`RULE_MODULES`, read when
    the seed is made, so a constant changed (a widening of quantile limits, a weight, a share) changes the seeds
    even where nobody bumped a version (the review of seed material 4 found one that shaped releases and entered
    no seed: ``histogram.QUANTILE_WIDEN_STEPS``)."""
    return {"auto": str(auto_bounds.AUTO_VERSION), "choice": auto_bounds.BIAS_VARIANCE_RULE,
            "bias report": bias_report.RULE, "constants": _constants_digest(command)}


def _constants_digest(command: str | None) -> str:
    """The digest of the constants of ``command``'s rule modules by name (where a constant lives does not enter it:
    a refactor that moves one between these modules keeps every seed; one name holding two values keeps both)."""
    names = RULE_MODULES.get(command or "") or sorted({n for ns in RULE_MODULES.values() for n in ns})
    found: dict[str, set[str]] = {}
    for name in names:
        for k, v in vars(importlib.import_module(f"dpcli.tasks.{name}")).items():
            if _CONSTANT.fullmatch(k) and _is_plain(v):
                found.setdefault(k, set()).add(json.dumps(_constant(v), sort_keys=True))
    text = json.dumps({k: sorted(v) for k, v in sorted(found.items())})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_CONSTANT = re.compile(r"[A-Z][A-Z0-9_]*")


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, Fraction)):
        return True
    if isinstance(value, (tuple, list, frozenset)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _constant(value: Any) -> Any:
    """A constant as JSON: exact (a float by its repr, a fraction as n/d), sets sorted."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Fraction):
        return f"{value.numerator}/{value.denominator}"
    if isinstance(value, frozenset):
        return sorted(repr(v) for v in value)
    if isinstance(value, (tuple, list)):
        return [_constant(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _constant(v) for k, v in value.items()}
    return value


def seed_material(query: dict[str, Any], inputs: Mapping[str, SeedInput], calibration: Calibration,
                  engine: Engine | None = None, reads: Reads | None = None) -> dict[str, Any]:
    """Everything that shapes a release, as the data its seed is derived from (every command's seed).

    ``{"material": 4, "query": …, "inputs": {role: {"fingerprint", "reading", ["origin"]}},
    "reads": {"needs", "partitions"} | None, "calibration": {"mode", "plan"},
    "engine": "polars …; bounding …; noise v2[; tag]", "rules": {"auto", "choice", "bias report", "constants"}}``.
    A run is
    a free replay of another exactly when all of it is equal. ``reads`` is None only for seeds that read no input
    as a release does (a stream state's seed, made once for every run: each run's input is bound by its step
    digest).
    """
    return {
        "material": SEED_MATERIAL_VERSION,
        "query": query,
        "inputs": {role: source.seed_material() for role, source in inputs.items()},
        "reads": reads.seed_material() if reads is not None else None,
        "calibration": calibration.seed_material(),
        "engine": engine_versions(engine),
        "rules": rule_versions(query.get("command")),
    }


def release_seed(root: Path, query: dict[str, Any], inputs: Mapping[str, SeedInput], calibration: Calibration,
                 engine: Engine | None = None, reads: Reads | None = None) -> ReleaseSeed:
    """seed = HMAC(key, :func:`seed_material`); query id = hash of the query alone."""
    seed = derive_seed(keys.load_or_create_key(root), seed_material(query, inputs, calibration, engine, reads))
    qid = "q:" + hashlib.sha256(canonical_json(query)).hexdigest()[:16]
    return ReleaseSeed(seed, seed_id(seed), qid)


def stream_seed(root: Path, query: Any, reservation: str, calibration: Calibration) -> ReleaseSeed:
    """A stream's seed, made once when its ``--state`` file is created and kept in it for every run: the stream's
    query (:func:`plan_material`) and a fresh reservation id, with the calibration and no input (each run's input,
    with its reading, is bound by the run's step digest in the ledger: :mod:`dpcli.release.streams`)."""
    material = {"command": "stream-replay", "query": plan_material(query), "reservation": reservation}
    return release_seed(root, material, {}, calibration)


def schedule_sizes_seed(root: Path, state: Mapping[str, Any], snapshot: SeedInput) -> ReleaseSeed:
    """The seed of a ``--schedule``'s size noise (bbscheduler's noisy unit counts) on one snapshot: the schedule's
    key and reservation, the snapshot (its bytes and how they were read) and, as the calibration, the schedule's
    spec and γ (they set every size noise's scale). The same snapshot gets the same noise within a schedule
    (asking again reveals nothing new), a new snapshot or a new schedule fresh noise."""
    material = {"command": "schedule-sizes", "v": 1, "schedule": state["key"], "reservation": state["reservation"]}
    calibration = Calibration("schedule", {"spec": state["spec"], "gamma": state.get("gamma")})
    return release_seed(root, material, {"data": snapshot}, calibration)
