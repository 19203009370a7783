"""stream-replay ``--max-contributions auto``, ``--bounds auto`` and ``--report-bias`` (issue 33)."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from dptest import cli, history, init_ledger, stream

from dpcli.tasks import auto_bounds as ab
from dpcli.tasks import stream as sr
from dpcli.tasks.stream.auto import choose
from dpcli.tasks.stream.plan import plan_pending

#: 2000 units with 1 + u % 4 records each (a quarter each of 1, 2, 3, 4) and normal(0, 20) values.
UNITS = 2000


def _events(units: int = UNITS, day: int = 1, seed: int = 7) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n = [1 + u % 4 for u in range(units)]
    user = [f"u{u}" for u in range(units) for _ in range(n[u])]
    ts = [f"2026-11-{day:02d}T{(u * 7 + j * 5) % 24:02d}:{j:02d}:00" for u in range(units) for j in range(n[u])]
    return pl.DataFrame({"ts": ts, "user": user, "page": [f"p{i % 3}" for i in range(len(user))],
                         "amount": rng.normal(0, 20, len(user))})


def _query(**kw):
    base = {"time": "ts", "keys": ("page",), "unit": "user", "window": 86400, "triggers": 4, "max_records": 0,
                "epsilon": Fraction(10), "delta": Fraction(1, 10**6), "value": "amount", "clamp": None,
                "auto": ab.AutoBounds(contributions=True, values=True)}
    return sr.StreamQuery(**{**base, **kw})


def test_auto_picks_the_90th_percentile_of_records_and_99th_of_magnitudes():
    """C: entries are the units' record counts; 75% are ≤ 3 and all ≤ 4, so at level 9/10 the queries
    10·#(≤ c) − 9n are −1.5n = −3000 at c = 3 and +n = +2000 at c = 4, against AboveThreshold noise of scale
    4·10/ε₁ = 80 (ε₁ = 10·0.1/2 = 0.5): C = 4 but with probability below e^-20. L: one |value| per unit,
    |N(0, 20)|'s 99th percentile is 51.5; on the grid 2^(j/2) the candidates around it are 45.25 (97.6% of
    entries: query −4800), 64 (99.86%: +1720) and 90.5 (all: +2000), noise scale 4·100/0.5 = 800: L is 64 or
    90.5 (one grid step), anything lower has probability below e^-5."""
    q = _query(report_bias=Fraction(1, 20))
    choice = choose(_events().lazy(), q, b"s" * 32, None, "the input")
    assert choice.max_records == 4
    assert choice.clamp in (64.0, 2.0 ** 6.5)
    assert choice.bias is not None and set(choice.bias) == {"share_cut_by_max_contributions", "share_clamped_below",
                                                            "share_clamped_above", "units", "moe95", "noise"}
    # the same seed and records: the same choice (a replay); the resolved query plans to the same cost
    assert choose(_events().lazy(), q, b"s" * 32, None, "the input") == choice
    pending = plan_pending(q)
    assert sr.plan_stream(choice.apply(q)).events == pending.events


def test_symmetric_limit_is_a_quantile_of_magnitudes_with_sensitivity_one():
    """choose_limit over 1000 entries |x| = 10 (a tenth negative): with ε = 5 the noise (scale 4·100/5 = 80)
    is far below the query gaps (±100·n·(1 − 0.99) = 1000 at the first candidate ≥ 10): L = 2^(7/2) ≈ 11.3."""
    entries = pl.LazyFrame({"x": [10.0] * 900 + [-10.0] * 100})
    assert ab.choose_limit(entries, "x", Fraction(5), stream("limit")) == 2.0 ** 3.5
    assert ab.LIMIT_CANDIDATES[0] > 0 and list(ab.LIMIT_CANDIDATES) == sorted(ab.LIMIT_CANDIDATES)


def test_plain_queries_keep_their_canonical_form():
    """No auto, no bias report: the query's canonical JSON (seed, state files) is the one before issue 33."""
    q = _query(max_records=3, clamp=50.0, auto=None)
    assert set(q.canonical()) == {"time", "keys", "unit", "window", "triggers", "max_records", "epsilon", "delta",
                                  "value", "clamp", "mu"}
    assert len(sr.plan_stream(q).events) == 1 and "parts" not in sr.plan_stream(q).summary
    auto = _query(report_bias=Fraction(1, 20)).canonical()
    assert auto["max_records"] is None and auto["clamp"] is None and auto["report_bias"] == "0.05"


def _args(f, *extra):
    return ["stream-replay", f, "--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d",
            "--triggers", "4", "--epsilon", "10", "--delta", "1e-6", "--value", "amount", *extra]


AUTO = ("--max-contributions", "auto", "--bounds", "auto", "--report-bias")


def test_one_release_charges_its_parts_together_and_replays_free(tmp_path):
    init_ledger("approx", "--epsilon", "30", "--delta", "1e-5")
    f = tmp_path / "ev.csv"
    _events(600).write_csv(f)
    args = _args(f, *AUTO, "--through", "2026-11-02")
    plan = cli(*args, "--dry-run")
    assert plan.exit_code == 0 and "count: 95% margin chosen at run time" in plan.stdout
    assert "parts: release ε=8.75, δ=0.000001, auto-bounds ε=1, bias ε=0.25" in plan.stdout
    assert history() == []
    r = cli(*args, "--json")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    assert summary["auto"]["max_contributions"] == 4 and summary["auto"]["epsilon"] == "1"
    assert summary["auto"]["bounds"][0] == -summary["auto"]["bounds"][1]
    assert set(summary["bias"]) == {"share_cut_by_max_contributions", "share_clamped_below", "share_clamped_above",
                                    "units", "moe95", "noise"}
    (entry,) = history()
    assert [(e["mechanism"], e["epsilon"]) for e in entry["events"]] == [
        ("stream-replay/dp-sqlp", "8.75"), ("stream-replay/auto-bounds", "1"), ("stream-replay/bias-shares", "0.25")]
    assert sum(Fraction(e["epsilon"]) for e in entry["events"]) == 10
    assert "; chosen: max_contributions 4, bounds" in entry["summary"]
    again = cli(*args, "--json")
    replay = json.loads(again.stdout)
    assert replay["result"] == json.loads(r.stdout)["result"] and replay["summary"]["auto"] == summary["auto"]
    assert not replay["summary"]["charged"] and history()[-1]["replay_of"] == entry["seq"]


def test_a_state_stream_chooses_once_at_its_first_run_and_keeps_the_choice(tmp_path):
    init_ledger("approx", "--epsilon", "30", "--delta", "1e-5")
    days = []
    for d in (1, 2):
        days.append(tmp_path / f"day{d}.csv")
        _events(400 * d, day=d, seed=d).write_csv(days[-1])
    state = tmp_path / "s.state"
    first = cli(*_args(days[0], *AUTO, "--state", state, "--through", "2026-11-02", "--json"))
    assert first.exit_code == 0, first.stderr
    chosen = json.loads(first.stdout)["summary"]["auto"]
    body = json.loads(state.read_text())["body"]
    assert body["auto"]["max_contributions"] == chosen["max_contributions"] and "bias" in body["auto"]
    (reservation,) = [e for e in history() if e["events"]]
    assert sum(Fraction(e["epsilon"]) for e in reservation["events"]) == 10
    changed = cli(*_args(days[1], *AUTO, "--auto-share", "0.2", "--state", state, "--through", "2026-11-03"))
    assert changed.exit_code == 2 and "created with other parameters: auto" in changed.stderr
    second = cli(*_args(days[1], *AUTO, "--state", state, "--through", "2026-11-03", "--json"))
    assert second.exit_code == 0, second.stderr
    later = json.loads(second.stdout)["summary"]
    assert later["auto"] == chosen and later["bias"] == json.loads(first.stdout)["summary"]["bias"]
    assert [e for e in history() if e["events"]] == [reservation]  # charged once, by the first run
    plan = cli(*_args(days[1], *AUTO, "--state", state, "--dry-run", "--json"))
    assert json.loads(plan.stdout)["auto"]["max_contributions"] == chosen["max_contributions"]


@pytest.mark.parametrize("extra, message", [
    (("--max-contributions", "auto", "--engine", "spark"), "polars engine only"),
    (("--max-contributions", "3", "--bounds", "-5:5", "--auto-share", "0.2"), "--auto-share needs a bound given as auto"),
    (("--max-contributions", "3", "--bounds", "-5:5", "--bias-share", "0.2"), "--bias-share needs --report-bias"),
    (("--max-contributions", "auto", "--bounds", "auto", "--auto-share", "0.4", "--report-bias", "--bias-share",
      "0.2"), "at most 0.5"),
    (("--max-contributions", "auto", "--auto-share", "0.7"), "must be in"),
    (("--max-contributions", "zero",), "whole number or auto"),
    (("--max-contributions", "auto", "--bounds", "-1:5"), "symmetric"),
])
def test_refusals_exit_2_before_any_debit(tmp_path, extra, message):
    init_ledger("approx", "--epsilon", "30", "--delta", "1e-5")
    f = tmp_path / "ev.csv"
    _events(50).write_csv(f)
    args = _args(f, *extra)
    if "--bounds" not in extra:
        args.remove("--value"), args.remove("amount")
    r = cli(*args)
    assert r.exit_code == 2 and message in r.stderr, r.stderr
    assert history() == []


def test_a_br_ledger_refuses_auto(tmp_path):
    init_ledger("br", "--epsilon-per", "0.5", "--delta", "1e-9", "--info-budget", "10", "--call-budget", "3",
                "--delta-prime", "1e-9")
    f = tmp_path / "ev.csv"
    _events(50).write_csv(f)
    r = cli(*_args(f, "--max-contributions", "auto", "--bounds", "auto"))
    assert r.exit_code == 2 and "br ledger" in r.stderr, r.stderr
