"""Option groups declared once (issue 40, item 5; as sqlite-utils' ``output_options``): a decorator per group puts
the group's options in a command's ``--help`` where its one parameter stands, and gives the command the group's
value (:class:`OutputOptions`, :class:`InputOptions`, :class:`ChoiceOptions`, :class:`ScheduleOptions` with
:func:`schedule_spec`; the engine's :class:`dpcli.spark.engine.EngineRequest`). The options themselves are declared
in :mod:`dpcli.cli._options`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeVar, cast

from dpcli.cli._options import (
    AutoShareOpt,
    BetaOpt,
    BiasShareOpt,
    DelimiterOpt,
    EngineOpt,
    FormatOpt,
    GammaOpt,
    ImproverCOpt,
    ImproverIndexOpt,
    InputFormatOpt,
    JsonOpt,
    MasterOpt,
    OutputOpt,
    RemoteOpt,
    ReportBiasOpt,
    ScheduleOpt,
    SchedulerOpt,
    SparkConfOpt,
    ThroughOpt,
    TotalDeltaOpt,
    TotalEpsilonOpt,
    engine_request,
    positive,
    probability,
)
from dpcli.errors import UsageError

if TYPE_CHECKING:
    from datetime import datetime

    from dpcli.core.schedules import ScheduleSpec
    from dpcli.spark.engine import EngineRequest

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class OutputOptions:
    """``-o``, ``--format`` and ``--json`` (:data:`dpcli.cli._groups.output_options`): where a release's data goes,
    in which format, and whether its summary (or its error) is machine-readable."""

    output: str | None = None
    out_format: str | None = None
    as_json: bool = False


@dataclass(frozen=True)
class InputOptions:
    """``--input-format`` and ``--delimiter`` (:data:`dpcli.cli._groups.input_options`): how a path's data is read
    (a catalog dataset is read as the operator declared it)."""

    input_format: str | None = None
    delimiter: str | None = None


@dataclass(frozen=True)
class ChoiceOptions:
    """``--auto-share``, ``--report-bias`` and ``--bias-share`` (:data:`dpcli.cli._groups.choice_options`), as typed:
    the shares of the budget that choose bounds from the data and report what they cut (parsed where the command
    builds its bounds, so refusals keep their order)."""

    auto_share: str | None = None
    report_bias: bool | None = None
    bias_share: str | None = None


@dataclass(frozen=True)
class ScheduleOptions:
    """The ``--schedule`` option group, as typed (:func:`schedule_spec` parses it; ``through`` is a run's,
    :func:`schedule_through`; ``runs``, a dry run's: how many runs it plans, None for the default)."""

    name: str | None
    scheduler: str = "bbscheduler"
    total_epsilon: str | None = None
    total_delta: str | None = None
    gamma: str | None = None
    beta: str = "0.05"
    improver_c: str | None = None
    improver_index: str | None = None
    through: str | None = None
    runs: int | None = None


def schedule_spec(options: ScheduleOptions, run_epsilon: Fraction | None, dry_run: bool = False) -> ScheduleSpec | None:
    """The schedule the options describe, checked (None when ``--schedule`` is absent)."""
    o = options
    if o.name is None:
        _refuse_schedule_options(o)
        return None
    from dpcli.core import schedules as sch  # only for a schedule (a plain run does not load them)
    from dpcli.core.schedules import ScheduleSpec, check_scheduler

    if dry_run and o.through is not None:
        raise UsageError("--through names a run's snapshot, and a dry run reads none: drop --through")
    if not dry_run and o.runs is not None:
        raise UsageError("--runs says how many runs a dry run plans: add --dry-run")
    check_scheduler(o.scheduler)  # before the totals are parsed, as always (the spec checks the rest)
    total, delta, gamma, beta = _schedule_budget(o)
    c = positive("--improver-c", o.improver_c) if o.improver_c is not None else Fraction(str(sch.DEFAULT_IMPROVER_C))
    defaulted = frozenset(name for name, value in (("c", o.improver_c), ("index", o.improver_index)) if value is None)
    return ScheduleSpec(o.name, o.scheduler, total, delta, gamma, float(beta), float(c), run_epsilon,
                        index=o.improver_index if o.improver_index is not None else "runs", defaulted=defaulted)


def _refuse_schedule_options(o: ScheduleOptions) -> None:
    if o.total_epsilon or o.total_delta or o.gamma or o.through or o.runs:
        raise UsageError("--total-epsilon, --total-delta, --gamma, --through and --runs need --schedule NAME")


def schedule_through(options: ScheduleOptions) -> datetime | None:
    """``--through``: the public moment a scheduled run's snapshot holds data through (None when absent)."""
    from dpcli.cli._times import parse_moment

    return None if options.through is None else parse_moment(options.through)


def _schedule_budget(o: ScheduleOptions) -> tuple[Fraction, Fraction, Fraction | None, Fraction]:
    """(total ε, total δ (0: pure), bbscheduler's γ if given, β) of a schedule."""
    total = positive("--total-epsilon", o.total_epsilon, required=True)
    delta = probability("--total-delta", o.total_delta) or Fraction(0)
    gamma = positive("--gamma", o.gamma)
    return total, delta, gamma, probability("--beta", o.beta, allow_zero=False)


def option_group(name: str, build: Callable[..., Any], options: Sequence[tuple[str, Any, Any]]) -> Callable[[F], F]:
    """A decorator declaring a group of options once (as sqlite-utils' ``output_options``): the command takes one
    parameter ``name``, the group's value, and ``--help`` lists the group's ``options`` (name, ``Annotated`` type,
    default) where that parameter stands; each run builds the value with ``build(**the options' values)``.

    Typer reads the command's options from its signature: the decorated function shows the group's options in
    place of ``name`` (``__signature__``, and ``__annotations__`` for their types), and turns them back into the
    one value before the command runs. Put it below ``@handles_errors`` (which copies what it shows)."""
    names = [option for option, _, _ in options]

    def decorate(command: F) -> F:
        signature = inspect.signature(command)  # the group's own type is for mypy only: never evaluated
        shown: list[inspect.Parameter] = []
        for parameter in signature.parameters.values():
            if parameter.name != name:
                annotation = parameter.annotation
                if isinstance(annotation, str):  # postponed (from __future__ import annotations): as typer would
                    # dpcli's own source; another group's type (for mypy only) stays text: its decorator replaces it
                    with contextlib.suppress(NameError):
                        annotation = eval(annotation, command.__globals__)
                shown.append(parameter.replace(annotation=annotation))
                continue
            shown += [inspect.Parameter(option, parameter.kind, default=default, annotation=annotation)
                      for option, annotation, default in options]

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = build(**{option: kwargs.pop(option) for option in names})
            return command(*args, **kwargs)

        run.__signature__ = signature.replace(parameters=shown, return_annotation=inspect.Signature.empty)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in shown if p.annotation is not inspect.Parameter.empty}
        return cast(F, run)

    return decorate


def _schedule_group(schedule: str | None, **rest: Any) -> ScheduleOptions:
    return ScheduleOptions(schedule, **rest)


#: The default a command's ``schedule`` parameter declares (its decorator always passes the group's value).
SCHEDULE_GIVEN = cast("ScheduleOptions", None)
#: ``--schedule`` and its options (``--scheduler`` … ``--through``), declared once: the command's parameter
#: ``schedule`` is their :class:`ScheduleOptions` (``runs``, a dry run's, is added by the command).
schedule_options = option_group("schedule", _schedule_group, [
    ("schedule", ScheduleOpt, None), ("scheduler", SchedulerOpt, "bbscheduler"),
    ("total_epsilon", TotalEpsilonOpt, None), ("total_delta", TotalDeltaOpt, None), ("gamma", GammaOpt, None),
    ("beta", BetaOpt, "0.05"), ("improver_c", ImproverCOpt, None), ("improver_index", ImproverIndexOpt, None),
    ("through", ThroughOpt, None)])


#: The default a command's ``engine`` parameter declares (its decorator always passes the group's value).
ENGINE_GIVEN = cast("EngineRequest", None)
#: ``--engine``, ``--master``, ``--remote``, ``--spark-conf``, declared once: the command's parameter ``engine`` is
#: their :class:`dpcli.spark.engine.EngineRequest`.
engine_options = option_group("engine", engine_request, [
    ("engine", EngineOpt, "polars"), ("master", MasterOpt, None), ("remote", RemoteOpt, None),
    ("spark_conf", SparkConfOpt, None)])


#: The default a command's ``out`` parameter declares (its decorator always passes the group's value).
OUTPUT_GIVEN = cast("OutputOptions", None)
#: ``-o``, ``--format`` and ``--json``, declared once for every release command: the command's parameter ``out`` is
#: their :class:`OutputOptions` (``--json`` also reaches ``handles_errors``, above the group: errors as JSON).
output_options = option_group("out", OutputOptions, [
    ("output", OutputOpt, None), ("out_format", FormatOpt, None), ("as_json", JsonOpt, False)])


#: The default a command's ``reading`` parameter declares (its decorator always passes the group's value).
INPUT_GIVEN = cast("InputOptions", None)
#: ``--input-format`` and ``--delimiter``, declared once: the command's parameter ``reading`` is their
#: :class:`InputOptions`.
input_options = option_group("reading", InputOptions, [("input_format", InputFormatOpt, None),
                                                      ("delimiter", DelimiterOpt, None)])

#: The default a command's ``choice`` parameter declares (its decorator always passes the group's value).
CHOICE_GIVEN = cast("ChoiceOptions", None)
#: ``--auto-share``, ``--report-bias`` and ``--bias-share``, declared once: the command's parameter ``choice`` is
#: their :class:`ChoiceOptions` (the caps themselves are each command's: their help says what they bound).
choice_options = option_group("choice", ChoiceOptions, [("auto_share", AutoShareOpt, None),
                                                       ("report_bias", ReportBiasOpt, None),
                                                       ("bias_share", BiasShareOpt, None)])
