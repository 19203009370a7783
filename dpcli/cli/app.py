"""The root ``dpcli`` command: global options and command registration."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpcli import __version__
from dpcli.cli import budget as budget_cli
from dpcli.cli import histogram as histogram_cli
from dpcli.cli import plot as plot_cli
from dpcli.cli import stream_replay as stream_replay_cli
from dpcli.cli import tabulate as tabulate_cli
from dpcli.cli import topk as topk_cli
from dpcli.cli._aliases import expand_aliases
from dpcli.cli._common import Settings
from dpcli.state.paths import default_state_dir

app = typer.Typer(
    name="dpcli",
    help=(
        "Differentially private statistics from CSV/Parquet files, with a local "
        "privacy-budget ledger. Data goes to stdout or -o; messages to stderr."
    ),
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish and PowerShell
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("topk")(topk_cli.topk)
app.command("histogram")(histogram_cli.histogram)
app.command("tabulate")(tabulate_cli.tabulate)
app.command("stream-replay")(stream_replay_cli.stream_replay)
app.command("plot")(plot_cli.plot)
app.add_typer(budget_cli.app, name="budget")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dpcli {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    ctx: typer.Context,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            envvar="DPCLI_STATE_DIR",
            help="State directory (ledgers, secret key). Default: $XDG_DATA_HOME/dpcli or ~/.local/share/dpcli.",
            show_default=False,
        ),
    ] = None,
    analyst: Annotated[
        str | None,
        typer.Option("--analyst", envvar="DPCLI_ANALYST", help="Whose budget ledger to charge. Default: 'default'."),
    ] = None,
    quiet: Annotated[int, typer.Option("--quiet", "-q", count=True, help="Less output on stderr.")] = 0,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More output (tracebacks on errors).")] = 0,
    lock_timeout: Annotated[
        float, typer.Option("--lock-timeout", help="Seconds to wait for the ledger lock before exit 75.", min=0.0)
    ] = 30.0,
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Differentially private statistics from files, with a privacy-budget ledger."""
    if not lock_timeout <= 10**6:  # also refuses nan, which the range check lets through (a wait forever)
        raise typer.BadParameter("must be a number of seconds in [0, 1e6]", param_hint="--lock-timeout")
    ctx.obj = Settings(
        state_dir=(state_dir or default_state_dir()).expanduser(),
        analyst=analyst or os.environ.get("DPCLI_ANALYST") or "default",
        verbosity=verbose - quiet,
        lock_timeout=lock_timeout,
    )


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: old option spellings are rewritten (with a note), then typer runs."""
    args, notes = expand_aliases(sys.argv[1:] if argv is None else argv)
    if not {"-q", "--quiet"} & set(args):
        for note in notes:
            print(note, file=sys.stderr)
    app(args=args, prog_name="dpcli")
