"""``dpcli plot``: draw a release dpcli wrote (see :mod:`dpcli.plot`)."""

from __future__ import annotations

import os
import shutil
from typing import Annotated

import typer

from dpcli.cli._common import handles_errors
from dpcli.cli._options import columns
from dpcli.errors import UsageError

WidthOpt = Annotated[
    int | None, typer.Option("--width", help="Terminal chart width in cells (default: the terminal's).", min=40,
                             max=400)
]


def terminal_width(width: int | None) -> int:
    """``--width``, else ``COLUMNS``, else the terminal's width (80 when there is none)."""
    if width is not None:
        return width
    return shutil.get_terminal_size((80, 24)).columns


@handles_errors
def plot(
    ctx: typer.Context,
    release: Annotated[str, typer.Argument(help="A release dpcli wrote (CSV, Parquet or JSON).", show_default=False,
                                                  metavar="RELEASE")],
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Draw to FILE.png or FILE.svg (needs 'dpcli[plot]'); "
                                 "without it, a chart is drawn as text.")
    ] = None,
    value: Annotated[
        str | None, typer.Option("--value", help="The released column to draw (default: the first, e.g. count).")
    ] = None,
    top: Annotated[
        int | None, typer.Option("--top", help="Draw the N largest groups (default 20; stream-replay: 5 keys).",
                                 min=1, max=10_000)
    ] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="stream-replay: the keys to draw, comma-separated (instead of --top).")
    ] = None,
    group: Annotated[
        str | None, typer.Option("--group", help="tabulate: the population group GEO_ID:ITERATION (default: the first "
                                 "with sex × age cells).")
    ] = None,
    level: Annotated[str | None, typer.Option("--level", help="tabulate: the level, as the file names it.")] = None,
    totals: Annotated[
        bool, typer.Option("--totals", help="tabulate: the level's released totals as bars (instead of a pyramid).")
    ] = False,
    summary: Annotated[
        str | None, typer.Option("--summary", help="The run's --json summary, for ε, δ and the threshold.")
    ] = None,
    width: WidthOpt = None,
) -> None:
    """Draw a release: bars with their 95% noise margins, lines over triggers, or a sex × age pyramid.

    Only released values are drawn (dpcli keeps no true values). Without -o the
    chart is text; with -o FILE.png or FILE.svg it is a picture.
    """
    from dpcli.access import gate
    from dpcli.cli._common import settings
    from dpcli.plot.recorded import read_with_report

    g = gate()
    if g.restricted and summary is not None:
        raise UsageError("in service mode plot reads the release only (its digest vouches for it)", field="summary")
    target = None
    if output is not None:
        from dpcli.plot.figure import check_target

        target = check_target(output)
        if os.path.abspath(output) == os.path.abspath(release):
            raise UsageError("would overwrite the release it draws", field="output")
    s = settings(ctx)
    view = read_with_report(release, summary, s.state_dir, g.analyst if g.restricted else s.analyst, "plot")
    key_list = list(columns("--keys", keys)) if keys else None
    if target is None:
        from dpcli.plot.terminal import release_text

        typer.echo(release_text(view, terminal_width(width), value, top, key_list, group, level, totals))
        return
    from dpcli.plot.figure import release_figure, save

    assert output is not None
    save(release_figure(view, value, top, key_list, group, level, totals), output)
