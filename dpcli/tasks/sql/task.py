"""``dpcli sql`` as a :class:`dpcli.tasks.Task`: the query resolved once, then the one release path.

The task is built from the query text and the declared tables (:meth:`SqlTask.from_text`): the
query is parsed and resolved, and every rule checked, before the release path reads any state or
data. Its first private table (in the order the query names them) is the release's data input;
every other table is read beside it under the role ``table:NAME`` (and a public list of groups as
``keys``), each opened once, hashed, and bound into the seed with how it was read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import DataError, UsageError
from dpcli.tasks import Engine, Frames, Needs, PublicList, Result, TaskDefaults, free_replay
from dpcli.tasks.auto_bounds import AUTO_SHARE, AutoBounds
from dpcli.tasks.reports import SqlReport
from dpcli.tasks.sql import auto as sql_auto
from dpcli.tasks.sql import owners
from dpcli.tasks.sql.compile import needed_columns
from dpcli.tasks.sql.fanout import check_fanout, check_private_work
from dpcli.tasks.sql.ir import Col, ResolvedQuery, column_source, scans_of
from dpcli.tasks.sql.outputs import Noisy, apply_post, output_table
from dpcli.tasks.sql.plan import Budget, Measure, SqlPlan, measures_of, plan_measures
from dpcli.tasks.sql.query import resolve_query
from dpcli.tasks.sql.run import (
    STREAM_LABEL,
    Layout,
    add_noise,
    compute_totals,
    per_user_frame,
    select_partitions,
)
from dpcli.tasks.sql.scope import TableDecl, owner_of
from dpcli.tasks.sql.typed import schema_of

if TYPE_CHECKING:
    from sqlglot import exp

    from dpcli.advice import Note
    from dpcli.tasks.dry_runs import SqlDryRun

#: ``--max-rows-per-table``'s default: at most this many rows per unit of each private table, before any join
#: (chosen so that it binds on none of the demo's and the tests' data: their largest is 1,140 rows).
DEFAULT_MAX_ROWS_PER_TABLE = 10_000

#: The role of a table other than the data input (``table:visits``), and of the public list of groups.
TABLE_ROLE = "table:"
KEYS_ROLE = "keys"


@dataclass(frozen=True)
class SqlOptions:
    """The options of a ``dpcli sql`` release besides its query (``keys``: a public list of groups is given)."""

    budget: Budget = field(default_factory=Budget)
    max_partitions: int = 1
    max_contributions: int = 1
    keys: bool = False
    with_error: bool = free_replay("--with-error", default=False)
    #: The bounds chosen from the data (``auto``; the caps above are then placeholders of 1), and the share of
    #: the ``--report-bias`` counts (None: no report).
    auto: AutoBounds | None = None
    bias_share: Fraction | None = None
    #: At most this many rows per unit of each private table, kept by the keyed order before any join.
    max_rows_per_table: int = DEFAULT_MAX_ROWS_PER_TABLE

    def check(self) -> None:
        for name in ("max_partitions", "max_contributions", "max_rows_per_table"):
            if not 1 <= getattr(self, name) <= 10**6:
                raise UsageError("must be in 1–1000000", field=name)
        if self.budget.noise not in ("laplace", "gaussian"):
            raise UsageError(f"must be laplace or gaussian, got {self.budget.noise!r}", field="noise")


@dataclass(frozen=True)
class SqlTask(TaskDefaults):
    """One ``dpcli sql`` release (see the module docstring). ``defaulted``: the caps left at their defaults."""

    query: ResolvedQuery
    tables: tuple[TableDecl, ...]
    options: SqlOptions = SqlOptions()
    noise_given: bool = True
    defaulted: tuple[str, ...] = free_replay("notes' wording", default=())
    unit_label: str | None = free_replay("notes' wording", default=None)
    command: str = "sql"
    left_out_stays: str | None = free_replay("notes' wording", default=None)
    left_out_chosen: tuple[str, ...] = free_replay("notes' wording", default=())
    #: The bias report was added by default (:meth:`with_report`), not asked for: dropped where it cannot run.
    report_defaulted: bool = free_replay("notes' wording", default=False)

    @classmethod
    def from_text(cls, text: str | exp.Select, tables: Mapping[str, TableDecl], options: SqlOptions,
                  noise_given: bool = True, defaulted: tuple[str, ...] = (), unit_label: str | None = None,
                  choose_left_out: bool = False, report_left_out: bool = False) -> SqlTask:
        """Resolve ``text`` (or its tree, parsed once: :func:`dpcli.tasks.sql.parse.parse_query`) over ``tables``
        (refusals are usage errors, before anything is read). With
        ``choose_left_out`` (the CLI's default on polars), the caps in ``defaulted`` are chosen from the data
        where they bound something (:meth:`with_defaults`); with ``report_left_out`` (the CLI's default on
        polars without ``--report-bias``/``--no-report-bias``), a bias report where it can run
        (:meth:`with_report`)."""
        options.check()
        chosen = options.auto is not None and options.auto.contributions
        chosen = chosen or (choose_left_out and "max_contributions" in defaulted)
        tables = owners.settle(tables)
        query = resolve_query(text, tables, sql_auto.DEFAULT_CAP_AUTO if chosen else options.max_contributions)
        used = owners.with_ancestors(tables, {s.table for s in scans_of(query.relation)})
        task = cls(query, tuple(tables[t] for t in sorted(used)), options, noise_given, defaulted, unit_label)
        task = task.with_defaults() if choose_left_out else task
        return task.with_report() if report_left_out else task

    def with_report(self) -> SqlTask:
        """A bias report at :data:`dpcli.tasks.bias_report.BIAS_SHARE` of the budget unless one is set, the budget
        has no ε or ρ, the shares would leave the release less than half, or its noise cannot be drawn (public
        inputs only; :meth:`for_ledger` drops it where the ledger cannot take its part)."""
        from dpcli.tasks.bias_report import BIAS_SHARE

        o = self.options
        if o.bias_share is not None or (o.budget.epsilon is None and o.budget.rho is None):
            return self
        if not self.query.groups and not self.capped_by_default():  # no bound in force can cut a row
            return self
        try:
            sql_auto.check_auto(self.query, o.auto, BIAS_SHARE)
            sql_auto.check_noise(o.auto, BIAS_SHARE, *self.unit_budget())
        except UsageError:
            return self
        return replace(self, options=replace(o, bias_share=BIAS_SHARE), report_defaulted=True)

    def with_defaults(self) -> SqlTask:
        """The caps left out (``defaulted``) as ``auto`` at :data:`dpcli.tasks.auto_bounds.AUTO_SHARE` where they
        bound something (``--max-partitions`` with a GROUP BY, ``--max-contributions`` with an ``ANON_COUNT``
        without its own cap) and the choice's noise can be drawn at this budget; else they stay at 1 and
        ``left_out_stays`` says why. Built from a query resolved with every default-cap count at
        :data:`sql_auto.DEFAULT_CAP_AUTO`; public inputs only."""
        q, o = self.query, self.options
        asked = o.auto or AutoBounds(False, False, False)
        parts = "max_partitions" in self.defaulted and bool(q.groups)
        counts = "max_contributions" in self.defaulted and sql_auto.default_counts(q)
        request = AutoBounds(asked.partitions or parts, asked.contributions or counts, False,
                             o.auto.share if o.auto else AUTO_SHARE)
        fixed = replace(self, query=q if asked.contributions else sql_auto.with_caps(q, o.max_contributions))
        if not parts and not counts:
            return fixed
        if o.budget.epsilon is None and o.budget.rho is None:  # refused later, as without the defaults (a br ledger's
            return replace(fixed, left_out_stays="no ε or ρ")  # ε_per is no sql budget)
        try:
            sql_auto.check_auto(q, request, o.bias_share)
            sql_auto.check_noise(request, o.bias_share, *self.unit_budget())
        except UsageError:
            return replace(fixed, left_out_stays="an ε too small to spend a share on them")
        chosen = (*(["max_partitions"] * parts), *(["max_contributions"] * counts))
        return replace(self, query=q if request.contributions else fixed.query, options=replace(o, auto=request),
                       left_out_chosen=chosen, defaulted=tuple(f for f in self.defaulted if f not in chosen))

    @property
    def stability(self) -> int:
        """How many units one unit's rows can move, as the release is calibrated: 1, or through the links of the
        owned tables the query reads :func:`dpcli.tasks.sql.owners.stability`."""
        return owners.stability({t.name: t for t in self.tables}, {s.table for s in scans_of(self.query.relation)})

    def unit_budget(self) -> tuple[Fraction | None, Fraction | None]:
        """(ε, ρ) at which a mechanism of sensitivity 1 per unit is as private as the budget at :attr:`stability`:
        ε/S and ρ/S² (choosing bounds, the bias report: each counts units)."""
        b, s = self.options.budget, self.stability
        return (None if b.epsilon is None else b.epsilon / s), (None if b.rho is None else b.rho / s**2)

    @property
    def unit_word(self) -> str:
        """How notes name the privacy unit: ``unit_label`` (a service-mode analyst's "unit"), else its column."""
        data = self.data_table()
        return self.unit_label or next(t.unit or "unit" for t in self.tables if t.name == data)

    # ---- the Task protocol ------------------------------------------------------------------

    def check(self) -> None:
        self.options.check()
        check_private_work(self.query.relation, self.options.max_rows_per_table)
        sql_auto.check_auto(self.query, self.options.auto, self.options.bias_share)
        if self.options.keys and not self.query.groups:
            raise UsageError("a public list of groups needs a GROUP BY", field="keys")
        names = [o.name for o in self.query.outputs]
        if self.options.with_error and any(f"{n}_moe95" in names for n in names):
            raise UsageError("an output column is named like another's margin (NAME_moe95): rename it")

    def for_ledger(self, mode: str) -> SqlTask:
        task = self
        if mode in ("approx", "pld") and self.options.budget.rho is not None and self.left_out_chosen:
            task = self._left_out_kept(f"ρ on an {mode} ledger")  # the choice's zCDP part has no δ to convert at
        if mode in ("approx", "pld") and self.options.budget.rho is not None and self.report_defaulted:  # nor its
            task = replace(task, options=replace(task.options, bias_share=None), report_defaulted=False)
        if task.noise_given or mode != "zcdp":
            return task
        budget = replace(task.options.budget, noise="gaussian")
        return replace(task, options=replace(task.options, budget=budget), noise_given=True)

    def _left_out_kept(self, why: str) -> SqlTask:
        """The caps :meth:`with_defaults` chose to leave to the data, back at the caps given (1), and why."""
        o, chosen = self.options, set(self.left_out_chosen)
        assert o.auto is not None
        auto = AutoBounds(o.auto.partitions and "max_partitions" not in chosen,
                          o.auto.contributions and "max_contributions" not in chosen, False, o.auto.share)
        query = sql_auto.with_caps(self.query, o.max_contributions) if not auto.contributions else self.query
        return replace(self, query=query, options=replace(o, auto=auto if auto.any else None), left_out_chosen=(),
                       left_out_stays=why, defaulted=(*self.defaulted, *self.left_out_chosen))

    @property
    def domain(self) -> str:
        if not self.query.groups:
            return "all"
        return "keys" if self.options.keys else "threshold"

    def data_table(self) -> str:
        """The table read as the release's data input: the first private table the query names."""
        return next(s.table for s in scans_of(self.query.relation) if s.unit is not None)

    def roles(self) -> dict[str, str]:
        """Each table's input role: ``data`` for :meth:`data_table`, ``table:NAME`` for the others."""
        data = self.data_table()
        return {t.name: "data" if t.name == data else TABLE_ROLE + t.name for t in self.tables}

    def table_columns(self) -> dict[str, tuple[str, ...]]:
        """The columns the query reads from each table (its privacy unit always)."""
        measures = measures_of(self.query.aggregates, self.options.max_contributions, False)
        extra = [*self.query.groups, *(m.value for m in measures if m.value is not None)]
        by_scan = needed_columns(self.query.relation, extra)
        out: dict[str, set[str]] = {t.name: {t.unit} if t.unit else set() for t in self.tables}
        for scan in scans_of(self.query.relation):
            out[scan.table] |= by_scan[scan.prefix]
        for t in self.tables:  # an owned table's unit is resolved, not read: its link and its parent's key are
            if (link := owner_of(t)) is not None:
                out[t.name] = (out[t.name] - {t.unit}) | {link.column}
                out[link.parent].add(link.key)
        return {t: tuple(sorted(cols)) for t, cols in out.items()}

    def check_lists(self, lists: Mapping[str, pl.DataFrame | pl.LazyFrame]) -> None:
        """A ``--keys`` list must have the GROUP BY keys' output names and list a group (public: refused before
        the debit; whether its values cast to the groups' types is seen by the run)."""
        if not self.options.keys:
            return
        listed = lists[KEYS_ROLE]
        frame = listed if isinstance(listed, pl.LazyFrame) else listed.lazy()
        missing = [n for n in self.query.group_names if n not in schema_of(frame)]
        if missing:
            raise DataError(f"the list of groups lacks column {missing[0]!r} (it needs the GROUP BY keys' output "
                            f"names: {', '.join(self.query.group_names)})")
        if frame.select(pl.len()).collect().item() == 0:  # a public list: counting its rows reads nothing private
            raise DataError("the list of groups lists no groups")

    def check_inputs(self, frames: Frames, plan: SqlPlan) -> None:
        """Refuse, from the tables' schemas alone (before the debit; a dry run on their declared schemas),
        what the run would refuse once it builds the per-user stage: a column of a type the query cannot
        use (a date summed, a float or nested GROUP BY key), and an ANON_ function given a column that a
        typed table (Parquet) declares as text. That type is schema: its values are text, not numbers to
        parse, and a release would aggregate nothing but noise. In a CSV or NDJSON every column is text and
        is parsed per record (a value that does not parse is dropped); CAST(col AS DOUBLE) asks for that
        parse on Parquet text too. A service-mode analyst is told neither the type nor another column."""
        from dpcli.access import gate

        try:
            self._check_types(frames, plan)
        except DataError:
            if gate().restricted:  # the types of the columns they read are not theirs to read
                raise DataError("a column the query reads cannot be used as the query asks (by its type)") from None
            raise

    def _check_types(self, frames: Frames, plan: SqlPlan) -> None:
        tables = owners.resolve(self.table_map, self._frames(frames))
        per_user_frame(self.query, plan, tables, self.query.group_names)  # builds lazily: reads no record
        roles = self.roles()
        for m in (c.measure for c in plan.calibrated):
            if m.kind == "count" or not isinstance(m.value, Col):
                continue
            found = column_source(self.query.relation, m.value.name)
            if found is None or roles[found[0]] not in frames.typed:
                continue
            table, column = found
            if schema_of(tables[table]).get(column) == pl.String:
                raise DataError(f"column {column!r} of table {table!r} is text (its declared type) and is "
                                "aggregated as a number: give a numeric column, or CAST it AS DOUBLE to read "
                                "its text as numbers")

    def needs(self) -> Needs:
        columns, data = self.table_columns(), self.data_table()
        decl = self.table_map[data]
        link = owner_of(decl)
        unit = decl.unit if link is None else link.column  # (an owned table's unit is its link's key)
        lists = {TABLE_ROLE + t: PublicList(cols, cast_to_data=False, groups=False)
                 for t, cols in columns.items() if t != data}
        if self.options.keys:
            lists[KEYS_ROLE] = PublicList(self.query.group_names, cast_to_data=False,
                                          missing="a public list of groups was announced but not given")
        return Needs({c: "key" if c == unit else "any" for c in columns[data]}, lists)

    def plan(self, mode: str, limits: Mapping[str, Fraction]) -> SqlPlan:
        """The release's calibration at its part of the budget, and the events of the other parts (choosing the
        bounds, the bias report). With ``auto`` the caps are placeholders: the events do not depend on them."""
        o = self.options
        query = sql_auto.with_caps(self.query, o.max_contributions)
        parts = sql_auto.parts_of(o.auto, o.bias_share)
        measures = measures_of(query.aggregates, o.max_contributions, self.domain == "threshold")
        planned = plan_measures(measures, sql_auto.release_budget(o.budget, parts), self.domain, o.max_partitions,
                                mode, o.with_error, self.stability)
        extra = parts.events("sql", o.budget.epsilon, o.budget.rho)
        sql_auto.check_noise(o.auto, o.bias_share, *self.unit_budget())
        return replace(planned, events=planned.events + tuple(extra), ledger=(mode, dict(limits)))

    def at_bounds(self, max_partitions: int, max_contributions: int) -> SqlTask:
        """The same release with these bounds in force (counts at the default cap capped at ``max_contributions``)."""
        options = replace(self.options, max_partitions=max_partitions, max_contributions=max_contributions)
        return replace(self, query=sql_auto.with_caps(self.query, max_contributions), options=options)

    def describe(self, plan: SqlPlan) -> SqlDryRun:
        from dpcli.tasks.sql.describe import describe_plan

        return describe_plan(self, plan)

    def capped_tables(self, tables: Mapping[str, pl.LazyFrame], salt: int) -> dict[str, pl.LazyFrame]:
        """Each private table the query reads with at most ``max_rows_per_table`` rows per unit (the first by the
        keyed order of the columns the query reads from it, in name order, after an owned table's unit:
        :func:`dpcli.bounding.keyed_order.cap_rows`), applied right after the table is read (and an owned table's
        unit resolved: :func:`dpcli.tasks.sql.owners.resolve`), before its WHERE and any join; public tables as
        they are."""
        from dpcli.bounding.keyed_order import cap_rows

        columns, resolved = self.table_columns(), owners.resolve(self.table_map, tables)
        scanned, out = {s.table for s in scans_of(self.query.relation)}, dict(resolved)
        for t in self.tables:
            if t.unit is None or t.name not in scanned:
                continue
            schema = schema_of(resolved[t.name])
            for c in columns[t.name]:
                if c not in schema:
                    raise DataError(f"column {c!r} not found in {t.name}")
            fields = [(t.unit, schema[t.unit]), *((c, schema[c]) for c in columns[t.name] if c != t.unit)]
            out[t.name] = cap_rows(resolved[t.name], t.unit, fields, salt, t.name, self.options.max_rows_per_table)
        return out

    def public_tables(self) -> dict[str, tuple[str, ...]]:
        """The public tables the query reads, each with the columns it reads (as text, when a file declares none)."""
        columns = self.table_columns()
        return {t.name: columns[t.name] for t in self.tables if t.unit is None}

    def check_fanout(self, public: Mapping[str, pl.LazyFrame]) -> None:
        """Refuse the query when its joins with public tables (``public``, by name: nothing private is read) can
        make one private row more than :data:`dpcli.tasks.sql.fanout.MAX_FANOUT` rows, or one person's rows
        (at ``--max-rows-per-table`` per private read) more than
        :data:`dpcli.tasks.sql.fanout.MAX_ROWS_PER_PERSON` rows."""
        check_fanout(self.query.relation, public, self.options.max_rows_per_table)

    def run(self, frames: Frames, plan: SqlPlan, seed: bytes, engine: Engine | None) -> Result:
        stream = KeyedStream(seed, STREAM_LABEL)
        words = stream.child("bounding-salt").uint64(2)
        salt = int(words[0]) | (int(words[1]) << 64)
        tables = self._frames(frames)
        self.check_fanout({t: tables[t] for t in self.public_tables()})  # the CLI checked it before any read
        tables = self.capped_tables(tables, salt)
        name = ", ".join(t.name for t in self.tables)
        task, extra = self, dict[str, Any]()
        frame, layout = per_user_frame(task.query, plan, tables, task.query.group_names)
        keys = task._keys(frames, schema_of(frame), layout)
        if self.options.auto is not None or self.options.bias_share is not None:
            from dpcli.tasks.sql.chosen import bounds_chosen

            listed = keys.height if keys is not None else None
            task, plan, extra = bounds_chosen(self, plan, tables, stream, salt, name, listed)
            frame, layout = per_user_frame(task.query, plan, tables, task.query.group_names)
        if engine is not None and engine.sql_totals is not None:
            totals, bins = engine.sql_totals(task, plan, layout, salt, schema_of(frame))
        else:
            totals, bins = compute_totals(frame, layout, plan, salt, name)
        totals, noisy = select_partitions(totals, layout, plan, stream, keys)
        noisy = add_noise(totals, layout, plan, stream, noisy)
        released = Noisy(totals, noisy, bins, layout, plan, stream, task.options.max_contributions)
        table, margins = output_table(task.query, released, task.options.with_error)
        table = apply_post(table, task.query.post)
        return Result(table, cast(SqlReport, {**task._metadata(plan, table, margins), **extra}))

    def summary(self, name: str, result: Result) -> str:
        report = result.metadata
        assert report["command"] == "sql"
        line = f"sql over {', '.join(report['tables'])}: {report['groups']} row(s) released"
        if report.get("threshold") is not None:
            line += f" (threshold {report['threshold']} noisy units)"
        if "auto" in report:
            line += "; chosen: " + ", ".join(f"{k} {v}" for k, v in report["auto"].items()
                                             if k in ("max_partitions", "max_contributions"))
        return line

    def notes(self, plan: SqlPlan, result: Result) -> list[Note]:
        from dpcli import advice
        from dpcli.tasks.sql.describe import sql_notes

        report = result.metadata
        assert report["command"] == "sql"
        chosen = report.get("auto")
        counts = self.capped_by_default()
        binding = [f for f in self.defaulted
                   if (f == "max_partitions" and self.query.groups) or (f == "max_contributions" and counts)]
        left_out = advice.left_out(self.left_out_chosen, chosen, self.left_out_stays, binding)
        k = int((chosen or {}).get("max_partitions", self.options.max_partitions))
        c = int((chosen or {}).get("max_contributions", self.options.max_contributions))
        bias = advice.bias_report(self.unit_word, report.get("bias"),
                                  {"max_partitions": k, "max_contributions": c, "bounds": None})
        if chosen is None:
            return [*sql_notes(self, plan, result.table), *left_out, *bias]
        # the margins of the bounds chosen (released values), not the placeholders planned before
        task = self.at_bounds(k, c)
        return [*sql_notes(task, task.plan("pure", {}), result.table), *left_out, *bias]

    def capped_by_default(self) -> bool:
        """Whether an ``ANON_COUNT`` counts at the query's row cap (``--max-contributions``, or ``auto``'s
        placeholder before the choice), not one of its own: only then does that cap cut rows (sums and means
        bound each user's partial, not rows)."""
        cap = self.options.max_contributions
        return sql_auto.default_counts(self.query) or any(a.function == "count" and a.cap == cap
                                                          for a in self.query.aggregates)

    def per_unit_means(self) -> list[str]:
        """The output columns that average each unit's own mean over units (ANON_AVG, ANON_VAR, ANON_STDDEV:
        paper 002's per-user partials), in the SELECT list's order."""
        return [o.name for o in self.query.outputs
                if o.aggregate is not None and self.query.aggregates[o.aggregate].function in ("avg", "var", "stddev")]

    # ---- helpers ----------------------------------------------------------------------------

    @property
    def table_map(self) -> dict[str, TableDecl]:
        return {t.name: t for t in self.tables}

    def _frames(self, frames: Frames) -> dict[str, pl.LazyFrame]:
        out = {}
        for name, role in self.roles().items():
            frame = frames.data if role == "data" else frames.lists[role]
            out[name] = frame if isinstance(frame, pl.LazyFrame) else frame.lazy()
        return out

    def _keys(self, frames: Frames, schema: pl.Schema, layout: Layout) -> pl.DataFrame | None:
        """The public list of groups, cast to the group keys' types (a value that does not cast is an error)."""
        if not self.options.keys:
            return None
        listed = frames.lists[KEYS_ROLE]
        frame = listed if isinstance(listed, pl.LazyFrame) else listed.lazy()
        missing = [n for n in self.query.group_names if n not in schema_of(frame)]
        if missing:
            raise DataError(f"the list of groups lacks column {missing[0]!r} (it needs the GROUP BY keys' output "
                            f"names: {', '.join(self.query.group_names)})")
        casts = [pl.col(name).cast(schema[g], strict=True).alias(g)
                 for name, g in zip(self.query.group_names, layout.groups, strict=True)]
        try:
            groups = frame.select(casts).unique().collect()
        except pl.exceptions.PolarsError as exc:
            raise DataError(f"the list of groups: its values do not match the groups' types ({type(exc).__name__}; "
                            "the parser's message is withheld)") from None
        if groups.height == 0:
            raise DataError("the list of groups lists no groups")
        return groups.sort(list(layout.groups), nulls_last=True)

    def _metadata(self, plan: SqlPlan, table: pl.DataFrame, margins: dict[str, str]) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "command": "sql", "tables": [t.name for t in self.tables], "groups": table.height,
            "domain": plan.domain, "max_partitions": plan.max_partitions,
            "max_rows_per_table": self.options.max_rows_per_table, "split": plan.split,
            "threshold": plan.threshold,
            "measurements": {c.measure.key: {"share": c.share, **(c.noise.describe() if c.noise else
                                                                  {"mechanism": "exponential"})}
                             for c in plan.calibrated},
        }
        if self.options.budget.epsilon is not None:
            meta["epsilon"] = fraction_text(self.options.budget.epsilon)
        if self.stability > 1:  # owned tables: the units one unit's rows can move, as calibrated
            meta["stability"] = self.stability
        steps = [_step(c.measure) for c in plan.calibrated if c.measure.bounds is not None]
        if steps:  # the finest grid of the query: text outputs round floats to two of its digits
            meta["granularity"] = fraction_text(min(steps))
        if margins:
            meta["margins"] = margins
        averaged = self.per_unit_means()
        if averaged:  # what ANON_AVG, ANON_VAR and ANON_STDDEV average (the query's, not the data's)
            meta["per_unit_means"] = averaged
        from dpcli.tasks.sql.describe import released_columns

        meta["columns"] = released_columns(self.query, self.options.max_contributions)
        return meta


def _step(m: Measure) -> Fraction:
    """The grid a measurement's released values lie on (an NTILE's too: gap sampling draws a grid point)."""
    assert m.bounds is not None
    return m.grid.granularity
