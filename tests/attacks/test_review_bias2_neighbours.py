"""Review of the bias report 2 (``unit shares 2``): one more unit, however extreme, moves only noisy values.

D and D′ = D plus one privacy unit are released under one forced seed (``report_diff.differential``): the exit
code, stderr (the bias statement's numbers masked), every ``--json`` summary field but the report's noisy shares,
units and margin, and the ledger entries must be identical (the caps are *given*: public, compared). The newcomer holds what a unit can hold at its worst: thousands
of rows over every bound (groups beyond K, rows beyond C, duplicate rows), values at the limits and beyond them,
±inf, NaN, nulls, and text no number parses from. Its groups sort last and are outside the public list, so the
noise draws of the other groups stay aligned.
"""

from __future__ import annotations

import polars as pl
import pytest
from dptest import ledger_argv
from report_diff import APPROX, PURE, csv_text, differential

#: 300 units, 3 rows each over the groups a, b, c, values 0…36 (text: the column is read as text in D and D′).
BASE = pl.DataFrame({"user": [f"u{i // 3:03d}" for i in range(900)], "g": [("a", "b", "c")[i % 3] for i in range(900)],
                     "v": [str(i % 37) for i in range(900)]})
#: the newcomer: 4,000 rows over 40 groups (each row twice), every awkward value, and some rows in the listed groups
_ODD = ["0", "10", "-1e308", "1e308", "inf", "-inf", "nan", "", "abc", "1,5", "11", "-0.0"]
NEWCOMER = pl.DataFrame({"user": ["zz-new"] * 4000,
                         "g": [("a", "b", "c")[i % 3] if i < 300 else f"zz{i % 40:02d}" for i in range(4000)],
                         "v": [_ODD[i % len(_ODD)] for i in range(4000)]})
D, D2 = csv_text(BASE), csv_text(pl.concat([BASE, NEWCOMER]))


def _same(diff: list[str]) -> None:
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)


@pytest.mark.parametrize("budget", [("pure", "--epsilon", "2"), ("zcdp", "--rho", "0.5")], ids=["laplace", "gaussian"])
def test_histogram_with_given_caps_and_bounds(tmp_path, budget):
    data, keys = tmp_path / "events.csv", tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    mode, *spend = budget
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--agg", "count,sum,mean", "--value", "v",
            "--bounds", "0:10", "--max-partitions", "2", "--max-contributions", "2", "--keys", keys,
            "--report-bias", *spend, "--json"]
    setup = [PURE] if mode == "pure" else [ledger_argv("zcdp", "--rho", "10", "--delta", "1e-5")]
    a, _, diff = differential(args, data, D, D2, tmp_path, setup=setup)
    assert a.exit_code == 0, a.stderr
    assert set(a.json["summary"]["bias"]) >= {"units", "moe95", "noise"}
    noise = "discrete_laplace" if mode == "pure" else "discrete_gaussian"
    assert a.json["summary"]["bias"]["noise"]["noise"] == noise
    _same(diff)


def test_topk_count_rows(tmp_path):
    data, keys = tmp_path / "events.csv", tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    args = ["topk", data, "--by", "g", "-k", "2", "--privacy-unit", "user", "--count", "rows",
            "--max-contributions", "2", "--keys", keys, "--report-bias", "--epsilon", "2", "--json"]
    a, _, diff = differential(args, data, D, D2, tmp_path, setup=[PURE])
    assert a.exit_code == 0, a.stderr
    assert set(a.json["summary"]["bias"]) >= {"units", "moe95", "noise"}
    _same(diff)


def test_sql_with_given_caps(tmp_path):
    data = tmp_path / "events.csv"
    args = ["sql", "SELECT g, ANON_COUNT(*) AS n FROM T WHERE g IN ('a', 'b', 'c') GROUP BY g",
            "--table", f"T={data}", "--privacy-unit", "T.user", "--max-partitions", "2", "--max-contributions", "2",
            "--report-bias", "--epsilon", "2", "--delta", "1e-6", "--json"]
    a, _, diff = differential(args, data, D, D2, tmp_path, setup=[APPROX], noisy={"json.summary.groups"})
    assert a.exit_code == 0, a.stderr
    assert set(a.json["summary"]["bias"]) >= {"units", "moe95", "noise"}
    _same(diff)


def _stream_rows(extra: int) -> str:
    """Three pages of 100 units a day over two days, values 0…6 as text; ``extra`` more rows of a newcomer on a
    page of its own (at the data's own times), every awkward value among them."""
    base = pl.DataFrame({"ts": [f"2026-11-0{1 + i % 2}T{(i * 5) % 24:02d}:{i % 60:02d}:00" for i in range(600)],
                         "user": [f"u{i}" for i in range(600)], "page": [f"p{i % 3}" for i in range(600)],
                         "v": [str(i % 7) for i in range(600)]})
    new = pl.DataFrame({"ts": [f"2026-11-0{1 + i % 2}T{(i * 7) % 24:02d}:{i % 60:02d}:00" for i in range(extra)],
                        "user": ["zz-new"] * extra, "page": ["zz"] * extra,
                        "v": [_ODD[i % len(_ODD)] for i in range(extra)]})
    return csv_text(pl.concat([base, new]))


def test_stream_replay_with_given_caps(tmp_path):
    data = tmp_path / "events.csv"
    args = ["stream-replay", data, "--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d",
            "--trigger-every", "6h", "--max-contributions", "3", "--value", "v", "--bounds", "-5:5",
            "--report-bias", "--epsilon", "4", "--delta", "1e-9", "--json"]
    a, _, diff = differential(args, data, _stream_rows(0), _stream_rows(3000), tmp_path, setup=[APPROX])
    assert a.exit_code == 0, a.stderr
    assert set(a.json["summary"]["bias"]) >= {"units", "moe95", "noise"}
    _same(diff)
