"""``dpcli sql --max-partitions auto --max-contributions auto`` and ``--report-bias`` (issue 33): K and C chosen
on the per-user frame (the rows the query aggregates, by its GROUP BY keys), charged as their own part, by the
bias–variance rule histogram uses (issue 38: :class:`dpcli.tasks.auto_bounds.ErrorModel`).

The data: 4000 units; 3800 have 3 rows in each of 2 of 8 groups, 200 (5%) have 40 rows in each of 6. At ε = 10 the
release's count noise is about 0.24 per unit of K·C, so the rule lets only a few units' entries lie beyond each bound
(groups × noise × bounds before it / entries per unit: about 2 beyond K, 7 beyond C) plus the walk's slack (three
threshold scales: about 20 units at its 4/13 of ε = 1): below K = 6 all 200 heavy units lie beyond it (the query is
about −178 against noise of scale 6.5, never reached), from 6 on none, so K stops at 6 (at 7 or 8 when the first
draws miss, under 0.5% each; past 8 about 3e-4). C stops at the first candidate ≥ 40 (45, below it all 200 heavy
units' first groups are beyond; further when its threshold draw is high) and leans to 53 (the largest candidate
≤ 45·√2). Nothing is cut: the bias report's shares are 0.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from dptest import SAMPLE, cli, history, init_ledger

HEAVY = 200
QUERY = "SELECT g, ANON_COUNT(*) AS c FROM T GROUP BY g"


@pytest.fixture
def data(tmp_path):
    rows = []
    for u in range(4000):
        heavy = u < HEAVY
        for j in range(6 if heavy else 2):
            rows += [(f"u{u}", f"g{(u + 3 * j) % 8}")] * (40 if heavy else 3)
    p = tmp_path / "d.csv"
    pl.DataFrame(rows, schema=["user", "g"], orient="row").write_csv(p)
    return p


def sql(data, query, *args):
    return cli("sql", query, "--table", f"T={data}", "--privacy-unit", "T.user", "--delta", "1e-6", *args)


def test_k_and_c_are_chosen_charged_as_their_own_part_and_replayed_free(data):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    args = ["--max-partitions", "auto", "--max-contributions", "auto", "--epsilon", "10", "--report-bias", "--json"]
    a = sql(data, QUERY, *args)
    assert a.exit_code == 0, a.stderr
    summary = json.loads(a.stdout)["summary"]
    k, c = summary["auto"]["max_partitions"], summary["auto"]["max_contributions"]
    # C: the walk's one threshold draw decides how far past 45 it runs (AboveThreshold: a threshold above its
    # two-scale slack by t more scales keeps it walking with probability ~e^-t, P[t > 4] < 1%): it stops at
    # 45–76, leaning to 53–107; below 45 all 200 heavy units lie beyond it (never reached, as K below 6)
    assert 6 <= k <= 8 and 53 <= c <= 107 and summary["auto"] == {"max_partitions": k, "max_contributions": c,
                                                                     "epsilon": "1"}
    assert summary["max_partitions"] == k
    # the bias report's shares: nothing is cut (K ≥ 6, C ≥ 40). Noise: ε 10/40 = 0.25, scale 4 units per number,
    # 0.001 of a share over 4,000 units: ±0.01 is 10 scales (fails with probability ~e^-10 per number)
    assert abs(summary["bias"]["share_cut_by_max_partitions"]) <= 0.01
    assert abs(summary["bias"]["share_cut_by_max_contributions"]) <= 0.01
    events = history()[0]["events"]
    assert [e["mechanism"] for e in events] == ["sql/laplace+threshold", "sql/auto-bounds", "sql/bias-shares"]
    assert [e["epsilon"] for e in events] == ["8.75", "1", "0.25"]
    assert history()[0]["summary"].endswith(f"chosen: max_partitions {k}, max_contributions {c}")
    b = sql(data, QUERY, *args)
    assert json.loads(b.stdout)["result"] == json.loads(a.stdout)["result"] and history()[1]["replay_of"] == 1


def test_a_rho_budget_splits_rho(data):
    init_ledger("zcdp", "--rho", "100", "--delta", "1e-3")
    r = sql(data, QUERY, "--max-partitions", "auto", "--max-contributions", "1", "--rho", "2", "--json")
    assert r.exit_code == 0, r.stderr
    auto = json.loads(r.stdout)["summary"]["auto"]  # K as in the test above (the same walk under ρ's ε)
    assert 6 <= auto["max_partitions"] <= 8 and auto == {"max_partitions": auto["max_partitions"], "rho": "0.2"}
    events = history()[0]["events"]
    assert events[0]["rho"] == "1.75" and events[-2:] == [{"kind": "zcdp", "mechanism": "sql/auto-bounds", "rho": "0.2"},
                                                           {"kind": "zcdp", "mechanism": "sql/bias-shares", "rho": "0.05"}]


def test_a_join_chooses_on_the_joined_rows():
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    r = cli("sql", "SELECT dept, ANON_COUNT(*) AS c FROM Employee JOIN Order USING (uid) GROUP BY dept",
            "--table", f"Employee={SAMPLE / 'employee.csv'}", "--table", f"Order={SAMPLE / 'order.csv'}",
            "--privacy-unit", "Employee.uid", "--privacy-unit", "Order.uid", "--epsilon", "5", "--delta", "1e-6",
            "--max-contributions", "auto", "--max-partitions", "1", "--json")
    assert r.exit_code == 0, r.stderr
    assert set(json.loads(r.stdout)["summary"]["auto"]) == {"max_contributions", "epsilon"}


def test_dry_run_says_which_margins_are_chosen_at_run_time(data):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    r = sql(data, "SELECT g, ANON_COUNT(*) AS c, ANON_COUNT(*, 4) AS c4 FROM T GROUP BY g",
            "--max-contributions", "auto", "--max-partitions", "1", "--epsilon", "5", "--dry-run")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("  c: ") and "[0, C]" in line and "margin chosen at run time" in line
               for line in lines)
    assert any(line.startswith("  c4: ") and "95% margin" in line for line in lines)
    assert "sql/auto-bounds (epsilon=0.5)" in r.stdout and history() == []


@pytest.mark.parametrize("query, args, needle", [
    ("SELECT ANON_COUNT(*) AS c FROM T", ["--max-partitions", "auto"], "--max-partitions auto needs a GROUP BY"),
    ("SELECT g, ANON_COUNT(*, 3) AS c FROM T GROUP BY g", ["--max-contributions", "auto"], "the query has none"),
    (QUERY, ["--max-partitions", "auto", "--engine", "spark"], "polars engine only"),
    (QUERY, ["--report-bias", "--engine", "spark"], "polars engine only"),
    (QUERY, ["--auto-share", "0.2"], "--auto-share needs a bound given as auto"),
    (QUERY, ["--bias-share", "0.2"], "--bias-share needs --report-bias"),
    (QUERY, ["--max-partitions", "sometimes"], "--max-partitions must be a whole number or auto"),
    (QUERY, ["--max-partitions", "auto", "--auto-share", "0.5", "--report-bias"], "less than half"),
])
def test_refusals_exit_2_before_reading_and_debit_nothing(data, tmp_path, query, args, needle):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    out = tmp_path / "o.csv"
    r = sql(data, query, "--epsilon", "5", *args, "-o", out)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and r.stderr.count("\n") == 1
    assert history() == [] and not out.exists()


def test_caps_left_out_are_chosen_where_they_bound_something(data):
    """``--max-partitions`` left out is chosen with a GROUP BY, ``--max-contributions`` with an ANON_COUNT that has
    no cap of its own; a note names both. Left out where they bound nothing, nothing is chosen or charged for them;
    spelt ``auto`` they are the same release (a free replay: only the notes differ)."""
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    left = sql(data, QUERY, "--epsilon", "5", "--json")
    assert left.exit_code == 0, left.stderr
    summary = json.loads(left.stdout)["summary"]
    assert set(summary["auto"]) == {"max_partitions", "max_contributions", "epsilon"}
    assert "left out, so chosen from the data with ε = 0.5 of the budget: --max-partitions" in left.stderr
    spelt = sql(data, QUERY, "--epsilon", "5", "--max-partitions", "auto", "--max-contributions", "auto", "--json")
    assert json.loads(spelt.stdout)["summary"]["charged"] is False and "left out" not in spelt.stderr
    capped = sql(data, "SELECT ANON_COUNT(*, 3) AS c FROM T", "--epsilon", "5", "--json")
    assert capped.exit_code == 0 and "auto" not in json.loads(capped.stdout)["summary"], capped.stderr


def test_caps_left_out_on_a_br_ledger_get_the_ledgers_refusal_not_an_internal_error(data, tmp_path):
    """A br ledger gives sql no ε (found by the new-user trial: the defaults' choice asserted an ε, exit 1)."""
    init_ledger("br", "--epsilon-per", "0.1", "--delta", "1e-10", "--info-budget", "3000", "--call-budget", "30",
                "--delta-prime", "1e-9")
    for extra in ([], ["--dry-run"]):
        r = cli("sql", QUERY, "--table", f"T={data}", "--privacy-unit", "T.user", *extra)
        assert r.exit_code == 2 and r.stderr.startswith("dpcli: error: a br ledger pays for histogram counts"), r.stderr


def test_the_dry_run_shows_the_margins_at_caps_of_1_and_at_the_largest_caps_as_histogram_does():
    """Issue 38: with caps left out, sql's dry run said only "margin chosen at run time"; it now gives the range
    histogram gives (the least, at caps of 1, and the most, at the largest caps ``auto`` can choose), the same
    figures for the same count (both plan the release again at those caps, from public grids only)."""
    from dptest import PV_SMALL

    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    common = ("--epsilon", "1", "--delta", "1e-6", "--dry-run", "--json")
    doc = json.loads(cli("sql", "SELECT country, ANON_COUNT(*) AS n FROM pv GROUP BY country", "--table",
                         f"pv={PV_SMALL}", "--privacy-unit", "pv.user_id", *common).stdout)
    hist = json.loads(cli("histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", *common).stdout)
    ranges = {m["column"].split(":")[0]: (m["moe95_at_caps_of_1"], m["moe95_at_largest_caps"])
              for m in doc["calibration"].values()}
    want = {k: (m["moe95_at_caps_of_1"], m["moe95_at_largest_caps"]) for k, m in hist["calibration"].items()}
    assert ranges == {"n": want["rows"], "threshold": want["units"]} and want["rows"][0] < want["rows"][1]
    text = cli("sql", "SELECT country, ANON_COUNT(*) AS n FROM pv GROUP BY country", "--table", f"pv={PV_SMALL}",
               "--privacy-unit", "pv.user_id", *common[:-1]).stdout
    assert "95% margin chosen at run time (±7 at caps of 1, at most ±29,409,307,754 at the largest caps)" in text
    assert "each user_id's count clamped to [0, C]" in text  # C chosen with K too (it read [0, 1])
