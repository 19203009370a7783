"""Option groups declared once (issue 40, item 5; as sqlite-utils' ``output_options``): a decorator per group puts
the group's options in a command's ``--help`` where its one parameter stands, and gives the command the group's
value. The options themselves are declared in :mod:`dpcli.cli._options`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from dpcli.cli._options import (
    BetaOpt,
    EngineOpt,
    GammaOpt,
    ImproverCOpt,
    ImproverIndexOpt,
    MasterOpt,
    RemoteOpt,
    ScheduleOpt,
    ScheduleOptions,
    SchedulerOpt,
    SparkConfOpt,
    ThroughOpt,
    TotalDeltaOpt,
    TotalEpsilonOpt,
    engine_request,
)

if TYPE_CHECKING:
    from dpcli.spark.engine import EngineRequest

F = TypeVar("F", bound=Callable[..., Any])


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
