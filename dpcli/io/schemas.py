"""Column checks, one rule for releases and dry runs (:func:`check_schema`: in :data:`TYPED_FORMATS` a value column
must be numeric), and public lists of groups read against the data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import polars as pl

from dpcli.access import gate
from dpcli.errors import (
    DataError,
    type_text,
    withheld,
)
from dpcli.io.tables import InputTable

ColumnKind = Literal["any", "numeric", "value", "temporal", "key"]


def header_is_text(names: Sequence[str]) -> bool:
    """Do these column names look like a written header (printable text, not raw bytes)?

    A Parquet or compressed file read as CSV yields a "header" of binary bytes from its first
    line, which can hold encoded records: such names are never printed.
    """
    return all(len(n) <= 256 and "\ufffd" not in n and n.isprintable() for n in names)


#: Formats whose columns carry declared types: a Parquet file or dataset, Parquet files Spark read. A column's
#: type there is schema (public, the same for every dataset of that schema); CSV and NDJSON declare none (every
#: column a query reads is read as text, and parsed per record).
TYPED_FORMATS = frozenset({"parquet", "spark-parquet"})


def require_columns(table: InputTable, columns: dict[str, ColumnKind]) -> pl.Schema:
    """Check that each column exists with a usable type (:func:`check_schema`); the table's schema.

    Only the schema is looked at (a Parquet footer, a CSV header), before anything is charged.
    """
    try:
        schema = table.frame.collect_schema()
    except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
        raise DataError(f"cannot read {table.name}: {withheld(exc)}") from None
    delimiter = table.reading.delimiter if table.reading else None
    check_schema(schema, columns, SchemaOf(table.name, table.format, delimiter))
    return schema


@dataclass(frozen=True)
class SchemaOf:
    """Whose schema :func:`check_schema` checks: the name messages use, its format, and a CSV's delimiter."""

    name: str
    format: str
    delimiter: str | None = None

    @property
    def typed(self) -> bool:
        """Are its column types schema (:data:`TYPED_FORMATS`)?"""
        return self.format in TYPED_FORMATS


def check_schema(schema: pl.Schema, columns: dict[str, ColumnKind], of: SchemaOf) -> None:
    """Each of ``columns`` must be in ``schema`` with a type its kind can use; name the offender otherwise.

    Kinds: ``numeric`` (a numeric type), ``value`` (a column aggregated: in a typed format such as Parquet
    a numeric type, since the type is schema and :func:`dpcli.bounding.numeric_value` aggregates no other:
    text, booleans, dates, times, durations, binary, categorical and nested columns are refused; in CSV
    and NDJSON, whose columns are read as text, text parsed per record), ``temporal`` (timestamps, numbers
    or text), ``key`` (a privacy-unit or group column: a type the keyed order samples, :func:`keyable`),
    ``any``. The same rule for a release (the opened input's
    schema) and a dry run (the schema read without the records: :func:`dpcli.io.columns.declared_schema`).
    In service mode the message names neither the column's type nor any other column.
    """
    for col, kind in columns.items():
        if col not in schema:
            raise _missing_column(of, list(schema.names()), col)
        dtype = schema[col]
        usable, refusal = _COLUMN_KINDS.get("numeric" if kind == "value" and of.typed else kind, (None, ""))
        if usable is not None and not usable(dtype):
            if gate().restricted:  # a service-mode analyst: the column's type is not theirs to read
                raise DataError(f"column {col!r} of {of.name} cannot be used as asked (a {kind} column)")
            raise DataError(refusal.format(col=col, type=type_text(dtype), name=of.name))


#: Column kind → (is a column of this type usable?, the error otherwise). ``any`` takes every type.
_COLUMN_KINDS: dict[str, tuple[Callable[[pl.DataType], bool], str]] = {
    "numeric": (lambda t: t.is_numeric(), "column {col!r} must be numeric but is {type} in {name}"),
    "value": (lambda t: t.is_numeric() or t == pl.String,
              "column {col!r} must be numeric (or text holding numbers) but is {type} in {name}"),
    "temporal": (lambda t: t.is_temporal() or t.is_numeric() or t == pl.String,
                 "column {col!r} must hold timestamps but is {type} in {name}"),
    "key": (lambda t: keyable(t), "column {col!r} has type {type} in {name}: a privacy-unit or group column must "
            "hold text, integers, booleans, dates or times (cast it), so that rows can be sampled the same on every "
            "engine"),
}


def keyable(dtype: pl.DataType) -> bool:
    """Whether a privacy-unit or group column of this type can be sampled by the keyed order
    (:func:`dpcli.bounding.keyed_order.field_word` hashes exactly these: text, categoricals, integers, booleans,
    dates, datetimes, durations): checked on the schema, before anything is charged, where the bounding would
    otherwise refuse the column after the debit."""
    return (dtype == pl.String or isinstance(dtype, (pl.Categorical, pl.Enum)) or dtype.is_integer()
            or dtype == pl.Boolean or dtype == pl.Date or isinstance(dtype, (pl.Datetime, pl.Duration)))


def _missing_column(of: SchemaOf, names: list[str], col: str) -> DataError:
    """The error for a column the input lacks: its other columns named, the closest one suggested, and a
    header that another delimiter would split pointed out, unless the names are binary bytes read as a
    header (never echoed) or private (a service-mode analyst's: nothing about them is said)."""
    restricted = gate().restricted  # a service-mode analyst: no hint from the header (it would pick the message)
    sep = None if restricted else _splitting_delimiter(of, names)
    if not header_is_text(names) and sep is None:
        return DataError(f"{of.name} does not look like {of.format}: its first line is not a header of "
                         "column names (Parquet or compressed data? give --input-format, or a .gz/.bz2/.xz "
                         "name)")
    if restricted:
        return DataError(f"column {col!r} not found in {of.name}")
    if sep is not None:
        shown = "tab" if sep == "\t" else repr(sep)
        return DataError(f"{shown} is probably needed: column {col!r} not found in {of.name}, whose header is "
                         f"one column that {shown} splits into {len(names[0].split(sep))}", field="delimiter")
    return DataError(f"column {col!r} not found in {of.name}{did_you_mean(col, names)} "
                     f"(columns: {listed(names)})")


def listed(names: Sequence[str], shown: int = 12) -> str:
    """``names`` joined by commas, the first ``shown`` of them and then how many more there are
    (``a, b, … and 7 more``): a long header in one line, saying it is cut."""
    head = ", ".join(names[:shown])
    return head if len(names) <= shown else f"{head}, … and {len(names) - shown} more"


#: Field separators a CSV header read as one column is tried with (:func:`_splitting_delimiter`).
_LIKELY_DELIMITERS = (";", "\t", "|", ",")


def _splitting_delimiter(of: SchemaOf, names: list[str]) -> str | None:
    """The separator that splits a CSV header read as one column into the most columns of text, if another
    one does (a file separated by ';' read with ','). The header is the schema: public in personal mode."""
    if of.format != "csv" or len(names) != 1:
        return None
    used = of.delimiter or ","
    splits = {sep: parts for sep in _LIKELY_DELIMITERS
              if sep != used and len(parts := names[0].split(sep)) > 1 and header_is_text(parts)}
    return max(splits, key=lambda sep: len(splits[sep])) if splits else None


def did_you_mean(col: str, names: Sequence[str]) -> str:
    """`` (did you mean 'country'?)`` for the name in ``names`` closest to ``col``, or nothing: for messages
    that may show the input's column names (never to a service-mode analyst: the caller checks)."""
    import difflib

    close = difflib.get_close_matches(col, list(names), n=1, cutoff=0.6)
    if not close:
        folded = {n.casefold(): n for n in names}
        close = [folded[col.casefold()]] if col.casefold() in folded else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_group_list(table: InputTable, by: tuple[str, ...], data_schema: pl.Schema) -> pl.DataFrame:
    """A public list of groups (``--keys``/``--domain``): distinct rows of the ``by`` columns,
    cast to the data's column types, sorted.

    Open the list with ``text_columns=by`` so that its codes are read as written: against a CSV or
    NDJSON input (whose group columns are text) values then match as text, exactly (``01`` is not
    ``1``); against a Parquet input they are cast to its declared types (``01`` → 1 for an integer
    column), and a value that does not cast is an error naming the list (the list is public).
    """
    schema = table.frame.collect_schema()
    missing = [c for c in by if c not in schema]
    if missing:
        raise DataError(f"{table.name} lacks column {missing[0]!r} (a list of groups needs: {', '.join(by)})")
    try:
        groups = table.frame.select([pl.col(c).cast(data_schema[c], strict=True) for c in by]).unique().collect()
    except pl.exceptions.PolarsError as exc:
        raise DataError(f"{table.name}: values do not match the data's column types ({type(exc).__name__}; "
                        "the parser's message is withheld)") from None
    if groups.height == 0:
        raise DataError(f"{table.name} lists no groups")
    table.verify_unchanged()  # the whole list has been read: it is the list that was hashed
    return groups.sort(list(by), nulls_last=True)
