"""The release path every command shares, as a library: open → seed → run → debit → report.

A release is computed in memory first (bad data fails before any debit), then
the ledger is charged durably, and only then may anything be written. The
seed is ``HMAC(key, seed material)``, where the material (:func:`seed_material`,
built here for every command) binds everything that shapes the output: the
query, each input's bytes with how they were read, the calibration (the
accounting mode and the plan: noise families, scales, thresholds) and the
engine versions. So the same query on the same bytes, read alike and calibrated
alike, is the same release (and a free replay), and anything else is not.

Library use (no CLI involved)::

    import dpcli
    query = dpcli.HistogramQuery(by=("country",), unit="user_id", aggregations=("count",),
                                 epsilon=Fraction(1, 2), delta=Fraction(1, 10**7))
    release = dpcli.release_histogram("views.parquet", query, state_dir=Path("state"), analyst="me")
    release.table, release.report  # the noisy table; what was charged and what is left
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl

from dpcli import bounding
from dpcli.access import Source
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.prf import (
    NOISE_VERSION,
    KeyedStream,
    canonical_json,
    derive_seed,
    seed_id,
)
from dpcli.errors import DataError, UsageError
from dpcli.frames import cheap_row_count
from dpcli.io.inputs import (
    InputTable,
    open_input,
    read_group_list,
    require_columns,
    verify_unchanged,
)
from dpcli.io.opening import EarlyInput
from dpcli.state import keys, ledger

if TYPE_CHECKING:  # loaded by the runners that use them: stream-replay and budget need neither
    from dpcli.tasks import histogram as hist
    from dpcli.tasks import topk as tk


@dataclass(frozen=True)
class ReleaseSeed:
    """The seed of one release and its public id."""

    seed: bytes
    id: str
    query_id: str


@dataclass(frozen=True)
class Engine:
    """Bounding on another engine (``--engine spark``): its totals function and what enters the seed.

    ``seed_tag`` enters the release seed. The CLI always sets one for Spark: the engines compute
    the same totals (selection v3, one number grammar; ``tests/test_spark.py``), but if they ever
    diverged silently (a reader that skips a file, two CSV parsers splitting a damaged record
    differently), a "free replay" across engines would reuse the noise over different values and
    publish their exact difference. So a Spark release has its own noise and its own charge. An
    empty tag (tests) gives polars' seed, and then the release is byte-identical to polars'.
    """

    totals: bounding.TotalsEngine
    seed_tag: str = ""
    #: ``histogram``'s quantile bins on this engine ((spec, salt, bins) → ``__bin``/``__n`` per group).
    quantile_counts: Any = None
    #: ``tabulate``'s counts on this engine (:data:`dpcli.tasks.tabulate.CountsEngine`).
    tabulate_counts: Any = None
    #: ``stream-replay``'s bounded events on this engine (:data:`dpcli.tasks.stream.events.EventsEngine`).
    stream_events: Any = None


#: The shape of the seed material (:func:`seed_material`), in one place for every command. 1: the
#: query, the inputs' fingerprints and the engine versions. 2 (issue 29): each input with how it was
#: read, and the calibration. A new version gives every release fresh noise (and a charge) once.
SEED_MATERIAL_VERSION = 2


class SeedInput(Protocol):
    """An input as it enters a seed (:class:`dpcli.io.inputs.InputTable`, :class:`DocumentInput`)."""

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
    """A plan as plain data for the seed: every field that takes part in its equality, recursively.

    A dataclass becomes the dict of its compared fields (``compare=False`` marks caches and
    display-only text, such as a stream plan's lazily filled threshold cache: two plans that compare
    equal calibrate the same noise); mappings and sequences keep their shape; numbers, text, booleans
    and None stay as they are (exact in :func:`dpcli.core.prf.canonical_json`). Any other type is
    refused, so a new plan field of a new kind fails loudly instead of staying out of the seed.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plan_material(getattr(value, f.name)) for f in dataclasses.fields(value) if f.compare}
    if isinstance(value, Mapping):
        return {str(k): plan_material(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plan_material(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str, Fraction, Decimal)):
        return value
    raise TypeError(f"a plan holds a {type(value).__name__}, which has no seed material")


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


def seed_material(query: dict[str, Any], inputs: Mapping[str, SeedInput], calibration: Calibration,
                  engine: Engine | None = None) -> dict[str, Any]:
    """Everything that shapes a release, as the data its seed is derived from (every command's seed).

    ``{"material": 2, "query": …, "inputs": {role: {"fingerprint", "reading", ["origin"]}},
    "calibration": {"mode", "plan"}, "engine": "polars …; bounding …; noise v2[; tag]"}``. A run is
    a free replay of another exactly when all of it is equal.
    """
    return {
        "material": SEED_MATERIAL_VERSION,
        "query": query,
        "inputs": {role: source.seed_material() for role, source in inputs.items()},
        "calibration": calibration.seed_material(),
        "engine": engine_versions(engine),
    }


def release_seed(root: Path, query: dict[str, Any], inputs: Mapping[str, SeedInput], calibration: Calibration,
                 engine: Engine | None = None) -> ReleaseSeed:
    """seed = HMAC(key, :func:`seed_material`); query id = hash of the query alone."""
    seed = derive_seed(keys.load_or_create_key(root), seed_material(query, inputs, calibration, engine))
    qid = "q:" + hashlib.sha256(canonical_json(query)).hexdigest()[:16]
    return ReleaseSeed(seed, seed_id(seed), qid)


@dataclass(frozen=True)
class Prepared:
    """A release computed in memory, not yet charged: its seed, cost, table and public metadata.

    Its table must not leave the process before :func:`charge` has debited it (the CLI and
    :func:`release_histogram` only ever hand out a charged :class:`Release`).
    """

    seed: ReleaseSeed
    events: list[PrivacyEvent]
    table: pl.DataFrame
    metadata: dict[str, Any]
    actual: list[PrivacyEvent] | None = None  # what it really cost, if less than ``events`` (topk's ⊥)


@dataclass(frozen=True)
class Release:
    """A charged release: the noisy table and the report of what was charged and what is left."""

    table: pl.DataFrame
    report: dict[str, Any]
    summary: str  # one line for humans (the CLI prints it on stderr)


@dataclass(frozen=True)
class QueryInputs:
    """The inputs of a grouped query, opened once, hashed and checked: the data and an optional public group list."""

    table: InputTable
    schema: pl.Schema
    groups: pl.DataFrame | None = None  # the public list of groups (--keys, --domain), cast to the data's types
    groups_table: InputTable | None = None
    group_list_name: str = "keys"  # the group list's role in the seed: keys (histogram) or domain (topk)

    @property
    def tables(self) -> tuple[InputTable | None, ...]:
        return (self.table, self.groups_table)

    @property
    def by_role(self) -> dict[str, InputTable]:
        """The inputs by their role in the seed material: ``data``, and the group list if any."""
        roles = {"data": self.table}
        if self.groups_table is not None:
            roles[self.group_list_name] = self.groups_table
        return roles

    @property
    def fingerprints(self) -> dict[str, str]:
        """Each input's fingerprint by role (part of a schedule's name: :func:`dpcli.state.schedules.schedule_key`)."""
        return {role: table.fingerprint for role, table in self.by_role.items()}


def open_query_inputs(
    source: str | Source,
    input_format: str | None,
    unit: str,
    by: tuple[str, ...],
    value: str | None = None,
    group_list: str | Source | None = None,
    group_list_name: str = "keys",
    delimiter: str = ",",
    table: InputTable | None = None,
    early: EarlyInput | None = None,
) -> QueryInputs:
    """Open the data (and a public group list) for a grouped query and check its columns.

    Every column the query uses is read as text from CSV/NDJSON, so its type comes from the query,
    never from what one record holds (values are parsed per record while bounding; unparsable ones
    are dropped). Parquet keeps its declared types. The group list is read as text too and cast to
    the data's types (text matches text exactly: "01" is not "1"). ``delimiter`` splits the data's
    CSV fields (a group list is always comma-separated). ``table`` is the data when it was opened
    elsewhere (a URI Spark listed: :func:`dpcli.spark.inputs.open_uri`); ``early``: the data file
    already opened and being hashed (:func:`dpcli.io.opening.hash_early`).
    """
    if table is None:
        table = open_input(source, input_format, text_columns=(unit, *by, *([value] if value else [])),
                           delimiter=delimiter, early=early)
    wanted: dict[str, Any] = {unit: "key", **{c: "key" for c in by}}
    if value:
        wanted[value] = "value"
    schema = require_columns(table, wanted)
    if group_list is None:
        return QueryInputs(table, schema, group_list_name=group_list_name)
    groups_table = open_input(group_list, text_columns=by)
    groups = read_group_list(groups_table, by, schema)
    return QueryInputs(table, schema, groups, groups_table, group_list_name)


def open_block_list(spec: Any) -> InputTable:
    """Open a tabulation spec's public block list once (fingerprinted; it enters the seed with its reading)."""
    from dpcli.tasks.tabulate import block_columns

    if spec.blocks is None:
        raise DataError("the spec needs geography.blocks: the public list of blocks groups are enumerated from")
    return open_input(block_list_source(spec), text_columns=tuple(block_columns(spec)))


def block_list_source(spec: Any) -> Source:
    """A spec's ``geography.blocks``: a catalog public name (always, in service mode), else a path next to the spec."""
    from dpcli.access import gate

    g = gate()
    if g.service or (g.catalog is not None and g.catalog.entry("public", spec.blocks) is not None):
        return g.public(spec.blocks, "geography.blocks")
    return Source(spec.blocks, str(spec.blocks_file))


def histogram_runner(root: Path, query: hist.HistogramQuery, inputs: QueryInputs,
                     limits: Any, engine: Engine | None = None) -> Callable[[Fraction | None], Prepared]:
    """ε → the histogram release at that ε (a schedule calls it with each run's ε)."""
    from dpcli.tasks import histogram as hist

    def run(eps: Fraction | None) -> Prepared:
        q = replace(query, epsilon=eps)
        plan = hist.plan_histogram(q, limits.mode, limits.values)
        seed = release_seed(root, {"command": "histogram", "v": 1, **q.canonical()}, inputs.by_role,
                            Calibration(limits.mode, plan), engine)
        result = hist.run_histogram(inputs.table.frame, q, plan, KeyedStream(seed.seed, "histogram"), inputs.groups,
                                    name=inputs.table.name, rows=cheap_row_count(inputs.table),
                                    engine=engine.totals if engine else None,
                                    quantile_engine=engine.quantile_counts if engine else None)
        metadata = {
            "command": "histogram",
            "groups": result.groups_released,
            "aggregations": list(q.aggregations),
            "max_partitions": q.max_partitions,
            "max_contributions": q.max_contributions,
            "split": plan.summary.get("split"),
            "threshold": plan.threshold,
            **result.metadata,
        }
        if q.epsilon is not None:
            metadata["epsilon"] = fraction_text(q.epsilon)
        return Prepared(seed, plan.events, result.table, metadata)

    return run


def topk_runner(root: Path, inputs: QueryInputs, limits: Any,
                engine: Engine | None = None) -> Callable[[tk.TopKQuery, str], Prepared]:
    """(query, accounting mode) → the top-k release (a schedule runs it in pure mode at each run's ε_per)."""
    from dpcli.tasks import topk as tk

    def run(q: tk.TopKQuery, mode: str) -> Prepared:
        plan = tk.plan_topk(q, mode, limits.values)
        seed = release_seed(root, {"command": "topk", "v": 1, **q.canonical()}, inputs.by_role, Calibration(mode, plan),
                            engine)
        result = tk.run_topk(inputs.table.frame, q, plan, KeyedStream(seed.seed, "topk"), inputs.groups,
                             name=inputs.table.name, rows=cheap_row_count(inputs.table),
                             engine=engine.totals if engine else None)
        result.metadata.update({"command": "topk", "guarantee": plan.guarantee})
        return Prepared(seed, plan.reserve, result.table, result.metadata, actual=result.actual)

    return run


def charge(
    root: Path,
    analyst: str,
    command: str,
    prepared: Prepared,
    summary_line: str,
    *,
    lock_timeout: float = 30.0,
    step: ledger.Step | None = None,
    before_output: Callable[[], None] | None = None,
    inputs: Sequence[InputTable | None] = (),
    output_digest: str | None = None,
) -> Release:
    """Debit ``prepared`` (free if this seed was already released) and report; nothing is written here.

    ``inputs`` (the tables the release read) are first checked to be unchanged since they were
    hashed: a file rewritten while it was read is refused (exit 66) with no debit.

    With ``step`` the release is a run against a stream's or schedule's state file, paid by its
    reservation (which ``step.create`` debits on the first run: the report then says
    ``"charged": true`` and lists it as ``reserved``). ``before_output`` runs after the debit (the
    state file's own write: ledger first, so a crash in between is retried as a free exact repeat).
    ``output_digest``: the digest of the file the release is about to be written to, recorded in the
    ledger entry (``dpcli plot`` in service mode draws only files whose digest a ledger holds).
    """
    verify_unchanged(*inputs)
    receipt = ledger.charge(root, analyst, command=command, query_id=prepared.seed.query_id,
                            seed_id=prepared.seed.id, reserve=prepared.events, actual=prepared.actual,
                            summary=summary_line, lock_timeout=lock_timeout, step=step, output=output_digest)
    if before_output is not None:
        before_output()
    charged = prepared.actual if prepared.actual is not None else prepared.events
    report = {
        **prepared.metadata,
        "cost": [] if step else [e.to_json() for e in charged],
        "charged": not receipt.replay and (step is None or bool(receipt.reserved)),
        "seed_id": prepared.seed.id,
        "ledger": {**receipt.to_json(), "remaining": receipt.remaining},
    }
    if receipt.reserved:
        report["reserved"] = [e.to_json() for e in receipt.reserved]
    if receipt.replay:
        cost = "free replay of an earlier identical release"
    elif receipt.reserved:
        cost = "reserved " + cost_text(list(receipt.reserved)) + ", which covers this run"
    elif step:
        cost = "covered by the reservation"
    else:
        cost = "charged " + cost_text(charged)
    remaining = ", ".join(f"{k}={v}" for k, v in report["ledger"]["remaining"].items())
    return Release(prepared.table, report, f"{summary_line}; {cost}; remaining {remaining}")


def cost_text(events: list[PrivacyEvent]) -> str:
    """``mechanism (epsilon=…, delta=…) + …``: a release's cost in one line."""
    parts = []
    for e in events:
        bits = [f"{k}={v}" for k, v in e.to_json().items() if k in ("epsilon", "delta", "rho", "units", "calls")]
        parts.append(f"{e.mechanism} ({', '.join(bits)})")
    return " + ".join(parts)


def histogram_summary(table_name: str, metadata: dict[str, Any]) -> str:
    """The one-line summary of a histogram release (public parameters and noisy counts only)."""
    line = f"histogram of {table_name}: {metadata['groups']} group(s) released"
    if metadata.get("threshold") is not None:
        line += f" (threshold {metadata['threshold']} noisy units)"
    return line


def release_histogram(
    source: str,
    query: hist.HistogramQuery,
    *,
    state_dir: Path,
    analyst: str = "default",
    keys: str | None = None,
    input_format: str | None = None,
    lock_timeout: float = 30.0,
) -> Release:
    """Run and charge one histogram release on a file: the library form of ``dpcli histogram``.

    ``keys`` is a public list of groups (known domain); without it groups are discovered and
    thresholded. The analyst's ledger in ``state_dir`` must exist and is debited before this returns.
    """
    if (keys is None) == (query.domain == "keys"):
        raise UsageError("a public list of groups is given exactly when the query's domain is 'keys'", field="keys")
    limits = ledger.read_ledger(state_dir, analyst, lock_timeout).limits
    query.validate()
    inputs = open_query_inputs(source, input_format, query.unit, query.by, query.value, keys)
    prepared = histogram_runner(state_dir, query, inputs, limits)(query.epsilon)
    return charge(state_dir, analyst, "histogram", prepared, histogram_summary(inputs.table.name, prepared.metadata),
                  lock_timeout=lock_timeout, inputs=inputs.tables)
