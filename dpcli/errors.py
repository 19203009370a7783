"""The exception hierarchy and the frozen table of exit codes.

Every error dpcli reports on purpose is a :class:`DpcliError`; the CLI maps
its ``exit_code`` to the process exit status and prints its message as one
line on stderr. Anything else that escapes is a bug (exit code 1).
"""

from __future__ import annotations

import errno
import os
import sys
from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit statuses. Frozen: scripts and cron jobs depend on them."""

    OK = 0
    INTERNAL = 1  # a bug in dpcli
    USAGE = 2  # bad options or arguments (also typer's own usage errors)
    DATA = 65  # bad input data: missing column, wrong type, nulls, empty file
    NO_INPUT = 66  # input file missing or unreadable
    CANT_WRITE = 73  # output cannot be written
    LOCK_TIMEOUT = 75  # state lock not acquired in time; safe to retry
    BUDGET = 77  # privacy budget refused
    STATE = 78  # corrupt, tampered, insecure or newer-version state
    INTERRUPTED = 130  # SIGINT
    TERMINATED = 143  # SIGTERM (128 + 15, what a shell shows for a process SIGTERM ended)
    CLOSED_PIPE = 141  # standard output closed by its reader (``| head``): no message, as a shell tool


class DpcliError(Exception):
    """Base class of all expected errors. ``str(err)`` is the one-line message.

    A library error about one input field names it in ``field`` (a query or
    ledger field such as ``"epsilon"`` or ``"max_contributions"``) and keeps
    the rest of the sentence in ``detail``; ``str(err)`` is ``"field detail"``.
    The CLI renders the field as its flag (``--epsilon``), the way
    sqlite-utils maps its library errors to click errors, so no module below
    ``dpcli.cli`` ever spells a flag.

    ``fix`` is a remedy only the operator may apply (create a ledger, reseal
    one): the CLI shows it to operators and tells anyone else to ask the
    operator, so no message hands an analyst a command that gives budget back.
    """

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, detail: str, *, field: str | None = None, fix: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.field} {self.detail}" if self.field else self.detail

    def rendered(self, name: str) -> str:
        """The message with the field shown as ``name`` (e.g. its command-line flag)."""
        return f"{name} {self.detail}" if self.field else self.detail


class UsageError(DpcliError):
    """Options or arguments that cannot be honoured (ε ≤ 0, k too large, ...)."""

    exit_code = ExitCode.USAGE


class DataError(DpcliError):
    """The input data does not fit the query (missing column, nulls, wrong type)."""

    exit_code = ExitCode.DATA


class InputMissingError(DpcliError):
    """The input file does not exist or cannot be read."""

    exit_code = ExitCode.NO_INPUT


class OutputError(DpcliError):
    """The output cannot be written."""

    exit_code = ExitCode.CANT_WRITE


class LockTimeoutError(DpcliError):
    """Another process holds the state lock for too long."""

    exit_code = ExitCode.LOCK_TIMEOUT


class BudgetError(DpcliError):
    """The ledger refuses the charge: the query would overspend the budget."""

    exit_code = ExitCode.BUDGET


class StateError(DpcliError):
    """The state directory, key file or a ledger is corrupt, insecure or too new."""

    exit_code = ExitCode.STATE


class SparkStopped(DpcliError):
    """The Spark driver went away during a run (it exits when out of heap); nothing was charged."""

    exit_code = ExitCode.INTERNAL


#: What an operating-system error means, in dpcli's words (its own text is the OS's: never printed).
_OS_REASONS = {errno.EACCES: "permission denied", errno.EPERM: "not permitted", errno.ENOENT: "no such file",
               errno.EISDIR: "a directory", errno.ENOTDIR: "a path component is not a directory",
               errno.ELOOP: "too many symbolic links", errno.ENAMETOOLONG: "name too long",
               errno.ENOSPC: "no space left on the device", errno.EROFS: "read-only file system",
               errno.EIO: "input/output error", errno.EMFILE: "too many open files", errno.EXDEV: "another device",
               errno.EDQUOT: "disk quota exceeded", errno.EEXIST: "already exists"}


def os_reason(exc: BaseException) -> str:
    """A fixed phrase for an OS error (by its errno), never the error's own text."""
    code = getattr(exc, "errno", None)
    return _OS_REASONS.get(code, "operating-system error") if isinstance(code, int) else "operating-system error"


def type_text(dtype: object) -> str:
    """A column type in dpcli's words: its kind only (``Enum``, ``Struct``, ``Datetime``, ``Int64``).

    A type's own text is foreign: a polars ``Enum`` lists its categories (data values, even ones no
    record holds), a ``Struct`` its fields (column names the analyst did not name), a Spark struct
    the same (``struct<…>``). Accepts a polars type (its base type) or a Spark one (its type name).
    """
    base = getattr(dtype, "base_type", None)
    if callable(base):
        return str(base())
    name = getattr(dtype, "typeName", None)
    return str(name()) if callable(name) else type(dtype).__name__


def withheld(exc: BaseException) -> str:
    """What to say about a parser's error on data: its kind only, never its message.

    Polars quotes the offending field (``could not parse `…` as dtype i64``) or, for an unterminated
    quote, the rest of the file: records, which must never reach stderr. The run still fails, so
    the inputs are kept total where they can be (CSV: ragged lines truncated, invalid UTF-8 replaced;
    NDJSON: a line that is not a JSON object is a record of nulls).
    """
    return f"the file does not parse ({type(exc).__name__}; the parser's message is withheld: it may quote records)"


def quiet_native_stderr() -> None:
    """Keep native libraries' text off stderr: file descriptor 2 is sent to the null device, and Python's
    ``sys.stderr`` (every message dpcli writes) goes on to a duplicate of where it pointed.

    Code below Python writes to descriptor 2 directly, past every ``except``: a Rust panic's message
    (polars: "thread … panicked at …", with a backtrace under ``RUST_BACKTRACE``), an allocation
    failure's before the process aborts, a child process's (a Spark JVM's log). That text is foreign
    and may quote records (README, "Threat model", rule 9), so a process of its own (the console
    script, ``python -m dpcli``) calls this once, first. A process killed by a signal still shows as
    one in its exit status (an abort is 134).
    """
    try:
        sys.stderr.flush()
        own = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # no descriptor 2 (closed): nothing reaches a stderr anyway
        return
    try:
        os.dup2(null, 2)
    finally:
        os.close(null)
    sys.stderr = open(own, "w", buffering=1, encoding=sys.stderr.encoding or "utf-8",  # noqa: SIM115 (for the process's life)
                      errors="backslashreplace")


def is_native_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a native library's panic (pyo3's ``PanicException``, a ``BaseException``)."""
    return type(exc).__name__ == "PanicException"
