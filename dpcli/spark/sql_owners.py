"""``dpcli sql --engine spark``: owned tables' units resolved through their links in Spark SQL.

Step for step :mod:`dpcli.tasks.sql.owners` (the rule, and why it is private, are there): each unit's (or
each owning key's) first ``max_keys`` keys by the same public order (the chain of ``xxhash64`` steps of
:mod:`dpcli.spark.bounding`, salt 0, ties dropped at the cap), a key owned when exactly one unit claims it,
and each child row given its key's owner, its keys compared as joins compare them; rows without one dropped.
The units polars resolves, bit for bit (``tests/test_spark_sql_owners.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpcli.spark.sql_exprs import col
from dpcli.tasks.sql.owners import PUBLIC_SALT, purpose
from dpcli.tasks.sql.scope import OwnerLink, TableDecl, owner_of

_OWNER, _KEY, _PARENT, _UP, _N, _MATCH, _RANK = ("__dp_owner", "__dp_key", "__dp_parent", "__dp_up", "__dp_n",
                                                 "__dp_match", "__dp_claim_rank")


def _types(sdf: Any) -> dict[str, Any]:
    return {f.name: f.dataType for f in sdf.schema.fields}


def _read(frame: Any, column: str) -> Any:
    """:func:`dpcli.tasks.sql.owners._read`: text told apart by its first characters only."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from dpcli.tasks.sql.lengths import MAX_TEXT_LENGTH

    is_text = isinstance(_types(frame)[column], T.StringType)
    return F.substring(col(column), 1, MAX_TEXT_LENGTH) if is_text else col(column)


def _first(pairs: Any, over: str, fields: list[str], link: OwnerLink) -> Any:
    """:func:`dpcli.tasks.sql.owners._first`: a rank by "max" (a count over a range frame) of the public order."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from dpcli.spark.bounding import order_key

    key = order_key(pairs, fields, PUBLIC_SALT, purpose(link))
    ordered = Window.partitionBy(col(over)).orderBy(key)
    rank = F.count(F.lit(1)).over(ordered.rangeBetween(Window.unboundedPreceding, Window.currentRow))
    return pairs.withColumn(_RANK, rank).filter(col(_RANK) <= link.max_keys).drop(_RANK)


def _lookup(frame: Any, column: str, owned: Any, key: str, how: str) -> Any:
    """:func:`dpcli.tasks.sql.owners._lookup`: ``frame`` joined with ``owned`` (one row per ``key``) on the coerced
    keys (:func:`dpcli.spark.sql.key_pair`)."""
    from dpcli.spark.sql import key_pair

    lk, rk = key_pair(_read(frame, column), _types(frame)[column], col(key), _types(owned)[key])
    left = frame.withColumn(_MATCH, lk)
    right = owned.withColumn(key, rk)
    return left.join(right, on=col(_MATCH) == col(key), how=how).drop(_MATCH, key)


def owned_keys(tables: Mapping[str, TableDecl], frames: Mapping[str, Any], link: OwnerLink) -> Any:
    """:func:`dpcli.tasks.sql.owners.owned_keys` in Spark SQL: (``__dp_key``, ``__dp_owner``), one row per key."""
    from pyspark.sql import functions as F

    parent, frame = tables[link.parent], frames[link.parent]
    up = owner_of(parent)
    if up is None:
        assert parent.unit is not None
        pairs = frame.select(_read(frame, parent.unit).alias(_OWNER), _read(frame, link.key).alias(_KEY))
        pairs = pairs.dropna().dropDuplicates()
        claims = _first(pairs, _OWNER, [_OWNER, _KEY], link)
    else:
        pairs = frame.select(_read(frame, up.column).alias(_PARENT), _read(frame, link.key).alias(_KEY))
        pairs = pairs.dropna().dropDuplicates()
        firsts = _first(pairs, _PARENT, [_PARENT, _KEY], link)
        above = owned_keys(tables, frames, up).withColumnRenamed(_KEY, _UP)
        claims = _lookup(firsts, _PARENT, above, _UP, "inner").drop(_PARENT)
    counted = claims.groupBy(col(_KEY)).agg(F.count_distinct(col(_OWNER)).alias(_N), F.min(col(_OWNER)).alias(_OWNER))
    return counted.filter(col(_N) == 1).select(_KEY, _OWNER)


def resolve(tables: Mapping[str, TableDecl], frames: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`dpcli.tasks.sql.owners.resolve` in Spark SQL: every owned table with its unit column, rows without an
    owner dropped."""
    out = dict(frames)
    for name, decl in tables.items():
        link = owner_of(decl)
        if link is None or name not in frames:
            continue
        assert decl.unit is not None
        owned = owned_keys(tables, frames, link)
        resolved = _lookup(frames[name], link.column, owned, _KEY, "left").withColumnRenamed(_OWNER, decl.unit)
        out[name] = resolved.filter(col(decl.unit).isNotNull())
    return out
