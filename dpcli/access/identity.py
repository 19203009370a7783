"""Who runs dpcli, and in which mode: the caller, read once from the system.

Two modes, decided by the process and never by an option (the package docstring, :mod:`dpcli.access`, says what
each may open). :func:`whoami` reads the identity once, from the system: the process's real and effective user
ids, and ``SUDO_USER``/``SUDO_UID`` (set by sudo itself under its environment reset), which are trusted only
when the process runs as the owner of the service state directory. Tests replace :data:`SOURCE`; nothing in the
environment can. :func:`service_refusals` refuses what only the operator may choose, and
:func:`interpreter_refusal` an interpreter other users could not run.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dpcli.errors import UsageError

#: Environment variables that configure dpcli; in service mode every one of them is refused.
ENV_PREFIXES = ("DPCLI_", "_DPCLI_")


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _user_home(uid: int) -> Path | None:
    try:
        return Path(pwd.getpwuid(uid).pw_dir)
    except KeyError:
        return None


def _user_id(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


@dataclass(frozen=True)
class IdentitySource:
    """Where identity comes from: the process's user ids, its environment and the user database."""

    uid: Callable[[], int] = os.getuid
    euid: Callable[[], int] = os.geteuid
    environ: Callable[[], Mapping[str, str]] = lambda: os.environ
    user_name: Callable[[int], str | None] = _user_name
    user_home: Callable[[int], Path | None] = _user_home
    user_id: Callable[[str], int | None] = _user_id
    #: The interpreter this process runs (``sys.executable``, read when asked).
    interpreter: Callable[[], str] = lambda: sys.executable


#: The identity source of this process. Tests replace it (never the environment: an analyst controls that).
SOURCE = IdentitySource()


def service_state_dir(source: IdentitySource, uid: int) -> Path | None:
    """The service account's state directory: ``~/.local/share/dpcli`` of its home in the user
    database (never ``$HOME`` or ``$XDG_DATA_HOME``, which the caller may set)."""
    home = source.user_home(uid)
    return None if home is None else home / ".local" / "share" / "dpcli"


@dataclass(frozen=True)
class Caller:
    """Who invoked dpcli, and in which mode.

    ``name`` is the user on whose behalf dpcli runs: in service mode the invoking analyst (their
    ledger is the one charged), in personal mode the real user. ``state_dir`` is the service
    account's fixed state directory (service mode only). ``root`` marks a caller that is the
    super-user: in service mode an operator by definition (they could become the account anyway).
    """

    name: str
    service: bool
    state_dir: Path | None = None
    root: bool = False


def _owned_dir(path: Path | None, uid: int) -> bool:
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return False
    return st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid


def whoami(source: IdentitySource | None = None) -> Caller:
    """The caller, read once from the system.

    Service mode when the process runs *on behalf of another user*: a set-user-id process (real
    uid ≠ effective uid: the real user invoked it), or sudo (``SUDO_UID`` ≠ the effective uid;
    ``SUDO_USER`` names the invoker), as the owner of its service state directory. Run so by anyone
    but root, a process whose account owns no such directory is refused (not set up yet, or moved
    away): it would otherwise run in personal mode with the account's rights, for a user who does
    not own them. Otherwise personal mode, as the real user: a ``SUDO_USER`` is never believed by a
    process that does not own a service state directory.
    """
    src = source or SOURCE
    euid, uid = src.euid(), src.uid()
    invoker, invoker_name = _invoker(src, uid, euid)
    if invoker is not None:
        directory = service_state_dir(src, euid)
        if _owned_dir(directory, euid):
            if not invoker_name:
                raise UsageError("service mode: the invoking user has no name in the user database")
            return Caller(invoker_name, True, directory, root=invoker == 0)
        if invoker != 0:  # root sets the service up this way (README: sudo -u dpcli dpcli catalog set)
            raise UsageError("service mode: dpcli runs for you as an account that has no dpcli state directory "
                             "of its own (not set up, or moved away); ask the operator")
    name = src.user_name(uid) or str(uid)
    return Caller(name, False, root=uid == 0)


def _invoker(src: IdentitySource, uid: int, euid: int) -> tuple[int | None, str | None]:
    """The user this process runs on behalf of (uid and name), if any: the real user of a
    set-user-id process, or sudo's invoker (``SUDO_UID``, named by ``SUDO_USER``)."""
    if uid != euid:
        return uid, src.user_name(uid)
    env = src.environ()
    if env.get("SUDO_UID", "").isdigit() and int(env["SUDO_UID"]) != euid:
        invoker = int(env["SUDO_UID"])
        return invoker, env.get("SUDO_USER") or src.user_name(invoker)
    return None, None


def service_refusals(caller: Caller, state_dir_option: bool, analyst_option: bool,
                     environ: Mapping[str, str]) -> None:
    """Refuse, in service mode, what only the operator may choose: the state directory, the ledger
    (``--analyst``) and every ``DPCLI_*`` variable of the caller's environment."""
    if not caller.service:
        return
    if state_dir_option:
        raise UsageError("--state-dir: in service mode the state directory is the operator's; drop it")
    if analyst_option:
        raise UsageError("--analyst: in service mode your ledger is the one of the user who ran dpcli; drop it")
    for name in sorted(environ):
        if name.startswith(ENV_PREFIXES):
            raise UsageError(f"{name} is set: in service mode dpcli takes no settings from the environment; unset it")


def interpreter_refusal(executable: str) -> str | None:
    """Why other users could not run ``executable`` (the interpreter, as ``sys.executable`` names it), or None:
    the file it resolves to (``os.path.realpath``) must be readable and executable by others (o+rx), and every
    directory above it, and above the name itself (a venv's ``bin``), searchable by them (o+x). A venv made
    with a ``python3`` in root's home (pyenv, conda) links to an interpreter no analyst can run."""
    named = os.path.abspath(executable)
    resolved = os.path.realpath(named)
    fix = ("make the venv with an interpreter every user can run (e.g. /usr/bin/python3 -m venv /opt/dpcli; "
           "README, Service mode, step 2)")
    prefix = f"other users cannot run dpcli's Python {resolved}"
    if resolved != named:
        prefix += f" (what {named} links to)"
    for directory in dict.fromkeys([*reversed(Path(named).parents), *reversed(Path(resolved).parents)]):
        if not _others_may(str(directory), stat.S_IXOTH):
            return f"{prefix}: others may not enter {directory} (o+x); {fix}"
    if not _others_may(resolved, stat.S_IROTH | stat.S_IXOTH):
        return f"{prefix}: others may not read and run it (o+rx); {fix}"
    return None


def _others_may(path: str, bits: int) -> bool:
    """Does ``path`` (followed) exist with every one of ``bits`` set for others?"""
    try:
        return os.stat(path).st_mode & bits == bits
    except OSError:
        return False
