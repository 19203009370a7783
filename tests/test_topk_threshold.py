"""``dpcli topk`` without a list: the threshold selection (the default outside br ledgers) against UnkGumb, its
plan (the threshold in ``--dry-run`` and ``--json``), its charges and its refusals (issue 38, item 5).
The exact privacy checks are in tests/audit/test_audit_topk_threshold.py."""

from __future__ import annotations

import json
from fractions import Fraction

import polars as pl
import pytest
from dptest import PV_SMALL, cli, history, init_ledger

from dpcli.core.prf import KeyedStream
from dpcli.tasks import topk as tk


def _topk(*args: str):
    return cli("topk", PV_SMALL, "--by", "page", "-k", "5", "--privacy-unit", "user_id", *args)


def test_dry_run_prints_the_threshold_and_its_calibration():
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    r = _topk("--epsilon", "1", "--delta", "1e-6", "--dry-run")
    assert r.exit_code == 0, r.stderr
    # ε_sel = 1/4, K̄ = 4: discrete Laplace of scale 16; T = 1 + the least m with P[Z ≥ m] ≤ 1 − (1 − 10⁻⁶)^(1/4)
    assert "a group needs a noisy count of at least 234 distinct units, each unit counted in at most 4 groups" \
        in r.stdout
    assert "topk/threshold (epsilon=0.25, delta=1e-06) + topk/knowngumb (epsilon=0.75)" in r.stdout
    doc = json.loads(_topk("--epsilon", "1", "--delta", "1e-6", "--dry-run", "--json").stdout)
    assert doc["selection"]["threshold"] == 234 and doc["selection"]["max_partitions"] == 4
    assert doc["selection"]["scale"] == "16" and doc["query"]["selection"] == "threshold"
    assert history() == []


def test_dry_run_of_unkgumb_prints_the_bottom_offsets():
    """UnkGumb's ⊥ is h_(k̄+1) + τ(1 + ln(m/δ)/ε_per), m = min(k̄, d̄ − k̄) in 1 … ⌊d̄/2⌋ = 500: with ε_per = 1/11
    (k = 5) and δ = 10⁻⁶ the offset runs from 1 + 11·ln(10⁶) = 153.0 to 1 + 11·ln(5·10⁸) = 221.4."""
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    r = _topk("--epsilon", "1", "--delta", "1e-6", "--selection", "unkgumb", "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert "UnkGumb's ⊥ threshold is the (k̄+1)-th largest count (distinct units) plus 153 to 221" in r.stdout
    doc = json.loads(_topk("--epsilon", "1", "--delta", "1e-6", "--selection", "unkgumb", "--dry-run",
                           "--json").stdout)
    assert doc["selection"]["offset_min"] == pytest.approx(153.0, abs=0.1)
    assert doc["selection"]["offset_max"] == pytest.approx(221.4, abs=0.1)


def test_a_br_ledger_runs_unkgumb_by_default_and_refuses_the_threshold_selection():
    init_ledger("br", "--epsilon-per", "0.1", "--delta", "1e-10", "--info-budget", "300", "--call-budget", "30",
                "--delta-prime", "1e-9")
    r = _topk("--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "selection" not in doc["query"] and doc["selection"]["method"] == "unkgumb"  # the canonical form UnkGumb had
    assert doc["reserve"][0]["mechanism"] == "topk/unkgumb" and doc["reserve"][0]["units"] == 11
    refused = _topk("--selection", "threshold", "--dry-run")
    assert refused.exit_code == 2 and "bounded-range" in refused.stderr


def test_a_release_reports_its_threshold_and_is_charged_both_stages():
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    r = _topk("--epsilon", "2", "--delta", "1e-6", "--json")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    assert summary["selection"] == "threshold" and summary["max_partitions"] == 4
    assert isinstance(summary["threshold"], int) and summary["selected"] >= summary["found"]
    events = history()[0]["events"]
    assert [(e["mechanism"], e["epsilon"]) for e in events] == [("topk/threshold", "0.5"), ("topk/knowngumb", "1.5")]
    assert events[0]["delta"] == "0.000001"


@pytest.mark.parametrize("args, needle", [
    (["--keys", "KEYS", "--max-partitions", "2"], "applies to groups discovered from the data"),
    (["--keys", "KEYS", "--selection", "threshold"], "applies to groups discovered from the data"),
    (["--selection", "threshold", "--max-groups", "50"], "applies to --selection unkgumb"),
    (["--selection", "unkgumb", "--max-partitions", "2"], "applies to --selection threshold"),
    (["--selection", "unkgumb", "--selection-share", "0.5"], "applies to --selection threshold"),
    (["--selection-share", "1"], "must be in (0, 1)"),
    (["--max-partitions", "0"], "must be ≥ 1"),
    (["--selection", "laplace"], "must be threshold or unkgumb"),
])
def test_selection_options_out_of_place_are_refused_before_reading(tmp_path, args, needle):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    keys = tmp_path / "keys.csv"
    keys.write_text("page\na\nb\nc\nd\ne\nf\n")
    r = _topk("--epsilon", "1", "--delta", "1e-6", *[str(keys) if a == "KEYS" else a for a in args])
    assert r.exit_code == 2 and needle in r.stderr, r.stderr
    assert history() == []


def test_max_groups_alone_keeps_unkgumb():
    """``--max-groups`` (d̄) is UnkGumb's option: given alone it selects UnkGumb, as before the threshold default."""
    q = tk.TopKQuery(("g",), "u", 3, dbar=50, epsilon_per=Fraction(1, 10), delta=Fraction(1, 10**6))
    assert q.resolved("approx").selection == "unkgumb" and q.canonical()["dbar"] == 50
    plain = tk.TopKQuery(("g",), "u", 3, epsilon_per=Fraction(1, 10), delta=Fraction(1, 10**6))
    assert plain.resolved("approx").selection == "threshold" and plain.resolved("br").selection == "unkgumb"


# ---- the default finds the top k where UnkGumb's ⊥ stops it ----------------------------------------------

TOP, LOW, ROWS = 10, 20, 15


@pytest.fixture(scope="module")
def skewed() -> pl.LazyFrame:
    """Event data: 10 popular groups with 400 units each and 20 others with 100, every unit 15 rows in each of
    its groups (so with τ = 30 a popular group counts 6,000 rows and another 1,500). Popular group g has the
    units 400g … 400g + 399; other group j takes 100 units spread over all of them (stride 37), so a unit is
    in 1 to 3 groups: K̄ = 4 drops none."""
    rows: list[tuple[str, str]] = []
    for g in range(TOP):
        rows += [(f"u{400 * g + j}", f"top{g}") for j in range(400) for _ in range(ROWS)]
    for g in range(LOW):
        rows += [(f"u{(g * 211 + 37 * j) % 4000}", f"low{g}") for j in range(100) for _ in range(ROWS)]
    return pl.DataFrame(rows, schema=["u", "g"], orient="row").lazy()


def _share_found(frame: pl.LazyFrame, selection: str, seed: int) -> float:
    q = tk.TopKQuery(("g",), "u", TOP, count="rows", max_contributions=30, delta=Fraction(1, 10**6),
                     selection=selection)
    q = tk.TopKQuery(**{**q.__dict__, "epsilon_per": tk.epsilon_per_for(Fraction(1), q)})
    plan = tk.plan_topk(q, "approx", {})
    table = tk.run_topk(frame, q, plan, KeyedStream(bytes([seed]) * 32, "skewed")).table
    return sum(str(g).startswith("top") for g in table["g"].to_list()) / TOP


def test_the_threshold_default_finds_the_top_k_where_unkgumb_does_not(skewed):
    """ε = 1, δ = 10⁻⁶, τ = 30, k = 10, 5 fixed seeds each.

    UnkGumb (ε_per = 1/21): ⊥ sits at least τ(1 + 21·ln(1/δ)) ≈ 8,700 rows above h_(k̄+1) ≥ 0, against popular
    counts of 6,000 and Gumbel noise of scale τ/ε_per = 630: a popular group beats ⊥ with probability about
    e^(−2,700/630) ≈ 0.014 — about 0.14 found per draw, so ≥ 5 found in 5 draws (share ≥ 0.1) has probability
    below P[Poisson(0.7) ≥ 5] ≈ 5·10⁻⁴.

    Threshold (ε_sel = 1/4, K̄ = 4, T = 234, Laplace scale 16): a popular group (400 units) misses T with
    probability ½e^(−166/16) ≈ 2·10⁻⁵, another (100 units) passes with ½e^(−134/16) ≈ 10⁻⁴; ranking at
    ε_per = 1/20 (Gumbel scale 600), another group outranks a popular one (4,500 rows apart) with probability
    ≤ e^(−4,500/600) ≈ 5.5·10⁻⁴ per pair, ≤ 0.11 misses per draw over the 200 pairs: ≥ 5 misses in 5 draws
    (mean share < 0.9) has probability below P[Poisson(0.55) ≥ 5] ≈ 2·10⁻⁴."""
    new = [_share_found(skewed, "threshold", s) for s in range(5)]
    old = [_share_found(skewed, "unkgumb", s) for s in range(5)]
    print(f"share of the top 10 found: threshold {new}, unkgumb {old}")
    assert sum(new) / 5 >= 0.9
    assert sum(old) / 5 < 0.1
