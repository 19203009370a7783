"""dpcli topk: exact Gumbel-free selection, KnownGumb/UnkGumb behaviour, Algorithm 5 charges, errors.
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from dptest import PAGES, PV_SMALL, cli, history, init_ledger, runner, stream
from scipy import stats

from dpcli.cli.app import app
from dpcli.core import selection as sel
from dpcli.tasks import topk as tk

# ---- the exponential race equals Gumbel noise + sort ---------------------------------------------


class _Words:
    """A stand-in stream that returns given 64-bit words in order (to force redraws)."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)

    def uint64(self, n: int) -> np.ndarray:
        out, self.words = self.words[:n], self.words[n:]
        return np.array(out, dtype=np.uint64)


@pytest.mark.parametrize("m, words", [
    (3, [2**64 - 1, 5, 2**64 - 1, 7, 8]),  # 2^64 mod 3 = 1: the word 2^64 − 1 is redrawn, twice
    (4, [2**64 - 1, 1, 2]),  # a power of two: nothing is redrawn
    (7, [2**64 - 1, 2**64 - 2, 0, 13, 2**63]),  # 2^64 mod 7 = 2: the top two words are redrawn
])
def test_the_race_proposals_are_uniform_below_word_for_word(m, words):
    from dpcli.core.samplers import uniform_below

    words = words + list(range(11, 31))
    a, b = _Words(words), _Words(words)
    assert sel._uniform_below_scalar(a, m).tolist() == uniform_below(b, np.full(m, m)).tolist()
    assert a.words == b.words  # the same words consumed


def test_first_finisher_is_softmax():
    """P[first = i] = w_i / Σw with w = exp(rate·h); chi-square over 3000 races, p > 1e-4."""
    h = np.array([30, 25, 24, 15, 3])
    rate = Fraction(1, 5)
    firsts = [sel.race(stream(i), h, np.ones(5, np.int64), rate, 1)[0] for i in range(3000)]
    w = np.exp(float(rate) * h)
    expected = w / w.sum() * 3000
    keep = expected > 5
    obs = np.bincount(firsts, minlength=5)
    assert stats.chisquare(obs[keep], expected[keep] * obs[keep].sum() / expected[keep].sum()).pvalue > 1e-4


def test_last_finisher_matches_gumbel_argmin_and_multipliers():
    """argmin_i (u_i + ln(c_i)/rate + Gumbel(1/rate)) by Monte Carlo with numpy's Gumbel (reference
    only: 400k draws, standard error < 0.1%) vs 3000 exact races; chi-square p > 1e-4."""
    u = np.array([10, 9, 9, 7])
    c = np.array([1, 2, 5, 40])
    rate = Fraction(1, 2)
    rng = np.random.default_rng(0)
    g = rng.gumbel(0, 1 / float(rate), (400_000, 4))
    ref = np.bincount(np.argmin(u + np.log(c) / float(rate) + g, axis=1), minlength=4) / 400_000
    got = np.bincount([sel.last_finisher(stream(("L", i)), u, c, rate) for i in range(3000)], minlength=4)
    assert stats.chisquare(got, ref * 3000).pvalue > 1e-4


def test_unknown_top_k_returns_the_true_top_when_separated():
    h = np.concatenate([np.arange(2000, 999, -100), np.full(200, 5)])
    hits = sum(
        sel.unknown_top_k(stream(("sep", i)), h, 10, 100, Fraction(1), 1, Fraction(1, 10**9)).positions
        == list(range(10))
        for i in range(40)
    )
    assert hits >= 38  # each swap needs Gumbel(1) noise ≥ 100 apart: P ≈ 0


# ---- library on data --------------------------------------------------------------------------------


def table_of(groups: dict[str, int]) -> pl.LazyFrame:
    users = [f"{g}-{i}" for g, n in groups.items() for i in range(n)]
    gs = [g for g, n in groups.items() for _ in range(n)]
    return pl.DataFrame({"user": users, "g": gs}).lazy()


def test_rare_groups_never_released_and_known_domain_always_k():
    """60 groups of one unit next to 5 large ones; δ = 1e-6: over 100 seeds no singleton group may
    appear (expected count 100·δ·60 ≈ 0.006). The known domain always returns k candidates."""
    groups = {f"big{i}": 500 - 50 * i for i in range(5)} | {f"s{i}": 1 for i in range(60)}
    t = table_of(groups)
    q = tk.TopKQuery(by=("g",), unit="user", k=10, epsilon_per=Fraction(1, 2), delta=Fraction(1, 10**6), dbar=100)
    plan = tk.plan_topk(q, "approx", {})
    for i in range(100):
        r = tk.run_topk(t, q, plan, stream(("rare", i)))
        assert all(g.startswith("big") for g in r.table["g"].to_list()) and r.bottom
    dom = pl.DataFrame({"g": ["big0", "s1", "zzz", "big3"]})
    qk = tk.TopKQuery(by=("g",), unit="user", k=3, epsilon_per=Fraction(1, 10), known_domain=True)
    pk = tk.plan_topk(qk, "approx", {})
    for i in range(30):
        out = tk.run_topk(t, qk, pk, stream(("known", i)), dom.sort("g")).table
        assert out.height == 3 and set(out["g"]) <= set(dom["g"]) and out["g"].n_unique() == 3


@pytest.mark.parametrize("known, counts", [(True, True), (True, False), (False, True), (False, False)])
def test_br_units_follow_algorithm_5(known, counts):
    groups = {f"big{i}": 400 - 30 * i for i in range(4)} | {f"s{i}": 1 for i in range(30)}
    q = tk.TopKQuery(by=("g",), unit="user", k=8, known_domain=known, with_counts=counts, dbar=50)
    plan = tk.plan_topk(q, "br", {"epsilon_per": Fraction(1, 2), "delta": Fraction(1, 10**9)})
    dom = pl.DataFrame({"g": sorted(groups)}) if known else None
    r = tk.run_topk(table_of(groups), q, plan, stream(("br", known, counts)), dom)
    ev = r.actual[0]
    if known:
        assert ev.units == (16 if counts else 8) and ev.calls == 0 and r.table.height == 8
    else:
        o = r.table.height + (1 if r.bottom else 0)  # |o| counts ⊥
        assert r.bottom and r.table.height == 4  # only the 4 big groups beat ⊥
        assert ev.units == (2 * o + 1 - 1 if counts else o + 1) and ev.calls == 1
        assert plan.reserve[0].units == (17 if counts else 9)


# ---- CLI --------------------------------------------------------------------------------------------


@pytest.fixture
def data(tmp_path):
    groups = {f"page{i}": 300 - 20 * i for i in range(12)} | {f"rare{i}": 1 for i in range(20)}
    p = tmp_path / "ev.csv"
    table_of(groups).collect().write_csv(p)
    return p


def topk_cli(*args):
    return runner.invoke(app, ["topk", *map(str, args)])


def test_cli_br_replay_and_charges(data, tmp_path):
    init_ledger("br", "--epsilon-per", "0.5", "--delta", "1e-9", "--info-budget", "100", "--call-budget", "5",
                "--delta-prime", "1e-9")
    a = topk_cli(data, "--by", "g", "-k", "5", "--privacy-unit", "user", "--max-groups", "20")
    b = topk_cli(data, "--by", "g", "-k", "5", "--privacy-unit", "user", "--max-groups", "20")
    assert a.exit_code == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.splitlines()[0] == "rank,g,count"
    h = history()
    assert h[0]["events"][0]["units"] == 11 and h[1]["replay_of"] == 1
    r = topk_cli(data, "--by", "g", "-k", "5", "--privacy-unit", "user", "--max-groups", "20", "--epsilon-per", "0.3")
    assert r.exit_code == 2 and "--epsilon-per must be left out or match the br ledger's ε_per" in r.stderr


@pytest.mark.parametrize(
    "opts, code, needle",
    [
        ({"-k": "0"}, 2, "-k must be ≥ 1"),
        ({"-k": "-3"}, 2, "-k must be ≥ 1"),
        ({"-k": "30", "--max-groups": "20"}, 2, "-k 30 is larger than the 20 groups considered"),
        ({"--keys": "/nonexistent/dom.csv"}, 66, "does not exist"),
        ({"--count": "rows", "--max-contributions": "0"}, 2, "τ"),
        ({"--max-contributions": "2"}, 2, "--max-contributions applies to counting rows"),
        ({"--by": "nope"}, 65, "'nope' not found"),
        ({"--delta": "0"}, 2, "--delta must be in (0, 1) to discover groups"),
    ],
)
def test_cli_errors_no_debit_no_output(data, tmp_path, opts, code, needle):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    out = tmp_path / "o.csv"
    merged = {"--by": "g", "-k": "3", "--privacy-unit": "user", "--epsilon-per": "0.1", "--delta": "1e-9", **opts}
    r = topk_cli(data, *[x for kv in merged.items() for x in kv], "-o", out)
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert needle in r.stderr and r.stderr.count("\n") == 1
    assert history() == [] and not out.exists()


def test_cli_known_domain_json_and_approx_charge(data, tmp_path):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-3")
    dom = tmp_path / "dom.csv"
    dom.write_text("g\npage0\npage1\npage2\nrare1\nnever\n")
    r = topk_cli(data, "--by", "g", "-k", "4", "--privacy-unit", "user", "--keys", dom, "--epsilon-per", "0.2",
            "--with-error", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["result"]) == 4 and {row["g"] for row in doc["result"]} <= {"page0", "page1", "page2", "rare1", "never"}
    assert doc["summary"]["cost"][0]["epsilon"] == "1.2"  # 3kε/2 (Lemma 5.2)
    assert "count_moe95" in doc["result"][0]


@pytest.mark.parametrize("known, counts", [(True, True), (True, False), (False, True), (False, False)])
def test_topk_epsilon_is_what_a_pure_ledger_is_charged(known, counts):
    init_ledger("approx", "--epsilon", "5", "--delta", "1e-5")
    domain = ["--keys", PAGES] if known else ["--delta", "1e-9"]
    r = cli("topk", PV_SMALL, "--by", "page", "-k", "4", "--privacy-unit", "user_id", "--epsilon", "0.6", *domain,
            *([] if counts else ["--no-counts"]), "--json")
    assert r.exit_code == 0, r.stderr
    cost = json.loads(r.stdout)["summary"]["cost"]
    assert sum(float(e.get("epsilon", 0)) for e in cost) == pytest.approx(0.6)
