"""Rule 4 for histogram and topk: a bad record is dropped inside the bounding, never an error or a count.

Attack: errors as an oracle on private records (issue 15, finding 4, bounding part). The analyst writes
the query, so a refusal that depends on a private record ("N non-finite value(s)", "null units", "no
rows") counts any predicate for free; even "fails or not" leaks a bit. For each kind of bad record
(null privacy unit, NaN value, ±inf value) and for an input with no rows, a dataset D with 0 such
records and its neighbour D′ with 1 must give the same exit code and the same stderr through the CLI;
stdout (``--json``) may differ only in noisy values (and the seed id, which names the data's
fingerprint).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dptest import init_ledger, runner, without_output_notes

from dpcli.cli.app import app

SCHEMA = {"user": pl.String, "g": pl.String, "x": pl.Float64}
BASE = [("u1", "a", 1.0), ("u2", "a", 2.5), ("u3", "b", 4.0), ("u4", "b", 0.5)]
BAD = {
    "null-unit": (None, "a", 1.0),
    "nan-value": ("u9", "a", float("nan")),
    "inf-value": ("u9", "a", float("inf")),
    "minus-inf-value": ("u9", "b", float("-inf")),
    "null-value": ("u9", "a", None),
}
HISTOGRAM = {
    "keys-sum-mean": ["--agg", "count,sum,mean,variance,median", "--value", "x", "--bounds", "0:5", "--epsilon", "1",
                      "--keys", "KEYS"],
    "threshold-sum": ["--agg", "count,sum", "--value", "x", "--bounds", "0:5", "--epsilon", "1", "--delta", "1e-9"],
    "unklap-count": ["--selection", "unklap", "--epsilon", "1", "--delta", "1e-9"],
}


def _write(path: Path, rows: list[tuple[Any, ...]], fmt: str) -> Path:
    df = pl.DataFrame(rows, schema=SCHEMA, orient="row")
    if fmt == "parquet":
        df.write_parquet(path.with_suffix(".parquet"))
        return path.with_suffix(".parquet")
    df.write_csv(path.with_suffix(".csv"))
    return path.with_suffix(".csv")


def _run(state: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> tuple[int, str, Any]:
    """One CLI run in a fresh state dir (own key, own ledger): exit code, stderr, parsed stdout."""
    monkeypatch.setenv("DPCLI_STATE_DIR", str(state))
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    r = runner.invoke(app, args)
    doc = json.loads(r.stdout) if r.exit_code == 0 else r.stdout
    return r.exit_code, r.stderr, doc


def _public(doc: Any) -> Any:
    """The --json document without its noisy parts: numbers in result rows, the seed id, released group counts."""
    if not isinstance(doc, dict):
        return doc
    result = [{k: v for k, v in row.items() if not isinstance(v, (int, float)) or k == "rank"} for row in doc["result"]]
    noisy = ("seed_id", "groups", "groups_seen", "bottom", "found", "br_units", "h_bottom", "k_bar", "bottom_offset",
             "selected")
    if "auto" in doc["summary"]:  # caps left out are chosen from the data: released, noisy, and so is what they scale
        noisy += ("auto", "max_partitions", "max_contributions", "measurements", "calibration", "threshold")
    summary = {k: v for k, v in doc["summary"].items() if k not in noisy}
    if "bias" in summary:  # the bias report's shares and units are released, noisy; its budget and noise are not
        summary["bias"] = {k: v for k, v in summary["bias"].items() if k in ("epsilon", "rho", "noise")}
    return {"result": result, "summary": summary, "columns": [sorted(row) for row in doc["result"]][:1]}


def _compare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, d: Path, d1: Path, args: list[str]) -> None:
    code0, err0, out0 = _run(tmp_path / "s0", monkeypatch, [*args[:1], str(d), *args[1:]])
    code1, err1, out1 = _run(tmp_path / "s1", monkeypatch, [*args[:1], str(d1), *args[1:]])
    err0, err1 = without_output_notes(err0), without_output_notes(err1)
    assert (code0, err0) == (code1, err1), (code0, err0, code1, err1)
    assert code0 == 0, err0
    if "--keys" in args and args[0] == "histogram":  # a known domain: every key is released, in order, noisy values
        assert _public(out0) == _public(out1)
    else:  # which groups are released (or picked by topk) is noisy; the rest of the answer is not
        assert _public(out0)["summary"] == _public(out1)["summary"]


#: (bad record, query, format): every bad record with a known domain, and a few with discovered groups and CSV.
ONE_BAD = [(bad, "keys-sum-mean", "parquet") for bad in sorted(BAD)] + [
    ("null-unit", "keys-sum-mean", "csv"),
    ("inf-value", "threshold-sum", "parquet"),
    ("null-unit", "threshold-sum", "parquet"),
    ("null-unit", "unklap-count", "csv"),
]

#: (the one row of D′, query) against an input with no rows.
NO_ROWS = [("good", "keys-sum-mean"), ("nan-value", "keys-sum-mean"), ("null-unit", "keys-sum-mean"),
           ("good", "threshold-sum"), ("good", "unklap-count")]


def _args(tmp_path: Path, query: str) -> list[str]:
    (tmp_path / "keys.csv").write_text("g\na\nb\n")
    return [str(tmp_path / "keys.csv") if a == "KEYS" else a for a in HISTOGRAM[query]]


@pytest.mark.parametrize("bad, query, fmt", ONE_BAD)
def test_histogram_one_bad_record_changes_nothing_public(tmp_path, monkeypatch, bad, query, fmt):
    d = _write(tmp_path / "d", BASE, fmt)
    d1 = _write(tmp_path / "d1", [*BASE, BAD[bad]], fmt)
    _compare(tmp_path, monkeypatch, d, d1,
             ["histogram", "--by", "g", "--privacy-unit", "user", *_args(tmp_path, query), "--json"])


@pytest.mark.parametrize("added, query", NO_ROWS)
def test_histogram_input_with_no_rows_is_released_like_any_other(tmp_path, monkeypatch, added, query):
    """D has a header (a schema) and no rows; D′ has one row, good or bad. Parquet keeps the schema
    (a header-only CSV has no column types to read)."""
    row = ("u1", "a", 1.0) if added == "good" else BAD[added]
    d = _write(tmp_path / "d", [], "parquet")
    d1 = _write(tmp_path / "d1", [row], "parquet")
    _compare(tmp_path, monkeypatch, d, d1,
             ["histogram", "--by", "g", "--privacy-unit", "user", *_args(tmp_path, query), "--json"])


def test_histogram_header_only_csv_counts_like_one_row(tmp_path, monkeypatch):
    """Without a value column the CSV's column types do not matter: a header-only CSV is released."""
    d = tmp_path / "d.csv"
    d.write_text("user,g,x\n")
    d1 = _write(tmp_path / "d1", [(None, "a", 1.0)], "csv")
    (tmp_path / "keys.csv").write_text("g\na\nb\n")
    _compare(tmp_path, monkeypatch, d, d1, ["histogram", "--by", "g", "--privacy-unit", "user", "--epsilon", "1",
                                            "--keys", str(tmp_path / "keys.csv"), "--json"])


@pytest.mark.parametrize("base, known", [("rows", False), ("empty", True)])
def test_topk_null_unit_and_empty_input(tmp_path, monkeypatch, base, known):
    """topk bounds through the same code: a null unit (and an input with no rows) is no oracle either."""
    rows = BASE if base == "rows" else []
    d = _write(tmp_path / "d", rows, "parquet")
    d1 = _write(tmp_path / "d1", [*rows, BAD["null-unit"]], "parquet")
    (tmp_path / "dom.csv").write_text("g\na\nb\n")
    domain = ["--keys", str(tmp_path / "dom.csv")] if known else ["--max-groups", "5", "--delta", "1e-9"]
    _compare(tmp_path, monkeypatch, d, d1, ["topk", "--by", "g", "--privacy-unit", "user", "-k", "1",
                                            "--epsilon-per", "0.1", *domain, "--json"])
