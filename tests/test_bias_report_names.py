"""Column names the release path computes under (issue 38's review): a unit, group or value column may be called
anything the bias report computes internally (``total``, ``below``, ``__r``, ``max_partitions``…) and the release
still runs, with its report; a group column named like a total dpcli computes per group (``units``, ``rows``,
``csum``, ``csumsq``) is refused before any debit, as a public input (the schema's names) should be."""

from __future__ import annotations

import json

import polars as pl
import pytest
from dptest import cli, history, init_ledger

from dpcli.advice import bias_beyond_margin
from dpcli.bounding import TOTALS_COLUMNS

def write(tmp_path, unit: str, by: str, value: str):
    """300 units, each with 4 rows in each of 2 of 3 groups (so K = 1 and C = 1 both cut), values 0…16, under the
    column names given (the value may share its column with the group)."""
    rows = [(f"u{u}", (u + j) % 3, (u + r) % 17) for u in range(300) for j in range(2) for r in range(4)]
    frame = pl.DataFrame(rows, schema=["u", "g", "v"], orient="row")
    columns = {unit: pl.col("u"), by: pl.col("g"), **({} if value == by else {value: pl.col("v")})}
    path = tmp_path / "d.csv"
    frame.select([e.alias(n) for n, e in columns.items()]).write_csv(path)
    return path


@pytest.fixture
def data(tmp_path):
    return write(tmp_path, "total", "below", "above")


@pytest.mark.parametrize("unit, by, value", [("total", "below", "above"), ("above", "total", "below"),
                                             ("__r", "max_partitions", "__x"), ("units_", "__kept", "__kept")])
def test_a_release_over_columns_named_like_the_reports_own_runs_and_reports(tmp_path, unit, by, value):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    r = cli("histogram", write(tmp_path, unit, by, value), "--privacy-unit", unit, "--by", by, "--agg", "count,sum", "--value", value,
            "--bounds", "0:20", "--max-partitions", "1", "--max-contributions", "1", "--epsilon", "5",
            "--delta", "1e-6", "--json")
    assert r.exit_code == 0, r.stderr
    bias = json.loads(r.stdout)["summary"]["bias"]
    # K = 1 cuts half of each unit's rows, C = 1 three of the four kept: shares 0.5 and 0.375. Noise: ε 5/40, scale
    # 1000‰/0.125 = 8 units per coordinate over 300 units: a numerator's sd 8√2/300 ≈ 0.038, the denominator's (five
    # coordinates) √10·8/300 ≈ 8.4%, so a share's sd is about √(0.038² + (0.5·0.084)²) ≈ 0.057: 0.25 is 4.4 sd.
    assert abs(bias["share_cut_by_max_partitions"] - 0.5) < 0.25
    assert abs(bias["share_cut_by_max_contributions"] - 0.375) < 0.25


def test_sql_over_columns_named_like_the_reports_own_runs(data):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    r = cli("sql", "SELECT below, ANON_COUNT(*) AS n FROM t GROUP BY below", "--table", f"t={data}",
            "--privacy-unit", "t.total", "--max-partitions", "1", "--max-contributions", "1", "--epsilon", "5",
            "--delta", "1e-6", "--json")
    assert r.exit_code == 0, r.stderr
    assert "share_cut_by_max_partitions" in json.loads(r.stdout)["summary"]["bias"]


@pytest.mark.parametrize("name", TOTALS_COLUMNS)
@pytest.mark.parametrize("command", ["histogram", "topk"])
def test_a_group_column_named_like_a_total_is_refused_before_any_debit(tmp_path, name, command):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    path = tmp_path / "d.csv"
    path.write_text(f"u,{name}\n" + "".join(f"u{i},{'ab'[i % 2]}\n" for i in range(50)))
    size = ["-k", "1", "--epsilon-per", "1"] if command == "topk" else ["--epsilon", "1"]
    r = cli(command, path, "--privacy-unit", "u", "--by", name, *size, "--delta", "1e-6", "-o", tmp_path / "o.csv")
    assert r.exit_code == 2, r.stderr
    assert r.stderr.count("\n") == 1 and f"group column {name!r}" in r.stderr and "rename" in r.stderr
    assert history() == [] and not (tmp_path / "o.csv").exists()


class _Query:
    aggregations = ["count"]
    bounds = None


def test_a_whole_cut_says_most_and_a_chosen_cap_is_not_asked_to_be_left_out(monkeypatch):
    """A noisy share of 1 said "short by about inf"; a cap dpcli chose was asked to be "left out for dpcli to
    choose"."""
    import dpcli.advice as advice

    monkeypatch.setattr(advice, "_noisy_columns", lambda query, plan, table: [("count", [100.0, 120.0], 5.0)])
    bias = {"moe95": 0.05, "share_cut_by_max_partitions": 0.0, "share_cut_by_max_contributions": 1.0}
    [note] = bias_beyond_margin(_Query(), None, None, "unit", bias, {})
    assert "short by most of the raw total" in note.text and "leave it out for dpcli to choose" in note.text
    [note] = bias_beyond_margin(_Query(), None, None, "unit", bias, {}, chosen=["max_contributions"])
    assert "leave it out" not in note.text and "chosen from the data" in note.text
