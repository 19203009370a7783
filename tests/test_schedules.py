"""Growing databases (paper 004): schedule arithmetic, epochs, caching, ledger reservation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from dpcli.cli.app import app
from dpcli.core import schedules as sch

runner = CliRunner()


# ---- arithmetic --------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [Fraction(1, 100), Fraction(1, 10), Fraction(1, 2)])
def test_bbscheduler_pure_sum_never_exceeds_total(gamma):
    total = Fraction(1)
    last = sch.epoch_of(10**6 * 1000, 1000, gamma)  # 10^6-fold growth
    eps = [sch.bbscheduler_epsilon(i, gamma, total, 0.0) for i in range(last + 1)]
    assert sum(eps) <= total
    assert sum(eps) > total * Fraction(9, 10) or gamma == Fraction(1, 100)  # the series really is used up


@pytest.mark.parametrize("gamma", [Fraction(1, 20), Fraction(1, 3)])
def test_bbscheduler_cdp_total_within_epsilon(gamma):
    last = sch.epoch_of(10**6 * 100, 100, gamma)
    eps = [sch.bbscheduler_epsilon(i, gamma, Fraction(1), 1e-9) for i in range(last + 1)]
    assert sch.cdp_total(eps, 1e-9) <= 1.0


def test_bbimprover_cdp_total_within_epsilon_over_a_million_sizes():
    t = np.arange(1, 10**6 + 1, dtype=np.float64)
    c, delta = 0.25, 1e-6
    e = np.sqrt(c) / (3 * np.sqrt(np.log(1 / delta))) * 0.8 / t ** (0.5 + c)
    s2 = float((e * e).sum())
    assert 0.5 * s2 + np.sqrt(2 * s2 * np.log(1 / delta)) <= 0.8
    assert float(sch.bbimprover_epsilon(1000, Fraction(4, 5), delta, c)) <= e[999] + 1e-15


@pytest.mark.parametrize("c", [0.01, 0.1, 0.24, 0.5])
def test_bbimprover_runs_index_stays_within_the_same_bound(c):
    """The runs index (t = k = 1, 2, …) keeps Σ ε_k² ≤ ε²/(9 ln(1/δ)) for c ≤ 1/2, whatever the number of
    runs: 10^6 runs summed, the rest bounded by ∫_K^∞ k^−(1+2c) dk = K^−2c/(2c); the derivation's
    bound c + 1/2 (docs/commands/schedules.md) is checked against the exact partial sum."""
    delta, total = 1e-6, 0.8
    k = np.arange(1, 10**6 + 1, dtype=np.float64)
    unit = total**2 / (9 * np.log(1 / delta))
    e = np.array([float(sch.bbimprover_epsilon(int(i), Fraction(4, 5), delta, c)) for i in (1, 2, 10, 1000)])
    exact = np.sqrt(c) / (3 * np.sqrt(np.log(1 / delta))) * total / np.array([1, 2, 10, 1000]) ** (0.5 + c)
    assert np.all(e <= exact) and np.all(e > exact - 1e-14)  # rounded down, never up
    s2 = float((c * unit / k ** (1 + 2 * c)).sum()) + c * unit * 1e6 ** (-2 * c) / (2 * c)
    assert s2 <= sch.bbimprover_runs_square_sum_bound(c) * unit <= unit
    assert 0.5 * s2 + np.sqrt(2 * s2 * np.log(1 / delta)) <= total


def test_bbimprover_defaults_and_c_range(snapshots):
    paths, keys = snapshots
    runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "5", "--delta", "1e-5"])
    imp = ["--scheduler", "bbimprover", "--total-delta", "1e-6"]
    r = hist(paths[1000], keys, *imp, "--improver-c", "0.25")
    assert r.exit_code == 2 and "(0, 1/4)" in r.stderr and "Theorem 13" in r.stderr
    r = hist(paths[1000], keys, "--improver-c", "0.1")
    assert r.exit_code == 2 and "bbimprover" in r.stderr
    r = hist(paths[1000], keys, *imp, "--improver-index", "days")
    assert r.exit_code == 2 and "runs or rows" in r.stderr
    assert ledger_entries() == []
    # runs index: every new snapshot is a run, even at the same size; k = 1, 2, 3
    eps = []
    for size in (1000, 1050, 1500):
        r = hist(paths[size], keys, *imp)
        assert r.exit_code == 0, r.stderr
        eps.append(Fraction(json.loads(r.stdout)["summary"]["schedule"]["run_epsilon"]))
    assert eps == [sch.bbimprover_epsilon(k, Fraction(1), 1e-6, 0.1) for k in (1, 2, 3)]
    # the rows index, Algorithm 2 as printed: t = the snapshot's rows
    r = runner.invoke(app, ["histogram", str(paths[1000]), "--by", "g", "--privacy-unit", "user", "--keys", str(keys),
                            "--schedule", "rows", "--total-epsilon", "1", *imp, "--improver-index", "rows",
                            "--improver-c", "0.05", "--json", "-o", "-"])
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)["summary"]["schedule"]
    assert s["t"] == 1000 and Fraction(s["run_epsilon"]) == sch.bbimprover_epsilon(1000, Fraction(1), 1e-6, 0.05)


def test_a_schedule_made_before_the_runs_index_keeps_its_c_and_rows(snapshots, monkeypatch):
    """Migration: a state written by dpcli 0.2 (c = 0.25 by default, no index) runs on as it was made
    when the options are left out; giving other values is "other settings" (exit 2)."""
    from dpcli.scheduling import ScheduleSpec

    paths, keys = snapshots
    runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "5", "--delta", "1e-5"])
    imp = ["--scheduler", "bbimprover", "--total-delta", "1e-6"]
    new_to_json = ScheduleSpec.to_json

    def old_to_json(self):  # what dpcli 0.2 wrote: no "index"
        doc = new_to_json(self)
        doc.pop("index", None)
        return doc

    monkeypatch.setattr(ScheduleSpec, "to_json", old_to_json)
    r = hist(paths[1000], keys, *imp, "--improver-c", "0.2", "--improver-index", "rows")
    assert r.exit_code == 0, r.stderr
    monkeypatch.setattr(ScheduleSpec, "to_json", new_to_json)
    r = hist(paths[1500], keys, *imp)  # options left out: the stored c (0.2) and rows
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)["summary"]["schedule"]
    assert s["t"] == 1500 and Fraction(s["run_epsilon"]) == sch.bbimprover_epsilon(1500, Fraction(1), 1e-6, 0.2)
    assert s["index"] == "rows" and s["c"] == 0.2 and "Theorem 13" not in r.stderr
    for extra in (["--improver-c", "0.1"], ["--improver-index", "runs"]):
        r = hist(paths[4000], keys, *imp, *extra)
        assert r.exit_code == 2 and "other settings" in r.stderr
    assert len(ledger_entries()) == 3  # reservation + two runs


def test_epochs_start_exactly_at_the_boundaries():
    g = Fraction(1, 10)
    assert [sch.epoch_of(s, 1000, g) for s in (1000, 1099, 1100, 1209, 1210)] == [0, 0, 1, 1, 2]
    assert sch.epoch_start(2, 1000, g) == 1210
    with pytest.raises(ValueError):
        sch.epoch_of(999, 1000, g)


def test_default_gamma_follows_algorithm_1():
    # δ = 0, p = g = 1: γ = (ln(1/β)/(εn))^{1/3}
    assert abs(float(sch.default_gamma(1.0, 10_000, 0.0, 0.05)) - (np.log(20) / 10_000) ** (1 / 3)) < 1e-8
    assert abs(float(sch.default_gamma(1.0, 10_000, 1e-6, 0.05)) - (np.log(20) / 10_000) ** (1 / 2.5)) < 1e-8


# ---- CLI ----------------------------------------------------------------------------------------


@pytest.fixture
def snapshots(tmp_path):
    rng = np.random.default_rng(11)  # test data only
    n = 4000
    df = pl.DataFrame({"user": rng.integers(0, 1500, n), "g": rng.choice(["a", "b", "c"], n)})
    paths = {}
    for size in (1000, 1050, 1100, 1500, 4000):
        p = tmp_path / f"snap{size}.csv"
        df.head(size).write_csv(p)
        paths[size] = p
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    return paths, keys


def hist(path, keys, *extra):
    return runner.invoke(app, ["histogram", str(path), "--by", "g", "--privacy-unit", "user", "--keys", str(keys),
                               "--schedule", "daily", "--total-epsilon", "1", *extra, "--json", "-o", "-"])


def ledger_entries():
    return json.loads(runner.invoke(app, ["budget", "history", "default", "--json"]).stdout)


def test_bbscheduler_reserves_once_runs_epochs_and_caches(snapshots, state_dir):
    paths, keys = snapshots
    runner.invoke(app, ["budget", "init", "default", "--mode", "pure", "--epsilon", "2"])
    r0 = hist(paths[1000], keys, "--gamma", "0.1")
    assert r0.exit_code == 0, r0.stderr
    s0 = json.loads(r0.stdout)["summary"]["schedule"]
    assert s0["epoch"] == 0 and not s0["cached"] and s0["computed_on_rows"] == 1000
    r1 = hist(paths[1050], keys, "--gamma", "0.1")  # mid-epoch: cached, free, identical
    s1 = json.loads(r1.stdout)
    assert s1["summary"]["schedule"]["cached"] and s1["summary"]["schedule"]["computed_on_rows"] == 1000
    assert s1["result"] == json.loads(r0.stdout)["result"]
    assert len(ledger_entries()) == 2  # reservation + epoch 0
    # The cache survives a fresh process.
    env = {**os.environ, "DPCLI_STATE_DIR": str(state_dir)}
    p = subprocess.run([sys.executable, "-m", "dpcli", "histogram", str(paths[1050]), "--by", "g", "--privacy-unit",
                        "user", "--keys", str(keys), "--schedule", "daily", "--total-epsilon", "1", "--gamma", "0.1",
                        "--json", "-o", "-"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["result"] == json.loads(r0.stdout)["result"]
    r2 = hist(paths[1100], keys, "--gamma", "0.1")  # exactly (1 + γ)·n: epoch 1
    assert json.loads(r2.stdout)["summary"]["schedule"]["epoch"] == 1
    r3 = hist(paths[4000], keys, "--gamma", "0.1")
    assert json.loads(r3.stdout)["summary"]["schedule"]["epoch"] == sch.epoch_of(4000, 1000, Fraction(1, 10))
    entries = ledger_entries()
    assert [bool(e["events"]) for e in entries] == [True, False, False, False]
    assert entries[0]["events"][0]["epsilon"] == "1" and all(e["covered_by"] == 1 for e in entries[1:])
    show = json.loads(runner.invoke(app, ["budget", "show", "--json"]).stdout)
    sc = show["schedules"][0]
    last = sch.epoch_of(4000, 1000, Fraction(1, 10))  # 1.1^14 · 1000 = 3797 ≤ 4000 < 4177
    assert last == 14
    assert sc["runs"] == 3 and sc["epochs"] == [0, 1, last] and sc["epsilon_reserved"] == "1"
    spent = sum(sch.bbscheduler_epsilon(i, Fraction(1, 10), Fraction(1), 0.0) for i in (0, 1, last))
    assert Fraction(sc["epsilon_spent"]) == spent and show["spent"]["epsilon"] == "1"
    text = runner.invoke(app, ["budget", "show"]).stdout
    assert "schedule     daily (bbscheduler, histogram): 3 run(s)" in text
    # Shrinking snapshots are refused, nothing changes.
    r = hist(paths[1500], keys, "--gamma", "0.1")
    assert r.exit_code == 65 and "growing databases" in r.stderr
    assert len(ledger_entries()) == 4
    # Different settings under the same name are refused.
    r = hist(paths[4000], keys, "--gamma", "0.2")
    assert r.exit_code == 2 and "other settings" in r.stderr


def test_fixed_stops_hard_and_bbimprover_runs_on_growth(snapshots):
    paths, keys = snapshots
    runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "5", "--delta", "1e-5"])
    args = ["--scheduler", "fixed", "--epsilon", "0.4"]
    assert hist(paths[1000], keys, *args).exit_code == 0
    assert hist(paths[1050], keys, *args).exit_code == 0
    r = hist(paths[1100], keys, *args)
    assert r.exit_code == 77 and "no more runs" in r.stderr
    imp = ["--scheduler", "bbimprover", "--total-delta", "1e-6"]
    r1 = runner.invoke(app, ["histogram", str(paths[1000]), "--by", "g", "--privacy-unit", "user", "--keys", str(keys),
                             "--schedule", "imp", "--total-epsilon", "1", *imp, "--json", "-o", "-"])
    assert r1.exit_code == 0, r1.stderr
    summary = json.loads(r1.stdout)["summary"]["schedule"]
    # a new bbimprover schedule counts runs (t = k = 1 here) with c = 0.1
    assert Fraction(summary["run_epsilon"]) == sch.bbimprover_epsilon(1, Fraction(1), 1e-6, sch.DEFAULT_IMPROVER_C)
    assert summary["run"] == 1
    show = json.loads(runner.invoke(app, ["budget", "show", "--json"]).stdout)
    assert show["spent"]["epsilon"] == "2" and show["spent"]["delta"] == "0.000001"


def test_schedule_needs_a_pure_known_domain_release(snapshots):
    paths, _ = snapshots
    runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "5", "--delta", "1e-5"])
    r = runner.invoke(app, ["histogram", str(paths[1000]), "--by", "g", "--privacy-unit", "user", "--delta", "1e-6",
                            "--schedule", "x", "--total-epsilon", "1"])
    assert r.exit_code == 2 and "--keys" in r.stderr
    assert ledger_entries() == []


def test_topk_shares_the_schedule_code(snapshots):
    paths, keys = snapshots
    runner.invoke(app, ["budget", "init", "default", "--mode", "pure", "--epsilon", "3"])
    args = ["--by", "g", "-k", "2", "--privacy-unit", "user", "--keys", str(keys), "--schedule", "tk",
            "--total-epsilon", "1", "--gamma", "0.1", "--json", "-o", "-"]
    r0 = runner.invoke(app, ["topk", str(paths[1000]), *args])
    r1 = runner.invoke(app, ["topk", str(paths[1050]), *args])
    assert r0.exit_code == 0, r0.stderr
    d0, d1 = json.loads(r0.stdout), json.loads(r1.stdout)
    assert d1["summary"]["schedule"]["cached"] and d0["result"] == d1["result"] and len(d0["result"]) == 2
    eps0 = sch.bbscheduler_epsilon(0, Fraction(1, 10), Fraction(1), 0.0)
    assert Fraction(d0["summary"]["schedule"]["run_epsilon"]) == eps0
    r = runner.invoke(app, ["topk", str(paths[1000]), *args[:-2], "--epsilon-per", "0.1"])
    assert r.exit_code == 2 and "drop --epsilon-per" in r.stderr


def test_bbscheduler_accuracy_parameters():
    a, b = sch.bbscheduler_accuracy(2, Fraction(1, 100), Fraction(1, 10), 1000, 0.05)
    assert b == pytest.approx((0.05 / 1.05) ** 3)
    assert a == pytest.approx(np.log(1 / b) / (0.01 * 1210))


def test_a_damaged_schedule_state_is_refused_not_reset(snapshots, state_dir):
    """The schedule state is a checked document: an edit (e.g. forgetting runs, which would hand back
    budget) or a truncation gives exit 78, and nothing is charged or written."""
    paths, keys = snapshots
    runner.invoke(app, ["budget", "init", "default", "--mode", "pure", "--epsilon", "2"])
    assert hist(paths[1000], keys, "--gamma", "0.1").exit_code == 0
    (state,) = (state_dir / "schedules" / "default").glob("*.json")
    good = state.read_text()
    doc = json.loads(good)
    doc["body"]["runs"] = []
    for damaged in (json.dumps(doc), good[: len(good) // 2]):
        state.write_text(damaged)
        r = hist(paths[1100], keys, "--gamma", "0.1")
        assert r.exit_code == 78 and ("checksum" in r.stderr or "corrupt" in r.stderr), r.stderr
        assert len(ledger_entries()) == 2


def test_a_schedule_made_with_dpcli_0_2s_default_c_runs_on_with_a_note(snapshots, monkeypatch):
    """dpcli 0.2 gave c = 0.25 by default; such a schedule keeps it (refusing would break its cron) and
    each run says why a new schedule would do better."""
    from dpcli.cli import _schedule

    paths, keys = snapshots
    runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "5", "--delta", "1e-5"])
    imp = ["--scheduler", "bbimprover", "--total-delta", "1e-6"]
    real = _schedule.schedule_spec

    def as_in_0_2(*args, **kwargs):  # what dpcli 0.2 built: c = 0.25, counting rows
        from dataclasses import replace
        spec = real(*args, **kwargs)
        return replace(spec, c=0.25, index="rows") if spec is not None else None

    monkeypatch.setattr(_schedule, "schedule_spec", as_in_0_2)  # the command imports it when it runs
    assert hist(paths[1000], keys, *imp).exit_code == 0
    monkeypatch.setattr(_schedule, "schedule_spec", real)
    r = hist(paths[1500], keys, *imp)
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)["summary"]["schedule"]
    assert s["c"] == 0.25 and s["index"] == "rows"
    assert "c = 0.25 ≥ 1/4" in r.stderr and "Theorem 13" in r.stderr
