"""Selection v2: one keyed order on records that every engine computes bit for bit.

Which of a unit's rows (or groups) a contribution bound keeps is decided by ranking them on

    SHA-256( "dpcli-order-v2|" + purpose + "|" + salt as 32 hex digits + "|" + field₁ + field₂ + … )

(purpose ``rows`` orders a unit's rows within a group, ``groups`` a unit's groups: two
independent orders from one salt)

with every field encoded explicitly by its type (never by an engine's own rendering, which
differs: ``1.0E10`` vs ``10000000000.0``, time zones, skipped nulls):

============  ==========================================  ===========================
type          encoding                                    example
============  ==========================================  ===========================
null          ``n;``                                      ``n;``
text          ``s`` + UTF-8 byte length + ``:`` + text    ``s5:héllo`` is ``s6:héllo``
integer       ``i`` + decimal + ``;``                     ``i-42;``
boolean       ``b1;`` or ``b0;``                          ``b1;``
date          ``d`` + days since 1970-01-01 + ``;``       ``d19000;``
datetime      ``t`` + µs since the epoch (UTC) + ``;``    ``t1700000000000000;``
duration      ``u`` + µs + ``;``                          ``u1000000;``
============  ==========================================  ===========================

Floating-point unit or group columns are refused (a public schema error, before any data is
read): engines render floats differently and polars cannot take their bits in an expression;
cast them to integers or text.

The length prefix (text) and terminator (others) make the concatenation injective: two
different records never share an encoding, so ties only happen between identical records (any
choice among them keeps the same values). The salt is secret (it comes from the release seed),
so the order is a keyed pseudorandom permutation: without the key nobody can tell which rows a
bound will keep. The hash is a standard function of bytes, so polars (through the polars-hash
plugin) and Spark (``sha2``) rank identically, and a polars upgrade cannot change what is kept.
:func:`reference_order_key` is the plain-Python definition the tests hold both to.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from typing import Any

import polars as pl
import polars_hash  # noqa: F401  (registers the ``chash`` expression namespace)

from dpcli.errors import DataError

SCHEME = "dpcli-order-v2"
_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _terminated(tag: str, text: pl.Expr) -> pl.Expr:
    return pl.concat_str([pl.lit(tag), text, pl.lit(";")])


def encode_field(column: str, dtype: pl.DataType) -> pl.Expr:
    """The explicit encoding of one column (see the module's table), never null."""
    col = pl.col(column)
    if dtype == pl.String or isinstance(dtype, (pl.Categorical, pl.Enum)):
        text = col.cast(pl.String)
        enc = pl.concat_str([pl.lit("s"), text.str.len_bytes().cast(pl.String), pl.lit(":"), text])
    elif dtype.is_integer():
        enc = _terminated("i", col.cast(pl.String))
    elif dtype == pl.Boolean:
        enc = pl.when(col).then(pl.lit("b1;")).otherwise(pl.lit("b0;"))
    elif dtype == pl.Date:
        enc = _terminated("d", col.cast(pl.Int32).cast(pl.String))
    elif isinstance(dtype, pl.Datetime):
        enc = _terminated("t", col.dt.epoch("us").cast(pl.String))
    elif isinstance(dtype, pl.Duration):
        enc = _terminated("u", col.dt.total_microseconds().cast(pl.String))
    else:
        raise DataError(f"column {column!r} has type {dtype}: a privacy-unit or group column must hold text, integers, "
                        "booleans, dates or times (cast it), so that rows can be sampled the same on every engine")
    return pl.when(col.is_null()).then(pl.lit("n;")).otherwise(enc)


def _prefix(salt: int, purpose: str) -> str:
    return f"{SCHEME}|{purpose}|{salt & ((1 << 128) - 1):032x}|"


def order_key(columns: Sequence[tuple[str, pl.DataType]], salt: int, purpose: str) -> pl.Expr:
    """The keyed SHA-256 (hex) of the encoded ``columns`` of each row: rank on it to sample rows."""
    prefix = _prefix(salt, purpose)
    text = pl.concat_str([pl.lit(prefix), *(encode_field(c, t) for c, t in columns)])
    return text.chash.sha2_256()


def _encode_value(value: Any) -> str:
    """:func:`encode_field` for one Python value (the reference definition)."""
    if value is None:
        return "n;"
    if isinstance(value, bool):
        return "b1;" if value else "b0;"
    if isinstance(value, int):
        return f"i{value};"
    if isinstance(value, str):
        return f"s{len(value.encode())}:{value}"
    if isinstance(value, dt.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        delta = when - _EPOCH
        return f"t{(delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds};"
    if isinstance(value, dt.date):
        return f"d{(value - _EPOCH_DATE).days};"
    if isinstance(value, dt.timedelta):
        return f"u{(value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds};"
    raise TypeError(f"no encoding for {type(value).__name__}")


def reference_order_key(values: Sequence[Any], salt: int, purpose: str) -> str:
    """The order key of one record, in plain Python: what every engine must compute."""
    text = _prefix(salt, purpose) + "".join(_encode_value(v) for v in values)
    return hashlib.sha256(text.encode()).hexdigest()
