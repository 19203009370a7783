"""Rule 4 for NDJSON: one record the reader cannot parse fails no run.

Attack (issue 29). NDJSON was read by polars' NDJSON reader, which fails the whole file on one line
beyond its grammar: a number beyond the double range (``1e999``), 1024 levels of nesting, a line that
is an array, ``null`` or a number rather than an object, bytes that are not UTF-8, text that is not
JSON. One person's record then decided whether every command failed (exit 65): a bit about that
person, published for free, whatever ε. CSV never did this (ragged lines are truncated, invalid UTF-8
replaced). Now every line is read alone (:func:`dpcli.io.inputs._scan_ndjson`): a line that is not a
JSON object is a record of nulls, dropped inside the bounded transformation by the per-record rules (a
null unit), never counted or reported.

Each test runs a real command through the CLI on D and on D′ = D plus ONE such record, with the seed
forced equal (``report_diff.differential``): both succeed, and the exit code, stderr, the ``--json``
summary and the ledger agree. The broken record is dropped, so the releases are equal too. Commands:
``histogram``, ``topk``, ``tabulate`` and ``stream-replay``, on a plain file, a ``.jsonl.gz`` and
standard input. ``make test`` runs every broken record once on ``histogram`` and a few on the other
commands and readings; ``make audit`` the whole matrix.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from report_diff import APPROX, PURE, Report, differential, report_diff, run_cli
from tabulate_specs import write_spec

USERS = 60  # units per group: counts far from any threshold

#: The one record D′ adds: each failed every command on NDJSON before (exit 65, "cannot read … as ndjson").
BROKEN: dict[str, bytes] = {
    "number beyond the double range": b'{"user": "intruder", "g": "a", "x": 1e999, "t": "2026-01-01T10:00:00"}',
    "1100 levels of nesting": b'{"user": "intruder", "g": "a", "x": ' + b"[" * 1100 + b"]" * 1100 + b"}",
    "top-level array": b'[{"user": "intruder", "g": "a", "x": 1, "t": "2026-01-01T10:00:00"}]',
    "top-level null": b"null",
    "top-level number": b"1",
    "invalid UTF-8": b'{"user": "intr\xffder", "g": "a\xc3", "x": 1, "t": "2026-01-01T10:00:00"}',
    "not JSON": b"user=intruder g=a x=1",
    "trailing text": b'{"user": "intruder", "g": "a", "x": 1, "t": "2026-01-01T10:00:00"} and more',
}

#: Read as a record that names no unit (a null unit drops it); invalid UTF-8 is replaced, as in CSV:
#: that record is kept, with an unknown group, so its release is a neighbour's, not the same.
DROPPED = [k for k in BROKEN if k != "invalid UTF-8"]


def _events() -> bytes:
    recs = [{"user": f"u{g}{i}", "g": g, "x": i % 5, "t": f"2026-01-01T{i % 24:02d}:00:00"}
            for g in ("a", "b") for i in range(USERS)]
    return "".join(json.dumps(r) + "\n" for r in recs).encode()


def _with(d: bytes, broken: bytes, where: str) -> bytes:
    """D′: D with the broken record as its first line, or as its last line without a newline."""
    return broken + b"\n" + d if where == "first" else d + broken


def _command(command: str, data: Path, tmp: Path) -> tuple[list[str], list[Any]]:
    """(ledger setup, the release command reading ``data``) for one of the four commands."""
    keys = tmp / "keys.csv"
    keys.write_text("g\na\nb\n")
    unit = ["--privacy-unit", "user"]
    if command == "histogram":
        return PURE, ["histogram", data, "--by", "g", *unit, "--agg", "count,sum,median", "--value", "x",
                      "--bounds", "0:5", "--epsilon", "1", "--keys", keys, "--json"]
    if command == "topk":
        return PURE, ["topk", data, "--by", "g", "-k", "1", *unit, "--epsilon-per", "1", "--keys", keys, "--json"]
    return APPROX, ["stream-replay", data, "--time", "t", "--by", "g", *unit, "--window", "1d", "--triggers", "4",
                    "--max-contributions", "1", "--value", "x", "--bounds", "-5:5", "--epsilon", "1",
                    "--delta", "1e-6", "--through", "2026-01-02T00:00:00", "--json"]


def _assert_same(a: Report, b: Report, diff: list[str], dropped: bool) -> None:
    assert a.exit_code == 0, a.stderr
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)
    if dropped:  # the record is dropped inside the bounding: the very same release
        assert a.stdout == b.stdout


def _matrix(commands: list[str], cases: list[str], fast_cases: int) -> list[Any]:
    """Every (command, case): histogram with every case and each other command with its first
    ``fast_cases`` cases in ``make test``; the rest of the matrix under ``make audit``."""
    return [(c, k) if c == "histogram" or i < fast_cases else pytest.param(c, k, marks=pytest.mark.audit)
            for c in commands for i, k in enumerate(cases)]


def _fast(cases: list[str], fast_cases: int) -> list[Any]:
    """The first ``fast_cases`` cases in ``make test``, every case under ``make audit``."""
    return [k if i < fast_cases else pytest.param(k, marks=pytest.mark.audit) for i, k in enumerate(cases)]


@pytest.mark.parametrize(("command", "case"), _matrix(["histogram", "topk", "stream-replay"], list(BROKEN), 2))
def test_one_broken_record_fails_no_command(tmp_path, command, case):
    data = tmp_path / "events.ndjson"
    setup, args = _command(command, data, tmp_path)
    d = _events()
    a, b, diff = differential(args, data, d, _with(d, BROKEN[case], "first"), tmp_path, setup=[setup])
    _assert_same(a, b, diff, case in DROPPED)


@pytest.mark.parametrize("case", _fast(DROPPED, 2))
def test_the_broken_record_as_the_last_line_without_a_newline(tmp_path, case):
    data = tmp_path / "events.ndjson"
    setup, args = _command("histogram", data, tmp_path)
    d = _events()
    a, b, diff = differential(args, data, d, _with(d, BROKEN[case], "last"), tmp_path, setup=[setup])
    _assert_same(a, b, diff, True)


@pytest.mark.parametrize("case", _fast(["number beyond the double range", "top-level null", "invalid UTF-8"], 1))
def test_compressed_ndjson_reads_record_by_record_too(tmp_path, case):
    data = tmp_path / "events.jsonl.gz"
    setup, args = _command("histogram", data, tmp_path)
    d = _events()
    a, b, diff = differential(args, data, gzip.compress(d), gzip.compress(_with(d, BROKEN[case], "first")),
                              tmp_path, setup=[setup])
    _assert_same(a, b, diff, case in DROPPED)


@pytest.mark.parametrize(("command", "case"), _matrix(["histogram", "topk", "stream-replay"],
                                                      ["1100 levels of nesting", "top-level array", "invalid UTF-8"], 1))
def test_ndjson_on_standard_input_reads_record_by_record_too(tmp_path, command, case):
    setup, args = _command(command, Path("-"), tmp_path)
    args[2:2] = ["--input-format", "ndjson"]
    d = _events()
    a = run_cli(args, tmp_path / "state-D", [setup], stdin=d)
    b = run_cli(args, tmp_path / "state-D-prime", [setup], stdin=_with(d, BROKEN[case], "first"))
    _assert_same(a, b, report_diff(a, b), case in DROPPED)


# ---- tabulate: the spec's columns from NDJSON persons ------------------------------------------------


LEVEL = '[[levels]]\ngeography = "state"\niterations = "reg"\nepsilon = 2\nstability = 2\n'
PEOPLE = [{"block": "01001", "race": [1000], "eth": 1, "sex": 1, "age": 30},
          {"block": "02001", "race": [2000, 1000], "eth": 2, "sex": 2, "age": 70.0}] * 40
BROKEN_PERSONS: dict[str, bytes] = {
    "number beyond the double range": b'{"block": "01001", "race": [1000], "eth": 1, "sex": 1, "age": 1e999}',
    "1100 levels of nesting": b'{"block": "01001", "race": ' + b"[" * 1100 + b"]" * 1100 + b"}",
    "top-level array": b'[{"block": "01001", "race": [1000], "eth": 1, "sex": 1, "age": 30}]',
    "top-level null": b"null",
    "top-level number": b"-0.5",
    "invalid UTF-8": b'{"block": "01\xff001", "race": [1000], "eth": 1, "sex": 1, "age": 30}',
    "not JSON": b"block=01001",
    "trailing text": b'{"block": "01001", "race": [1000], "eth": 1, "sex": 1, "age": 30},',
}


@pytest.mark.parametrize("case", _fast(list(BROKEN_PERSONS), 3))
def test_tabulate_one_broken_person_fails_nothing(tmp_path, case):
    spec = write_spec(tmp_path, LEVEL)
    data = tmp_path / "persons.ndjson"
    d = "".join(json.dumps(p) + "\n" for p in PEOPLE).encode()
    args = ["-v", "tabulate", data, "--spec", spec, "--json"]
    a, b, diff = differential(args, data, d, _with(d, BROKEN_PERSONS[case], "first"), tmp_path, setup=[PURE],
                              noisy={"json.summary.levels.*.branches", "json.summary.rows"})
    # The invalid UTF-8 person's block is no block of the public list: dropped like every other.
    _assert_same(a, b, diff, True)
    assert len(a.json["result"]) > 1


# ---- a file whose every line is broken: no records, released like any other --------------------------


def test_a_file_of_broken_lines_is_released_as_no_records(tmp_path):
    """Every line broken (and blank lines): not an error but a file of no usable record, released as
    the mechanisms release no records (noisy zeros over the public list), exactly like a file of
    blank lines only."""
    data = tmp_path / "events.ndjson"
    setup, args = _command("histogram", data, tmp_path)
    broken = b"\n".join(v for k, v in BROKEN.items() if k in DROPPED) + b"\n\n"
    a, b, diff = differential(args, data, b"\n \n", broken, tmp_path, setup=[setup])
    _assert_same(a, b, diff, True)
    assert [row["g"] for row in a.json["result"]] == ["a", "b"]
    setup, args = _command("stream-replay", data, tmp_path)
    a, b, diff = differential(args, data, b"\n", broken, tmp_path / "stream", setup=[setup])
    _assert_same(a, b, diff, True)
