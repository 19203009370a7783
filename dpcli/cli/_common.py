"""Shared CLI plumbing: global settings, error → exit-code mapping, stderr messages."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, Protocol, TypeGuard, TypeVar

import typer

from dpcli.errors import DpcliError, ExitCode, UsageError, is_native_panic
from dpcli.state import progress
from dpcli.state.paths import default_state_dir, validate_analyst

if TYPE_CHECKING:
    from dpcli.advice import Note
    from dpcli.release.steps import LedgerRef


@dataclass
class Settings:
    """Global options shared by every command."""

    state_dir: Path
    analyst: str
    verbosity: int  # <0 quiet, 0 default, >0 verbose
    lock_timeout: float
    job: str = ""  # the running command and its -o output (:func:`job_label`), for the notes in a log

    @property
    def loud(self) -> bool:
        """Print messages that change how to read a result (even in pipes and cron)? Yes unless -q."""
        return self.verbosity >= 0

    @property
    def chatty(self) -> bool:
        """Print informational messages? Yes on a terminal or with -v; never with -q."""
        if self.verbosity < 0:
            return False
        return self.verbosity > 0 or sys.stderr.isatty()


class CommandContext(Protocol):
    """A command's context as it arrives: a ``typer.Context``, or the context of typer's vendored click
    (not a ``typer.Context`` instance): anything with the root context holding the settings."""

    def find_root(self) -> Any: ...


def _is_context(value: object) -> TypeGuard[CommandContext]:
    return callable(getattr(value, "find_root", None))


def settings(ctx: CommandContext) -> Settings:
    obj = ctx.find_root().obj
    if isinstance(obj, Settings):
        return obj
    return Settings(default_state_dir(), os.environ.get("DPCLI_ANALYST", "default"), 0, 30.0)


def info(ctx: typer.Context, message: str) -> None:
    """An informational line on stderr (suppressed when quiet)."""
    if settings(ctx).chatty:
        typer.echo(message, err=True)


def notice(ctx_or_settings: Any, message: str) -> None:
    """A line on stderr that changes how to read a result (⊥, nothing released, mostly noise, biased by
    caps): printed on a terminal, in pipes and under cron alike; only -q silences it."""
    s = ctx_or_settings if isinstance(ctx_or_settings, Settings) else settings(ctx_or_settings)
    if s.loud:
        typer.echo(f"dpcli: note: {one_line(message)}{job_suffix(s)}", err=True)


def job_suffix(s: Settings) -> str:
    """Nothing on a terminal; elsewhere (a cron log, ``make -s``) the job the note is about,
    `` [histogram -o daily.csv]``, so that a log of many runs says whose note each is (and
    ``grep 'dpcli: note:'`` still finds every note)."""
    return f" [{s.job}]" if s.job and not sys.stderr.isatty() else ""


def unit_word() -> str | None:
    """How notes name the privacy unit: by its column (None), except to a service-mode analyst, to whom
    the operator's column names are private ("unit")."""
    from dpcli.access import gate

    return "unit" if gate().restricted else None


def render_note(note: Note) -> str:
    """A library :class:`dpcli.advice.Note` with its field spelt as the flag."""
    return note.render(flag_for(note.field)) if note.field else note.render()


@contextlib.contextmanager
def working(ctx: typer.Context, message: str) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while long work runs, only when stderr is a terminal
    and not quiet. It never counts rows: how many records were read is a statistic of the data."""
    s = settings(ctx)
    if s.verbosity < 0 or not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        progress.add_task(message, total=None)
        yield


def emit_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


P = ParamSpec("P")
R = TypeVar("R")


def one_line(text: str) -> str:
    """``text`` with control and line-separator characters escaped (names from hostile files stay on one line)."""
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in text)


#: Library fields whose flag is not ``--`` + the field name with dashes.
FLAG_FOR_FIELD: dict[str, str] = {
    "k": "-k",
    # Library fields whose command-line name follows the one vocabulary (docs/vocabulary.md):
    "key": "--by",
    "domain": "--keys",
    "dbar": "--max-groups",
    "max_records": "--max-contributions",
    "clamp": "--bounds",
}


def flag_for(field: str) -> str:
    """The command-line spelling of a library error's field: ``max_contributions`` → ``--max-contributions``.

    Fields that are not identifiers (e.g. a spec key ``levels[2].moe``) are shown as they are.
    """
    if field in FLAG_FOR_FIELD:
        return FLAG_FOR_FIELD[field]
    return "--" + field.replace("_", "-") if field.isidentifier() else field


def error_line(exc: DpcliError) -> str:
    """The one stderr line for an expected error, its field (if any) spelt as a flag.

    An operator's remedy (:attr:`DpcliError.fix`) is shown to operators only; anyone else is told
    to ask the operator (in service mode no message hands an analyst a command that gives budget back).
    """
    from dpcli.access import gate

    text = exc.rendered(flag_for(exc.field)) if exc.field else str(exc)
    if exc.fix:
        text += f"; {exc.fix}" if gate().operator else "; ask the operator"
    return one_line(text)


_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _where(exc: BaseException) -> str:
    """The innermost frame of dpcli's own code that ``exc`` went through (``dpcli/io/inputs.py:120``), for a bug
    report."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve().is_relative_to(_PACKAGE_DIR)]
    if not frames:
        return "?"
    return f"{Path(frames[-1].filename).resolve().relative_to(_PACKAGE_DIR.parent)}:{frames[-1].lineno}"


def message_of(exc: BaseException) -> str:
    """An exception's message if dpcli wrote it as such (a :class:`DpcliError`), else a placeholder.

    Any other exception's text is foreign: a parser's or a library's message may quote a record
    (polars: the offending field; ``float()``: the text; a ``KeyError``: the missing key), a path
    or a secret, even when it was raised inside dpcli's own code. Only its type is shown.
    """
    if isinstance(exc, DpcliError):
        return error_line(exc)
    return "message withheld (it may quote records)"


def safe_traceback(exc: BaseException) -> str:
    """``-v``: the stack of ``exc`` and of the exceptions it came from, with messages through
    :func:`message_of` (frames show code, never data)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    parts = []
    for e in reversed(chain):
        parts.append("Traceback (most recent call last):\n" + "".join(traceback.format_tb(e.__traceback__)))
        parts.append(f"{type(e).__module__}.{type(e).__name__}: {one_line(message_of(e))}\n")
    return "".join(parts)


def handles_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Map :class:`DpcliError` to its exit code with a one-line message; bugs exit 1.

    Every ending that is not a success writes its one line on stderr and, when the command was given
    ``--json``, the same line as a JSON object on stdout (:func:`fail`). An interruption (SIGINT, or
    SIGTERM through :func:`dpcli.cli.app.main`'s handler) says what the run made durable before it
    stopped (:func:`interrupted_line`)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        verbose, as_json = _begin((*args, *kwargs.values()), kwargs)
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except DpcliError as exc:
            if verbose:
                sys.stderr.write(safe_traceback(exc))
            fail(f"dpcli: error: {error_line(exc)}", int(exc.exit_code), as_json)
        except BrokenPipeError:  # the reader closed standard output (| head): a normal end, said by the code only
            _drop_stdout()
            raise typer.Exit(int(ExitCode.CLOSED_PIPE)) from None
        except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM (Terminated)
            code = ExitCode.TERMINATED if isinstance(exc, Terminated) else ExitCode.INTERRUPTED
            fail(interrupted_line(code, progress.snapshot()), int(code), as_json)
        except Exception as exc:  # noqa: BLE001 (a bug: say so, keep the one-line contract, never the foreign text)
            _internal(exc, verbose, as_json)
        except BaseException as exc:  # pyo3's PanicException (polars panicked) is not an Exception
            if not is_native_panic(exc):
                raise
            _internal(exc, verbose, as_json)

    return wrapper


def _begin(values: tuple[Any, ...], params: dict[str, Any]) -> tuple[bool, bool]:
    """A command starts: its job named in the settings, a fresh record of what it makes durable; whether it
    was given -v and --json."""
    # typer hands commands its vendored click's Context, which is not a typer.Context
    # instance: recognise it by what it does.
    ctx = next((a for a in values if _is_context(a)), None)
    if ctx is not None:
        settings(ctx).job = job_label(str(getattr(ctx, "command_path", "")), params)
    progress.start()
    return ctx is not None and settings(ctx).verbosity > 0, params.get("as_json") is True


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by :func:`dpcli.cli.app.main`'s handler: a KeyboardInterrupt, so
    every clean-up that SIGINT runs (temporary files removed, locks released) runs for it too."""


#: How the last :func:`fail` ended: its line, its code and whether its JSON object was written (for
#: :func:`dpcli.cli.app.main`, which writes the object of an ending the root callback's handler could not tell
#: was under ``--json``).
ENDING: list[tuple[str, int, bool]] = []


def fail(line: str, code: int, as_json: bool) -> NoReturn:
    """End with ``code``: ``line`` on stderr and, under ``--json``, ``{"error": line, "exit": code}`` on stdout
    (a wrapper that parses stdout gets an object for every ending, never nothing)."""
    typer.echo(line, err=True)
    ENDING[:] = [(line, code, False)]
    if as_json:
        json_error(line, code)
    raise typer.Exit(code) from None


def json_error(line: str, code: int) -> None:
    """``{"error": line, "exit": code}`` on stdout (nothing if it is closed), once per ending."""
    if ENDING and ENDING[0][2]:
        return
    with contextlib.suppress(BrokenPipeError, OSError, ValueError):
        typer.echo(json.dumps({"error": line, "exit": code}))
        ENDING[:] = [(line, code, True)]


def interrupted_line(code: ExitCode, done: progress.Done) -> str:
    """What an interrupted run says: which signal, and what it made durable before it stopped.

    Both facts are public (README, "Threat model"): the ledger entries it appended are what
    ``dpcli budget history`` shows, the files it wrote are there to see. Neither depends on a record:
    a run debits before it reads its first one, and writes only once it has its release."""
    signal_name = "SIGTERM" if code == ExitCode.TERMINATED else "SIGINT"
    charged = (f"charged ledger {', '.join(map(repr, done.charged))} (it had begun reading its data; its rerun on "
               "the same input is free: see dpcli budget history)" if done.charged else "charged nothing")
    written = f"wrote {', '.join(done.written)}" if done.written else "wrote nothing"
    return f"dpcli: interrupted by {signal_name}: this run {charged} and {written}"


def job_label(command_path: str, params: dict[str, Any]) -> str:
    """Which job a note belongs to, for logs: the command, and its output if it has one (``-o``)."""
    command = command_path.removeprefix("dpcli").strip()
    output = params.get("output")
    if isinstance(output, (str, Path)) and str(output) not in ("", "-"):
        return f"{command} -o {one_line(str(output))}"
    return command


def _internal(exc: BaseException, verbose: bool, as_json: bool) -> NoReturn:
    """A bug (or a native library's panic): its type and dpcli's frame only, exit 1."""
    if verbose:
        sys.stderr.write(safe_traceback(exc))
    fail(f"dpcli: internal error (please report): {type(exc).__name__} at {_where(exc)}", int(ExitCode.INTERNAL),
         as_json)


def _drop_stdout() -> None:
    """Point standard output at the null device, so that flushing it at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no descriptor (a test's captured stream): nothing will flush to the pipe
        pass


def resolve_analyst(name: str | None, ctx: typer.Context) -> str:
    """The ledger a command uses: ``name`` if given, else the caller's. In service mode an analyst
    may name only their own ledger (an operator any)."""
    from dpcli.access import gate

    chosen = validate_analyst(name or settings(ctx).analyst)
    g = gate()
    if g.service and chosen != g.analyst and not g.operator:
        raise UsageError(f"in service mode you use your own ledger ({g.analyst!r}) only")
    return chosen


def payer(ctx: typer.Context, analyst: str | None = None) -> LedgerRef:
    """The ledger a command charges: the caller's (or ``analyst``'s, see :func:`resolve_analyst`) in the
    state directory, with the global lock timeout."""
    from dpcli.release.steps import LedgerRef

    s = settings(ctx)
    return LedgerRef(s.state_dir, resolve_analyst(analyst, ctx), s.lock_timeout)


def busy(ctx: typer.Context) -> Callable[[str], contextlib.AbstractContextManager[None]]:
    """``what`` → a spinner while long work runs (on a terminal only): :func:`working` for the release path."""
    return lambda what: working(ctx, what)
