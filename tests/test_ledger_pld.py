"""pld ledgers (issue 42, item 2): the privacy filter over blocks, series reserved in advance, costs sealed in the
entries and recomputed by ``budget verify``, a change of accounting recosted (never silently), the O(1) charge,
the migration from approx, the calculator, and the missing extra (one line, exit 77)."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import pytest
from dptest import cli, history, init_ledger

from dpcli.core.accounting import pld
from dpcli.core.accounting.budget import Limits
from dpcli.core.events import PrivacyEvent
from dpcli.errors import BudgetError, StateError
from dpcli.state import keys, ledger
from dpcli.state.ledger import charges as ledger_charges
from dpcli.state.ledger import costs
from dpcli.state.ledger import document as ledger_document
from dpcli.state.ledger import format as ledger_format

F = Fraction
LIMITS = Limits("pld", {"epsilon": F(1), "delta": F(1, 10**6)})


def lap(eps: str = "0.05") -> list[PrivacyEvent]:
    return [PrivacyEvent("pure", "histogram/laplace", epsilon=F(eps))]


def charge(root, seed: str, events: list[PrivacyEvent]) -> ledger.Receipt:
    return ledger.charge(root, "a", command="histogram", query_id="q", seed_id=seed, reserve=events)


def test_the_filter_adds_blocks_and_refuses_at_the_limit(state_dir):
    """Releases chosen one after another are blocks composed basically (the rule that is a filter under full
    adaptivity): 20 of ε 0.05 exhaust ε 1 and the 21st is refused, although the PLD of 24 such releases fixed in
    advance stays under ε 1 at δ 10⁻⁶ (a series reserved in advance: next test)."""
    ledger.init_ledger(state_dir, "a", LIMITS)
    for i in range(20):
        charge(state_dir, f"s{i}", lap())
    assert ledger.read_ledger(state_dir, "a").spend().epsilon == 1
    with pytest.raises(BudgetError, match="ε left is 0"):
        charge(state_dir, "s20", lap())
    assert pld.block_cost(lap(), 24, F(1, 10**6))[0] < 1  # fixed in advance, 24 fit: the filter does not assume it


def test_a_series_covers_its_runs_and_the_next_release_pays(state_dir):
    """A series of 24 releases of ε 0.05 is one block (its 24-fold PLD at all the δ left, under ε 1): each new
    release of that cost takes a run (nothing more to pay, replays free as ever), the 25th is charged as any
    release, and refused once the budget is gone."""
    ledger.init_ledger(state_dir, "a", LIMITS)
    receipt = ledger.reserve_series(state_dir, "a", lap(), 24, command="histogram", summary="cron")
    cost = pld.block_cost(lap(), 24, F(1, 10**6))
    assert (receipt.spent.epsilon, receipt.spent.delta) == cost
    for i in range(24):
        r = charge(state_dir, f"s{i}", lap())
        assert not r.replay and r.spent == receipt.spent
    assert charge(state_dir, "s3", lap()).replay  # a replay takes no run
    led = ledger.read_ledger(state_dir, "a")
    runs = [e["series_run"] for e in led.entries if "series_run" in e]
    assert runs == list(range(1, 25)) and all(e["events"] == [] for e in led.entries if "series_run" in e)
    assert 1 - cost[0] < F(5, 100)
    with pytest.raises(BudgetError, match="ε left is"):
        charge(state_dir, "s24", lap())
    other = [PrivacyEvent("pure", "histogram/laplace", epsilon=F(1, 10**6))]
    assert not charge(state_dir, "tiny", other).replay  # another cost is charged from what is left
    with pytest.raises(BudgetError, match="δ left is 0"):
        charge(state_dir, "d", [PrivacyEvent("approx", "histogram/threshold", delta=F(1, 10**9))])


def test_a_series_is_refused_where_it_does_not_fit_or_in_another_mode(state_dir):
    ledger.init_ledger(state_dir, "a", LIMITS)
    with pytest.raises(BudgetError, match="ε left is 1; this query needs"):
        ledger.reserve_series(state_dir, "a", lap(), 40, command="histogram", summary="")
    assert ledger.read_ledger(state_dir, "a").entries == ()
    ledger.init_ledger(state_dir, "b", Limits("approx", {"epsilon": F(1), "delta": F(1, 10**6)}))
    with pytest.raises(BudgetError, match="reserved in a pld ledger"):
        ledger.reserve_series(state_dir, "b", lap(), 2, command="histogram", summary="")


def test_costs_are_sealed_in_the_entries_and_the_mark_carries_their_sum(state_dir):
    """Each block's (ε, δ) is in its entry with the accounting that computed it; the mark's totals (and its open
    series) equal a sum over the entries, exactly; a release of several events is composed by their PLDs."""
    ledger.init_ledger(state_dir, "a", LIMITS)
    mixed = [*lap("0.1"), PrivacyEvent("zcdp", "histogram/gaussian", rho=F(1, 1000), delta=F(1, 10**8),
                                       rdp_curve="discrete_gaussian"),
             PrivacyEvent("approx", "histogram/threshold", delta=F(1, 10**8))]
    charge(state_dir, "m", mixed)
    ledger.reserve_series(state_dir, "a", lap("0.01"), 10, command="histogram", summary="")
    charge(state_dir, "r1", lap("0.01"))
    led = ledger.read_ledger(state_dir, "a")
    first = led.entries[0]["cost"]
    assert first["accounting"] == pld.accounting_version()
    assert (F(first["epsilon"]), F(first["delta"])) == pld.block_cost(mixed)
    assert F(first["epsilon"]) < pld._basic(mixed, 1)[0]  # below basic composition (0.1 + ρ's conversion)
    mark = json.loads((state_dir / "ledgers" / "a.hwm").read_text())["cache"]
    total = sum((F(e["cost"]["epsilon"]) for e in led.entries if "cost" in e), F(0))
    assert F(mark["spent"]["epsilon"]) == total == led.spend().epsilon
    assert mark["accounting"] == pld.accounting_version()
    assert mark["series"] == [[2, led.entries[1]["series"]["key"], 10, 1]]


def test_a_charge_is_o1_on_the_mark(state_dir, monkeypatch):
    """While the mark vouches for the file, a charge reads no entry (it would fail here if it did)."""
    ledger.init_ledger(state_dir, "a", LIMITS)
    ledger.reserve_series(state_dir, "a", lap("0.01"), 10, command="histogram", summary="")
    charge(state_dir, "x", lap("0.2"))
    monkeypatch.setattr(ledger_charges, "load_ledger", lambda *a: pytest.fail("read the whole ledger"))
    charge(state_dir, "y", lap("0.01"))  # a series run, from the mark's open series
    charge(state_dir, "z", lap("0.2"))
    monkeypatch.undo()
    led = ledger.read_ledger(state_dir, "a")
    assert [e.get("series_run") for e in led.entries] == [None, None, 1, None]


def test_budget_verify_recomputes_every_cost_and_catches_one_edited_with_the_key(state_dir):
    """``budget verify`` recomputes each block: equal, OK; a cost lowered and the chain resealed with the key
    (which the seal cannot catch) is caught by the recomputation: exit 78, one line."""
    init_ledger("pld", "--epsilon", "1", "--delta", "1e-6")
    ledger.reserve_series(state_dir, "default", lap(), 10, command="histogram", summary="")
    ledger.charge(state_dir, "default", command="t", query_id="q", seed_id="s", reserve=lap("0.1"))
    ok = cli("budget", "verify", "--json")
    assert ok.exit_code == 0, ok.stderr
    assert json.loads(ok.stdout)["costs"] == {"accounting": pld.accounting_version(), "equal": 2, "other": 0}
    assert "2 recorded cost(s) recomputed, all equal" in cli("budget", "verify").stdout
    led = ledger.read_ledger(state_dir, "default")
    doc = ledger_document.document_of(led, list(led.entries))
    doc["entries"][0]["cost"]["epsilon"] = "0.01"
    ledger_document.write_ledger(state_dir, led.path, doc)  # sealed with the key: the chain verifies
    bad = cli("budget", "verify")
    assert bad.exit_code == 78 and "entry 1: its recorded cost differs from its recomputation" in bad.stderr
    assert bad.stderr.count("\n") == 1


def test_a_new_accounting_recosts_the_period_once_and_never_lowers_it(state_dir, monkeypatch):
    """Another dp_accounting (or scipy, numpy, rules) version: the next write first appends a recost entry: the
    period's blocks recomputed, the total raised to the sum of max(recorded, new); its summary says so. A
    version that computes less lowers nothing."""
    ledger.init_ledger(state_dir, "a", LIMITS)
    charge(state_dir, "s1", lap("0.1"))
    ledger.reserve_series(state_dir, "a", lap("0.01"), 10, command="histogram", summary="")
    before = ledger.read_ledger(state_dir, "a").spend().epsilon
    real = pld.block_cost
    monkeypatch.setattr(pld, "accounting_version", lambda: "pld/1 dp-accounting/9.9")
    monkeypatch.setattr(pld, "block_cost", lambda ev, n=1, d=None: (real(ev, n, d)[0] * F(11, 10), real(ev, n, d)[1]))
    pld._cached_cost.cache_clear()
    charge(state_dir, "s2", lap("0.1"))
    led = ledger.read_ledger(state_dir, "a")
    recost = led.entries[2]
    assert recost["command"] == "budget recost" and recost["recost"]["entries"] == 2
    assert "accounting is now pld/1 dp-accounting/9.9: 2 charge(s) of this period recomputed" in recost["summary"]
    assert F(recost["cost"]["epsilon"]) == before / 10  # every block 10% dearer
    assert led.entries[3]["cost"]["accounting"] == "pld/1 dp-accounting/9.9"
    assert led.spend().epsilon == before * F(11, 10) + F(11, 100)
    charge(state_dir, "s3", lap("0.01"))  # the same accounting: no second recost
    assert sum(e["command"] == "budget recost" for e in ledger.read_ledger(state_dir, "a").entries) == 1
    check = costs.verify_costs(ledger.read_ledger(state_dir, "a"))
    assert (check.equal, check.other) == (2, 2)  # the recost and the new charge; the two older ones not comparable
    monkeypatch.setattr(pld, "accounting_version", lambda: "pld/1 dp-accounting/10.0")
    monkeypatch.setattr(pld, "block_cost", lambda ev, n=1, d=None: (real(ev, n, d)[0] / 2, real(ev, n, d)[1]))
    charge(state_dir, "s4", lap("0.1"))
    led = ledger.read_ledger(state_dir, "a")
    assert led.entries[-2]["command"] == "budget recost" and F(led.entries[-2]["cost"]["epsilon"]) == 0
    assert "none costs more than recorded" in led.entries[-2]["summary"]


def test_an_approx_ledger_migrates_with_its_spend(state_dir):
    """``budget migrate --to pld``: the operator's, recorded; the ledger keeps its id and what it spent (each
    charge as its (ε, δ)), and goes on as a pld ledger (a series fits there afterwards)."""
    init_ledger("approx", "--epsilon", "1", "--delta", "1e-6")
    ledger.charge(state_dir, "default", command="t", query_id="q", seed_id="a",
                  reserve=[PrivacyEvent("approx", "histogram/laplace+threshold", epsilon=F(1, 10), delta=F(1, 10**7)),
                           PrivacyEvent("zcdp", "histogram/gaussian", rho=F(1, 1000), delta=F(1, 10**8))])
    before = ledger.read_ledger(state_dir, "default")
    r = cli("budget", "migrate", "--to", "pld")
    assert r.exit_code == 0, r.stderr
    assert "now a pld ledger (1 earlier charge(s) keep their (ε, δ)" in r.stdout
    after = ledger.read_ledger(state_dir, "default")
    assert after.limits == LIMITS and after.ledger_id == before.ledger_id
    assert after.spend() == before.spend()
    assert after.entries[0]["cost"]["accounting"] == costs.MIGRATED and after.entries[-1]["command"] == "budget migrate"
    assert cli("budget", "verify").exit_code == 0
    assert cli("budget", "migrate").exit_code == 2  # a pld ledger is not migrated again
    ledger.reserve_series(state_dir, "default", lap("0.01"), 10, command="histogram", summary="")


def test_the_calculator_composes_without_a_ledger():
    """``budget compose --mode pld``: the same block as a ledger's series; options it does not use are refused."""
    r = cli("budget", "compose", "--mode", "pld", "--epsilon", "0.01243", "--count", "365", "--delta", "1e-6",
            "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    eps, _ = pld.block_cost(lap("0.01243"), 365, F(1, 10**6))
    assert out["epsilon"] == pytest.approx(float(eps)) and out["epsilon"] <= 1 and out["basic_epsilon"] > 4.5
    g = json.loads(cli("budget", "compose", "--mode", "pld", "--rho", "0.0001", "--count", "100", "--delta",
                       "1e-6", "--json").stdout)
    assert g["sigma"] == pytest.approx(70.71, abs=0.01) and 0 < g["epsilon"] < 1
    for bad in (["--epsilon", "1", "--rho", "1"], ["--epsilon", "1"], ["--epsilon", "1", "--delta", "1e-6",
                                                                       "--call-budget", "3"]):
        refused = cli("budget", "compose", "--mode", "pld", *bad)
        assert refused.exit_code == 2, refused.stdout


def test_show_and_history_say_what_a_series_and_a_block_cost(state_dir):
    init_ledger("pld", "--epsilon", "1", "--delta", "1e-6")
    ledger.reserve_series(state_dir, "default", lap(), 10, command="histogram", summary="series of 10")
    ledger.charge(state_dir, "default", command="histogram", query_id="q", seed_id="s", reserve=lap())
    show = cli("budget", "show")
    assert show.exit_code == 0, show.stderr
    assert "series       #1 (histogram): 1 of 10 run(s) taken, histogram/laplace (epsilon=0.05) each; the series costs ε" in show.stdout
    data = json.loads(cli("budget", "show", "--json").stdout)
    assert data["series"][0]["taken"] == 1 and data["mode"] == "pld"
    rows = history()
    assert rows[0]["series"]["count"] == 10 and rows[1]["covered_by"] == 1
    text = cli("budget", "history").stdout
    assert "(pld: epsilon=" in text and "covered by reservation #1" in text


def test_without_the_extra_one_line_and_exit_77_and_reads_still_work(state_dir, monkeypatch):
    """No dp_accounting: ``init --mode pld`` refused, a charge refused before anything is debited; ``budget show``
    of an existing pld ledger still reads (its costs are recorded)."""
    init_ledger("pld", "--epsilon", "1", "--delta", "1e-6")
    ledger.charge(state_dir, "default", command="t", query_id="q", seed_id="s", reserve=lap())
    monkeypatch.setattr(pld, "available", lambda: False)
    r = cli("budget", "init", "other", "--mode", "pld", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 77 and r.stderr == f"dpcli: error: {pld.MISSING}\n"
    with pytest.raises(BudgetError, match=r"pip install 'dpcli\[pld\]'"):
        ledger.charge(state_dir, "default", command="t", query_id="q", seed_id="s2", reserve=lap())
    assert len(ledger.read_ledger(state_dir, "default").entries) == 1
    assert cli("budget", "show").exit_code == 0


def test_a_pld_release_end_to_end_and_the_start_up_imports_nothing_heavy(tmp_path, state_dir):
    """A histogram on a pld ledger is charged its block; ``dpcli --help`` and ``budget show`` import neither
    dp_accounting nor scipy."""
    init_ledger("pld", "--epsilon", "1", "--delta", "1e-6")
    data = tmp_path / "d.csv"
    data.write_text("user,g\n" + "".join(f"u{i},{'ab'[i % 2]}\n" for i in range(40)))
    keys_csv = tmp_path / "k.csv"
    keys_csv.write_text("g\na\nb\n")
    r = cli("histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys_csv, "--agg", "count-units",
            "--max-partitions", "1", "--max-contributions", "1", "--epsilon", "0.1", "--noise", "gaussian",
            "--delta", "1e-7")
    assert r.exit_code == 0, r.stderr
    (debit,) = [e for e in history() if e["events"]]
    assert debit["events"][0]["rdp_curve"] == "discrete_gaussian"
    assert F(debit["cost"]["epsilon"]) <= F(1, 10) and F(debit["cost"]["delta"]) == F(1, 10**7)
    probe = ("import sys; from dpcli.cli.app import main\n"
             "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('dp_accounting', 'scipy') if m in sys.modules), file=sys.stderr)")
    for argv in (["--help"], ["budget", "show"]):
        p = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True,
                           env={"DPCLI_STATE_DIR": str(state_dir), "PATH": "/usr/bin:/bin"})
        assert p.stderr.strip().splitlines()[-1] == "[]", p.stderr


def test_a_torn_pld_append_is_completed_from_its_sealed_intent(state_dir, monkeypatch):
    """Crash safety holds for pld entries: a charge killed mid-append (its cost sealed in the pending mark) is
    read as appended, with its cost, and the next charge goes on from there."""
    ledger.init_ledger(state_dir, "a", LIMITS)
    charge(state_dir, "s1", lap("0.1"))

    def torn(path, at, data):
        with open(path, "r+b") as fh:
            fh.seek(at)
            fh.write(data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(ledger_charges, "append_at", torn)
    with pytest.raises(KeyboardInterrupt):
        charge(state_dir, "s2", lap("0.2"))
    monkeypatch.undo()
    led = ledger.read_ledger(state_dir, "a")
    assert led.spend().epsilon == F(3, 10) and led.entries[-1]["cost"]["epsilon"] == "0.2"
    charge(state_dir, "s3", lap("0.1"))
    assert ledger.read_ledger(state_dir, "a").spend().epsilon == F(4, 10)
    assert costs.verify_costs(ledger.read_ledger(state_dir, "a")).equal == 3


def test_a_cost_that_does_not_parse_is_corrupt_state(state_dir):
    ledger.init_ledger(state_dir, "a", LIMITS)
    charge(state_dir, "s1", lap("0.1"))
    led = ledger.read_ledger(state_dir, "a")
    doc = ledger_document.document_of(led, list(led.entries))
    doc["entries"][0]["cost"]["delta"] = "2"
    ledger_format.seal(doc, ledger_format.current_mac_key(state_dir))
    ledger_document.write_ledger(state_dir, led.path, doc)
    with pytest.raises(StateError, match="entry 1 has an invalid event"):
        ledger.read_ledger(state_dir, "a")
    assert keys.key_path(state_dir).exists()
