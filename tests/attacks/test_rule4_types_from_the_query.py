"""Rule 4, control flow depends only on public inputs: column types come from the query, never from the records.

Attack: one record that flips a column's inferred type (CSV and NDJSON inputs). CSV and NDJSON carry
no column types: a reader that infers them from the data lets one private record decide the type of a
column, and with it whether the run fails ("column 'x' must be numeric", a ``--keys`` value that no
longer casts), the types and order of the released groups (``9`` < ``10`` as integers, ``"10"`` <
``"9"`` as text) and which listed groups match. The schema of a CSV is its header only, and NDJSON has
none: the columns a query uses must be typed from the query alone.

The first tests run D and its neighbour D′ = D plus ONE record whose value would flip the inferred
type of one column (text in a numeric value column, a fraction or a word in an integer-looking group
column), with the seed forced equal (``report_diff.differential``): exit code, stderr, the ``--json``
summary and the ledger must agree, and so must the released group values and their JSON types (with a
public list they are all released, in order).

The review of issue 15 added the cases below them: a value past the inference window, an unterminated
quote, invalid UTF-8, a ragged record and a late NDJSON record of another type must neither fail the
run nor put private text on stderr (parser errors never quote a record); and (issue 17, which made
``-`` read CSV by default) a Parquet file read as CSV must not have its first bytes echoed as a
header.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dptest import init_ledger, runner
from report_diff import APPROX, PURE, Report, differential
from small_tables import csv_rows, write
from tabulate_specs import write_spec

from dpcli.cli.app import app
from dpcli.io import inputs
from dpcli.io import schemas

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
            "--bounds", "0:5", "--epsilon", "2", "--delta", "1e-3", "--max-partitions", "1", "--max-contributions", "1",
            "--json"]
    # How many groups pass the noisy threshold is noisy (the summary line counts them too). The caps are given: on
    # 48 units the caps chosen from the data may be large enough for no group of 12 to pass, and nothing is typed.
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
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--keys", keys,
            "--max-partitions", "1", "--max-contributions", "1", "--json"]  # caps of 1: a count's noise scale ~1
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
    # D′'s record has no number, so it counts nowhere: the noisy counts may differ (same noise, another
    # truth), and so may the note's typical released value, a function of them; every other word may not
    typical = re.compile(r"typical released value \([^)]*\)")
    if typical.sub("", a.stderr) == typical.sub("", b.stderr):
        diff = [d for d in diff if not d.startswith("stderr:")]
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


# ---- the review of issue 15: one record decides whether a run fails, or is quoted ----------------


SECRET = "SECRET4711"


def histogram_sum(tmp_path: Path, data: Path, fmt: list[str] | None = None):
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n0\n1\n2\n")
    return runner.invoke(app, ["histogram", str(data), *(fmt or []), "--by", "g", "--privacy-unit", "uid",
                               "--agg", "sum", "--value", "v", "--bounds", "0:10", "--epsilon", "1",
                               "--keys", str(keys)])


# ---- CSV schema inference: one record decides a column's type ------------------------------------


def test_csv_parse_errors_never_quote_a_record(tmp_path):
    """A value past the inference window that does not parse as the inferred type made polars fail with
    the value in its message (``could not parse `SECRET4711` as dtype i64``): private text on stderr."""
    init_ledger()
    rows = csv_rows(10_050)
    rows[10_020] = f"10019,1,{SECRET}"
    r = histogram_sum(tmp_path, write(tmp_path / "b.csv", rows))
    assert SECRET not in r.stderr and SECRET not in r.stdout


def test_csv_unterminated_quote_is_not_quoted_back(tmp_path):
    """A malformed quoted field made polars echo the rest of the file (other records) on stderr."""
    init_ledger()
    rows = csv_rows(300)
    rows[200] = f'199,"1,{SECRET}'
    r = histogram_sum(tmp_path, write(tmp_path / "q.csv", rows))
    said = r.stderr.replace(str(tmp_path), "<tmp>")  # the path may hold any number (pytest-199)
    assert SECRET not in said and "199" not in said


def test_csv_late_unparsable_value_does_not_fail_the_run(tmp_path):
    init_ledger()
    rows = csv_rows(10_050)
    clean = histogram_sum(tmp_path, write(tmp_path / "a.csv", rows))
    rows[10_020] = f"10019,1,{SECRET}"
    dirty = histogram_sum(tmp_path, write(tmp_path / "b.csv", rows))
    assert clean.exit_code == 0, clean.stderr
    assert dirty.exit_code == clean.exit_code, dirty.stderr


def test_csv_one_text_value_does_not_change_the_value_columns_type(tmp_path):
    init_ledger()
    rows = csv_rows(300)
    clean = histogram_sum(tmp_path, write(tmp_path / "a.csv", rows))
    rows[5] = "4,1,n/a"
    dirty = histogram_sum(tmp_path, write(tmp_path / "c.csv", rows))
    assert clean.exit_code == 0, clean.stderr
    assert dirty.exit_code == clean.exit_code, dirty.stderr


def test_csv_one_record_does_not_change_the_released_group_types(tmp_path):
    init_ledger()
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n0\n1\n2\n")
    outs = []
    for name, odd in (("a.csv", None), ("d.csv", "4,x,3")):
        rows = csv_rows(300)
        if odd:
            rows[5] = odd
        data = write(tmp_path / name, rows)
        r = runner.invoke(app, ["histogram", str(data), "--by", "g", "--privacy-unit", "uid", "--epsilon", "1",
                                "--keys", str(keys), "--json"])
        assert r.exit_code == 0, r.stderr
        outs.append([type(row["g"]) for row in json.loads(r.stdout)["result"]])
    assert outs[0] == outs[1]


def test_csv_invalid_utf8_in_one_record_does_not_fail_the_run(tmp_path):
    """One byte that is not UTF-8 in one record's field failed the whole run ('invalid utf-8 sequence')."""
    init_ledger()
    rows = csv_rows(300)
    raw = ("\n".join(rows) + "\n").encode().replace(b"\n200,", b"\n200\xff,", 1)
    data = tmp_path / "u.csv"
    data.write_bytes(raw)
    r = runner.invoke(app, ["topk", str(data), "--by", "g", "--privacy-unit", "uid", "-k", "1",
                            "--epsilon-per", "1", "--keys", str(write(tmp_path / "dom.csv", ["g", "0", "1", "2"]))])
    assert r.exit_code == 0, r.stderr


def test_csv_one_ragged_record_does_not_fail_the_run(tmp_path):
    """A record with one field too many failed the run ('found more fields than defined in Schema')."""
    init_ledger()
    rows = csv_rows(300)
    rows[200] = "199,1,3,extra"
    r = histogram_sum(tmp_path, write(tmp_path / "e.csv", rows))
    assert r.exit_code == 0, r.stderr


# ---- NDJSON schema inference ----------------------------------------------------------------------


def test_ndjson_one_late_record_of_another_type_does_not_fail_the_run(tmp_path):
    init_ledger()
    recs = [{"uid": i, "g": i % 3, "v": i % 7} for i in range(300)]
    data = tmp_path / "a.ndjson"
    data.write_text("\n".join(json.dumps(x) for x in recs) + "\n")
    clean = histogram_sum(tmp_path, data)
    recs[200] = {"uid": 200, "g": 1, "v": SECRET}
    data = tmp_path / "b.ndjson"
    data.write_text("\n".join(json.dumps(x) for x in recs) + "\n")
    dirty = histogram_sum(tmp_path, data)
    assert SECRET not in dirty.stderr
    assert clean.exit_code == 0, clean.stderr
    assert dirty.exit_code == clean.exit_code, dirty.stderr


@pytest.mark.parametrize("how", ["stdin", "misnamed-file"])
def test_binary_data_read_as_csv_is_never_echoed_as_a_header(tmp_path, how):
    """Attack (issue 17 made `-` read CSV by default): a Parquet file piped in, or named .csv, has
    a first "line" of raw bytes that can hold encoded records. The column-not-found error used to
    list them as the file's columns; now it names no bytes of the file."""
    secret = "SECRET-UNIT-90210"
    pq = tmp_path / "data.parquet"
    pl.DataFrame({"user": [secret] * 3, "g": ["a", "b", secret]}).write_parquet(pq, compression="uncompressed")
    assert secret.encode() in pq.read_bytes()[:4096]  # the records are in the first bytes
    init_ledger("approx", "--epsilon", "5", "--delta", "1e-6")
    args = ["--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--max-contributions", "1", "--max-partitions", "1"]
    if how == "stdin":
        r = runner.invoke(app, ["histogram", "-", *args, "--delta", "1e-9"], input=pq.read_bytes())
    else:
        misnamed = tmp_path / "data.csv"
        misnamed.write_bytes(pq.read_bytes())
        r = runner.invoke(app, ["histogram", str(misnamed), *args, "--delta", "1e-9"])
    assert r.exit_code == 65 and "does not look like csv" in r.stderr
    assert "SECRET" not in r.stderr and "PAR1" not in r.stderr and r.stderr.count("\n") == 1
    assert not schemas.header_is_text(["PAR1\x15\x04"]) and schemas.header_is_text(["user_id", "page views"])
