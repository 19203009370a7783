"""Ownership through foreign keys: rows of a private table that belong to a unit through another table.

In TPC-H, ``lineitem`` has no customer column: each line belongs to the customer of its order
(``lineitem.l_orderkey → orders.o_orderkey``, ``orders.o_custkey`` the unit). An owned table
(:class:`dpcli.tasks.sql.scope.OwnedTable`) declares such a link to a parent, itself a unit table
or owned in turn (a chain, to any depth); every row gets the unit of the parent key it names
before anything else is done with it, and is then private like the unit table's rows: the same
rules, the same row cap, the same bounds.

**The rule.** Keys are *claimed*, then owned:

* In a unit table, each unit claims the first ``max_keys`` distinct values of the parent's key
  column among its own rows, in a public order (the keyed order of
  :mod:`dpcli.bounding.keyed_order` with salt 0: a property of the data alone, never of the
  release's secret salt, and the same on every engine).
* In an owned table that is itself a parent, each key it is owned through (each order) claims the
  first ``max_keys`` distinct values of the parent's key column (its lines' keys) among the rows
  that name it, in the same kind of order, on behalf of that key's owner.
* A key value claimed on behalf of exactly one unit is owned by it; a child row naming it gets that
  unit. A child row naming a key claimed by several units (a key the data duplicates across
  people) or by none (a dangling key, or a key beyond every claim) is dropped, silently: it is
  never counted in any output or message (README, rule 4).

Nothing in the data can make a run fail: duplicates, dangling keys and nulls only drop rows.
Refusals come from the declarations and the schemas alone (:func:`settle`, :func:`check_types`).

**Why it is private (the stability).** Two datasets are neighbours when one holds one more unit
u: its rows of the unit tables, and rows of owned tables that name keys u claims (or keys nobody
claims). With keys the data keeps unique, that is a customer, their orders and the lines of those
orders, and adding u changes no one else's rows. A duplicated key is the danger: u's order with
another customer v's order key makes v's lines of that order ambiguous, and no rule can attribute
them right in every case (v's and u's copies can be identical), so some other unit's rows change.
(Which rows are u's is the rule's answer: a row naming one of u's keys beyond its claims that another
unit claims is that unit's; with unique keys those are all the records u brought.) Under the rule
above a value whose ownership u's rows change moves the rows of its owner in each of the two
datasets (one other unit at most in each), and only its first ``max_keys`` claims in a dataset where
it has an owner can change a value one level down. u changes at most:

* ``max_keys`` values of a unit table's key (its claims): each goes from one owner to
  contested, or from none to u, so its child rows leave one other unit at most;
* through an owned parent, ``max_keys`` values per value changed one level up (one-sided changes
  above: those keys claim in one dataset only), or ``2·max_keys`` when the change above can be
  from one owner v to another w (two levels from the unit table and deeper), which moves both.

(The count is conservative: a value that passes from v to w took a claim from a changed value above
in each dataset, so counting each changed value once per dataset in which it has an owner, every
level multiplies the count by ``max_keys`` only, and the product of the ``max_keys`` bounds the units
moved: ``tests/attacks/test_review_fk_proof.py``.)

So with A the sum of those counts over the owned tables a query reads, adding u changes u's rows
and the rows of at most A other units, each of which may lose and gain rows, after the row cap
and the bounds alike (each is a function of the unit's own rows). A changed unit moves a bounded
statistic at most twice as far as an added one (remove, then add), so the release is calibrated
to the stability S = 1 + 2A (:func:`stability`): noise for S·K·Δ in ℓ1, (S·√K·Δ)² in ℓ2²,
exponential mechanisms at rates divided by S (S² under ρ), and a threshold τ that a partition of
at most 1 + A units, among (1 + A)·K new ones, passes with probability δ in all
(:mod:`dpcli.tasks.sql.plan`). Choosing bounds and the bias report run at ε/S (ρ/S²): each moves by
at most 1 per unit added and 2 per unit changed (the bias report's vector of a changed unit: ℓ1 2·SCALE,
ℓ2 √2·SCALE, :mod:`dpcli.tasks.bias_report`), S in all. With unique keys nothing is lost but the keys beyond the
claims (their rows are dropped), and the price of covering duplicates is S.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import polars as pl

from dpcli.bounding import RESERVED_PREFIX
from dpcli.bounding.keyed_order import with_order_key
from dpcli.errors import DataError, UsageError
from dpcli.tasks.sql.compile import key_pair
from dpcli.tasks.sql.lengths import MAX_TEXT_LENGTH
from dpcli.tasks.sql.scope import OwnedTable, OwnerLink, TableDecl, owner_of
from dpcli.tasks.sql.typed import schema_of

#: The salt of the order claims are made in: public, so which rows belong to whom depends on the data alone.
PUBLIC_SALT = 0
#: The longest chain of links from an owned table to its unit table.
MAX_DEPTH = 8
#: At most this many keys per owner (``--max-keys-per-owner``, a catalog link's ``max_keys``).
MOST_KEYS = 1000

_OWNER, _KEY, _PARENT, _UP, _ORDER, _N, _MATCH = ("__dp_owner", "__dp_key", "__dp_parent", "__dp_up",
                                                  "__dp_claim", "__dp_n", "__dp_match")


# ---- the declarations ---------------------------------------------------------------------------


def root_of(tables: Mapping[str, TableDecl], name: str) -> str:
    """The unit table ``name``'s chain of links ends at (refused: a parent not declared or public, a cycle, a
    chain longer than :data:`MAX_DEPTH`)."""
    seen = [name]
    decl = tables[name]
    while (link := owner_of(decl)) is not None:
        where = link.text(seen[-1])
        if link.parent not in tables:
            raise UsageError(f"{where}: table {link.parent!r} is not declared (declare it with --table, or name a "
                             "catalog dataset)")
        if link.parent in seen:
            circle = " → ".join([*seen, link.parent])
            raise UsageError(f"{where}: the links of {name!r} go round in a circle ({circle})")
        decl = tables[link.parent]
        if not decl.private:
            raise UsageError(f"{where}: table {link.parent!r} is public; a table is owned through a private one")
        if len(seen) > MAX_DEPTH:
            raise UsageError(f"the chain of links of {name!r} is longer than {MAX_DEPTH} tables")
        if not 1 <= link.max_keys <= MOST_KEYS:
            raise UsageError(f"{where}: max_keys must be in 1–{MOST_KEYS}")
        seen.append(link.parent)
    return seen[-1]


def settle(tables: Mapping[str, TableDecl]) -> dict[str, TableDecl]:
    """Every owned table checked against its declarations (:func:`root_of`, its columns by the schemas known
    before any read) and named its privacy unit: the unit column's name of the table its chain ends at."""
    out = dict(tables)
    for name, decl in tables.items():
        link = owner_of(decl)
        if link is None:
            continue
        assert isinstance(decl, OwnedTable)
        unit = tables[root_of(tables, name)].unit
        assert unit is not None
        parent = tables[link.parent]
        if decl.columns is not None and link.column not in decl.columns:
            raise DataError(f"column {link.column!r} not found in {name} (its link {link.text(name)})")
        if parent.columns is not None and link.key not in parent.columns:
            raise DataError(f"column {link.key!r} not found in {link.parent} (the key of {link.text(name)})")
        if decl.columns is not None and unit in decl.columns:
            raise DataError(f"table {name!r} has a column {unit!r}, the name its privacy unit takes (owned through "
                            f"{link.parent!r}): rename that column")
        out[name] = replace(decl, unit=unit)
    return out


def with_ancestors(tables: Mapping[str, TableDecl], names: Iterable[str]) -> set[str]:
    """``names`` and every table their links go through."""
    out: set[str] = set()
    for name in names:
        while name not in out:
            out.add(name)
            link = owner_of(tables[name])
            if link is None:
                break
            name = link.parent
    return out


def owning_key(tables: Mapping[str, TableDecl], table: str, column: str) -> tuple[str, str] | None:
    """The key (parent table, key column) that ``table.column`` names, as a link or as a key other tables are
    owned through; None for any other column. Two columns naming one such key join rows of one owner."""
    link = owner_of(tables.get(table))
    if link is not None and link.column == column:
        return link.parent, link.key
    for decl in tables.values():
        up = owner_of(decl)
        if up is not None and (up.parent, up.key) == (table, column):
            return table, column
    return None


def _changed(tables: Mapping[str, TableDecl], name: str) -> tuple[int, bool]:
    """(the most values of ``name``'s parent key whose owner one unit changes, whether each such change is
    one-sided: a key that claims in one of the two datasets only)."""
    link = owner_of(tables[name])
    assert link is not None
    if owner_of(tables[link.parent]) is None:
        return link.max_keys, True
    above, one_sided = _changed(tables, link.parent)
    return link.max_keys * above * (1 if one_sided else 2), False


def stability(tables: Mapping[str, TableDecl], read: Iterable[str]) -> int:
    """S = 1 + 2A, A the most other units whose rows of the owned tables ``read`` one unit can change (the module
    docstring); 1 when the query reads no owned table."""
    return 1 + 2 * sum(_changed(tables, name)[0] for name in sorted(set(read)) if owner_of(tables[name]) is not None)


# ---- the resolution (polars) --------------------------------------------------------------------


def purpose(link: OwnerLink) -> str:
    """The purpose of the public order a link's claims are made in (its parent and key in the chain's first word)."""
    return f"owners|{link.parent}|{link.key}"


def check_key(schema: Mapping[str, pl.DataType], column: str, table: str) -> None:
    """A column that names or holds a key of a link must be one every engine orders alike (as a unit's)."""
    dtype = schema[column]
    if not (dtype == pl.String or dtype == pl.Boolean or dtype.is_integer() or dtype == pl.Date
            or isinstance(dtype, (pl.Datetime, pl.Duration, pl.Categorical, pl.Enum))):
        raise DataError(f"column {column!r} of {table} links rows to their owners and has type {dtype.base_type()}: "
                        "a key holds text, integers, booleans, dates or times")


def check_names(schema: Mapping[str, pl.DataType], table: str, unit: str) -> None:
    """An owned table's columns must leave room for what its resolution adds: no column named like dpcli's own
    (``__dp_…``: the owner joined in would be suffixed and the table's own column renamed to the unit) or like the
    unit its rows are given (:func:`settle` sees a header; an NDJSON or a library frame has none). From the schema:
    refused before any read."""
    for column in schema:
        if column.startswith(RESERVED_PREFIX):
            raise DataError(f"column {column!r} of {table}: names starting with {RESERVED_PREFIX!r} are dpcli's own "
                            "(an owned table's rows get their owner under one): rename it")
        if column == unit:
            raise DataError(f"column {column!r} of {table}: the name its privacy unit takes (owned through a link): "
                            "rename that column")


def _first(pairs: pl.LazyFrame, over: str, fields: list[tuple[str, pl.DataType]], link: OwnerLink) -> pl.LazyFrame:
    """The first ``max_keys`` rows of each ``over`` value by the public order of ``fields`` (equal keys: all
    dropped at the cap, as the bounds' ties are). A value with at most ``max_keys`` rows keeps them all, so the order
    is computed for the values over it only, as :func:`dpcli.bounding.keyed_order.keep_first` does (both sides read
    one cached computation of ``pairs``)."""
    sized = pairs.with_columns(pl.len().over(over).alias(_N)).cache()
    within = sized.filter(pl.col(_N) <= link.max_keys).drop(_N)
    keyed = with_order_key(sized.filter(pl.col(_N) > link.max_keys).drop(_N), fields, PUBLIC_SALT, purpose(link),
                           _ORDER)
    return pl.concat([within, keyed.filter(pl.col(_ORDER).rank("max").over(over) <= link.max_keys).drop(_ORDER)])


def _read(column: str, schema: Mapping[str, pl.DataType]) -> pl.Expr:
    """A unit or key as the query reads it: text told apart by its first characters only (:mod:`.lengths`)."""
    return pl.col(column).str.slice(0, MAX_TEXT_LENGTH) if schema[column] == pl.String else pl.col(column)


def owned_keys(tables: Mapping[str, TableDecl], frames: Mapping[str, pl.LazyFrame], link: OwnerLink) -> pl.LazyFrame:
    """(``__dp_key``, ``__dp_owner``): every value of ``link``'s parent key claimed for exactly one unit (one row
    each), from the parent's rows as read (every row: no cap, no filter)."""
    parent, frame = tables[link.parent], frames[link.parent]
    schema = schema_of(frame)
    check_key(schema, link.key, link.parent)
    up = owner_of(parent)
    if up is None:
        assert parent.unit is not None
        check_key(schema, parent.unit, link.parent)
        pairs = frame.select(_read(parent.unit, schema).alias(_OWNER), _read(link.key, schema).alias(_KEY))
        pairs = pairs.drop_nulls().unique()
        claims = _first(pairs, _OWNER, [(_OWNER, schema[parent.unit]), (_KEY, schema[link.key])], link)
    else:
        check_key(schema, up.column, link.parent)
        pairs = frame.select(_read(up.column, schema).alias(_PARENT), _read(link.key, schema).alias(_KEY))
        pairs = pairs.drop_nulls().unique()
        firsts = _first(pairs, _PARENT, [(_PARENT, schema[up.column]), (_KEY, schema[link.key])], link)
        above = owned_keys(tables, frames, up).rename({_KEY: _UP})
        claims = _lookup(firsts, _PARENT, above, _UP).drop(_PARENT)
    # claimed for one unit: its least and greatest claimant are one (cheaper than counting them)
    counted = claims.group_by(_KEY).agg(pl.col(_OWNER).min(), pl.col(_OWNER).max().alias(_N))
    return counted.filter(pl.col(_OWNER) == pl.col(_N)).select(_KEY, _OWNER)


def _lookup(frame: pl.LazyFrame, column: str, owned: pl.LazyFrame, key: str) -> pl.LazyFrame:
    """``frame`` inner-joined with ``owned`` (one row per ``key``) on ``column`` = ``key``, compared as a join compares
    keys (:func:`dpcli.tasks.sql.compile.key_pair`): each row of ``frame`` meets at most one row."""
    schema = schema_of(frame)
    lk, rk = key_pair(_read(column, schema), schema[column], pl.col(key), schema_of(owned)[key])
    left = frame.with_columns(lk.alias(_MATCH))
    right = owned.with_columns(rk.alias(key))
    joined = left.join(right, left_on=_MATCH, right_on=key, how="inner")
    return joined.drop(_MATCH, key, strict=False)


def resolve(tables: Mapping[str, TableDecl], frames: Mapping[str, pl.LazyFrame]) -> dict[str, pl.LazyFrame]:
    """``frames`` with every owned table given its unit column (named as its declaration's ``unit``): the owner of
    the key its row names; a row without one is dropped (dangling, contested, beyond the claims). Lazy: building it
    reads no record, and refuses a key column of a type no engine orders alike (:func:`check_key`)."""
    out = dict(frames)
    for name, decl in tables.items():
        link = owner_of(decl)
        if link is None or name not in frames:
            continue
        assert decl.unit is not None
        schema = schema_of(frames[name])
        check_names(schema, name, decl.unit)
        check_key(schema, link.column, name)
        owned = owned_keys(tables, frames, link)
        # an inner join: a row whose key no one owns meets no row (the owners are never null)
        out[name] = _lookup(frames[name], link.column, owned, _KEY).rename({_OWNER: decl.unit})
    return out


__all__ = ["MAX_DEPTH", "MOST_KEYS", "PUBLIC_SALT", "check_key", "check_names", "owned_keys", "owning_key", "purpose",
           "resolve", "root_of", "settle", "stability", "with_ancestors"]
