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

:func:`whoami` reads the identity once, from the system (:mod:`dpcli.access.identity`: the caller,
their mode, what only the operator may choose).

:class:`Gate` is what every command asks before it opens or writes a path: the few entry points
(:func:`dpcli.io.opening.open_binary` through :meth:`Gate.open`, :func:`dpcli.io.outputs.check_output_path`
and :meth:`Gate.write`, the plot and state-file openers) call :func:`gate`, so a new option that
takes a path passes the same check. In service mode a read is allowed for a :class:`Source` the
gate resolved from a catalog name (never for a path the analyst typed, whatever its text), and
files in the analyst's output directories are read and written through the directory, opened
without following symlinks (:mod:`dpcli.access.walk`): what the check saw is what is opened. The
operator's locations are opened as the catalog sealed them (:mod:`dpcli.access.locations`), and every
other output through its directory opened once and checked on that descriptor (:mod:`dpcli.access.writes`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dpcli.access import identity
from dpcli.access.identity import (
    ENV_PREFIXES,
    Caller,
    IdentitySource,
    interpreter_refusal,
    service_refusals,
    service_state_dir,
    whoami,
)
from dpcli.access.locations import open_location, open_output_dir, open_output_root, output_root, outside_refusal
from dpcli.access.walk import SWAPPED, inside, trusted_uids
from dpcli.access.writes import checked_parent, write_through
from dpcli.errors import UsageError

if TYPE_CHECKING:
    from dpcli.access.catalog import Catalog, Entry

__all__ = ["ENV_PREFIXES", "Caller", "Gate", "IdentitySource", "Source", "gate", "install", "interpreter_refusal",
           "service_refusals", "service_state_dir", "whoami"]


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
        refusal = interpreter_refusal(identity.SOURCE.interpreter())
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
        return self.typed(path) in self.releases

    def typed(self, path: str) -> str:
        """A path an analyst typed, as service mode takes it: made absolute and its ``..`` taken off by its text
        before anything is asked of the file system (so ``PRIVATE/../out/x.csv`` never probes ``PRIVATE``, which
        the service account could see and the analyst could not); as given otherwise and for ``-``."""
        if not self.restricted or path in ("", "-") or "://" in path:
            return path
        return os.path.normpath(os.path.abspath(path))

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
        real = os.path.realpath(self.typed(path))
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
        """Open a catalog location (service mode) as :func:`dpcli.access.catalog.seal_paths` stored it
        (:func:`dpcli.access.locations.open_location`: nothing on its path renamable by others, no symlink, the
        file owned and writable by root and the service account only); refused in one line (exit 2)."""
        return open_location(source.location, source.location in self.sealed, flags, f"{what} {source.name!r}",
                             self.restricted)

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
        self.releases.add(self.typed(path))

    # --- outputs ------------------------------------------------------------------------------

    def check_write(self, path: str, what: str = "output") -> None:
        """May dpcli write ``path`` for the caller? Never inside the state directory (exit 73); in
        service mode only inside an output directory the catalog gives this analyst (resolved:
        symlinks, ``..``; exit 2). The run's own inputs are protected by
        :func:`dpcli.io.outputs.check_path_is_not_protected`."""
        if path in ("", "-"):
            return
        path = self.typed(path)
        if self.restricted:
            roots = [o for o in self.require_catalog().output_entries(self.analyst) if inside(path, output_root(o))]
            if not roots:
                raise UsageError(outside_refusal(what))
            os.close(open_output_root(roots[0]))  # (refused now, before any data is read, if swapped)
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
        descriptor (:func:`dpcli.access.writes.checked_parent`: never the state directory, an input, or below an input
        dataset; exit 73)."""
        from dpcli.errors import OutputError, os_reason
        from dpcli.state.atomic import atomic_write_at, writes_in_place

        self.check_write(path, what)
        target = Path(self.typed(path))
        try:
            if not self.restricted and writes_in_place(target):  # /dev/null, a pipe: written through, never replaced
                write_through(target, data, what, self.state_dir, self.protected)
                return
            if not self.restricted:
                directory = checked_parent(target, what, self.state_dir, self.protected)
            else:
                directory = self._output_dir_fd(os.path.realpath(target.parent), outside_refusal(what))
            try:
                atomic_write_at(directory, target.name, data, mode)
            finally:
                os.close(directory)
        except OSError as exc:
            raise OutputError(f"cannot write {path!r}: {os_reason(exc)}") from None

    def _output_dir_fd(self, directory: str, refusal: str) -> int:
        """``directory`` (resolved) opened from the output directory of this analyst it lies in; the
        ``refusal`` (exit 2) if it lies in none, or no longer does."""
        outputs = self.require_catalog().output_entries(self.analyst) if self.restricted else []
        return open_output_dir(outputs, directory, refusal)

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
