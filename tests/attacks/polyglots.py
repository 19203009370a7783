"""Bytes that parse two ways (issue 29's seed attacks): one file valid as CSV and as NDJSON, or split on
``,`` and on ``;``. Rule 1's seed tests and rule 2's restored-state tests read them both ways.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

N = 60  # units per group in the polyglot data files


# ---- polyglots: one file, two readings ----------------------------------------------------------


def csv_and_ndjson(columns: Sequence[str], csv_rows: Sequence[Sequence[str]],
                   json_rows: Sequence[Sequence[str]]) -> bytes:
    """Bytes that are a CSV with ``columns`` and ``csv_rows``, and an NDJSON with ``json_rows``.

    Each line is a JSON object ``{"z":[0,"a","b",0], "c1":"x", "c2":"y"}``. Split on commas it is
    the CSV fields ``{"z":[0``, ``"a"``, ``"b"``, ``0]``, `` "c1":"x"``, …: the array holds the CSV
    values (the header line's array holds the column names), the object's keys the NDJSON ones. The
    header line is an NDJSON record too, so there is one more JSON row than CSV rows.
    """
    assert len(json_rows) == len(csv_rows) + 1

    def line(array: Sequence[str], record: Sequence[str]) -> str:
        items = ",".join(json.dumps(v) for v in array)
        fields = "".join(f", {json.dumps(c)}:{json.dumps(v)}" for c, v in zip(columns, record))
        return '{"z":[0,' + items + ",0]" + fields + "}\n"

    return "".join(line(a, r) for a, r in zip([columns, *csv_rows], json_rows)).encode()


def comma_and_semicolon(rows: int) -> bytes:
    """Bytes that are two CSVs: split on ``,`` every unit ``u…`` is in group G, split on ``;`` every
    unit ``v…`` is in group H (header ``user,g,x;g;user;y,z``)."""
    return ("user,g,x;g;user;y,z\n" + "".join(f"u{i},G,x;H;v{i};y,z\n" for i in range(rows))).encode()


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def hard_link(path: Path, name: str) -> Path:
    """A second name for ``path``'s bytes (the same inode)."""
    other = path.with_name(name)
    os.link(path, other)
    return other
