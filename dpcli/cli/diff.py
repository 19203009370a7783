"""``dpcli diff OLD NEW``: did it change, or is it the noise? (see :mod:`dpcli.plot.diff`)."""

from __future__ import annotations

from typing import Annotated

import typer

from dpcli.cli._common import emit_json, handles_errors, info, notice, settings
from dpcli.cli._groups import OUTPUT_GIVEN, OutputOptions, output_options
from dpcli.errors import UsageError

SummaryOpt = Annotated[str | None, typer.Option(help="The release's --json summary (not needed when the release is "
                                                     "a --json document itself).", show_default=False)]


@handles_errors
@output_options
def diff(
    ctx: typer.Context,
    old: Annotated[str, typer.Argument(help="The earlier release: a --json document, or a file with --old-summary.",
                                       show_default=False, metavar="OLD")],
    new: Annotated[str, typer.Argument(help="The later release, of the same query.", show_default=False,
                                       metavar="NEW")],
    old_summary: SummaryOpt = None,
    new_summary: SummaryOpt = None,
    fdr: Annotated[float, typer.Option("--fdr", min=0.0001, max=0.5, help="False-discovery rate of the groups "
                                       "flagged changed (Benjamini–Hochberg).")] = 0.05,
    at_least: Annotated[
        float | None, typer.Option("--at-least", min=0.0, help="Call a group unchanged when every difference is "
                                   "within ±D (two one-sided tests at 5%).", show_default=False, metavar="D")
    ] = None,
    out: OutputOptions = OUTPUT_GIVEN,  # -o, --format, --json (output_options)
) -> None:
    """Per group, the difference of two releases of one histogram query with its 95% margin, and whether it
    changed beyond the noise: changes flagged across groups at a false-discovery rate (default 5%), groups released
    in one file only listed as such. Pure post-processing: no data read, nothing charged."""
    from dpcli.access import gate
    from dpcli.cli.render import output_target
    from dpcli.io.outputs import check_output_path, write_output
    from dpcli.plot.diff import diff as differences
    from dpcli.plot.release_view import read_release

    if gate().restricted:
        raise UsageError("dpcli diff reads releases with their --json summaries, which service mode does not read "
                         "(as dpcli plot): run it in personal mode")
    target = output_target(out)
    check_output_path(target.path, settings(ctx).state_dir, (old, new, old_summary, new_summary))
    result = differences(read_release(old, old_summary), read_release(new, new_summary), fdr, at_least)
    summary = result.summary
    if summary["bounds_differ"]:
        notice(ctx, f"the two releases bounded contributions differently ({', '.join(summary['bounds_differ'])}): "
                    "what each counts differs, so a difference may be the bounds', not the data's")
    if target.to_file or not out.as_json:
        write_output(result.table, target.path, target.format)
    if out.as_json:
        emit_json(summary if target.to_file else {"result": result.table.to_dicts(), "summary": summary})
    else:
        groups = ", ".join(f"{n} {v}" for v, n in sorted(summary["groups"].items()))
        left_out = f"; not compared: {', '.join(summary['not_compared'])}" if summary["not_compared"] else ""
        shared = " (they share their noise: the differences are exact)" if summary["shared_noise"] else ""
        info(ctx, f"diff of {old} and {new}{shared}: {groups or 'no group'} (false-discovery rate "
                    f"{summary['fdr']:g}){left_out}")
