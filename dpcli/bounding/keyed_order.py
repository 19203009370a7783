"""Selection v3: one keyed order on records that every engine computes bit for bit, cheaply.

Which of a unit's rows (or groups) a contribution bound keeps is decided by ranking them on a
64-bit order key. Each field of a record becomes one 64-bit *word* (table below), and the words
are folded into a chain that starts from a secret word:

    h₀ = first 8 bytes (little-endian) of SHA-256("dpcli-order-v3|" + purpose + "|" + salt as 32 hex digits)
    hᵢ = X(hᵢ₋₁ XOR wordᵢ)            for the fields of the record, in order
    order key = hₙ read as a signed 64-bit integer

where X(x) is XXH64 of the 8 little-endian bytes of x with seed 42: exactly what Spark's built-in
``xxhash64`` computes for a ``bigint``, and what polars computes here with wrapping UInt64
arithmetic. Purpose ``rows`` orders a unit's rows within a group, ``groups`` a unit's groups:
two independent orders from one salt.

============  ==============================================================  ==========
type          word                                                            example
============  ==============================================================  ==========
null          :data:`NULL_WORD`                                               —
text          XXH64 of the UTF-8 bytes, seed 42 (Spark ``xxhash64(text)``)    —
integer       the value, two's complement (128-bit types: XXH64 of decimal)   ``-1`` → 2⁶⁴ − 1
boolean       1 or 0                                                          ``true`` → 1
date          days since 1970-01-01                                           19000
datetime      µs since the epoch (UTC)                                        1700000000000000
duration      the stored integer, in the column's own unit (µs, ms, ns)       1000000 µs
float         X(IEEE-754 bits), −0.0 as 0.0, one NaN (Spark ``xxhash64(double)``)  —
decimal       its unscaled integer's word (``1.50`` at scale 2 → 150; rows only)  —
============  ==============================================================  ==========

A float word exists only for a row of a private table (:func:`cap_rows`, ``sql --max-rows-per-table``);
floating-point unit or group columns are refused (a public schema error, before any data is
read): engines render and compare floats differently; cast them to integers or text.

**Rows: a uniform sample.** Purpose ``rows`` ranks the rows of one (unit, group) partition on
(unit, group columns, grid value, *occurrence*), where a row's occurrence is its number (0, 1, …)
among the partition's rows with the same grid value, that is among that unit's identical records
in that group. Without the occurrence, identical records would share one key: each *distinct
value* would be equally likely kept, not each row (with C = 1, a unit's one rare large value
would be kept as often as all its common ones together). With it, every row has its own key, and
the C smallest keys are a uniform sample of the C-subsets of the unit's rows in that group. The
occurrence counts only that unit's identical records in that group, so the sample depends on that
unit's own rows alone (never on file position, which would let other people's rows move it), and
not on their order: a partition with value v held m times gets the occurrences 0 … m − 1 for v
whatever the order, and which of the m identical records gets which number does not change the
values kept. (Spark numbers them by ``row_number`` over the identical records: any order of
interchangeable rows gives the same result.)

**Ties.** X is a bijection of 64-bit words, so for a fixed prefix of fields the key is injective
in the next field's word, but the next-to-last link (grid value) and the last (occurrence) can
still meet by chance, as can text words and 128-bit integers (hashes that can collide), a value and
the null word, or two-field groups. Ties must not be broken by row order (a replay would then
bound other records, and a unit's sample would depend on the file's order), so a record is kept
**only if at most ``cap`` records of its partition have a key ≤ its own** (a rank by "max"):
records tied at the cap are all dropped, the partition never exceeds its cap, and the kept set
depends only on the unit's own records (:data:`TIES`), for rows and groups alike.

**What the key is for.** Each unit's kept records are a function of that unit's records and the
salt alone, so the bound's stability holds for every salt: privacy does not rest on the order
being unpredictable. The salt (secret, drawn from the release seed) makes the sample
independent of any order in the data and unknowable to the analyst, and determinism makes a
replayed release bound exactly the same records (which is what lets its noise be replayed).
XXH64 is not a cryptographic PRF; it does not need to be. Selection v2 hashed every record
with SHA-256 over a text encoding, about 2.5 times the time; v3 changes which records are
kept, so it comes with a new :data:`dpcli.bounding.SEMANTICS` (fresh noise, fresh charge), and so
did adding the occurrence to the rows' key (semantics 5).

:func:`reference_order_key` is the plain-Python definition the tests hold polars and Spark to.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import polars as pl
from polars_hash import NonCryptographicHashingNameSpace as _nchash  # (also registers the ``nchash`` namespace)

from dpcli.errors import DataError, type_text

if TYPE_CHECKING:
    from polars.datatypes import DataTypeClass  # a dtype may be given as its class (pl.Int64)

SCHEME = "dpcli-order-v3"
#: XXH64's seed in every word and step: the seed of Spark's ``xxhash64``.
SEED = 42
_MASK = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                           0x27D4EB2F165667C5)
_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _word_of(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


#: The word of a null field (a fixed constant; a value with the same word only ties, see above).
NULL_WORD = _word_of(f"{SCHEME}|null")


def start_word(salt: int, purpose: str) -> int:
    """h₀: the secret first link of the chain, from the 128-bit salt and the purpose."""
    return _word_of(f"{SCHEME}|{purpose}|{salt & ((1 << 128) - 1):032x}")


def signed(word: int) -> int:
    """A 64-bit word read as a signed integer (Spark's ``bigint``; the order key's type)."""
    return word - (1 << 64) if word >= 1 << 63 else word


# --- the plain-Python definition -------------------------------------------------------------

def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _MASK, 31) * _P1) & _MASK


def _avalanche(h: int) -> int:
    h = ((h ^ (h >> 33)) * _P2) & _MASK
    h = ((h ^ (h >> 29)) * _P3) & _MASK
    return h ^ (h >> 32)


def xxh64(data: bytes, seed: int = SEED) -> int:
    """XXH64 of ``data`` (the published algorithm, in plain Python: the reference for tests)."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _MASK, (seed + _P2) & _MASK, seed & _MASK, (seed - _P1) & _MASK]
        while i + 32 <= n:
            v = [_round(v[j], int.from_bytes(data[i + 8 * j:i + 8 * j + 8], "little")) for j in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _MASK
        for lane in v:
            h = ((h ^ _round(0, lane)) * _P1 + _P4) & _MASK
    else:
        h = (seed + _P5) & _MASK
    h = (h + n) & _MASK
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, int.from_bytes(data[i:i + 8], "little")), 27) * _P1 + _P4) & _MASK
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ ((int.from_bytes(data[i:i + 4], "little") * _P1) & _MASK), 23) * _P2 + _P3) & _MASK
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * _P5) & _MASK), 11) * _P1) & _MASK
        i += 1
    return _avalanche(h)


def mix(x: int) -> int:
    """X(x): XXH64 of the 8 little-endian bytes of the word ``x``, seed 42 (Spark's ``xxhash64(bigint)``)."""
    return xxh64((x & _MASK).to_bytes(8, "little"))


def reference_word(value: Any) -> int:
    """The word of one Python value (see the module's table; a ``timedelta`` is taken in µs, the
    word of a µs duration column)."""
    if value is None:
        return NULL_WORD
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if -(1 << 63) <= value < 1 << 64:
            return value & _MASK
        return xxh64(str(value).encode())  # a 128-bit type's value beyond 64 bits
    if isinstance(value, str):
        return xxh64(value.encode())
    if isinstance(value, float):  # a private table's row only (cap_rows): never a unit or group word
        canonical = 0.0 if value == 0.0 else (math.nan if math.isnan(value) else value)
        return mix(int.from_bytes(struct.pack("<d", canonical), "little"))
    if isinstance(value, dt.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        delta = when - _EPOCH
        return ((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds) & _MASK
    if isinstance(value, dt.date):
        return (value - _EPOCH_DATE).days & _MASK
    if isinstance(value, dt.timedelta):
        return ((value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds) & _MASK
    raise TypeError(f"no word for {type(value).__name__}")


def reference_order_key(values: Sequence[Any], salt: int, purpose: str) -> int:
    """The order key of one record (signed 64-bit), in plain Python: what every engine must compute."""
    h = start_word(salt, purpose)
    for value in values:
        h = mix(h ^ reference_word(value))
    return signed(h)


#: How each purpose's ranking treats equal keys (see "Ties" above): polars' ``rank`` method.
TIES: dict[str, Literal["ordinal", "max"]] = {"rows": "max", "groups": "max", "table-rows": "max"}


def reference_keep(keys: Sequence[int], cap: int, purpose: str) -> list[bool]:
    """Which records of one partition the bound keeps, given their order keys in row order."""
    if TIES[purpose] == "max":
        return [sum(1 for other in keys if other <= k) <= cap for k in keys]
    ranked = sorted(range(len(keys)), key=lambda i: keys[i])  # stable: equal keys in row order
    kept = set(ranked[:cap])
    return [i in kept for i in range(len(keys))]


def reference_occurrences(records: Sequence[Sequence[Any]]) -> list[int]:
    """Each record's number (0, 1, …) among the earlier records equal to it, in the given order."""
    seen: dict[tuple[int, ...], int] = {}
    out = []
    for record in records:
        words = tuple(reference_word(v) for v in record)
        out.append(seen.get(words, 0))
        seen[words] = out[-1] + 1
    return out


def reference_keep_rows(records: Sequence[Sequence[Any]], salt: int, cap: int) -> list[bool]:
    """Which rows of one (unit, group) partition :func:`keep_first` keeps for purpose ``rows``: each record is
    (unit, group values…, grid value), keyed by the record followed by its occurrence number among the
    partition's identical records (:func:`reference_occurrences`), ties at the cap dropped."""
    if len(records) <= cap:
        return [True] * len(records)
    keys = [reference_order_key([*r, o], salt, "rows") for r, o in zip(records, reference_occurrences(records),
                                                                       strict=True)]
    return reference_keep(keys, cap, "rows")


# --- polars ------------------------------------------------------------------------------------

def _u64(value: int) -> pl.Expr:
    return pl.lit(value & _MASK, dtype=pl.UInt64)


def field_word(column: str, dtype: pl.DataType | DataTypeClass) -> pl.Expr:
    """The word of one column (see the module's table), UInt64, never null."""
    col = pl.col(column)
    if dtype == pl.String or isinstance(dtype, (pl.Categorical, pl.Enum)):
        word = _nchash(col.cast(pl.String)).xxhash64(seed=SEED)
    elif dtype in (pl.Int128, pl.UInt128):
        # Literals of the column's own type: a mixed comparison would cast the column to a common
        # type, which fails on some values (an error that would depend on the data).
        fits = col <= pl.lit((1 << 64) - 1, dtype=dtype)
        if dtype == pl.Int128:
            fits = fits & (col >= pl.lit(-(1 << 63), dtype=dtype))
        word = (pl.when(fits).then(col.cast(pl.UInt64, wrap_numerical=True))
                .otherwise(_nchash(col.cast(pl.String)).xxhash64(seed=SEED)))
    elif dtype == pl.UInt64:
        word = col
    elif dtype.is_integer():
        word = col.cast(pl.Int64).reinterpret(signed=False)
    elif dtype == pl.Boolean:
        word = col.cast(pl.UInt64)
    elif dtype == pl.Date:
        word = col.cast(pl.Int32).cast(pl.Int64).reinterpret(signed=False)
    elif isinstance(dtype, pl.Datetime):
        word = col.dt.epoch("us").reinterpret(signed=False)
    elif isinstance(dtype, pl.Duration):
        # The stored integer, in the column's own unit: what Spark reads (a Parquet duration is a
        # bigint there). Never converted: ms would overflow and ns would be truncated, and neither
        # would match Spark.
        word = col.to_physical().cast(pl.Int64).reinterpret(signed=False)
    else:
        raise DataError(f"column {column!r} has type {type_text(dtype)}: a privacy-unit or group column must hold "
                        "text, integers, booleans, dates or times (cast it), so that rows can be sampled the same on "
                        "every engine")
    return word.fill_null(_u64(NULL_WORD))


def _rotl_expr(x: pl.Expr, r: int) -> pl.Expr:
    # UInt64 arithmetic wraps: a multiplication by 2^r is a left shift, a floor division a right shift.
    return x * _u64(1 << r) + x // _u64(1 << (64 - r))


def with_order_key(lf: pl.LazyFrame, fields: Sequence[tuple[str, pl.DataType | DataTypeClass]], salt: int, purpose: str,
                   name: str) -> pl.LazyFrame:
    """``lf`` with the order key of ``fields`` (Int64) in column ``name``.

    Each step of X is its own ``with_columns``, so every intermediate value is computed once
    (an expression that reused a sub-expression would be evaluated twice per use).
    """
    words = [field_word(c, t) for c, t in fields]
    lf = lf.with_columns(_u64(start_word(salt, purpose)).alias(name))
    for word in words:
        lf = _step(lf, name, word)
    return lf.with_columns(pl.col(name).reinterpret(signed=True).alias(name))


def _step(lf: pl.LazyFrame, name: str, word: pl.Expr) -> pl.LazyFrame:
    """One link of the chain on the UInt64 column ``name``: X(h XOR word)."""
    h = pl.col(name)
    k = h.xor(word) * _u64(_P2)
    lf = lf.with_columns((_rotl_expr(k, 31) * _u64(_P1)).xor(_u64(SEED + _P5 + 8)).alias(name))
    lf = lf.with_columns((_rotl_expr(h, 27) * _u64(_P1) + _u64(_P4)).alias(name))
    lf = lf.with_columns((h.xor(h // _u64(1 << 33)) * _u64(_P2)).alias(name))
    lf = lf.with_columns((h.xor(h // _u64(1 << 29)) * _u64(_P3)).alias(name))
    return lf.with_columns(h.xor(h // _u64(1 << 32)).alias(name))


def _next_link(lf: pl.LazyFrame, name: str, word: str) -> pl.LazyFrame:
    """The order key in ``name`` (Int64) extended by one more field, the UInt64 column ``word``."""
    lf = lf.with_columns(pl.col(name).reinterpret(signed=False).alias(name))
    lf = _step(lf, name, pl.col(word))
    return lf.with_columns(pl.col(name).reinterpret(signed=True).alias(name))


def keep_first(lf: pl.LazyFrame, over: list[str], fields: Sequence[tuple[str, pl.DataType | DataTypeClass]], salt: int,
               purpose: str, cap: int) -> pl.LazyFrame:
    """The records of each ``over`` partition that the keyed order of ``fields`` puts among the first ``cap``.

    For purpose ``rows`` (``fields``: the ``over`` columns, then one more) the key is that of
    ``fields`` followed by each record's occurrence number among the partition's records equal on
    ``fields`` (:func:`reference_keep_rows`: a uniform row sample). Equal keys are ranked as
    :data:`TIES` says for ``purpose`` (:func:`reference_keep`).
    Partitions within the cap keep every record, so the key is only computed for the records of
    partitions over it; the result is the same. The partitions' sizes are counted once, in one
    column both sides read (polars computes a window expression once per filter that uses it:
    one window fewer over the per-(unit, group) table, about 10% of a histogram's bounding).
    """
    key, size, occ = "__dp_order", "__dp_size", "__dp_occ"
    sized = lf.with_columns(pl.len().over(over).alias(size))
    within = sized.filter(pl.col(size) <= cap).drop(size)
    over_cap = sized.filter(pl.col(size) > cap).drop(size)
    over_cap = with_order_key(over_cap, fields, salt, purpose, key)
    if purpose == "rows":
        if [c for c, _ in fields[:-1]] != over:
            raise ValueError("a rows key is the partition's columns and one more field")
        # The occurrence among identical records, then one more link of the chain. The chain so far is
        # injective in the last field (the prefix is the partition's, the same for all its rows), so equal
        # keys are identical records, and their ordinal ranks run on from their smallest: ordinal − min
        # numbers them 0 … m − 1 (in row order, which among interchangeable rows keeps the same values).
        # Two ranks over the partition cost about a third of one window over all the record's columns.
        rank = pl.col(key).rank("ordinal").over(over).cast(pl.Int64)
        first = pl.col(key).rank("min").over(over).cast(pl.Int64)
        over_cap = over_cap.with_columns((rank - first).cast(pl.UInt64).alias(occ))
        over_cap = _next_link(over_cap, key, occ).drop(occ)
    kept = over_cap.filter(pl.col(key).rank(TIES[purpose]).over(over) <= cap).drop(key)
    return pl.concat([within, kept], how="vertical")


# --- a person's rows of one private table (sql's --max-rows-per-table) ---------------------------

def table_purpose(table: str) -> str:
    """The purpose of the per-table row cap of ``table``: its name is in the chain's first word."""
    return f"table-rows|{table}"


def reference_cap_rows(rows: Sequence[Sequence[Any]], salt: int, table: str, cap: int) -> list[bool]:
    """Which rows of one unit's rows of ``table`` (each the values of the columns read, unit first, in
    the fixed order) :func:`cap_rows` keeps: the order key of (the row's values, its occurrence number
    among the unit's identical rows), ties dropped at the cap (``max``)."""
    seen: dict[tuple[int, ...], int] = {}
    keys = []
    for row in rows:
        words = tuple(reference_word(v) for v in row)
        occurrence = seen.get(words, 0)
        seen[words] = occurrence + 1
        h = start_word(salt, table_purpose(table))
        for word in (*words, occurrence):
            h = mix(h ^ word)
        keys.append(signed(h))
    if len(rows) <= cap:
        return [True] * len(rows)
    return reference_keep(keys, cap, "table-rows")


def _x_expr(x: pl.Expr) -> pl.Expr:
    """X(x) as one expression (used once per float cell: :func:`with_order_key` steps the chain instead)."""
    k = _rotl_expr(x * _u64(_P2), 31) * _u64(_P1)
    h = _rotl_expr(k.xor(_u64(SEED + _P5 + 8)), 27) * _u64(_P1) + _u64(_P4)
    h = h.xor(h // _u64(1 << 33)) * _u64(_P2)
    h = h.xor(h // _u64(1 << 29)) * _u64(_P3)
    return h.xor(h // _u64(1 << 32))


def row_word(column: str, dtype: pl.DataType | DataTypeClass) -> pl.Expr:
    """:func:`field_word`, and floats too (a row's column, never a unit or group: see the table)."""
    if dtype in (pl.Float32, pl.Float64):
        col = pl.col(column).cast(pl.Float64)
        canonical = (pl.when(col == 0.0).then(pl.lit(0.0, dtype=pl.Float64))
                     .when(col.is_nan()).then(pl.lit(math.nan, dtype=pl.Float64)).otherwise(col))
        return _x_expr(canonical.reinterpret(dtype=pl.UInt64)).fill_null(_u64(NULL_WORD))
    return field_word(column, dtype)


def has_row_word(dtype: pl.DataType | DataTypeClass) -> bool:
    """Whether a row's column of this type has a word (the module's table, floats and decimals): a column without
    one (lists, structs, binary, …) is left out of the order key, and rows that differ only there are told apart
    by their occurrence number, that is by the order of that unit's own rows."""
    return (dtype in (pl.String, pl.Boolean, pl.Date, pl.Float32, pl.Float64) or dtype.is_integer()
            or isinstance(dtype, (pl.Categorical, pl.Enum, pl.Datetime, pl.Duration, pl.Decimal)))


def cap_rows(lf: pl.LazyFrame, unit: str, fields: Sequence[tuple[str, pl.DataType | DataTypeClass]], salt: int,
             table: str, cap: int) -> pl.LazyFrame:
    """At most ``cap`` rows of ``table`` per ``unit``: each unit's rows ranked on the order key of (the words of
    ``fields``, in order, then the row's occurrence number among the unit's rows with the same words), keyed by
    :func:`table_purpose`; a row is kept only if at most ``cap`` rows of its unit have a key ≤ its own (ties:
    ``max``, so a collision never lets row order decide). The kept rows depend only on the unit's own rows
    and the salt, never on their order in the file nor on anyone else's rows (:func:`reference_cap_rows`)."""
    size, occ, key = "__dp_tsize", "__dp_tocc", "__dp_torder"
    hashed = [(c, t) for c, t in fields if has_row_word(t)]
    words = [f"__dp_tw{i}" for i in range(len(hashed))]
    # Cached: both sides read one computation of the table (and of whatever built it: an owned table's join with its
    # owners). Without it the sides differ in the columns they read (the over-cap side hashes every column), polars
    # cannot tell they share a plan, and the table, its owners and the window are computed twice.
    sized = lf.with_columns(pl.len().over(unit).alias(size)).cache()
    within = sized.filter(pl.col(size) <= cap).drop(size)
    over = sized.filter(pl.col(size) > cap).drop(size)
    # a decimal's word is its unscaled integer's (an Int128's), so "1.5" at scale 1 is 15
    over = over.with_columns([(pl.col(c).to_physical() if isinstance(t, pl.Decimal) else pl.col(c)).alias(w)
                              for (c, t), w in zip(hashed, words, strict=True)])
    over = over.with_columns([row_word(w, pl.Int128 if isinstance(t, pl.Decimal) else t).alias(w)
                              for (_, t), w in zip(hashed, words, strict=True)])
    over = over.with_columns(pl.int_range(pl.len(), dtype=pl.UInt64).over(words).alias(occ))
    over = with_order_key(over, [*((w, pl.UInt64) for w in words), (occ, pl.UInt64)], salt, table_purpose(table), key)
    kept = over.filter(pl.col(key).rank(TIES["table-rows"]).over(unit) <= cap).drop([key, occ, *words])
    return pl.concat([within, kept], how="vertical")
