"""``dpcli topk``: declare the options, build the task, run the release path (reserve, settle), render."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from dpcli.cli._common import busy, handles_errors, payer, settings, unit_word
from dpcli.cli._groups import (
    CHOICE_GIVEN,
    ENGINE_GIVEN,
    INPUT_GIVEN,
    OUTPUT_GIVEN,
    SCHEDULE_GIVEN,
    ChoiceOptions,
    InputOptions,
    OutputOptions,
    ScheduleOptions,
    choice_options,
    engine_options,
    input_options,
    output_options,
    schedule_options,
    schedule_spec,
    schedule_through,
)
from dpcli.cli._options import (
    BoundOptions,
    DeltaOpt,
    InputArg,
    RowsOpt,
    RunsOpt,
    TargetMoeOpt,
    TargetRelativeMoeOpt,
    UnitOpt,
    UnitsOpt,
    cap,
    columns,
    expected_size,
    margin_target,
    positive,
    probability,
)
from dpcli.cli._sources import data_source, public_source
from dpcli.errors import UsageError
from dpcli.io.opening import hash_early

if TYPE_CHECKING:
    from dpcli.spark.engine import EngineRequest
    from dpcli.tasks.auto_bounds import AutoBounds

# The library (polars, numpy) is imported inside the command: `dpcli --help` stays fast.


@handles_errors
@output_options
@choice_options
@input_options
@engine_options
@schedule_options
def topk(
    ctx: typer.Context,
    input: InputArg,
    by: Annotated[str, typer.Option("--by", help="Group-by column(s), comma-separated.")],
    k: Annotated[int, typer.Option("-k", "--k", help="How many groups to return.", max=10**4)],
    privacy_unit: UnitOpt = None,
    count: Annotated[
        str, typer.Option("--count", help="units (distinct privacy units, τ = 1) or rows (capped at τ per unit and "
                                          "group).")
    ] = "units",
    max_contributions: Annotated[
        str | None,
        typer.Option("--max-contributions", metavar="N|auto", help="τ: rows per unit per group counted with --count "
                     "rows, or auto: chosen privately from the data. [default: 1]", show_default=False),
    ] = None,
    choice: ChoiceOptions = CHOICE_GIVEN,  # --auto-share, --report-bias, --bias-share (choice_options)
    keys: Annotated[
        str | None, typer.Option("--keys", help="Public list of candidate groups (known domain, KnownGumb).")
    ] = None,
    selection: Annotated[
        str | None,
        typer.Option("--selection", metavar="threshold|unkgumb", help="Without --keys: threshold (distinct units "
                     "over a noisy threshold, then KnownGumb over the groups selected) or unkgumb (LinkedIn's "
                     "Alg. 4). [default: threshold; unkgumb on br ledgers]", show_default=False),
    ] = None,
    max_partitions: Annotated[
        int | None,
        typer.Option("--max-partitions", help="--selection threshold: K̄, the groups per unit its distinct-unit "
                     "counts include (a keyed sample). [default: 4]", show_default=False),
    ] = None,
    selection_share: Annotated[
        str | None,
        typer.Option("--selection-share", help="--selection threshold: the share of the release's ε the "
                     "threshold spends. [default: 0.25]", show_default=False),
    ] = None,
    max_groups: Annotated[
        int | None,
        typer.Option("--max-groups", help="--selection unkgumb: look at the top d̄ groups (default max(10k, 1000)).",
                     min=1, max=10**5),
    ] = None,
    no_counts: Annotated[bool, typer.Option("--no-counts", help="Ranking only: no counts, cheaper.")] = False,
    epsilon: Annotated[
        str | None,
        typer.Option("--epsilon", help="ε of this release (pure composition of its k selections and counts); "
                     "with --scheduler fixed, of each run."),
    ] = None,
    epsilon_per: Annotated[
        str | None,
        typer.Option("--epsilon-per", help="Instead of --epsilon: ε_per of each selection and count "
                     "(br ledgers: from the ledger)."),
    ] = None,
    delta: DeltaOpt = None,
    target_moe: TargetMoeOpt = None,
    target_relative_moe: TargetRelativeMoeOpt = None,
    with_error: Annotated[bool, typer.Option("--with-error", help="Add the 95% margin of the count noise.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the count noise and 95% margin, the cost and whether the ledger "
                           "would accept it; read the schema but no record, charge nothing.")
    ] = False,
    schedule: ScheduleOptions = SCHEDULE_GIVEN,  # --schedule … --through (schedule_options)
    rows: RowsOpt = None,
    units: UnitsOpt = None,
    runs: RunsOpt = None,
    reading: InputOptions = INPUT_GIVEN,  # --input-format, --delimiter (input_options)
    engine: EngineRequest = ENGINE_GIVEN,  # --engine, --master, --remote, --spark-conf (engine_options)
    out: OutputOptions = OUTPUT_GIVEN,  # -o, --format, --json (output_options)
) -> None:
    """The k most frequent groups with noisy counts, protecting each privacy unit as a whole.

    Units may touch any number of groups; only k groups are released. With
    --keys the list always has k rows; otherwise groups are discovered and
    the list may end early (⊥) when the remaining groups are too rare.
    """
    source = data_source(input, privacy_unit, reading.input_format, reading.delimiter)
    early = hash_early(source, read=not dry_run and engine.engine == "polars")  # hashed while the rest loads
    from dpcli import release
    from dpcli.cli.render import output_target, show_plan, write_release
    from dpcli.tasks.topk import TopKQuery, TopKTask

    whole, per_step = _epsilons(epsilon, epsilon_per)
    tau, auto, bias = _bounds(max_contributions, choice, engine.engine)
    query = TopKQuery(
        by=columns("--by", by), unit=source.unit, k=k, count=count, max_contributions=tau,
        known_domain=keys is not None, dbar=max_groups, with_counts=not no_counts, epsilon_per=per_step,
        delta=probability("--delta", delta) or Fraction(0), with_error=with_error, auto=auto, bias_share=bias,
        selection=selection, max_partitions=max_partitions, selection_share=positive("--selection-share",
                                                                                    selection_share))
    options = replace(schedule, runs=runs)
    spec = schedule_spec(options, whole if schedule.name else None, dry_run)
    size = expected_size(rows, dry_run, spec is not None, relative=target_relative_moe is not None, units=units)
    task = TopKTask(query, ("max_contributions",) if max_contributions is None else (), unit_word(),
                    target=margin_target(target_moe, target_relative_moe, size, spec is not None),
                    epsilon=None if schedule.name else whole)
    ledger = payer(ctx)
    sources = release.Sources(source, {"domain": public_source(keys, "--keys")} if keys else {})
    if dry_run:  # (a dry run reads no snapshot: no --through)
        planned = release.plan(task, ledger, sources, runs=runs,
                               continuation=release.Scheduled(spec, None, size) if spec else None)
        show_plan(planned, ledger.analyst, out.as_json)
        return
    target = output_target(out)  # refused before --through is parsed, as always
    continuation = release.Scheduled(spec, schedule_through(options)) if spec else None
    done = release.run(task, sources, ledger, output=target, engine=engine,
                       early=early, busy=busy(ctx), continuation=continuation)
    write_release(settings(ctx), done, target, out.as_json)


def _epsilons(epsilon: str | None, epsilon_per: str | None) -> tuple[Fraction | None, Fraction | None]:
    """(the release's ε, each step's ε_per): ``--epsilon`` or ``--epsilon-per``, never both; a whole ε
    sets ε_per by the guarantee of the selection the ledger runs (:meth:`dpcli.tasks.topk.TopKTask.for_ledger`;
    a schedule's runs get theirs from the schedule)."""
    if epsilon is not None and epsilon_per is not None:
        raise UsageError("give --epsilon (the release's) or --epsilon-per (each step's), not both")
    return positive("--epsilon", epsilon), positive("--epsilon-per", epsilon_per)


def _bounds(text: str | None, choice: ChoiceOptions, engine: str) -> tuple[int, AutoBounds | None, Fraction | None]:
    """(τ, the auto request, the bias report's share) from ``--max-contributions N|auto`` and the shares
    (:class:`dpcli.cli._options.BoundOptions`: τ is topk's only bound)."""
    tau = _tau(text)
    options = BoundOptions.given(None, "auto" if tau == "auto" else None, None, choice)
    options.check_engine(engine)
    return (1 if tau == "auto" else tau), options.auto_bounds(), options.bias


def _tau(text: str | None) -> int | Literal["auto"]:
    """``--max-contributions``: ``auto``, or a whole number (below 1 left for the query to refuse: τ ≥ 1)."""
    if text is None:
        return 1
    try:
        if int(text.strip()) < 1:
            return int(text.strip())
    except ValueError:
        pass
    found = cap("--max-contributions", text)
    assert found is not None
    return found
