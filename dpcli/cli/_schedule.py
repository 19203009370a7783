"""``--schedule`` options of ``histogram`` and ``topk``: declared and parsed here, run by :mod:`dpcli.scheduling`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dpcli.cli._common import Settings
from dpcli.cli._options import positive, probability
from dpcli.errors import UsageError

if TYPE_CHECKING:  # the library is imported when a schedule runs, not for --help
    from dpcli.io.inputs import InputTable
    from dpcli.scheduling import RunRelease, ScheduleSpec

ScheduleOpt = Annotated[
    str | None, typer.Option("--schedule", help="Run as part of the named schedule over growing snapshots.")
]
SchedulerOpt = Annotated[
    str, typer.Option("--scheduler", help="bbscheduler (a new epoch when the noisy count of units has grown by 1+γ), "
                      "bbimprover (every run) or fixed.")
]
TotalEpsilonOpt = Annotated[str | None, typer.Option("--total-epsilon", help="ε of the whole schedule, forever.")]
TotalDeltaOpt = Annotated[str | None, typer.Option("--total-delta", help="δ of the whole schedule (0: pure).")]
GammaOpt = Annotated[str | None, typer.Option("--gamma", help="bbscheduler: growth factor between epochs (default: Alg. 1).")]
BetaOpt = Annotated[str, typer.Option("--beta", help="bbscheduler: failure probability β used to derive γ.")]
ImproverCOpt = Annotated[
    str | None,
    typer.Option("--improver-c", help="bbimprover: c in ε_t ∝ t^-(1/2+c), 0 < c < 1/4 (default 0.1; "
                 "an existing schedule keeps its own)."),
]
ImproverIndexOpt = Annotated[
    str | None,
    typer.Option("--improver-index", help="bbimprover: t counts runs (the default). rows (Algorithm 2 as "
                 "printed) is refused for new schedules; one made with it counts runs from now on."),
]


def schedule_spec(
    name: str | None,
    scheduler: str,
    total_epsilon: str | None,
    total_delta: str | None,
    gamma: str | None,
    beta: str,
    c: str | None,
    run_epsilon: Fraction | None,
    dry_run: bool = False,
    index: str | None = None,
) -> ScheduleSpec | None:
    """Parse the schedule options (None when ``--schedule`` is absent)."""
    from dpcli.core import schedules as sch
    from dpcli.scheduling import ScheduleSpec

    if name is not None and dry_run:
        raise UsageError("--dry-run does not apply to --schedule (each run's ε depends on the data's growth)")
    if name is None:
        if total_epsilon or total_delta or gamma:
            raise UsageError("--total-epsilon, --total-delta and --gamma need --schedule NAME")
        return None
    if scheduler not in sch.SCHEDULERS:
        raise UsageError(f"--scheduler must be one of {', '.join(sch.SCHEDULERS)}, got {scheduler!r}")
    total = positive("--total-epsilon", total_epsilon, required=True)
    delta = probability("--total-delta", total_delta) or Fraction(0)
    g = positive("--gamma", gamma)
    if g is not None and not g < 1:
        raise UsageError("--gamma must be in (0, 1)")
    b = probability("--beta", beta, allow_zero=False)
    defaulted = frozenset(name for name, value in (("c", c), ("index", index)) if value is None)
    cc = positive("--improver-c", c) if c is not None else Fraction(str(sch.DEFAULT_IMPROVER_C))
    if cc is None or cc >= Fraction(1, 4) or float(cc) >= 0.25:  # stored as a float: 0.2499…9 would be 0.25
        raise UsageError("--improver-c must be in (0, 1/4): from c = 1/4 on, Theorem 13's error bound "
                         "no longer improves as the data grows")
    if index is not None and index not in sch.IMPROVER_INDEXES:
        raise UsageError(f"--improver-index must be runs or rows, got {index!r}")
    if (c is not None or index is not None) and scheduler != "bbimprover":
        raise UsageError("--improver-c and --improver-index apply to --scheduler bbimprover")
    if scheduler == "fixed":
        if run_epsilon is None:
            raise UsageError("--scheduler fixed spends --epsilon per run; give --epsilon")
        if delta:
            raise UsageError("--scheduler fixed composes pure runs: drop --total-delta")
    elif run_epsilon is not None:
        raise UsageError(f"--scheduler {scheduler} sets each run's ε itself; drop --epsilon")
    if scheduler == "bbimprover" and not delta:
        raise UsageError("--scheduler bbimprover composes with CDP: give --total-delta in (0, 1)")
    if delta:
        try:
            sch.check_cdp_total(float(total), float(delta))  # type: ignore[arg-type]
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return ScheduleSpec(name, scheduler, total, delta, g, float(b), float(cc), run_epsilon,  # type: ignore[arg-type]
                        index=index or "runs", defaulted=defaulted)


def run_scheduled(
    s: Settings,
    analyst: str,
    command: str,
    spec: ScheduleSpec,
    query: dict[str, Any],
    table: InputTable,
    run: RunRelease,
    output: str | None,
    out_format: str,
    as_json: bool,
    notes_for: Callable[[Any, Fraction], Sequence[Any]] = lambda done, eps: (),
) -> None:
    """One call of a scheduled query (:func:`dpcli.scheduling.run_scheduled`), then its output.

    ``notes_for(release, run ε)`` gives the command's notes on the run's release; a run that used
    under 1% of the schedule's ε says so too."""
    from dpcli import advice, scheduling
    from dpcli.cli._release import output_digest, write_release

    done = scheduling.run_scheduled(s.state_dir, analyst, command, spec, query, table, run, s.lock_timeout,
                                    lambda released, report: output_digest(released, output, out_format, report))
    run_eps = Fraction(done.report["schedule"]["run_epsilon"])
    label = done.report["schedule"]
    notes = [*notes_for(done, run_eps), advice.small_run_epsilon(float(run_eps), float(spec.total_epsilon)),
             advice.improver_c_without_gain(label["scheduler"], float(label.get("c", 0))),
             advice.improver_counts_runs(label.get("made_with_index"))]
    write_release(s, done, output, out_format, as_json, [n for n in notes if n is not None])
