"""Who runs dpcli, in which mode, and what dpcli may open on their behalf.

Two modes, decided by the process and never by an option:

* **Personal mode.** The person running dpcli owns the data and the state directory. Every
  path they name may be read (dpcli runs with their own rights), except dpcli's own private
  files: nothing inside the state directory, and no key, ledger or state file wherever it lies,
  is ever read as an input. The library API is personal mode only.
* **Service mode.** Analysts run dpcli as a service account that owns the state directory
  (``sudo -u dpcli dpcli …`` under a sudo rule that allows only dpcli). They cannot read the
  data, the key or the state; they name datasets, public lists, Spark endpoints and stream
  states by their names in the operator's catalog (:mod:`dpcli.access.catalog`), write only into the
  output directories the catalog gives them, and dpcli opens nothing else with its rights.

:func:`whoami` reads the identity once, from the system: the process's real and effective user
ids, and ``SUDO_USER``/``SUDO_UID`` (set by sudo itself under its environment reset), which are
trusted only when the process runs as the owner of the service state directory. Tests replace
:data:`SOURCE`; nothing in the environment can.

:class:`Gate` is what every command asks before it opens or writes a path: the few entry points
(:func:`dpcli.io.opening.open_binary` through :meth:`Gate.open`, :func:`dpcli.io.outputs.check_output_path`
and :meth:`Gate.write`, the plot and state-file openers) call :func:`gate`, so a new option that
takes a path passes the same check. In service mode a read is allowed for a :class:`Source` the
gate resolved from a catalog name (never for a path the analyst typed, whatever its text), and
files in the analyst's output directories are read and written through the directory, opened
without following symlinks (:mod:`dpcli.access.walk`): what the check saw is what is opened.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dpcli.access.walk import (
    SWAPPED,
    Escape,
    inside,
    open_dir_below,
    open_nofollow,
    trusted_uids,
    unsafe_component,
    unsafe_stat,
)
from dpcli.errors import UsageError

if TYPE_CHECKING:
    from dpcli.access.catalog import Catalog, Entry, OutputEntry

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


@dataclass(frozen=True)
class Source:
    """An input as the caller named it, resolved to where and how it is read.

    ``name`` is what messages, summaries and ledger lines show (a catalog name, or the path as
    given); ``location`` is the path, directory or URI read. ``entry`` is the catalog entry the name
    resolved to (it enters the release seed), None for a path given directly. ``public`` marks a public
    list (never a data input): given as a pipe (``--keys <(…)``) it is read whole, its format told by its
    first bytes when its name does not tell (:func:`dpcli.io.inputs.open_input`).
    """

    name: str
    location: str
    format: str | None = None
    delimiter: str | None = None
    compression: str | None = None
    privacy_unit: str | None = None
    entry: dict[str, object] | None = None
    public: bool = False

    @property
    def unit(self) -> str:
        """The privacy unit column of a data input (:func:`dpcli.cli._sources.data_source` settles it)."""
        assert self.privacy_unit is not None, self.name
        return self.privacy_unit


@dataclass
class Gate:
    """What this process may open and write for its caller (see the module docstring).

    Personal mode: any path except dpcli's own private files. Service mode: only what the catalog
    lets this analyst use, resolved by name; every other path is refused before anything is read.
    """

    caller: Caller
    state_dir: Path | None = None
    catalog: Catalog | None = None
    #: Locations the resolved names of this run may read (service mode): filled by the resolvers.
    readable: set[str] = field(default_factory=set)
    #: Files in the analyst's output directories this run may read (service mode: ``plot``).
    releases: set[str] = field(default_factory=set)
    #: Locations of this run's names that ``catalog set`` resolved (the rest: a catalog sealed before).
    sealed: set[str] = field(default_factory=set)
    #: (device, inode) of what this run reads (files opened through :meth:`open`, dataset directories, the
    #: inputs :func:`dpcli.io.outputs.check_output_path` was given): :meth:`write` never replaces one, nor
    #: writes below one.
    protected: set[tuple[int, int]] = field(default_factory=set)
    #: What this run read from pipes (a public list, a query file: :func:`dpcli.io.opening.read_pipe`), by path:
    #: a pipe is read once, and a list opened again (a table's header, then its rows) is read from these bytes.
    pipes: dict[str, bytes] = field(default_factory=dict)

    @property
    def service(self) -> bool:
        return self.caller.service

    @property
    def analyst(self) -> str:
        return self.caller.name

    @property
    def restricted(self) -> bool:
        """Does the catalog limit what this caller may open and write? (A service-mode analyst; an
        operator owns the data and the state, as in personal mode.)"""
        return self.service and not self.operator

    @property
    def operator(self) -> bool:
        """May this caller give budget back (create ledgers, reseal, rotate the key, edit the catalog)?

        In personal mode, yes: one person holds every role. In service mode: the super-user, or a user
        the catalog names as an operator.
        """
        if not self.service:
            return True
        return self.caller.root or (self.catalog is not None and self.caller.name in self.catalog.operators)

    def require_operator(self, what: str) -> None:
        """Refuse ``what`` unless the caller is an operator (one line, exit 2)."""
        if not self.operator:
            raise UsageError(f"{what} is the operator's: analysts cannot run it in service mode")

    def require_public_interpreter(self, what: str) -> None:
        """In service mode, refuse ``what`` (an operator's set-up step: ``catalog set``, ``budget init``) when the
        interpreter that runs dpcli is one other users cannot run: every analyst's ``sudo -u`` would fail
        with "Permission denied" before Python starts, where nothing could say why (one line, exit 2)."""
        if not self.service:
            return
        refusal = interpreter_refusal(SOURCE.interpreter())
        if refusal is not None:
            raise UsageError(f"{what}: {refusal}")

    def require_catalog(self) -> Catalog:
        if self.catalog is None:
            raise UsageError("service mode: the operator has not set up dpcli yet (no catalog)")
        return self.catalog

    # --- inputs -------------------------------------------------------------------------------

    def dataset(self, argument: str) -> Source:
        """The data input named on the command line: a catalog dataset, standard input, or (personal
        mode) a path."""
        if argument == "-":
            return Source("<stdin>", "-")
        entry = self._entry("datasets", argument)
        if entry is None:
            return Source(argument, argument)
        return self._resolved(argument, entry)

    def public(self, argument: str, option: str) -> Source:
        """A public file (a list of groups, a block list) named by ``option``: a catalog public name,
        standard input, or (personal mode) a path."""
        if argument == "-":
            return Source("<stdin>", "-", public=True)
        entry = self._entry("public", argument, option)
        if entry is None:
            return Source(argument, argument, public=True)
        return replace(self._resolved(argument, entry), public=True)

    def _entry(self, section: str, argument: str, option: str | None = None) -> Entry | None:
        """The catalog entry ``argument`` names in ``section`` (if the caller may use it); None for a
        path in personal mode; refused in service mode when it is no such name."""
        if not self.restricted:
            return self.catalog.entry(section, argument) if self.catalog is not None else None
        catalog = self.require_catalog()
        entry = catalog.entry(section, argument)
        if entry is None or not catalog.allows(entry, self.analyst):
            what = "dataset" if section == "datasets" else "public list"
            named = f"{argument!r}" if _is_name(argument) else "the path given"  # a path is not echoed
            where = f"{option} " if option else ""
            raise UsageError(f"{where}{named} is not a {what} of the catalog you may use "
                             "(in service mode inputs are named, never given as paths; see: dpcli catalog show)")
        return entry

    def _resolved(self, name: str, entry: Entry) -> Source:
        location = entry.get("resolved", entry["location"])  # (resolved at catalog set; older catalogs: as given)
        self.readable.add(location)
        if "resolved" in entry:
            self.sealed.add(location)
        # what enters the seed (the resolved path is where the location lies, not how it is read)
        shaping = {k: v for k, v in entry.items() if k not in ("analysts", "description", "resolved")}
        return Source(name, location, entry.get("format"), entry.get("delimiter"), entry.get("compression"),
                      entry.get("privacy_unit"), {"name": name, **shaping})

    def check_read(self, path: str | Source, what: str) -> None:
        """May dpcli read ``path``? (Asked by :meth:`open`, and before a dataset directory is listed.)

        Personal mode: not inside the state directory (the key, ledgers, catalog and schedule states
        live there). Service mode: only a :class:`Source` this gate resolved from a catalog name the
        analyst may use, and the releases :meth:`allow_read` let through; a path the analyst typed is
        refused even when its text is a resolved location, and nothing below a dataset directory is
        opened here (dpcli lists those files itself). Refused before anything is opened.
        """
        if self.restricted and not self._may_read(path):
            raise UsageError(f"{what}: dpcli opens no path for an analyst in service mode (name a catalog entry)")
        if self.service and isinstance(path, Source) and path.entry is not None and "://" not in path.location:
            os.close(self._open_location(path, what, getattr(os, "O_PATH", os.O_RDONLY) | os.O_CLOEXEC))
        if self.restricted:
            return
        location = path.location if isinstance(path, Source) else path
        if self.state_dir is not None and location != "-" and inside(location, self.state_dir):
            from dpcli.errors import InputMissingError

            raise InputMissingError(f"{what} {_shown(path)!r} lies in the state directory: dpcli never reads its own "
                                    "state as an input")

    def _may_read(self, path: str | Source) -> bool:
        """Service mode: a :class:`Source` this gate resolved from the catalog, or a release let through."""
        if isinstance(path, Source):
            return path.entry is not None and path.location in self.readable
        return path in self.releases

    def open(self, path: str | Source, what: str, flags: int) -> int:
        """Open ``path`` for reading once :meth:`check_read` allows it; ``OSError`` as the OS raises it.

        A release in an output directory (service mode) is opened from that directory, one name at a
        time without following symlinks (:mod:`dpcli.access.walk`): one swapped for a symlink after the
        check is refused like any path outside, whether or not what it points to exists.
        """
        self.check_read(path, what)
        if self.service and isinstance(path, Source) and path.entry is not None:
            return self._protected(self._open_location(path, what, flags))
        if not (self.restricted and isinstance(path, str)):
            return self._protected(os.open(path.location if isinstance(path, Source) else path, flags))
        real = os.path.realpath(path)
        refusal = f"{what} {path!r}: in service mode dpcli reads only releases in your output directories"
        directory = self._output_dir_fd(os.path.dirname(real), refusal)
        try:
            return os.open(os.path.basename(real), flags | os.O_NOFOLLOW, dir_fd=directory)
        except OSError as exc:
            if exc.errno in SWAPPED:
                raise UsageError(refusal) from None
            raise
        finally:
            os.close(directory)

    def _open_location(self, source: Source, what: str, flags: int) -> int:
        """Open a catalog location (service mode) as :func:`dpcli.access.catalog.seal_paths` stored it: no component
        renamable or writable by anyone but root and the service account, no symlink anywhere on the path
        (:func:`dpcli.access.walk.open_nofollow`), and the file opened owned and writable by them only (its
        ``fstat``). A catalog sealed before paths were resolved is checked so at every use (its location
        resolved then). Refused in one line (exit 2): the operator's names the path and the fix."""
        location = source.location
        if location not in self.sealed:
            location = os.path.realpath(location)  # (an older catalog: resolved now, checked the same way)
        trusted = trusted_uids()
        try:
            bad = unsafe_component(location, trusted)
        except FileNotFoundError:
            bad = None  # (reported by the open below, as a missing input)
        if bad is None:
            try:
                fd = open_nofollow(location, flags)
            except OSError as exc:
                if exc.errno not in SWAPPED:
                    raise
                bad = (location, "a symlink, or below one")
            else:
                why = unsafe_stat(os.fstat(fd), trusted)
                if why is None:
                    return fd
                os.close(fd)
                bad = (location, why)
        raise UsageError(self._unsafe(f"{what} {source.name!r}", *bad))

    def _unsafe(self, what: str, component: str, why: str) -> str:
        """The one line refusing an unsafe catalog path: to an analyst without the path (it is private)."""
        if self.restricted:
            return (f"{what}: its catalog location is no longer safe from renames (a symlink, or a directory or file "
                    "others can write, on its path); ask the operator")
        from dpcli.access.catalog import PATH_FIX

        return f"{what}: {component} is {why}: {PATH_FIX}"

    def open_directory(self, source: Source, what: str) -> tuple[int, frozenset[int] | None]:
        """A dataset directory opened as :meth:`open` opens a file (in service mode a catalog location as
        sealed, checked on its descriptor), for a walk from that descriptor (:func:`dpcli.access.walk.files_below`);
        and who may own what lies below it: root and the service account for a catalog location in service
        mode (checked as the location was), None (not checked: only symlinks are refused) otherwise."""
        fd = self.open(source, what, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
        checked = self.service and source.entry is not None and "://" not in source.location
        return fd, trusted_uids() if checked else None

    def below_refusal(self, what: str, source: Source, why: str) -> UsageError:
        """The one line (exit 2) refusing what lies below a dataset directory (``why``: a symlink, or what
        :func:`dpcli.access.walk.unsafe_stat` said). Names below a dataset can be data (hive partitions): they
        are never quoted; the operator is given the directory and a ``find`` that lists what is refused, an
        analyst neither (the location is private)."""
        if self.restricted:
            return UsageError(f"{what} {source.name!r}: a file or directory below its catalog location is a symlink, "
                              "or others can change it; ask the operator")
        where = source.location
        listing = (f"find {where} \\( -type l -o -perm /022 -o \\! \\( -uid 0 -o -uid {os.geteuid()} \\) \\) -print"
                   if self.service else f"find {where} -type l")
        if why == "a symlink":
            return UsageError(f"{what} {source.name!r}: a symlink lies below {where} (a dataset is read from its own "
                              f"files, never through a link; {listing} lists them): replace it by the file or "
                              "directory it points to")
        return UsageError(f"{what} {source.name!r}: a file or directory below {where} is {why} (names below a "
                          f"dataset are not shown; {listing} lists them): keep everything below a dataset owned by "
                          "root or the service account and writable by neither group nor others")

    def _protected(self, fd: int) -> int:
        """``fd``, an input just opened, its (device, inode) recorded as one :meth:`write` must not touch."""
        st = os.fstat(fd)
        self.protected.add((st.st_dev, st.st_ino))
        return fd

    def protect(self, paths: Sequence[str | os.PathLike[str] | None]) -> None:
        """Record the inputs at ``paths`` (as they resolve now; ``-``: the file or pipe on standard input)
        as ones :meth:`write` must not replace or write below; missing ones and URIs are skipped."""
        for path in paths:
            try:
                st = (os.fstat(0) if str(path) == "-" else os.stat(path)) if path is not None else None
            except OSError:
                continue
            if st is not None and not stat.S_ISCHR(st.st_mode):
                self.protected.add((st.st_dev, st.st_ino))

    def allow_read(self, path: str) -> None:
        """Let this run read ``path``, a file in the analyst's output directories (a release that
        ``plot`` then checks against the ledger by its digest)."""
        self.releases.add(path)

    # --- outputs ------------------------------------------------------------------------------

    def check_write(self, path: str, what: str = "output") -> None:
        """May dpcli write ``path`` for the caller? Never inside the state directory (exit 73); in
        service mode only inside an output directory the catalog gives this analyst (resolved:
        symlinks, ``..``; exit 2). The run's own inputs are protected by
        :func:`dpcli.io.outputs.check_path_is_not_protected`."""
        if path in ("", "-"):
            return
        if self.restricted:
            roots = [o for o in self.require_catalog().output_entries(self.analyst) if inside(path, _root(o))]
            if not roots:
                raise UsageError(_outside(what))
            os.close(self._output_root_fd(roots[0]))  # (refused now, before any data is read, if swapped)
        if self.state_dir is not None and inside(path, self.state_dir):
            from dpcli.errors import OutputError

            raise OutputError(f"{what} {path!r} lies inside the state directory; write it elsewhere")

    def write(self, path: str, data: bytes, what: str = "output", mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` atomically once :meth:`check_write` allows it (:class:`OutputError`
        when the system refuses); in personal mode a device or a pipe is written in place
        (:func:`dpcli.state.atomic.writes_in_place`). For a service-mode analyst the file is written
        through its directory, opened from their output directory without following symlinks
        (:mod:`dpcli.access.walk`), so a directory swapped for a symlink after the check cannot lead the
        write elsewhere (exit 2); for everyone else through its directory opened once and checked on that
        descriptor (:meth:`_checked_parent`: never the state directory, an input, or below an input
        dataset; exit 73)."""
        from dpcli.errors import OutputError, os_reason
        from dpcli.state.atomic import atomic_write_at, writes_in_place

        self.check_write(path, what)
        target = Path(path)
        try:
            if not self.restricted and writes_in_place(target):  # /dev/null, a pipe: written through, never replaced
                self._write_through(target, data, what)
                return
            if not self.restricted:
                directory = self._checked_parent(target, what)
            else:
                directory = self._output_dir_fd(os.path.realpath(target.parent), _outside(what))
            try:
                atomic_write_at(directory, target.name, data, mode)
            finally:
                os.close(directory)
        except OSError as exc:
            raise OutputError(f"cannot write {path!r}: {os_reason(exc)}") from None

    def _checked_parent(self, target: Path, what: str) -> int:
        """The directory of an output that is not an analyst's (operators, personal mode), opened once (by
        path: symlinks followed, as the caller may) and checked on that descriptor: not in the state
        directory nor below an input dataset (its ancestors, by device and inode, through ``..``), and the
        name in it no input and none of dpcli's private files (:class:`OutputError`, exit 73). The write
        is then made relative to it, so a directory on the path swapped after :meth:`check_write` cannot
        lead it elsewhere."""
        fd = os.open(target.parent, _DIR_FLAGS)
        try:
            self._refuse_below_protected(fd, str(target), what)
            self._refuse_protected_entry(fd, target.name, str(target), what)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _write_through(self, target: Path, data: bytes, what: str) -> None:
        """A device or a pipe (:func:`dpcli.state.atomic.writes_in_place`) written in place, through its directory
        opened once and checked as :meth:`_checked_parent` checks it. In ``/dev`` or a process's descriptors
        (what the descriptor's directory is now, not its path) the name is followed (``/dev/stdout``), and a
        regular file it leads to must be none of the run's inputs; anywhere else the name is not followed and
        must still be no regular file (one swapped in since the check is refused, never appended to)."""
        from dpcli.errors import OutputError
        from dpcli.state.atomic import in_stream_dir, write_in_place_at

        directory = os.open(target.parent, _DIR_FLAGS)
        try:
            self._refuse_below_protected(directory, str(target), what)
            stream = in_stream_dir(directory, target.parent)

            def check(st: os.stat_result) -> None:
                if stat.S_ISREG(st.st_mode) and (not stream or (st.st_dev, st.st_ino) in self.protected):
                    raise OutputError(f"{what} {str(target)!r} is a regular file now (a device or a pipe when "
                                      "checked): write it elsewhere")

            write_in_place_at(directory, target.name, data, follow=stream, check=check)
        finally:
            os.close(directory)

    def _refuse_below_protected(self, fd: int, path: str, what: str) -> None:
        """Refuse when the open directory ``fd`` is, or lies below, the state directory or an input dataset."""
        from dpcli.errors import OutputError

        state = _identity(self.state_dir)
        for key in _ancestry(fd):
            if key == state:
                raise OutputError(f"{what} {path!r} lies inside the state directory; write it elsewhere")
            if key in self.protected:
                raise OutputError(f"{what} {path!r} lies inside one of the run's input datasets; write it elsewhere")

    def _refuse_protected_entry(self, fd: int, name: str, path: str, what: str) -> None:
        """Refuse when the entry ``name`` of the open directory ``fd`` (not followed: it is what is replaced)
        is one of the run's inputs, or a key, ledger or state file."""
        from dpcli.errors import OutputError
        from dpcli.io.opening import is_private_file

        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) in self.protected:
            raise OutputError(f"{what} {path!r} is one of the run's inputs; write it elsewhere")
        if not stat.S_ISREG(st.st_mode):
            return
        try:
            entry = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return  # (one dpcli cannot read is none of its private files, which it reads: replaced as before)
        try:
            head = os.pread(entry, 32, 0)
        finally:
            os.close(entry)
        if is_private_file(head):
            raise OutputError(f"{what} {path!r} is one of dpcli's private files (a key, ledger or state); "
                              "write it elsewhere")

    def _output_dir_fd(self, directory: str, refusal: str) -> int:
        """``directory`` (resolved) opened from the output directory of this analyst it lies in; the
        ``refusal`` (exit 2) if it lies in none, or no longer does."""
        for out in self.require_catalog().output_entries(self.analyst) if self.restricted else []:
            if inside(directory, _root(out)):
                root = self._output_root_fd(out)
                try:
                    return open_dir_below(root, directory)
                except Escape:
                    break
                finally:
                    os.close(root)
        raise UsageError(refusal)

    def _output_root_fd(self, out: OutputEntry) -> int:
        """The output directory ``out`` opened from ``/`` without following any symlink, and checked to be
        the directory pinned (device, inode) when the catalog was sealed, owned and writable by root and
        the service account only; else refused in one line (exit 2). (An older catalog without a pin: its
        directory resolved and every component checked, at each use.)"""
        root = _root(out)
        if "resolved" not in out:
            root = os.path.realpath(root)
        trusted = trusted_uids()
        refusal = (f"output directory {out['directory']}: no longer the one the catalog was sealed with (renamed, "
                   "replaced, or on a path others can write); ask the operator")
        try:
            if "pin" not in out and unsafe_component(root, trusted) is not None:
                raise UsageError(refusal)
            fd = open_nofollow(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
        except OSError:
            raise UsageError(refusal) from None
        st = os.fstat(fd)
        if ("pin" in out and [st.st_dev, st.st_ino] != out["pin"]) or unsafe_stat(st, trusted) is not None:
            os.close(fd)
            raise UsageError(refusal)
        return fd

    def output_dirs(self) -> list[str]:
        """The directories this caller may write into (service mode); empty in personal mode."""
        return self.catalog.output_dirs(self.analyst) if self.restricted and self.catalog is not None else []

    # --- other named things -------------------------------------------------------------------

    def spark(self, master: str | None, remote: str | None, conf: list[str] | None) -> tuple[str | None, str | None,
                                                                                                list[str] | None]:
        """``--master``/``--remote``/``--spark-conf``: as given in personal mode; in service mode
        ``--master NAME`` names a Spark endpoint of the catalog (its master or Connect server and its
        settings), and ``--remote``/``--spark-conf`` are refused."""
        if not self.restricted:
            return master, remote, conf
        if remote is not None or conf:
            raise UsageError("--remote and --spark-conf: in service mode Spark endpoints are the catalog's; "
                             "name one with --master NAME")
        catalog = self.require_catalog()
        if master is None:
            names = catalog.usable("spark", self.analyst)
            if len(names) != 1:
                raise UsageError("--engine spark: name the catalog's Spark endpoint with --master NAME")
            master = names[0]
        entry = catalog.entry("spark", master)
        if entry is None or not catalog.allows(entry, self.analyst):
            raise UsageError(f"--master {master!r} is not a Spark endpoint of the catalog you may use")
        return entry.get("master"), entry.get("remote"), list(entry.get("conf", []))

    def stream_state(self, argument: str) -> Path:
        """``--state``: a path in personal mode; in service mode a NAME, kept in the state directory
        under the analyst's own folder (``streams/ANALYST/NAME.stream``)."""
        if not self.service:
            return Path(argument)
        from dpcli.state.paths import validate_analyst

        try:
            validate_analyst(argument)
        except UsageError:
            raise UsageError("--state: in service mode a stream is named (letters, digits, '_', '.', '-'), "
                             "not given as a path") from None
        assert self.state_dir is not None
        folder = self.state_dir / "streams" / self.analyst
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return folder / f"{argument}.stream"


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC
_UP_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC


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


def _identity(path: Path | None) -> tuple[int, int] | None:
    """(device, inode) of ``path`` (followed), None if there is none."""
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if st is not None else None


def _ancestry(fd: int) -> list[tuple[int, int]]:
    """(device, inode) of the open directory ``fd`` and of each of its ancestors up to ``/``, found through
    ``..`` from the descriptor (never by path), as they are now; a ``..`` that cannot be opened ends it."""
    chain: list[tuple[int, int]] = []
    current = os.dup(fd)
    try:
        while True:
            st = os.fstat(current)
            key = (st.st_dev, st.st_ino)
            if key in chain:
                return chain
            chain.append(key)
            try:
                up = os.open("..", _UP_FLAGS, dir_fd=current)
            except OSError:
                return chain
            os.close(current)
            current = up
    finally:
        os.close(current)


def _root(out: OutputEntry) -> str:
    """Where an output directory lies: as resolved at ``catalog set`` (older catalogs: as given)."""
    return out.get("resolved", out["directory"])


def _outside(what: str) -> str:
    """The refusal of a path outside the analyst's output directories (or led out of them by a symlink)."""
    return f"{what}: in service mode you write only into your output directories (see: dpcli catalog show)"


def _shown(path: str | Source) -> str:
    """How messages name an input: a catalog name (its location is private), or the path as given."""
    return path.name if isinstance(path, Source) else path


def _is_name(text: str) -> bool:
    """Does ``text`` have the shape of a catalog name (so a refusal may echo it)?"""
    from dpcli.state.paths import validate_analyst

    try:
        validate_analyst(text)
    except UsageError:
        return False
    return True


#: The gate of this process: personal mode with no state directory until the CLI installs one.
_GATE = Gate(Caller("", False))


def gate() -> Gate:
    """The gate every entry point asks (:func:`install` sets it; the library runs in personal mode)."""
    return _GATE


def install(new: Gate) -> Gate:
    """Make ``new`` the process's gate (the CLI, once per invocation); returns the previous one."""
    global _GATE
    previous, _GATE = _GATE, new
    return previous
