"""``dpcli sql``: declare the options, resolve the tables and the query, run the release path, render."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Annotated

import typer

from dpcli.cli._common import busy, handles_errors, payer, settings, unit_word
from dpcli.cli._groups import (
    CHOICE_GIVEN,
    ENGINE_GIVEN,
    OUTPUT_GIVEN,
    ChoiceOptions,
    OutputOptions,
    choice_options,
    engine_options,
    output_options,
)
from dpcli.cli._options import (
    BoundOptions,
    DelimiterOpt,
    DeltaOpt,
    EpsilonOpt,
    cap,
    positive,
    probability,
)
from dpcli.errors import UsageError

if TYPE_CHECKING:
    from dpcli.access import Source
    from dpcli.io.opening import EarlyInputs
    from dpcli.release import Sources
    from dpcli.spark.engine import EngineRequest
    from dpcli.tasks.sql import Budget, SqlOptions, SqlTask

# The library (polars, numpy, sqlglot) is imported inside the command: `dpcli --help` stays fast.


@handles_errors
@output_options
@choice_options
@engine_options
def sql(
    ctx: typer.Context,
    query: Annotated[str | None, typer.Argument(help="The query (or -f FILE).", show_default=False,
                                                metavar="QUERY")] = None,
    file: Annotated[str | None, typer.Option("--file", "-f", help="Read the query from FILE ('-': standard "
                                             "input).")] = None,
    table: Annotated[list[str] | None, typer.Option("--table", help="A private table NAME=FILE (repeatable); in "
                                                    "service mode FILE is a catalog dataset.")] = None,
    public_table: Annotated[list[str] | None, typer.Option("--public-table", help="A public table NAME=FILE "
                                                           "(repeatable): joined on any key, never protected.")] = None,
    privacy_unit: Annotated[list[str] | None, typer.Option("--privacy-unit", help="A private table's unit column, "
                                                           "TABLE.COLUMN (repeatable); a catalog dataset's is the "
                                                           "operator's.", show_default=False)] = None,
    owned_by: Annotated[list[str] | None, typer.Option("--owned-by", metavar="TABLE.COLUMN=PARENT.KEY",
                                                       help="A private table owned through another (repeatable): "
                                                       "each row belongs to the owner of the PARENT row whose KEY "
                                                       "its COLUMN names (personal mode; a catalog dataset's is the "
                                                       "operator's).", show_default=False)] = None,
    max_keys_per_owner: Annotated[
        str | None, typer.Option("--max-keys-per-owner", metavar="N", help="With --owned-by: at most this many keys "
                                 "of a parent carry each owner's ownership (the first by a public order); the noise "
                                 "grows with it. [default: 16]", show_default=False)] = None,
    max_partitions: Annotated[
        str | None, typer.Option("--max-partitions", metavar="N|auto", help="At most this many groups per unit "
                                 "(chosen at random), or auto: chosen privately from the data. [default: auto with a "
                                 "GROUP BY (not with --engine spark), else 1]",
                                 show_default=False)] = None,
    max_contributions: Annotated[
        str | None, typer.Option("--max-contributions", metavar="N|auto", help="The per-unit cap U of ANON_COUNT "
                                 "when the query gives none, or auto: chosen privately from the data. "
                                 "[default: auto where such an ANON_COUNT exists (not with --engine spark), else 1]",
                                 show_default=False)] = None,
    max_rows_per_table: Annotated[
        str | None, typer.Option("--max-rows-per-table", metavar="N", help="At most this many rows per unit of each "
                                 "private table (chosen at random), before its WHERE and any join: the work per unit "
                                 "is bounded. [default: 10000]", show_default=False)] = None,
    choice: ChoiceOptions = CHOICE_GIVEN,  # --auto-share, --report-bias, --bias-share (choice_options)
    epsilon: EpsilonOpt = None,
    delta: DeltaOpt = None,
    rho: Annotated[str | None, typer.Option("--rho", help="ρ (zCDP) for Gaussian noise, instead of ε/δ.")] = None,
    noise: Annotated[
        str | None, typer.Option("--noise", help="laplace or gaussian (default: gaussian for zcdp ledgers, else "
                                 "laplace).")] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Public list of groups (a file with the GROUP BY columns, named as "
                                 "in the output): known domain.")] = None,
    with_error: Annotated[bool, typer.Option("--with-error", help="Add 95% margins of error (_moe95 columns).")]
    = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan (measurements, noise, 95% margins, cost, ledger check); "
                           "read only the tables' column names (and the public tables joined), charge "
                           "nothing.")] = False,
    delimiter: DelimiterOpt = None,
    engine: EngineRequest = ENGINE_GIVEN,  # --engine, --master, --remote, --spark-conf (engine_options)
    out: OutputOptions = OUTPUT_GIVEN,  # -o, --format, --json (output_options)
) -> None:
    """Differentially private SQL: ANON_ aggregates over private tables, joins with public ones.

    The query is paper 002's: SELECT [WITH ANONYMIZATION] keys, ANON_COUNT/SUM/AVG/VAR/STDDEV/
    NTILE/MEDIAN/MIN/MAX(…) FROM … [JOIN …] [WHERE …] GROUP BY keys. Every private row stays owned
    by one unit (joins of private tables on their units only), contributions are bounded per unit,
    and rules it breaks are refused before any data is read.
    """
    early = _hash_declared(table or [], public_table or [], read=not dry_run and engine.engine == "polars")
    from dpcli import release
    from dpcli.cli.render import output_target, show_plan, write_release
    from dpcli.tasks.sql import Budget

    budget = Budget(positive("--epsilon", epsilon), probability("--delta", delta) or Fraction(0),
                    positive("--rho", rho), noise or "laplace")
    options = _options(budget, (max_partitions, max_contributions), choice,
                       keys is not None, with_error, engine.engine, max_rows_per_table)
    defaulted = tuple(f for f, v in (("max_contributions", max_contributions), ("max_partitions", max_partitions))
                      if v is None)
    links = (owned_by or [], _max_keys(max_keys_per_owner) if max_keys_per_owner is not None else None)
    task, sources = _task(_query_text(query, file), (table or [], public_table or [], privacy_unit or [], *links),
                          delimiter, options, noise is not None, defaulted, engine.engine == "polars",
                          choice.report_bias is None and engine.engine == "polars")
    _check_fanout(task, sources)
    ledger = payer(ctx)
    if dry_run:
        show_plan(release.plan(task, ledger, _sources(task, sources, keys)), ledger.analyst, out.as_json)
        return
    target = output_target(out)
    done = release.run(task, _sources(task, sources, keys), ledger, output=target,
                       engine=engine if engine.engine != "polars" else None, early=early,
                       busy=busy(ctx))
    write_release(settings(ctx), done, target, out.as_json)


def _hash_declared(private: list[str], public: list[str], read: bool) -> EarlyInputs | None:
    """Every file a ``--table`` or ``--public-table`` names, opened and hashed each on a thread of its own while
    dpcli loads and resolves the query (:func:`dpcli.io.opening.hash_early`; the release takes those it opens, by
    path). Personal mode only (in service mode FILE is a catalog name, resolved later); nothing for a dry run or
    another engine (``read``). Only early: a file not opened here is opened, and reported, in its usual order."""
    from dpcli.access import gate
    from dpcli.io.opening import EarlyInputs, hash_early

    if not read or gate().service:
        return None
    files = dict.fromkeys(text.partition("=")[2] for text in [*private, *public])
    found = [e for e in (hash_early(f) for f in files if f) if e is not None]
    return EarlyInputs(found) if found else None


def _options(budget: Budget, caps: tuple[str | None, str | None], choice: ChoiceOptions, keys: bool, with_error: bool,
             engine: str, max_rows: str | None = None) -> SqlOptions:
    """The release's options: ``--max-partitions``/``--max-contributions`` ``N|auto`` and the shares
    (:class:`dpcli.cli._options.BoundOptions`; an auto cap is a placeholder of 1 until chosen)."""
    from dpcli.tasks.sql import SqlOptions
    from dpcli.tasks.sql.task import DEFAULT_MAX_ROWS_PER_TABLE

    rows = _max_rows(max_rows) if max_rows is not None else DEFAULT_MAX_ROWS_PER_TABLE
    options = BoundOptions.given(cap("--max-partitions", caps[0]), cap("--max-contributions", caps[1]), None, choice)
    options.check_engine(engine)
    return SqlOptions(budget, options.max_partitions, options.max_contributions, keys, with_error,
                      options.auto_bounds(), options.bias, rows)


def _max_rows(text: str) -> int:
    """``--max-rows-per-table N`` (:func:`dpcli.cli._options.cap`); ``auto`` is refused (never chosen from the data)."""
    value = cap("--max-rows-per-table", text)
    if not isinstance(value, int):
        raise UsageError("--max-rows-per-table takes a number, not auto: this bound is not chosen from the data")
    return value


def _max_keys(text: str) -> int:
    """``--max-keys-per-owner N`` (:func:`dpcli.cli._options.cap`); never chosen from the data."""
    from dpcli.tasks.sql.owners import MOST_KEYS

    value = cap("--max-keys-per-owner", text)
    if not isinstance(value, int):
        raise UsageError("--max-keys-per-owner takes a number, not auto: this bound is not chosen from the data")
    if value > MOST_KEYS:
        raise UsageError(f"--max-keys-per-owner must be between 1 and {MOST_KEYS}, got {value}")
    return value


def _task(text: str, declarations: tuple[list[str], list[str], list[str], list[str], int | None],
          delimiter: str | None,
          options: SqlOptions, noise_given: bool, defaulted: tuple[str, ...],
          choose_left_out: bool, report_left_out: bool = False) -> tuple[SqlTask, dict[str, Source]]:
    """The query resolved over its tables (declared by option or in the catalog), and each table's source."""
    from dpcli.cli._sql_tables import parse_declarations, resolve_tables
    from dpcli.tasks.sql import SqlTask
    from dpcli.tasks.sql.parse import parse_query, table_names

    declared = parse_declarations(*declarations)
    parsed = parse_query(text)  # once: its tables name the declarations, then it is resolved over them
    decls, sources = resolve_tables(table_names(parsed), declared, delimiter)
    task = SqlTask.from_text(parsed, decls, options, noise_given, defaulted, unit_word(), choose_left_out,
                             report_left_out)
    if not choose_left_out and defaulted:
        task = replace(task, left_out_stays="--engine spark")
    return task, sources


def _sources(task: SqlTask, sources: dict[str, Source], keys: str | None) -> Sources:
    """The release's inputs: the data table, every other table by its role, the public list of groups."""
    from dpcli.cli._sources import public_source
    from dpcli.release import Sources

    roles = task.roles()
    data = next(name for name, role in roles.items() if role == "data")
    lists = {role: sources[name] for name, role in roles.items() if role != "data"}
    if keys is not None:
        lists["keys"] = public_source(keys, "--keys")
    return Sources(sources[data], lists)


def _check_fanout(task: SqlTask, sources: dict[str, Source]) -> None:
    """The fan-out of the query's public joins, read from the public tables alone (before any private byte)."""
    from dpcli.io.inputs import open_input

    public = {name: open_input(sources[name], text_columns=columns).frame
              for name, columns in task.public_tables().items()}
    task.check_fanout(public)


def _query_text(query: str | None, file: str | None) -> str:
    """The query, from the argument or ``-f FILE`` (exactly one), read through the gate like any input."""
    if (query is None) == (file is None):
        raise UsageError("give the query as an argument or with -f FILE (one of them)")
    if query is not None:
        return query
    assert file is not None
    return _read_query_file(file)


def _read_query_file(path: str) -> str:
    import sys

    from dpcli.errors import InputMissingError, os_reason
    from dpcli.io.opening import is_pipe, open_binary, read_pipe, refuse_private

    if path == "-":
        data = sys.stdin.buffer.read()
    elif is_pipe(path):  # -f <(…): a query is public text, read whole from the pipe
        data = read_pipe(path, "query file", limit=1 << 20)
    else:
        fh, _ = open_binary(path, "query file")
        try:
            with fh:
                data = fh.read(1 << 20)
        except OSError as exc:
            raise InputMissingError(f"cannot read query file {path!r}: {os_reason(exc)}") from None
    refuse_private(data[:32], "query file", path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"query file {path!r} is not UTF-8 text") from None
