"""The operator's catalog: what analysts may use in service mode, by name.

The operator writes it as TOML and installs it with ``dpcli catalog set FILE``; dpcli keeps it in
the state directory as ``catalog.json``, sealed with a key derived from the secret key (an edit
made without dpcli fails its seal: exit 78). Sections::

    operators = ["ops"]                     # users who may act as the operator through sudo

    [datasets.visits]                       # private data: analysts name it, never read it
    location = "/srv/data/visits.parquet"   # an absolute path, a directory of Parquet files, or a URI
    privacy_unit = "user_id"                # the column that identifies a person: the operator's choice
    # or, for rows owned through another dataset's key (sql only; the parent is another dataset):
    # owned_by = { column = "l_orderkey", parent = "orders", key = "o_orderkey", max_keys = 16 }
    format = "parquet"                      # csv, parquet or ndjson (default: from the extension)
    delimiter = ","                         # CSV only
    compression = "gzip"                    # gzip, bzip2, xz or none (default: from the extension)
    analysts = ["alice", "bob"]             # or ["*"]: every analyst

    [public.pages]                          # public lists and tables (--keys, a spec's block list)
    location = "/srv/data/pages.csv"
    analysts = ["*"]

    [spark.cluster]                         # Spark endpoints (--engine spark --master cluster)
    master = "spark://10.0.0.5:7077"        # or: remote = "sc://gateway:15002"
    conf = ["spark.executor.memory=8g"]
    analysts = ["alice"]

    [[outputs]]                             # where analysts may write (-o, plot -o, budget show --plot)
    directory = "/srv/dpcli/out/alice"
    analysts = ["alice"]

Every name follows the analyst-name rule (letters, digits, ``_ . -``). The catalog is private: an
analyst's ``dpcli catalog show`` lists only the names they may use, never locations or columns.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, Required, TypedDict

from dpcli.errors import StateError, UsageError
from dpcli.state.paths import validate_analyst

CATALOG_FILE = "catalog.json"
_KIND = "dpcli-catalog"
_VERSION = 1
_MAC_LABEL = "catalog-mac/v1"
SECTIONS = ("datasets", "public", "spark")
_FORMATS = ("csv", "parquet", "ndjson")
_COMPRESSIONS = ("gzip", "bzip2", "xz", "none")
_ENTRY_KEYS = {
    "datasets": {"location", "privacy_unit", "owned_by", "format", "delimiter", "compression", "analysts",
                 "description"},
    "public": {"location", "format", "delimiter", "compression", "analysts", "description"},
    "spark": {"master", "remote", "conf", "analysts", "description"},
}


class OwnedBy(TypedDict):
    """A dataset's ``owned_by`` link: its rows belong to whoever owns the key their ``column`` names in dataset
    ``parent``'s ``key`` column (``max_keys``: the most keys one owner passes ownership on through)."""

    column: str
    parent: str
    key: str
    max_keys: int


#: ``owned_by``'s ``max_keys`` when the entry gives none, and its largest value (dpcli.tasks.sql.scope and owners).
_MAX_KEYS_DEFAULT, _MAX_KEYS_MOST = 16, 1000


class Entry(TypedDict, total=False):
    """A checked entry of ``datasets``, ``public`` or ``spark`` (the keys of its section, ``_ENTRY_KEYS``)."""

    analysts: Required[list[str]]
    description: str
    location: str  # datasets, public
    privacy_unit: str  # datasets: one of privacy_unit and owned_by
    owned_by: OwnedBy
    format: str
    delimiter: str
    compression: str
    master: str  # spark: one of master and remote
    remote: str
    conf: list[str]
    resolved: str  # datasets, public: the location resolved at ``catalog set`` (:func:`seal_paths`)


class OutputEntry(TypedDict):
    """A checked ``[[outputs]]`` table (``resolved`` and ``pin``: set by :func:`seal_paths`)."""

    directory: str
    analysts: list[str]
    resolved: NotRequired[str]
    pin: NotRequired[list[int]]  # (device, inode) of the resolved directory when the catalog was sealed


@dataclass(frozen=True)
class Catalog:
    """A checked catalog: operators, named entries per section, and output directories."""

    operators: tuple[str, ...]
    sections: dict[str, dict[str, Entry]]
    outputs: tuple[OutputEntry, ...]

    def entry(self, section: str, name: str) -> Entry | None:
        """The entry ``name`` of ``section`` (None if there is none)."""
        return self.sections.get(section, {}).get(name)

    @staticmethod
    def allows(entry: Entry | OutputEntry, analyst: str) -> bool:
        """May ``analyst`` use ``entry``?"""
        users = entry.get("analysts", [])
        return "*" in users or analyst in users

    def usable(self, section: str, analyst: str) -> list[str]:
        """The names of ``section`` that ``analyst`` may use, sorted."""
        return sorted(n for n, e in self.sections.get(section, {}).items() if self.allows(e, analyst))

    def output_dirs(self, analyst: str) -> list[str]:
        """The output directories ``analyst`` may write into (as resolved at ``catalog set``)."""
        return [o.get("resolved", o["directory"]) for o in self.output_entries(analyst)]

    def output_entries(self, analyst: str) -> list[OutputEntry]:
        """The ``[[outputs]]`` tables ``analyst`` may write into."""
        return [o for o in self.outputs if self.allows(o, analyst)]

    def to_json(self) -> dict[str, Any]:
        return {"operators": list(self.operators), **{s: self.sections.get(s, {}) for s in SECTIONS},
                "outputs": list(self.outputs)}

    def view_for(self, analyst: str) -> dict[str, Any]:
        """What an analyst may know of the catalog: the names they may use (no locations, no columns)."""
        view: dict[str, Any] = {s: {n: {k: v for k, v in self.sections[s][n].items() if k in ("description",)}
                                    for n in self.usable(s, analyst)} for s in SECTIONS}
        view["outputs"] = self.output_dirs(analyst)
        return view


def _err(where: str, problem: str) -> UsageError:
    return UsageError(f"catalog: {where}: {problem}")


def _names(value: Any, where: str, star: bool = True) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _err(where, "must be a list of user names")
    for v in value:
        if not (star and v == "*"):
            try:
                validate_analyst(v)
            except UsageError:
                raise _err(where, f"{v!r} is not a valid user name") from None
    return sorted(set(value))


def _location(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _err(where, "must be a path or URI")
    if "://" not in value and not os.path.isabs(value):
        raise _err(where, f"{value!r} must be an absolute path (or a URI)")
    return value


def _one_char(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) != 1 or value in "\"\r\n":
        raise _err(where, "must be one character (not a quote or a line break)")
    return value


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise _err(where, f"must be one of {', '.join(choices)}")
    return str(value)


def _entry(section: str, name: str, raw: Any, sealed: bool = False) -> Entry:
    """One named entry of ``section``, checked key by key in a fixed order (the first error wins);
    ``sealed``: read back from the state directory, where ``catalog set`` added the resolved location."""
    where = f"{section}.{name}"
    if not isinstance(raw, dict):
        raise _err(where, "must be a table")
    unknown = sorted(set(raw) - _ENTRY_KEYS[section] - ({"resolved"} if sealed and section != "spark" else set()))
    if unknown:
        raise _err(where, f"unknown key {unknown[0]!r} (expected: {', '.join(sorted(_ENTRY_KEYS[section]))})")
    out: Entry = {"analysts": _names(raw.get("analysts", []), f"{where}.analysts")}
    if isinstance(raw.get("description"), str):
        out["description"] = raw["description"]
    if section == "spark":
        _spark_entry(raw, where, out)
    else:
        _file_entry(section, raw, where, out)
        if sealed and isinstance(raw.get("resolved"), str):
            out["resolved"] = raw["resolved"]
    return out


def _spark_entry(raw: dict[str, Any], where: str, out: Entry) -> None:
    """A Spark endpoint's keys into ``out``: exactly one of master and remote, and its settings."""
    if ("master" in raw) == ("remote" in raw):
        raise _err(where, "give exactly one of master (local[N], spark://…) or remote (sc://HOST:PORT)")
    for key in ("master", "remote"):
        if key in raw:
            if not isinstance(raw[key], str) or not raw[key]:
                raise _err(f"{where}.{key}", "must be text")
            out[key] = raw[key]
    conf = raw.get("conf", [])
    if not isinstance(conf, list) or not all(isinstance(c, str) and "=" in c for c in conf):
        raise _err(f"{where}.conf", "must be a list of KEY=VALUE settings")
    out["conf"] = list(conf)


def _file_entry(section: str, raw: dict[str, Any], where: str, out: Entry) -> None:
    """A dataset's or public list's keys into ``out``: where it lies, how it is read, its privacy unit."""
    out["location"] = _location(raw.get("location"), f"{where}.location")
    if "format" in raw:
        out["format"] = _choice(raw["format"], _FORMATS, f"{where}.format")
    if "delimiter" in raw:
        out["delimiter"] = _one_char(raw["delimiter"], f"{where}.delimiter")
    if "compression" in raw:
        out["compression"] = _choice(raw["compression"], _COMPRESSIONS, f"{where}.compression")
    if section == "datasets" and "owned_by" in raw:
        if "privacy_unit" in raw:
            raise _err(where, "give one of privacy_unit and owned_by (the rows' owner comes from one of them)")
        out["owned_by"] = _owned_by(raw["owned_by"], f"{where}.owned_by")
    elif section == "datasets":
        out["privacy_unit"] = _unit(raw.get("privacy_unit"), f"{where}.privacy_unit")


def _owned_by(value: Any, where: str) -> OwnedBy:
    """``owned_by = { column, parent, key[, max_keys] }``: the parent named here is checked by :func:`_check_links`."""
    if not isinstance(value, dict):
        raise _err(where, "must be a table: { column = …, parent = …, key = … }")
    unknown = sorted(set(value) - {"column", "parent", "key", "max_keys"})
    if unknown:
        raise _err(where, f"unknown key {unknown[0]!r} (expected: column, parent, key, max_keys)")
    for name in ("column", "parent", "key"):
        if not isinstance(value.get(name), str) or not value[name]:
            raise _err(f"{where}.{name}", "is required: a name")
    keys = value.get("max_keys", _MAX_KEYS_DEFAULT)
    if isinstance(keys, bool) or not isinstance(keys, int) or not 1 <= keys <= _MAX_KEYS_MOST:
        raise _err(f"{where}.max_keys", f"must be a whole number in 1–{_MAX_KEYS_MOST}")
    return OwnedBy(column=value["column"], parent=value["parent"], key=value["key"], max_keys=keys)


def _check_links(datasets: dict[str, Entry]) -> None:
    """Every ``owned_by`` names another dataset as its parent, and no chain of them goes round in a circle."""
    for name in sorted(datasets):
        seen = [name]
        link = datasets[name].get("owned_by")
        while link is not None:
            parent = link["parent"]
            if parent not in datasets:
                raise _err(f"datasets.{seen[-1]}.owned_by.parent", f"{parent!r} is not a dataset of the catalog")
            if parent in seen:
                circle = " → ".join([*seen, parent])
                raise _err(f"datasets.{name}.owned_by", f"the links go round in a circle ({circle})")
            seen.append(parent)
            link = datasets[parent].get("owned_by")


def _unit(value: Any, where: str) -> str:
    """The privacy unit column: one name (a list of one is accepted; several columns are not supported yet)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, list):
        raise _err(where, "one column identifies the privacy unit (several columns are not supported yet)")
    if not isinstance(value, str) or not value:
        raise _err(where, "is required: the column that identifies a person")
    return value


def parse_catalog(raw: dict[str, Any], sealed: bool = False) -> Catalog:
    """Check a catalog document (the operator's TOML, parsed; ``sealed``: the sealed body read back,
    which may hold what :func:`seal_paths` added); every error names its key (exit 2)."""
    unknown = sorted(set(raw) - {"operators", "outputs", *SECTIONS})
    if unknown:
        raise _err(unknown[0], "unknown section (expected: operators, datasets, public, spark, outputs)")
    operators = tuple(_names(raw.get("operators", []), "operators", star=False))
    sections = {section: _section(section, raw.get(section, {}), sealed) for section in SECTIONS}
    _check_links(sections["datasets"])
    outputs = raw.get("outputs", [])
    if not isinstance(outputs, list):
        raise _err("outputs", "must be an array of tables ([[outputs]])")
    return Catalog(operators, sections, tuple(_output(f"outputs[{i}]", out, sealed) for i, out in enumerate(outputs)))


def _section(section: str, table: Any, sealed: bool = False) -> dict[str, Entry]:
    """The named entries of one section: every name checked first, then the entries in name order."""
    if not isinstance(table, dict):
        raise _err(section, "must be a table of named entries")
    for name in table:
        try:
            validate_analyst(name)
        except UsageError:
            raise _err(f"{section}.{name}", "names use letters, digits, '_', '.' or '-'") from None
    return {name: _entry(section, name, table[name], sealed) for name in sorted(table)}


def _output(where: str, out: Any, sealed: bool = False) -> OutputEntry:
    """One ``[[outputs]]`` table: a local directory and the analysts who may write there (``sealed``:
    with the resolved directory and its pin, as ``catalog set`` stored them)."""
    extra = {"resolved", "pin"} if sealed else set()
    if not isinstance(out, dict) or set(out) - {"directory", "analysts"} - extra:
        raise _err(where, "holds directory and analysts")
    directory = _location(out.get("directory"), f"{where}.directory")
    if "://" in directory:
        raise _err(f"{where}.directory", "must be a local directory")
    entry: OutputEntry = {"directory": directory, "analysts": _names(out.get("analysts", []), f"{where}.analysts")}
    if sealed and isinstance(out.get("resolved"), str):
        entry["resolved"] = out["resolved"]
    pin = out.get("pin")
    if sealed and isinstance(pin, list) and len(pin) == 2 and all(isinstance(v, int) for v in pin):
        entry["pin"] = [int(pin[0]), int(pin[1])]
    return entry


def check_outputs(catalog: Catalog, state_dir: Path) -> None:
    """Refuse an output directory that holds the state directory, lies in it, or holds a dataset's or
    public list's location (exit 2 names the key): analysts write there (and, if the operator lets
    them, plant symlinks), so ``-o`` could replace the data, or a list swapped for a link to it be read."""
    from dpcli.access.walk import inside

    for i, out in enumerate(catalog.outputs):
        where, directory = f"outputs[{i}].directory", out["directory"]
        if inside(state_dir, directory) or inside(directory, state_dir):
            raise _err(where, "holds the state directory or lies in it: analysts write into their directories")
        for section in ("datasets", "public"):
            for name, entry in catalog.sections.get(section, {}).items():
                if "://" not in entry["location"] and inside(entry["location"], directory):
                    raise _err(where, f"holds the location of {section}.{name}: analysts write into their "
                                      "directories")


def read_toml(data: bytes) -> Catalog:
    """The operator's TOML catalog, parsed and checked."""
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        raise UsageError("catalog: not valid UTF-8 TOML") from None
    return parse_catalog(raw)


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _mac(root: Path, body: dict[str, Any]) -> str:
    from dpcli.state import keys

    key = keys.derive_key(keys.load_key(root), _MAC_LABEL)
    return hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()


def catalog_path(root: Path) -> Path:
    return root / CATALOG_FILE


def read_catalog(root: Path) -> Catalog | None:
    """The state directory's catalog, its seal verified; None when there is none (exit 78 if damaged)."""
    path = catalog_path(root)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        raise StateError(f"catalog {path} is not readable") from None
    try:
        doc = json.loads(raw)
        body = doc["body"]
        if doc.get("format") != _KIND or doc.get("version") != _VERSION or not isinstance(body, dict):
            raise ValueError("kind")
    except (ValueError, KeyError, TypeError):
        raise StateError(f"catalog {path} is corrupt") from None
    if not hmac.compare_digest(_mac(root, body), str(doc.get("mac", ""))):
        raise StateError(f"catalog {path} fails its seal (edited by hand?)",
                         fix="install the catalog again with: dpcli catalog set FILE")
    return parse_catalog(body, sealed=True)


def write_catalog(root: Path, catalog: Catalog) -> Path:
    """Seal and write ``catalog`` into the state directory (0600, atomically)."""
    from dpcli.state import keys
    from dpcli.state.atomic import atomic_write_bytes

    keys.load_or_create_key(root)
    body = catalog.to_json()
    doc = {"format": _KIND, "version": _VERSION, "body": body, "mac": _mac(root, body)}
    path = catalog_path(root)
    atomic_write_bytes(path, json.dumps(doc, indent=1, ensure_ascii=False).encode("utf-8"), mode=0o600)
    return path


#: What a refusal of an unsafe catalog path tells the operator to do.
PATH_FIX = ("a path is only as safe as whoever can rename its ancestors: keep it where only root and the service "
            "account can write (README: Service mode), then run dpcli catalog set again")


def _sealed_location(where: str, location: str, trusted: frozenset[int]) -> str:
    """``location`` resolved (symlinks, ``..``), every component of it checked: none may be renamed,
    replaced or written by anyone but ``trusted`` (exit 2 names the component and the fix)."""
    from dpcli.access.walk import unsafe_component
    from dpcli.errors import os_reason

    resolved = os.path.realpath(location)
    try:
        bad = unsafe_component(resolved, trusted)
    except FileNotFoundError:  # (a data file between two nightly copies: its directory must exist)
        try:
            bad = unsafe_component(os.path.dirname(resolved), trusted)
        except OSError as exc:
            raise _err(where, f"{location!r} cannot be examined ({os_reason(exc)})") from None
    except OSError as exc:
        raise _err(where, f"{location!r} cannot be examined ({os_reason(exc)})") from None
    if bad is not None:
        raise _err(where, f"{bad[0]} is {bad[1]}: {PATH_FIX}")
    return resolved


def _sealed_below(where: str, resolved: str, trusted: frozenset[int]) -> None:
    """A dataset directory's contents checked as they will be at every use (:func:`dpcli.access.walk.files_below`:
    no symlink below it, every sub-directory and file owned and writable by ``trusted`` only); names below it
    are data and never quoted: the refusal gives a ``find`` that lists them. A file location passes."""
    from dpcli.access.walk import HIDDEN_PREFIXES, Below, files_below
    from dpcli.errors import os_reason

    try:
        fd = os.open(resolved, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return  # (a file, or missing: checked at use)
    try:
        files_below(fd, trusted, HIDDEN_PREFIXES, open_files=False)
    except Below as below:
        uids = " -o ".join(f"-uid {uid}" for uid in sorted(trusted))
        raise _err(where, f"a file or directory below {resolved} is {below.why} (find {resolved} \\( -type l -o "
                          f"-perm /022 -o \\! \\( {uids} \\) \\) -print lists them): keep everything below a "
                          "dataset owned by root or the service account, writable by neither group nor others, and "
                          "no symlink") from None
    except OSError as exc:
        raise _err(where, f"{resolved!r} cannot be examined ({os_reason(exc)})") from None
    finally:
        os.close(fd)


def seal_paths(catalog: Catalog, state_dir: Path, service: bool = True) -> Catalog:
    """The catalog with every local location resolved once and checked (the operator's act, at
    ``catalog set``): datasets' and public lists' locations, the output directories (each pinned by
    its device and inode: at use the directory opened must be that one) and the state directory.
    No component of any of them may be renamable or writable by anyone but root and the service
    account (:func:`dpcli.access.walk.unsafe_component`); data files are never pinned (operators
    replace them). A URI is left as it is (Spark reads it)."""
    from dpcli.access.walk import trusted_uids

    trusted = trusted_uids()
    with contextlib.suppress(OSError):
        trusted |= {os.stat(state_dir).st_uid}
    if service:  # (the service account's state directory; a personal one is its user's to place)
        _sealed_location("state directory", str(state_dir), trusted)
    sections: dict[str, dict[str, Entry]] = {}
    for section, entries in catalog.sections.items():
        sections[section] = {}
        for name, entry in entries.items():
            sealed = entry.copy()
            if section != "spark" and "://" not in entry["location"]:
                sealed["resolved"] = _sealed_location(f"{section}.{name}.location", entry["location"], trusted)
                _sealed_below(f"{section}.{name}.location", sealed["resolved"], trusted)
            sections[section][name] = sealed
    outputs = []
    for i, out in enumerate(catalog.outputs):
        where = f"outputs[{i}].directory"
        resolved = _sealed_location(where, out["directory"], trusted)
        try:
            st = os.stat(resolved)
        except OSError:
            raise _err(where, f"{out['directory']!r} does not exist (create it first)") from None
        if not os.path.isdir(resolved):
            raise _err(where, f"{out['directory']!r} is not a directory")
        outputs.append(OutputEntry(directory=out["directory"], analysts=out["analysts"], resolved=resolved,
                                   pin=[st.st_dev, st.st_ino]))
    return Catalog(catalog.operators, sections, tuple(outputs))
