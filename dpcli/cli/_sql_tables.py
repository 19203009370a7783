"""The tables of a ``dpcli sql`` query, declared on the command line or named in the catalog, resolved
through the gate, with their column names read before the query is resolved.

``--table NAME=FILE`` declares a private table (its unit by ``--privacy-unit NAME.COLUMN``), and
``--public-table NAME=FILE`` a public one: a table is public only when declared so, never for lack
of a unit. A table the query names without a declaration is looked up in the catalog (a dataset is
private with the operator's unit, a public entry public); in service mode that is the only way, and
FILE must itself be a catalog name. A table declared but not named by the query is not opened.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dpcli.access import Source, gate
from dpcli.errors import DataError, UsageError
from dpcli.tasks.sql.scope import TableDecl, match_name


@dataclass(frozen=True)
class Declared:
    """The tables as the options give them: name → (location, private), and each unit by table name."""

    tables: dict[str, tuple[str, bool]]
    units: dict[str, str]


def parse_declarations(private: list[str], public: list[str], units: list[str]) -> Declared:
    """``--table``, ``--public-table`` and ``--privacy-unit`` checked (names unique, one unit per table)."""
    tables: dict[str, tuple[str, bool]] = {}
    for flag, given, is_private in (("--table", private, True), ("--public-table", public, False)):
        for text in given:
            name, sep, location = text.partition("=")
            if not sep or not name.strip() or not location:
                raise UsageError(f"{flag} takes NAME=FILE, got {text!r}")
            if name.strip() in tables:
                raise UsageError(f"table {name.strip()!r} is declared twice")
            tables[name.strip()] = (location, is_private)
    return Declared(tables, _units(units, [n for n, (_, p) in tables.items() if p]))


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


def resolve_tables(names: list[tuple[str, bool]], declared: Declared, delimiter: str | None
                   ) -> tuple[dict[str, TableDecl], dict[str, Source]]:
    """Each table the query names: its declaration (unit, column names) and its source, through the gate."""
    decls: dict[str, TableDecl] = {}
    sources: dict[str, Source] = {}
    for name, quoted in names:
        key = match_name(name, quoted, declared.tables)
        source, unit = _declared(key, declared, delimiter) if key is not None else _from_catalog(name)
        from dpcli.io.columns import column_names

        columns = column_names(source)
        if unit is not None and columns is not None and unit not in columns:
            raise DataError(f"column {unit!r} not found in {source.name} (the privacy unit of table "
                            f"{key or name!r})")
        table = key or name
        decls[table] = TableDecl(table, unit, columns)
        sources[table] = source
    return decls, sources


def _declared(name: str, declared: Declared, delimiter: str | None) -> tuple[Source, str | None]:
    """A table given by option: a path (personal mode) or a catalog name; a private one with its unit."""
    location, private = declared.tables[name]
    if not private:
        source = gate().public(location, "--public-table")
        return replace(source, delimiter=source.delimiter or delimiter, privacy_unit=None), None
    source = gate().dataset(location)
    unit = declared.units.get(name)
    if source.entry is not None:
        if unit is not None and (gate().service or unit != source.privacy_unit):
            raise UsageError(f"--privacy-unit: dataset {source.name!r} has the privacy unit the operator declared; "
                             "drop the option")
        if delimiter is not None and (gate().service or delimiter != (source.delimiter or delimiter)):
            # how private bytes are split is the operator's: each delimiter tried would probe the header
            raise UsageError(f"--delimiter: dataset {source.name!r} is read as the operator declared it; "
                             "drop --delimiter")
        unit = source.privacy_unit
    if not unit:
        raise UsageError(f"--privacy-unit {name}.COLUMN is required: the column of {name!r} that identifies a person")
    return Source(source.name, source.location, source.format, source.delimiter or delimiter, source.compression,
                  unit, source.entry), unit


def _from_catalog(name: str) -> tuple[Source, str | None]:
    """A table named only in the query: a catalog dataset (private) or public entry, if there is one."""
    g = gate()
    catalog = g.catalog
    if catalog is not None and catalog.entry("datasets", name) is not None:
        source = g.dataset(name)
        return source, source.privacy_unit
    if catalog is not None and catalog.entry("public", name) is not None:
        return g.public(name, "the query"), None
    if g.service:
        raise UsageError(f"table {name!r} is not a dataset or public table of the catalog you may use "
                         "(see: dpcli catalog show)")
    raise UsageError(f"table {name!r} is not declared (give --table {name}=FILE --privacy-unit {name}.COLUMN, or "
                     f"--public-table {name}=FILE)")
