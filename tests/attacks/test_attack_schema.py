"""Attack: one record that flips a column's inferred type (CSV and NDJSON inputs).

CSV and NDJSON carry no column types: a reader that infers them from the data
lets one private record decide the type of a column, and with it whether the
run fails ("column 'x' must be numeric", a ``--keys`` value that no longer
casts), the types and order of the released groups (``9`` < ``10`` as
integers, ``"10"`` < ``"9"`` as text) and which listed groups match. The
schema of a CSV is its header only, and NDJSON has none: the columns a query
uses must be typed from the query alone.

Each test runs D and its neighbour D′ = D plus ONE record whose value would
flip the inferred type of one column (text in a numeric value column, a
fraction or a word in an integer-looking group column), with the seed forced
equal (``report_diff.differential``): exit code, stderr, the ``--json``
summary and the ledger must agree, and so must the released group values and
their JSON types (with a public list they are all released, in order).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from report_diff import Report, differential
from tabulate_specs import write_spec

APPROX = ["budget", "init", "default", "--mode", "approx", "--epsilon", "100", "--delta", "1e-3"]
PURE = ["budget", "init", "default", "--mode", "pure", "--epsilon", "100"]
USERS = 12  # units per group in D: (user, g, x) with g in 1, 2, 9, 10 and x an integer


def _rows() -> list[tuple[str, Any, Any]]:
    return [(f"u{g}_{i}", g, i % 5) for g in (1, 2, 9, 10) for i in range(USERS)]


def _csv(extra: list[tuple[Any, Any, Any]] = ()) -> str:
    return "user,g,x\n" + "".join(f"{u},{g},{x}\n" for u, g, x in [*_rows(), *extra])


def _ndjson(extra: list[dict[str, Any]] = ()) -> str:
    recs = [{"user": u, "g": g, "x": x} for u, g, x in _rows()] + list(extra)
    return "".join(json.dumps(r) + "\n" for r in recs)


#: The one record D′ adds, per format: what it puts in the value column x or the group column g.
FLIPS_CSV = {
    "text-value": ("intruder", 1, "abc"),
    "fraction-group": ("intruder", "1.5", 2),
    "word-group": ("intruder", "zz", 2),
}
FLIPS_NDJSON = {
    "text-value": {"user": "intruder", "g": 1, "x": "abc"},
    "fraction-group": {"user": "intruder", "g": 1.5, "x": 2},
    "word-group": {"user": "intruder", "g": "zz", "x": 2},
    "nested-value": {"user": "intruder", "g": 1, "x": [1, 2]},
}


def _data(tmp_path: Path, fmt: str, flip: str) -> tuple[Path, str, str]:
    if fmt == "csv":
        return tmp_path / "events.csv", _csv(), _csv([FLIPS_CSV[flip]])
    return tmp_path / "events.ndjson", _ndjson(), _ndjson([FLIPS_NDJSON[flip]])


def _groups(report: Report) -> list[tuple[str, Any]]:
    """The released group values with their JSON types (``1`` and ``"1"`` differ)."""
    if report.json is None:
        return []
    return [(type(row["g"]).__name__, row["g"]) for row in report.json["result"]]


def _assert_same(a: Report, b: Report, diff: list[str]) -> None:
    assert a.exit_code == 0, a.stderr
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)


#: (format, flip) per test: each kind of flip in each format at least once, a few seconds in all.
VALUE_CASES = [("csv", "text-value"), ("csv", "fraction-group"), ("ndjson", "text-value"), ("ndjson", "nested-value")]
GROUP_CASES = [("csv", "word-group"), ("csv", "fraction-group"), ("ndjson", "fraction-group")]
THRESHOLD_CASES = [("csv", "text-value"), ("ndjson", "word-group")]


@pytest.mark.parametrize("fmt, flip", VALUE_CASES)
def test_histogram_value_aggregates_do_not_depend_on_inferred_types(tmp_path, fmt, flip):
    """sum/mean/median of --value over a public list of integer-looking codes (9 and 10 test the order)."""
    data, d, d2 = _data(tmp_path, fmt, flip)
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n1\n2\n9\n10\n")
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--agg", "count,sum,mean,median",
            "--value", "x", "--bounds", "0:5", "--epsilon", "1", "--keys", keys, "--json"]
    a, b, diff = differential(args, data, d, d2, tmp_path, setup=[PURE])
    _assert_same(a, b, diff)
    assert _groups(a) == _groups(b) == [("str", "1"), ("str", "10"), ("str", "2"), ("str", "9")]


@pytest.mark.parametrize("fmt, flip", GROUP_CASES)
def test_histogram_keys_cast_does_not_depend_on_inferred_types(tmp_path, fmt, flip):
    """A public list holding a code the data does not have ("zz") must not fail on D and pass on D′."""
    data, d, d2 = _data(tmp_path, fmt, flip)
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n1\n2\nzz\n")
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--keys", keys, "--json"]
    a, b, diff = differential(args, data, d, d2, tmp_path, setup=[PURE])
    _assert_same(a, b, diff)
    assert _groups(a) == _groups(b) == [("str", "1"), ("str", "2"), ("str", "zz")]


@pytest.mark.parametrize("fmt, flip", THRESHOLD_CASES)
def test_histogram_threshold_does_not_depend_on_inferred_types(tmp_path, fmt, flip):
    """Groups discovered from the data: which are released is noisy, their type is not."""
    data, d, d2 = _data(tmp_path, fmt, flip)
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--agg", "count,mean", "--value", "x",
            "--bounds", "0:5", "--epsilon", "2", "--delta", "1e-3", "--json"]
    # How many groups pass the noisy threshold is noisy (the summary line counts them too).
    a, b, diff = differential(args, data, d, d2, tmp_path, setup=[APPROX],
                              noisy={"json.summary.groups", "ledger.*.summary"})
    _assert_same(a, b, diff)
    assert {t for t, _ in _groups(a) + _groups(b)} == {"str"}


@pytest.mark.parametrize("fmt, flip", GROUP_CASES)
def test_topk_domain_does_not_depend_on_inferred_types(tmp_path, fmt, flip):
    data, d, d2 = _data(tmp_path, fmt, flip)
    domain = tmp_path / "domain.csv"
    domain.write_text("g\n1\n2\n9\n10\nzz\n")
    args = ["topk", data, "--by", "g", "-k", "2", "--privacy-unit", "user", "--epsilon-per", "1",
            "--keys", domain, "--json"]
    a, b, diff = differential(args, data, d, d2, tmp_path, setup=[PURE])
    _assert_same(a, b, diff)
    assert {t for t, _ in _groups(a) + _groups(b)} == {"str"}


def test_keys_compare_as_text_leading_zeros_count(tmp_path):
    """Codes are text on both sides: a listed "01" is not the data's "1" (documented), whatever the data holds."""
    data = tmp_path / "events.csv"
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n01\n1\n")
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--keys", keys, "--json"]
    a, b, diff = differential(args, data, _csv(), _csv([FLIPS_CSV["word-group"]]), tmp_path, setup=[PURE])
    _assert_same(a, b, diff)
    counts = {row["g"]: row["count"] for row in a.json["result"]}
    assert set(counts) == {"01", "1"} and counts["1"] > USERS / 2 > counts["01"]  # noise scale 1 vs 12 units


def test_schedule_does_not_depend_on_inferred_types(tmp_path):
    """A scheduled release: D′ has the same rows, one of them with a text value instead of a number."""
    data = tmp_path / "events.csv"
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n1\n2\n9\n10\n")
    d = _csv()
    d2 = d.replace("u1_0,1,0\n", "u1_0,1,abc\n")
    assert d2 != d
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--agg", "count,sum", "--value", "x",
            "--bounds", "0:5", "--keys", keys, "--schedule", "daily", "--total-epsilon", "1", "--gamma", "0.1",
            "--json"]
    # A schedule's reservation id keys its size noise, so both runs take theirs from one counter; its steps
    # record a keyed digest of the input, which differs between any two inputs.
    volatile = {"ledger.*.step.input"}
    a, b, diff = differential(args, data, d, d2, tmp_path, setup=[PURE], noisy=volatile, same_ids=True)
    _assert_same(a, b, diff)
    assert _groups(a) == _groups(b) == [("str", "1"), ("str", "10"), ("str", "2"), ("str", "9")]


def test_tabulate_ndjson_does_not_depend_on_inferred_types(tmp_path):
    """tabulate reads its spec columns as text from NDJSON too: D has race lists and integer codes; D′
    adds one person whose race is ';'-text and whose age is a word (the record is dropped). Lists of
    codes, read as their JSON text, count as they do from Parquet."""
    spec = write_spec(tmp_path, '[[levels]]\ngeography = "state"\niterations = "reg"\nepsilon = 2\nstability = 2\n')
    people = [{"block": "01001", "race": [1000], "eth": 1, "sex": 1, "age": 30},
              {"block": "02001", "race": [2000, 1000], "eth": 2, "sex": 2, "age": 70}] * 40
    d = "".join(json.dumps(p) + "\n" for p in people)
    d2 = d + json.dumps({"block": "01001", "race": "1000;2000", "eth": "1", "sex": "1", "age": "old"}) + "\n"
    data = tmp_path / "persons.ndjson"
    args = ["tabulate", data, "--spec", spec, "--json"]
    a, b, diff = differential(args, data, d, d2, tmp_path, setup=[PURE],
                              noisy={"json.summary.levels.*.branches", "json.summary.rows"})
    _assert_same(a, b, diff)
    csv = tmp_path / "persons.csv"
    csv.write_text("block,race,eth,sex,age\n" + "01001,1000,1,1,30\n02001,2000;1000,2,2,70\n" * 40)
    c, _, _ = differential(["tabulate", csv, "--spec", spec, "--json"], csv, csv.read_text(), csv.read_text(),
                           tmp_path / "csv", setup=[PURE])
    assert c.json["result"] == a.json["result"]  # same persons, same forced seed: the same release
