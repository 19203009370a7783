"""The tables of a ``dpcli sql`` query, declared on the command line or named in the catalog, resolved
through the gate, with their column names read before the query is resolved.

``--table NAME=FILE`` declares a private table (its unit by ``--privacy-unit NAME.COLUMN``, or its
owner through another private table by ``--owned-by NAME.COLUMN=PARENT.KEY``), and
``--public-table NAME=FILE`` a public one: a table is public only when declared so, never for lack
of a unit. A table the query names without a declaration is looked up in the catalog (a dataset is
private with the operator's unit or ``owned_by`` link, a public entry public); in service mode that
is the only way, FILE must itself be a catalog name, and a link is the operator's. A table declared
but not named by the query is not opened, unless a table the query reads is owned through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dpcli.access import Source, gate
from dpcli.errors import DataError, UsageError
from dpcli.tasks.sql.scope import DEFAULT_MAX_KEYS, OwnedTable, OwnerLink, TableDecl, match_name, owner_of


@dataclass(frozen=True)
class Declared:
    """The tables as the options give them: name → (location, private), each unit and each link by table name."""

    tables: dict[str, tuple[str, bool]]
    units: dict[str, str]
    links: dict[str, OwnerLink] = field(default_factory=dict)


def parse_declarations(private: list[str], public: list[str], units: list[str], owned: list[str] | None = None,
                       max_keys: int | None = None) -> Declared:
    """``--table``, ``--public-table``, ``--privacy-unit``, ``--owned-by`` and ``--max-keys-per-owner`` checked
    (names unique, one unit or one link per table; a link on the command line is refused in service mode)."""
    tables: dict[str, tuple[str, bool]] = {}
    for flag, given, is_private in (("--table", private, True), ("--public-table", public, False)):
        for text in given:
            name, sep, location = text.partition("=")
            if not sep or not name.strip() or not location:
                raise UsageError(f"{flag} takes NAME=FILE, got {text!r}")
            if name.strip() in tables:
                raise UsageError(f"table {name.strip()!r} is declared twice")
            tables[name.strip()] = (location, is_private)
    names = [n for n, (_, p) in tables.items() if p]
    unit_of = _units(units, names)
    if (owned or max_keys is not None) and gate().service:
        flag = "--owned-by" if owned else "--max-keys-per-owner"
        raise UsageError(f"{flag}: in service mode which rows a unit owns is the operator's (the catalog's owned_by); "
                         f"drop {flag}")
    links = _links(owned or [], names, max_keys if max_keys is not None else DEFAULT_MAX_KEYS)
    both = sorted(set(links) & set(unit_of))
    if both:
        raise UsageError(f"table {both[0]!r} has both --privacy-unit and --owned-by: give one")
    return Declared(tables, unit_of, links)


def _units(given: list[str], private: list[str]) -> dict[str, str]:
    """``--privacy-unit TABLE.COLUMN`` (or ``COLUMN`` when one private table is declared)."""
    out: dict[str, str] = {}
    for text in given:
        table, dot, column = text.rpartition(".")
        if not dot:
            if len(private) != 1:
                raise UsageError(f"--privacy-unit {text!r}: name its table (TABLE.COLUMN)")
            table, column = private[0], text
        if table not in private:
            raise UsageError(f"--privacy-unit {text!r}: {table!r} is not declared with --table")
        if table in out:
            raise UsageError(f"--privacy-unit: table {table!r} has two units")
        out[table] = column
    return out


def _links(given: list[str], private: list[str], max_keys: int) -> dict[str, OwnerLink]:
    """``--owned-by TABLE.COLUMN=PARENT.KEY``: the rows of TABLE (declared with --table) belong to whoever owns the
    key their COLUMN names in PARENT's KEY column."""
    out: dict[str, OwnerLink] = {}
    for text in given:
        child, sep, parent = text.partition("=")
        table, dot, column = child.strip().rpartition(".")
        up, dot2, key = parent.strip().rpartition(".")
        if not (sep and dot and dot2 and table and column and up and key):
            raise UsageError(f"--owned-by takes TABLE.COLUMN=PARENT.KEY, got {text!r}")
        if table not in private:
            raise UsageError(f"--owned-by {text!r}: {table!r} is not declared with --table")
        if table in out:
            raise UsageError(f"--owned-by: table {table!r} has two links")
        out[table] = OwnerLink(column, up, key, max_keys)
    return out


@dataclass
class _Found:
    """The tables resolved so far, their sources, and the links the catalog declared (their parents are its)."""

    decls: dict[str, TableDecl] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)
    catalog_links: set[str] = field(default_factory=set)


def resolve_tables(names: list[tuple[str, bool]], declared: Declared, delimiter: str | None
                   ) -> tuple[dict[str, TableDecl], dict[str, Source]]:
    """Each table the query names, and each table their links go through: its declaration (unit or link, column
    names) and its source, through the gate."""
    found = _Found()
    for name, quoted in names:
        key = match_name(name, quoted, declared.tables)
        _add(found, key or name, key is not None, declared, delimiter)
    pending = [n for n in found.decls if owner_of(found.decls[n]) is not None]
    while pending:
        child = pending.pop(0)
        link = owner_of(found.decls[child])
        assert link is not None
        parent = link.parent
        if parent in found.decls:
            _same_parent(found, child, parent)
            continue
        key = None if child in found.catalog_links else match_name(parent, True, declared.tables)
        _add(found, key or parent, key is not None, declared, delimiter, child)
        if owner_of(found.decls[key or parent]) is not None:
            pending.append(key or parent)
    return found.decls, found.sources


def _add(found: _Found, table: str, declared_here: bool, declared: Declared, delimiter: str | None,
         child: str | None = None) -> None:
    """One table resolved into ``found`` (declared on the command line, or a catalog name; ``child``: the table owned
    through it)."""
    from dpcli.io.columns import column_names

    if declared_here:
        source, unit, link = _declared(table, declared, delimiter)
    else:
        source, unit, link = _from_catalog(table, child)
    columns = column_names(source)
    if unit is not None and columns is not None and unit not in columns:
        raise DataError(f"column {unit!r} not found in {source.name} (the privacy unit of table {table!r})")
    found.decls[table] = TableDecl(table, unit, columns) if link is None else OwnedTable(table, None, columns, link)
    found.sources[table] = source
    if link is not None and source.entry is not None:
        found.catalog_links.add(table)


def _same_parent(found: _Found, child: str, parent: str) -> None:
    """A catalog link's parent is the catalog's dataset of that name, whatever else the query names so (one the
    caller may use: else refused as one they may not, whatever table the query names so)."""
    if child not in found.catalog_links:
        return
    _usable_parent(child, parent)
    entry = found.sources[parent].entry
    if entry is None or entry.get("name") != parent:
        raise UsageError(f"table {parent!r} is declared as another input than the dataset {child!r} is owned through "
                         f"(the catalog's {parent!r}): name it otherwise")


def _declared(name: str, declared: Declared, delimiter: str | None) -> tuple[Source, str | None, OwnerLink | None]:
    """A table given by option: a path (personal mode) or a catalog name; a private one with its unit or link."""
    location, private = declared.tables[name]
    if not private:
        source = gate().public(location, "--public-table")
        return replace(source, delimiter=source.delimiter or delimiter, privacy_unit=None), None, None
    source = gate().dataset(location)
    unit, link = declared.units.get(name), declared.links.get(name)
    if source.entry is not None:
        if unit is not None and (gate().service or unit != source.privacy_unit):
            raise UsageError(f"--privacy-unit: dataset {source.name!r} has the privacy unit the operator declared; "
                             "drop the option")
        if link is not None:
            raise UsageError(f"--owned-by: dataset {source.name!r} is owned as the operator declared; drop the option")
        if delimiter is not None and (gate().service or delimiter != (source.delimiter or delimiter)):
            # how private bytes are split is the operator's: each delimiter tried would probe the header
            raise UsageError(f"--delimiter: dataset {source.name!r} is read as the operator declared it; "
                             "drop --delimiter")
        unit, link = source.privacy_unit, catalog_link(source)
    if not unit and link is None:
        raise UsageError(f"--privacy-unit {name}.COLUMN is required: the column of {name!r} that identifies a person "
                         f"(or --owned-by {name}.COLUMN=PARENT.KEY)")
    return Source(source.name, source.location, source.format, source.delimiter or delimiter, source.compression,
                  unit, source.entry), unit, link


def catalog_link(source: Source) -> OwnerLink | None:
    """A catalog dataset's ``owned_by`` link (None: it has a privacy unit)."""
    raw = (source.entry or {}).get("owned_by")
    if not isinstance(raw, dict):
        return None
    keys = int(raw.get("max_keys", DEFAULT_MAX_KEYS))
    return OwnerLink(str(raw["column"]), str(raw["parent"]), str(raw["key"]), keys)


def _usable_parent(child: str, parent: str) -> Source:
    """The catalog dataset ``child`` is owned through, resolved through the gate; one the caller may not use is
    refused without its name (an analyst learns no name of the catalog they may not use)."""
    try:
        return gate().dataset(parent)
    except UsageError:
        raise UsageError(f"table {child!r} is owned through a dataset you may not use: ask the operator") from None


def _from_catalog(name: str, child: str | None = None) -> tuple[Source, str | None, OwnerLink | None]:
    """A table named only in the query (or a link's parent: ``child`` is owned through it): a catalog dataset
    (private) or public entry, if there is one."""
    g = gate()
    catalog = g.catalog
    if catalog is not None and catalog.entry("datasets", name) is not None:
        source = g.dataset(name) if child is None else _usable_parent(child, name)
        return source, source.privacy_unit, catalog_link(source)
    if catalog is not None and catalog.entry("public", name) is not None:
        return g.public(name, "the query"), None, None
    if child is not None:
        raise UsageError(f"table {child!r} is owned through {name!r}, which is not declared (give --table "
                         f"{name}=FILE with its --privacy-unit or --owned-by)")
    if g.service:
        raise UsageError(f"table {name!r} is not a dataset or public table of the catalog you may use "
                         "(see: dpcli catalog show)")
    raise UsageError(f"table {name!r} is not declared (give --table {name}=FILE --privacy-unit {name}.COLUMN, or "
                     f"--public-table {name}=FILE)")
