"""``dpcli diff OLD NEW``: did it change, or is it the noise? (see :mod:`dpcli.plot.diff`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from dpcli.cli._common import emit_json, handles_errors, info, notice, settings
from dpcli.cli._groups import OUTPUT_GIVEN, OutputOptions, output_options
from dpcli.errors import UsageError

if TYPE_CHECKING:
    from dpcli.plot.diff import Diff

SummaryOpt = Annotated[str | None, typer.Option(help="The release's --json summary (not needed for a --json "
                                                     "document, or a file written with -o that your ledger "
                                                     "recorded).", show_default=False)]


@handles_errors
@output_options
def diff(
    ctx: typer.Context,
    old: Annotated[str, typer.Argument(help="The earlier release: a --json document, a file written with -o, or a "
                                            "file with --old-summary.", show_default=False, metavar="OLD")],
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
    plot: Annotated[
        str | None, typer.Option("--plot", help="Draw the differences with their margins: FILE.png or FILE.svg (needs "
                                 "'dpcli[plot]'), or - for a text chart on stdout instead of the table.",
                                 show_default=False, metavar="FILE")
    ] = None,
    out: OutputOptions = OUTPUT_GIVEN,  # -o, --format, --json (output_options)
) -> None:
    """Per group, the difference of two releases of one query (histogram, topk, tabulate, stream-replay, sql) with its
    95% margin, and whether it changed beyond the noise: changes flagged across groups at a false-discovery rate
    (default 5%), groups released in one file only listed as such. Pure post-processing: no data read, nothing
    charged."""
    from dpcli.access import gate
    from dpcli.cli.render import output_target
    from dpcli.io.outputs import check_output_path, write_output
    from dpcli.plot.diff import diff as differences
    from dpcli.plot.recorded import read_with_report

    g = gate()
    if g.restricted and (old_summary or new_summary):
        raise UsageError("in service mode diff reads the releases only (their digests vouch for them, and your "
                         "ledger keeps their reports)", field="old_summary" if old_summary else "new_summary")
    if plot == "-" and out.as_json:
        raise UsageError("prints its chart on stdout, where --json prints the summary: draw to FILE.png or FILE.svg",
                         field="plot")
    target = output_target(out)
    check_output_path(target.path, settings(ctx).state_dir, (old, new, old_summary, new_summary))
    if plot is not None and plot != "-":
        import os

        from dpcli.plot.figure import check_target

        check_target(plot, "plot")
        if any(p and os.path.abspath(plot) == os.path.abspath(p) for p in (old, new, old_summary, new_summary,
                                                                           target.path)):
            raise UsageError("would overwrite a file diff reads or writes", field="plot")
    s = settings(ctx)
    analyst = g.analyst if g.restricted else s.analyst
    views = [read_with_report(path, summary, s.state_dir, analyst)
             for path, summary in ((old, old_summary), (new, new_summary))]
    result = differences(views[0], views[1], fdr, at_least)
    summary = result.summary
    if summary["bounds_differ"]:
        notice(ctx, f"the two releases bounded contributions differently ({', '.join(summary['bounds_differ'])}): "
                    "what each counts differs, so a difference may be the bounds', not the data's")
    _draw(plot, result)
    if target.to_file or (not out.as_json and plot != "-"):
        write_output(result.table, target.path, target.format)
    if out.as_json:
        from dpcli.io.outputs import shown  # as the CSV shows it: differences to their margins' digits

        emit_json(summary if target.to_file else {"result": json.loads(shown(result.table).write_json()),
                                                  "summary": summary})
    else:
        groups = ", ".join(f"{n} {v}" for v, n in sorted(summary["groups"].items()))
        left_out = f"; not compared: {', '.join(summary['not_compared'])}" if summary["not_compared"] else ""
        for column, why in summary["not_compared_why"].items():
            notice(ctx, f"{column}: not compared ({why})")
        shared = " (they share their noise: the differences are exact)" if summary["shared_noise"] else ""
        info(ctx, f"diff of {old} and {new}{shared}: {groups or 'no group'} (false-discovery rate "
                  f"{summary['fdr']:g}){left_out}")


def _draw(plot: str | None, result: Diff) -> None:
    """``--plot``: a picture, or (``-``) the text chart on stdout."""
    if plot is None:
        return
    from dpcli.plot.diff_view import diff_figure, diff_text
    from dpcli.plot.release_view import recognise

    view = recognise(result.table, "diff", {**result.summary})
    if plot == "-":
        from dpcli.cli.plot import terminal_width

        typer.echo(diff_text(view, terminal_width(None)))
        return
    from dpcli.plot.figure import save

    save(diff_figure(view), plot)
