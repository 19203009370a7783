"""NDJSON, record by record: one line is one record, and a line that is not a JSON object is a record
of nulls (the per-record rules drop it), never an error (see :func:`scan_ndjson`)."""

from __future__ import annotations

import json
from typing import IO

import polars as pl

from dpcli.errors import (
    DataError,
)

#: The one column an NDJSON file is first read into: each line whole, as text. (``__dp_`` names are
#: dpcli's own: no query column can take it.)
_LINE = "__dp_line"
#: What the lines are split on: NUL, which never occurs in JSON text (a control character in a
#: string must be escaped, and it is no whitespace). A line that holds one is no JSON anyway; it is
#: read up to its first NUL, and that part counts as the record (see :func:`scan_ndjson`).
_NO_SPLIT = "\x00"
#: The most negative double: a JSONPath filter ``value >= this`` holds exactly when the value is a number.
_MOST_NEGATIVE = "-1.7976931348623157e308"
#: Characters that end or change a key in JSONPath's dot notation (``$.name``), as do whitespace and a
#: leading quote.
_DOT_SPECIAL = frozenset("$.*[]()@?,:<>=&|!")


NDJSON_NEEDS_COLUMNS = ("an NDJSON input is read by the columns a query names (text_columns): they are its "
                         "schema, never inferred from the records")


def _json_member_paths(name: str) -> tuple[str, str]:
    """Two JSONPath expressions for the member ``name`` of a JSON object (the one record of a line):
    its value, and a filter that matches the object exactly when that value is a number.

    polars' JSONPath reader keeps no escape inside brackets (a backslash is dropped, an escaped
    quote is matched with its backslash in filters), so the name goes in quotes it does not
    contain; a name with a backslash or both kinds of quotes goes in dot notation, which cannot
    hold JSONPath's special characters, whitespace or a leading quote: such a name is refused.
    Either way, the paths are checked on probe records (:func:`_check_member_paths`): a name is
    refused rather than read from the wrong member. Depends only on the name, so the refusal is the
    same for every file.
    """
    if "\\" not in name and "'" not in name:
        spelt = f"['{name}']"
    elif "\\" not in name and '"' not in name:
        spelt = f'["{name}"]'
    elif name and name[0] not in "'\"" and not any(c in _DOT_SPECIAL or c.isspace() for c in name):
        spelt = f".{name}"
    else:
        raise DataError(f"column {name!r} cannot be read from NDJSON: its name mixes quotes, backslashes and "
                        "JSONPath's special characters (rename the key, or convert the file to CSV or Parquet)")
    paths = f"${spelt}", f"$[?(@{spelt} >= {_MOST_NEGATIVE})]"
    _check_member_paths(name, *paths)
    return paths


def _probe_records(name: str) -> list[tuple[object, str | None, bool]]:
    """(record, the value ``name``'s path must read from it, whether the number filter must see a number)."""
    outer = "nested" if name != "nested" else "outer"
    pieces = {p for p in "".join(c if c.isalnum() else " " for c in name).split() if p != name}
    decoys = dict.fromkeys(["", *sorted(pieces), "x" + name, name + "x", "\U0010ffff"])
    decoys.pop(name, None)
    return [
        ({**dict.fromkeys(decoys, "decoy"), name: "probe", outer: {name: "nested"}}, "probe", False),
        ({name: 5.0, **dict.fromkeys(decoys, 1.0)}, "5.0", True),
        ({name: "5.0", **dict.fromkeys(decoys, 1.0)}, "5.0", False),
        ({**dict.fromkeys(decoys, 2), outer: {name: 3}}, None, False),
        ([{name: "in a list"}], None, False),
        ("a string", None, False),
    ]


def _check_member_paths(name: str, value_path: str, number_path: str) -> None:
    """Refuse (DataError) ``name`` unless its paths read exactly its member on probe records: the
    member among decoys (keys that hold pieces of its name, nested copies of it), a missing member,
    lines that are no object; and the number filter tells a number from the same text as a string."""
    records = _probe_records(name)
    lines = pl.Series([json.dumps(r) for r, _, _ in records], dtype=pl.String)
    try:
        values = lines.str.json_path_match(value_path).to_list()
        objects = lines.head(4).str.json_path_match(number_path).to_list()  # it sees objects only (see _scan_ndjson)
    except BaseException as exc:  # a path polars rejects, or panics on (pyo3's PanicException is a BaseException)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        values, objects = [], []
    if values != [v for _, v, _ in records] or [o is not None for o in objects] != [n for _, _, n in records[:4]]:
        raise DataError(f"column {name!r} cannot be read from NDJSON: JSONPath does not spell its name "
                        "(rename the key, or convert the file to CSV or Parquet)")


def scan_ndjson(source: IO[bytes] | bytes, columns: tuple[str, ...]) -> pl.LazyFrame:
    """NDJSON, record by record: one line is one record, and a line that is not a JSON object is a
    record whose every column is null (the per-record rules then drop it), never an error.

    The lines are read as text (as CSV without quotes, split on nothing a JSON line holds: see
    :data:`_NO_SPLIT`; bytes that are not UTF-8 are replaced, as in CSV); blank lines are not
    records. Each column is then taken from its line with JSONPath, which is null when the line is
    not valid JSON (text after the object included), not an object, nests 128 levels deep or more,
    holds a number beyond the double range, or lacks the key (or has it as JSON ``null``). A string
    is its text; any other value is its JSON text, compact (``[1,2]``, ``{"a":1}``, ``true``).
    Numbers are read so that one value has one spelling: an integer as written (up to 64 bits; a
    longer one is a double), a whole number written with a fraction or an exponent as that integer
    (``1.0``, ``1e2`` → ``1``, ``100``, below 10^16), any other number in the shortest form that
    reads back as the same double (``2.50`` → ``2.5``, ``0.00000015`` → ``1.5e-7``, ``1e16`` →
    ``1e+16``); the same text in a JSON string stays as written. With duplicate keys, the last one
    counts. Every step is per line: no record changes another's columns, the schema is ``columns``
    (all strings) whatever the file holds, and the scan is lazy.
    """
    paths = {c: _json_member_paths(c) for c in columns}
    line = pl.col(_LINE)
    lines = (pl.scan_csv(source, has_header=False, separator=_NO_SPLIT, quote_char=None, schema={_LINE: pl.String},
                         encoding="utf8-lossy", truncate_ragged_lines=True, extra_columns="ignore",
                         raise_if_empty=False)
             .filter(line.str.contains(r"[^ \t\r]")))  # blank lines (null when empty) are no records
    # Columns by position (pl.col would take "*" or "^…$" as patterns); names are only ever aliases, and
    # the line is kept under one no column has (a library caller may name a column __dp_line).
    held = _LINE
    while held in paths:
        held += "_"
    raw = lines.select(line.alias(held), *[line.str.json_path_match(value).alias(c) for c, (value, _) in paths.items()])
    # A whole number written as a float ("1.0": serde prints every such double < 10^16 so) is read as
    # the integer, like 1: one unit or group is never split by how a writer spelt its number. Only lines
    # whose value ends in ".0" are parsed a second time, to tell the number 1.0 from the string "1.0".
    values = [(pl.nth(i + 1), c, number) for i, (c, (_, number)) in enumerate(paths.items())]
    # cache(): a query that reads the input twice (bounding unions two passes over it) parses each line
    # once per collect, not once per pass. A query that reads it once keeps its pushdowns (polars drops
    # a cache with one consumer: counting rows parses nothing).
    return raw.select([
        pl.when(pl.when(v.str.ends_with(".0")).then(pl.nth(0)).str.json_path_match(number).is_not_null())
        .then(v.str.strip_suffix(".0")).otherwise(v).alias(c)
        for v, c, number in values
    ]).cache()
