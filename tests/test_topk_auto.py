"""``dpcli topk --max-contributions auto`` and ``--report-bias`` (issue 33): τ chosen privately, charged as its
own part of the release's ε, replayed free; refusals before any data is read.

The data: 2000 units, each with rows in 2 of 8 groups; 1900 units have 3 rows in each of their groups, 100 (5%)
have 40. τ is the first candidate with 90% of the sampled (unit, group) row counts at most it: 3. With
ε = 5 the choice runs at ε = 0.5 (the default 1/10); AboveThreshold's query at candidate 3 is
10·1900 − 9·2000 = 1000 against noise of scale 4·10/0.5 = 80 (threshold: 40), and −18000 at 1 and 2, so
another τ has probability below 1e-5 (about e^(−1000/80)), whatever the test's fresh key.
"""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

import polars as pl
import pytest
from dptest import cli, history, init_ledger

from dpcli.tasks import topk as tk
from dpcli.tasks.auto_bounds import AutoBounds

HEAVY = 100


@pytest.fixture
def data(tmp_path):
    rows = []
    for u in range(2000):
        n = 40 if u < HEAVY else 3
        for g in (u % 8, (u + 3) % 8):
            rows += [(f"u{u}", f"g{g}")] * n
    p = tmp_path / "d.csv"
    pl.DataFrame(rows, schema=["user", "g"], orient="row").write_csv(p)
    return p


def topk(data, *args):
    return cli("topk", data, "--by", "g", "-k", "3", "--privacy-unit", "user", "--count", "rows", "--delta", "1e-6",
               *args)


def test_tau_is_chosen_charged_as_its_own_part_and_replayed_free(data):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    a = topk(data, "--max-contributions", "auto", "--epsilon", "5", "--report-bias", "--json")
    assert a.exit_code == 0, a.stderr
    summary = json.loads(a.stdout)["summary"]
    assert summary["auto"] == {"max_contributions": 3, "epsilon": "0.5"} and summary["tau"] == 3
    # the bias report: the 100 heavy units lose 74 of their 80 rows to τ = 3 (925‰), the others none: 0.04625 on
    # average over 2,000 units. Noise: ε 5·0.05 = 0.25, scale 2000‰/0.25 = 8000‰, 0.004 of a share: ±0.04 is 10
    # scales (fails with probability ~e^-10)
    assert abs(summary["bias"]["share_cut_by_max_contributions"] - 0.04625) <= 0.04
    events = history()[0]["events"]
    # without a list: the threshold selection (1/4 of the release's part) and KnownGumb over what it selected
    assert [e["mechanism"] for e in events] == ["topk/threshold", "topk/knowngumb", "topk/auto-bounds", "topk/bias-shares"]
    assert events[2] == {"kind": "pure", "mechanism": "topk/auto-bounds", "epsilon": "0.5"}
    assert sum(float(e["epsilon"]) for e in events) == pytest.approx(5)
    assert json.loads(cli("budget", "history", "default", "--json").stdout)[0]["summary"].endswith(
        "chosen: max_contributions 3")
    b = topk(data, "--max-contributions", "auto", "--epsilon", "5", "--report-bias", "--json")
    assert json.loads(b.stdout)["result"] == json.loads(a.stdout)["result"]
    assert history()[1]["replay_of"] == 1


def test_the_auto_share_splits_the_epsilon_and_a_given_tau_keeps_its_seed(data):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    r = topk(data, "--max-contributions", "auto", "--auto-share", "0.2", "--epsilon", "5", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["auto"]["epsilon"] == "1"
    assert [e["epsilon"] for e in history()[0]["events"]] == ["1", "3", "1"]  # the release's 4: 1/4 selection
    q = tk.TopKQuery(("g",), "user", 3, count="rows", max_contributions=3, delta=Fraction(1, 10**6))
    q = replace(q, epsilon_per=tk.epsilon_per_for(Fraction(5), q))
    assert "auto" not in q.canonical() and "report_bias" not in q.canonical()  # seeds of τ given: unchanged
    auto = replace(q, auto=AutoBounds(contributions=True))
    assert auto.canonical()["auto"] == {"chosen": ["max_contributions"], "share": "0.1", "v": 2}


def test_dry_run_shows_the_parts_and_no_margin(data):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    r = topk(data, "--max-contributions", "auto", "--epsilon", "5", "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert "τ chosen at run time" in r.stdout and "topk/auto-bounds (epsilon=0.5)" in r.stdout
    assert history() == []


@pytest.mark.parametrize("args, needle", [
    (["--count", "units", "--max-contributions", "auto"], "auto applies to counting rows"),
    (["--count", "units", "--report-bias"], "no bias to report"),
    (["--max-contributions", "auto", "--target-moe", "50"], "the count margin depends on τ"),
    (["--max-contributions", "auto", "--engine", "spark"], "polars engine only"),
    (["--report-bias", "--engine", "spark"], "polars engine only"),
    (["--auto-share", "0.2"], "--auto-share needs a bound given as auto"),
    (["--bias-share", "0.2"], "--bias-share needs --report-bias"),
    (["--max-contributions", "auto", "--auto-share", "0.6"], "--auto-share must be in"),
    (["--max-contributions", "auto", "--auto-share", "0.5", "--report-bias"], "less than half"),
    (["--max-contributions", "auto", "--keys", "KEYS", "--schedule", "s", "--total-epsilon", "5",
      "--scheduler", "fixed"], "a schedule keeps its bounds"),
])
def test_refusals_exit_2_before_reading_and_debit_nothing(data, tmp_path, args, needle):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n" + "".join(f"g{i}\n" for i in range(8)))
    args = [str(keys) if a == "KEYS" else a for a in args]
    out = tmp_path / "o.csv"
    given = ["--epsilon", "5"] if "--target-moe" not in args else []
    r = cli("topk", data, "--by", "g", "-k", "3", "--privacy-unit", "user", "--delta", "1e-6",
            *(["--count", "rows"] if "--count" not in args else []), *given, *args, "-o", out)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and r.stderr.count("\n") == 1
    assert history() == [] and not out.exists()


def test_a_br_ledger_refuses_auto(data):
    init_ledger("br", "--epsilon-per", "0.5", "--delta", "1e-9", "--info-budget", "100", "--call-budget", "5",
                "--delta-prime", "1e-9")
    r = cli("topk", data, "--by", "g", "-k", "3", "--privacy-unit", "user", "--count", "rows",
            "--max-contributions", "auto", "--max-groups", "20")
    assert r.exit_code == 2 and "a br ledger pays LinkedIn-style selections only" in r.stderr
    assert history() == []


def test_a_schedule_reports_bias_from_each_runs_epsilon(data, tmp_path):
    init_ledger("pure", "--epsilon", "100")
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n" + "".join(f"g{i}\n" for i in range(8)))
    r = cli("topk", data, "--by", "g", "-k", "3", "--privacy-unit", "user", "--count", "rows", "--keys", keys,
            "--max-contributions", "3", "--report-bias", "--schedule", "s", "--total-epsilon", "10",
            "--scheduler", "fixed", "--epsilon", "1", "--json")
    assert r.exit_code == 0, r.stderr
    assert set(json.loads(r.stdout)["summary"]["bias"]) == {"share_cut_by_max_contributions", "units", "moe95",
                                                            "noise"}
