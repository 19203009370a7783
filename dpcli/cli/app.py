"""The root ``dpcli`` command: global options and command registration."""

from __future__ import annotations

import functools
import importlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from dpcli import __version__
from dpcli.cli._aliases import command_path, expand_aliases, hoist_root_options
from dpcli.cli._common import ENDING, Settings, Terminated, handles_errors, interrupted_line, json_error, one_line
from dpcli.errors import ExitCode, quiet_native_stderr
from dpcli.state import progress
from dpcli.state.paths import default_state_dir, validate_analyst

if TYPE_CHECKING:
    from dpcli.access import Caller
    from dpcli.access.catalog import Catalog

CATALOG_FILE = "catalog.json"  # dpcli.access.catalog.CATALOG_FILE, without importing it for every command

#: The root's settings (every app :func:`build_app` makes has them).
_SETTINGS: dict[str, Any] = {
    "name": "dpcli",
    "help": (
        "Differentially private statistics from CSV/Parquet files, with a local "
        "privacy-budget ledger. Data goes to stdout or -o; messages to stderr. Global options may also "
        "follow the command. One number format everywhere: integers as integers (never -0), ε, δ and ρ in text "
        "to 4 significant digits (spent and charged rounded up, remaining down; --json exact), the times dpcli "
        "computes in ISO 8601 UTC with Z."
    ),
    "no_args_is_help": True,
    "add_completion": True,  # --install-completion / --show-completion for bash, zsh, fish and PowerShell
    "pretty_exceptions_enable": False,
    "rich_markup_mode": None,
}
#: Every command, in the order ``dpcli --help`` lists them: its module, and the function (a command) or ``app`` (a
#: group of commands) in it.
COMMANDS: dict[str, tuple[str, str]] = {
    "topk": ("dpcli.cli.topk", "topk"),
    "histogram": ("dpcli.cli.histogram", "histogram"),
    "tabulate": ("dpcli.cli.tabulate", "tabulate"),
    "sql": ("dpcli.cli.sql", "sql"),
    "stream-replay": ("dpcli.cli.stream_replay", "stream_replay"),
    "plot": ("dpcli.cli.plot", "plot"),
    "diff": ("dpcli.cli.diff", "diff"),
    "budget": ("dpcli.cli.budget", "app"),
    "catalog": ("dpcli.cli.catalog", "app"),
}


@functools.cache
def build_app(only: str | None = None) -> typer.Typer:
    """The root ``dpcli`` app with every command, or with the command ``only`` alone (built once per ``only``).

    A run of one command builds only that command: typer turns every command's signature into options when it
    starts (22 ms for all of them against 4 ms for ``histogram`` alone, a tenth of a short run), and each command's
    module is imported only when it is built. What a command parses, prints and refuses is the same either way:
    its options, help and errors are its own (``tests/test_cli.py`` compares them). ``dpcli --help``, an unknown
    command and shell completion get every command (:func:`full_app`).
    """
    made = typer.Typer(**_SETTINGS)
    made.callback()(root)
    for name, (module, attribute) in COMMANDS.items():
        if only is None or only == name:
            declared = getattr(importlib.import_module(module), attribute)
            if isinstance(declared, typer.Typer):
                made.add_typer(declared, name=name)
            else:
                made.command(name)(declared)
    return made


def full_app() -> typer.Typer:
    """The root app with every command: ``dpcli.cli.app.app``, the CLI runner's and the man pages'."""
    return build_app()


def __getattr__(name: str) -> Any:
    """``app``, the root app with every command, built on first use (a run of one command never builds it)."""
    if name == "app":
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def app_for(args: list[str]) -> typer.Typer:
    """The app a run with these arguments needs: the one command they name, or every command."""
    path, start = command_path(args)
    root_help = any(a in ("--help", "-h") for a in args[:start - len(path)])  # the root's help lists every command
    if path and path[0] in COMMANDS and not root_help and not _completion_asked(args):
        return build_app(path[0])
    return full_app()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dpcli {__version__}")
        raise typer.Exit(0)


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
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="More output (tracebacks on errors).")
    ] = 0,
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
    ctx.obj = start(state_dir, analyst, verbose - quiet, lock_timeout)


@handles_errors
def start(state_dir: Path | None, analyst: str | None, verbosity: int, lock_timeout: float) -> Settings:
    """Who runs dpcli and where its state is (:func:`dpcli.access.whoami`); installs the gate every
    command's opens and writes pass through, and returns the global settings.

    Service mode: the state directory and the ledger are fixed by the process (the service account's
    directory, the invoking user's ledger); ``--state-dir``, ``--analyst`` and ``DPCLI_*`` are refused.
    """
    from dpcli import access
    from dpcli.access import identity

    caller = access.whoami()
    access.service_refusals(caller, state_dir is not None, analyst is not None, identity.SOURCE.environ())
    root_dir, name = _state_and_ledger(caller, state_dir, analyst)
    access.install(access.Gate(caller, root_dir))  # until the catalog is read: no one but root is an operator
    catalog = _catalog(root_dir) if caller.service or (root_dir / CATALOG_FILE).exists() else None
    gate = access.Gate(caller, root_dir, catalog)
    if caller.service and catalog is None and not caller.root:
        gate.require_catalog()
    access.install(gate)
    return Settings(state_dir=root_dir, analyst=name, verbosity=verbosity, lock_timeout=lock_timeout)


def _state_and_ledger(caller: Caller, state_dir: Path | None, analyst: str | None) -> tuple[Path, str]:
    """The state directory and the ledger's analyst: the process's own in service mode; else the
    options, ``DPCLI_ANALYST``, or the defaults."""
    if caller.service:
        assert caller.state_dir is not None
        return caller.state_dir, validate_analyst(caller.name)
    return (state_dir or default_state_dir()).expanduser(), analyst or os.environ.get("DPCLI_ANALYST") or "default"


def _catalog(root_dir: Path) -> Catalog | None:
    from dpcli.access.catalog import read_catalog

    return read_catalog(root_dir)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: old option spellings are rewritten (with a note), then typer runs.

    Library warnings are silenced (their text is foreign: it may quote a record or a path), so is what
    native code writes to stderr in a process of its own (:func:`dpcli.errors.quiet_native_stderr`), and in
    service mode shell completion is refused before typer would install or print it; elsewhere
    ``--install-completion`` first says what it adds to which files, and asks on a terminal
    (:mod:`dpcli.cli._completion`).

    In a process of its own (``argv`` None: the console script, ``python -m dpcli``) two start-up
    costs are avoided, neither of which changes what a command computes. numpy's OpenBLAS starts no
    worker threads (unless ``OPENBLAS_NUM_THREADS`` is set): dpcli does no linear algebra, and
    starting them is 40% of numpy's import (140 ms → 85 ms on 2 cores). And the objects alive when
    the command starts and when it ends are frozen out of the cyclic garbage collector
    (:func:`gc.freeze`): they live until exit anyway, and the full collections that would walk them
    (while polars and numpy load, and the interpreter's last one at exit) cost a short command
    about 70 ms. Collection stays on for everything the command creates.
    """
    import gc
    import warnings

    own_process = argv is None
    if own_process:
        quiet_native_stderr()
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads (commands import it lazily)
        gc.freeze()
    warnings.simplefilter("ignore")
    args, notes = expand_aliases(sys.argv[1:] if argv is None else argv)
    args = hoist_root_options(args, _value_options)
    app = app_for(args)
    if _completion_asked(args):
        _refuse_completion_in_service_mode()
        from dpcli.cli._completion import confirm_install

        args = confirm_install(args)
    if not {"-q", "--quiet"} & set(args):
        for note in notes:
            print(note, file=sys.stderr)
    if own_process:
        signal.signal(signal.SIGTERM, _terminate)
    as_json = _json_asked(args)
    try:
        if as_json:
            _run_with_json_errors(app, args)
        else:
            app(args=args, prog_name="dpcli")
    except SystemExit as end:
        if end.code == ExitCode.INTERRUPTED and _TERMINATED:  # SIGTERM before (or after) a command's own handler
            _terminated_outside(as_json)
        raise
    finally:
        if own_process:
            gc.freeze()


def _terminated_outside(as_json: bool) -> NoReturn:
    """End a run SIGTERM stopped outside its command's handler as that handler would: 143, the interrupted line,
    and under ``--json`` its object."""
    line = interrupted_line(ExitCode.TERMINATED, progress.snapshot())
    print(line, file=sys.stderr)
    if as_json:
        json_error(line, int(ExitCode.TERMINATED))
    raise SystemExit(int(ExitCode.TERMINATED)) from None


_TERMINATED: list[int] = []  # the SIGTERM received (at most one is acted on)


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM (cron's timeout, systemd, ``kill``) ends a run as SIGINT does, with its own code and words
    (:class:`dpcli.cli._common.Terminated`); a second one while the first is cleaned up is ignored."""
    if _TERMINATED:
        return
    _TERMINATED.append(signum)
    raise Terminated


def _json_asked(args: list[str]) -> bool:
    """``--json`` among the options (before a ``--`` that ends them)."""
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def _run_with_json_errors(app: typer.Typer, args: list[str]) -> None:
    """Run a ``--json`` command so that a usage error typer finds before the command starts (an unknown
    option, a bad value) also ends with one line on stderr and a JSON error object on stdout
    (:func:`dpcli.cli._common.fail`); the command's own endings are :func:`handles_errors`'."""
    ENDING.clear()
    try:
        code = app(args=args, prog_name="dpcli", standalone_mode=False)
    except typer.TyperException as exc:
        line = f"dpcli: error: {one_line(exc.format_message())}"
        code = exc.exit_code
        print(line, file=sys.stderr)
        print(json.dumps({"error": line, "exit": code}))
    except typer.Abort:  # end of input at a prompt
        code = int(ExitCode.INTERNAL)
    if ENDING and code == ENDING[0][1] != 0:  # an ending the root callback's handler met (it sees no --json)
        json_error(ENDING[0][0], ENDING[0][1])
    sys.exit(code if isinstance(code, int) else 0)


def _value_options(path: tuple[str, ...]) -> frozenset[str]:
    """The options of the command ``path`` (``("budget", "show")``) that take a value, from typer's command."""
    command: Any = typer.main.get_command(app_for(list(path)))
    for name in path:
        command = getattr(command, "commands", {}).get(name)
        if command is None:
            return frozenset()
    return frozenset(opt for p in command.params
                     if p.param_type_name == "option" and not p.is_flag and not p.count
                     for opt in (*p.opts, *p.secondary_opts))


def _completion_asked(args: list[str]) -> bool:
    return any(a in ("--install-completion", "--show-completion") for a in args) or any(
        k.startswith("_DPCLI_COMPLETE") for k in os.environ)


def _refuse_completion_in_service_mode() -> None:
    """Shell completion writes to (or prints for) the running account's shell: the operator's, in service mode."""
    from dpcli import access
    from dpcli.errors import DpcliError

    try:
        service = access.whoami().service
    except DpcliError:
        service = True
    if service:
        print("dpcli: error: shell completion is not available in service mode", file=sys.stderr)
        raise SystemExit(2)
