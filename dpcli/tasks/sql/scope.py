"""Names in a query: the tables it may read, and the columns each clause can see.

A table is declared before the query is resolved (:class:`TableDecl`: private with its privacy
unit, or public; its column names from its header, or unknown for NDJSON; :class:`OwnedTable`: private,
its rows owned through a key of another private table, :mod:`dpcli.tasks.sql.owners`). SQL's rules for
names: an unquoted name matches a declared name exactly, else the one name equal to it ignoring
case; a quoted name matches exactly only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from dpcli.errors import DataError, UsageError


@dataclass(frozen=True)
class TableDecl:
    """A table a query may name: ``unit`` is its privacy-unit column (None: a public table);
    ``columns`` its column names (None: not known before it is read, as for NDJSON)."""

    name: str
    unit: str | None
    columns: tuple[str, ...] | None

    @property
    def private(self) -> bool:
        return self.unit is not None


#: The keys each owner passes its ownership on through, when the declaration gives no number
#: (``--max-keys-per-owner``, a catalog link's ``max_keys``): :mod:`dpcli.tasks.sql.owners`.
DEFAULT_MAX_KEYS = 16

#: The version of the ownership rule of :mod:`dpcli.tasks.sql.owners` (in the seed with every owned table).
OWNERS_RULE = "owners-v1"


@dataclass(frozen=True)
class OwnerLink:
    """Rows of a table belong to whoever owns the key their ``column`` names in ``parent``'s ``key`` column
    (``lineitem.l_orderkey → orders.o_orderkey``); ``max_keys``: the most keys one owner passes ownership on
    through (a unit's first keys, or deeper in a chain each owned key's first keys, by a public order)."""

    column: str
    parent: str
    key: str
    max_keys: int = DEFAULT_MAX_KEYS

    def text(self, child: str) -> str:
        return f"{child}.{self.column} → {self.parent}.{self.key}"


@dataclass(frozen=True)
class OwnedTable(TableDecl):
    """A private table whose rows are owned through ``owner``: ``unit`` is the name its resolved privacy unit
    takes in the query (the unit column's name of the table the chain ends at; None until
    :func:`dpcli.tasks.sql.owners.settle` sets it)."""

    owner: OwnerLink
    rule: str = OWNERS_RULE

    @property
    def private(self) -> bool:
        return True


def owner_of(decl: Any) -> OwnerLink | None:
    """The link a declared table's rows are owned through (None: a unit table, or a public one)."""
    return decl.owner if isinstance(decl, OwnedTable) else None


def match_name(wanted: str, quoted: bool, names: Iterable[str]) -> str | None:
    """The name among ``names`` that ``wanted`` denotes (SQL's rules above), None if none or several."""
    names = list(names)
    if wanted in names:
        return wanted
    if quoted:
        return None
    folded = [n for n in names if n.lower() == wanted.lower()]
    return folded[0] if len(folded) == 1 else None


def identifier(node: exp.Expression) -> tuple[str, bool]:
    """(name, quoted) of an identifier-like node."""
    ident = node if isinstance(node, exp.Identifier) else node.args.get("this")
    if isinstance(ident, exp.Identifier):
        return str(ident.this), bool(ident.quoted)
    return node.name, False


@dataclass
class Visible:
    """A FROM item as a clause sees it: the names that qualify its columns, and its columns.

    ``columns`` maps SQL names to internal names; None: an open table (NDJSON), whose every name
    is ``<prefix>.<name>`` and is recorded in ``used``.
    """

    names: tuple[str, ...]
    columns: dict[str, str] | None
    prefix: str
    unit: str | None
    used: set[str] = field(default_factory=set)

    def lookup(self, name: str, quoted: bool) -> str | None:
        if self.columns is None:
            self.used.add(name)
            return f"{self.prefix}.{name}"
        found = match_name(name, quoted, self.columns)
        return self.columns[found] if found is not None else None

    def knows(self, name: str, quoted: bool) -> bool:
        return self.columns is not None and match_name(name, quoted, self.columns) is not None

    def star(self, node: exp.Expression) -> list[tuple[str, str]]:
        if self.columns is None:
            raise UsageError(f"{self.names[0]}: * needs the table's columns, which an NDJSON file does not declare; "
                             "name the columns")
        return list(self.columns.items())


@dataclass
class Scope:
    """The FROM items a clause sees, and the merged columns of its USING joins."""

    visibles: list[Visible]
    merged: dict[str, str] = field(default_factory=dict)

    def column(self, node: exp.Column) -> str:
        """The internal name of a column reference (refused when unknown or ambiguous)."""
        name, quoted = identifier(node)
        if node.table:
            return self._qualified(node, name, quoted)
        merged = match_name(name, quoted, self.merged)
        if merged is not None:
            return self.merged[merged]
        known = [v for v in self.visibles if v.knows(name, quoted)]
        open_ = [v for v in self.visibles if v.columns is None]
        candidates = known or open_
        if len(candidates) == 1:
            found = candidates[0].lookup(name, quoted)
            assert found is not None
            return found
        if not candidates:
            raise DataError(f"column {name!r} is in no table of this FROM clause")
        tables = ", ".join(v.names[0] for v in candidates)
        raise UsageError(f"column {name!r} is ambiguous (it may be in {tables}): qualify it")

    def _qualified(self, node: exp.Column, name: str, quoted: bool) -> str:
        qualifier, q_quoted = identifier(node.args["table"])
        if node.args.get("db") is not None:
            raise UsageError(f"{node.sql()}: name a column as table.column at most")
        for v in self.visibles:
            if match_name(qualifier, q_quoted, v.names) is not None:
                found = v.lookup(name, quoted)
                if found is None:
                    raise DataError(f"column {name!r} is not in {v.names[0]}")
                return found
        raise UsageError(f"{qualifier!r} names no table of this FROM clause")

    def star(self, node: exp.Expression) -> list[tuple[str, str]]:
        """``SELECT *``: every column of every FROM item (USING columns once), as (SQL name, internal name)."""
        out = list(self.merged.items())
        for v in self.visibles:
            out += [(n, i) for n, i in v.star(node) if n not in self.merged]
        return out
