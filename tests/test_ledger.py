"""Ledger arithmetic, replays, refusals, tamper detection, parallel and crash safety."""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

from dpcli.core.budget import Limits
from dpcli.core.events import PrivacyEvent
from dpcli.errors import BudgetError, StateError, UsageError
from dpcli.state import ledger


def ev(eps="0.1"):
    return PrivacyEvent("pure", "discrete_laplace", epsilon=Fraction(eps))


def test_ten_spends_of_a_tenth_exhaust_one_exactly(state_dir):
    ledger.init_ledger(state_dir, "a", Limits("pure", {"epsilon": Fraction(1)}))
    for i in range(10):
        ledger.charge(state_dir, "a", command="t", query_id="q", seed_id=f"s{i}", reserve=[ev()])
    led = ledger.read_ledger(state_dir, "a")
    assert led.spend().epsilon == 1
    with pytest.raises(BudgetError, match="left is 0"):
        ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="s10", reserve=[ev("0.0001")])


def test_replay_is_recorded_and_free(state_dir):
    ledger.init_ledger(state_dir, "a", Limits("pure", {"epsilon": Fraction(1)}))
    r1 = ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="same", reserve=[ev("0.5")])
    r2 = ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="same", reserve=[ev("0.5")])
    assert not r1.replay and r2.replay
    led = ledger.read_ledger(state_dir, "a")
    assert led.spend().epsilon == Fraction(1, 2) and len(led.entries) == 2


def test_reserve_decides_refusal_and_actual_is_charged(state_dir):
    lim = Limits("br", {"epsilon_per": Fraction("0.1"), "delta": Fraction("1e-10"), "info_budget": Fraction(10),
                        "call_budget": Fraction(3), "delta_prime": Fraction("1e-9")})
    ledger.init_ledger(state_dir, "b", lim)
    big = PrivacyEvent("br", "unkgumb", epsilon=Fraction("0.1"), units=11, calls=1, delta=Fraction("2e-10"))
    with pytest.raises(BudgetError, match="information budget"):
        ledger.charge(state_dir, "b", command="topk", query_id="q", seed_id="x", reserve=[big])
    res = PrivacyEvent("br", "unkgumb", epsilon=Fraction("0.1"), units=9, calls=1, delta=Fraction("2e-10"))
    act = PrivacyEvent("br", "unkgumb", epsilon=Fraction("0.1"), units=4, calls=1, delta=Fraction("2e-10"))
    r = ledger.charge(state_dir, "b", command="topk", query_id="q", seed_id="y", reserve=[res], actual=[act])
    assert r.spent.units == 4 and r.spent.calls == 1


def test_pure_ledger_refuses_gaussian(state_dir):
    ledger.init_ledger(state_dir, "a", Limits("pure", {"epsilon": Fraction(10)}))
    g = PrivacyEvent("zcdp", "discrete_gaussian", rho=Fraction(1, 100), delta=Fraction(1, 10**6))
    with pytest.raises(BudgetError, match="pure"):
        ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="g", reserve=[g])


def test_zcdp_and_rdp_and_approx_modes(state_dir):
    ledger.init_ledger(state_dir, "z", Limits("zcdp", {"rho": Fraction(1), "delta": Fraction(0)}))
    r = ledger.charge(state_dir, "z", command="t", query_id="q", seed_id="1", reserve=[ev("1")])
    assert r.spent.rho == Fraction(1, 2)
    ledger.init_ledger(state_dir, "r", Limits("rdp", {"epsilon": Fraction(10), "delta": Fraction(1, 10**9)}))
    lap = PrivacyEvent("pure", "discrete_laplace", epsilon=Fraction(1, 10), rdp_curve="discrete_laplace")
    n = 0
    with pytest.raises(BudgetError):
        while True:
            ledger.charge(state_dir, "r", command="t", query_id="q", seed_id=f"r{n}", reserve=[lap])
            n += 1
    assert n > 150  # RDP composition beats the 100 releases basic composition would allow
    ledger.init_ledger(state_dir, "x", Limits("approx", {"epsilon": Fraction(2), "delta": Fraction(1, 10**6)}))
    g = PrivacyEvent("zcdp", "discrete_gaussian", rho=Fraction(1, 50), delta=Fraction(1, 10**7))
    r = ledger.charge(state_dir, "x", command="t", query_id="q", seed_id="g", reserve=[g])
    assert 0 < r.spent.epsilon < 2 and r.spent.delta == Fraction(1, 10**7)


def test_no_ledger_and_double_init(state_dir):
    with pytest.raises(BudgetError, match="no budget ledger"):
        ledger.charge(state_dir, "nobody", command="t", query_id="q", seed_id="s", reserve=[ev()])
    ledger.init_ledger(state_dir, "a", Limits("pure", {"epsilon": Fraction(1)}))
    with pytest.raises(UsageError, match="already has a ledger"):
        ledger.init_ledger(state_dir, "a", Limits("pure", {"epsilon": Fraction(5)}))


def _charged(state_dir, n=3):
    ledger.init_ledger(state_dir, "a", Limits("pure", {"epsilon": Fraction(1)}))
    for i in range(n):
        ledger.charge(state_dir, "a", command="t", query_id="q", seed_id=f"s{i}", reserve=[ev()])
    return state_dir / "ledgers" / "a.json"


def test_tampering_is_detected(state_dir):
    path = _charged(state_dir)
    original = path.read_bytes()
    doc = json.loads(original)
    doc["entries"][1]["events"][0]["epsilon"] = "0.01"
    path.write_text(json.dumps(doc))
    with pytest.raises(StateError, match="modified"):
        ledger.read_ledger(state_dir, "a")
    doc = json.loads(original)
    del doc["entries"][1]
    path.write_text(json.dumps(doc))
    with pytest.raises(StateError, match="entry 2"):
        ledger.read_ledger(state_dir, "a")
    doc = json.loads(original)
    del doc["entries"][2]  # drop the last entry: a rollback
    path.write_text(json.dumps(doc))
    with pytest.raises(StateError, match="high-water"):
        ledger.read_ledger(state_dir, "a")
    path.write_text("{not json")
    with pytest.raises(StateError, match="corrupt"):
        ledger.read_ledger(state_dir, "a")
    doc = json.loads(original)
    doc["schema_version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(StateError, match="upgrade"):
        ledger.read_ledger(state_dir, "a")


def _worker(args):
    state_dir, wid, n = args
    ok = 0
    for i in range(n):
        try:
            ledger.charge(Path(state_dir), "p", command="t", query_id="q", seed_id=f"w{wid}-{i}",
                          reserve=[ev("0.01")], lock_timeout=120)
            ok += 1
        except BudgetError:
            pass
    return ok


@pytest.mark.parametrize("per_worker,fit", [(50, 300), pytest.param(200, 1000, marks=pytest.mark.slow)])
def test_parallel_debits_never_overspend_or_lose_entries(state_dir, per_worker, fit):
    """8 processes × per_worker debits of 0.01 against a limit that fits exactly ``fit`` of them."""
    ledger.init_ledger(state_dir, "p", Limits("pure", {"epsilon": Fraction(fit, 100)}))
    with mp.get_context("spawn").Pool(8) as pool:
        oks = pool.map(_worker, [(str(state_dir), w, per_worker) for w in range(8)])
    led = ledger.read_ledger(state_dir, "p")
    assert sum(oks) == fit == len(led.entries)
    assert led.spend().epsilon == Fraction(fit, 100)
    assert len({e["seed_id"] for e in led.entries}) == fit


_KILL_CHILD = """
import sys
from fractions import Fraction
from pathlib import Path
from dpcli.core.events import PrivacyEvent
from dpcli.state import ledger
root = Path(sys.argv[1]); start = int(sys.argv[2])
for i in range(start, start + 100000):
    ledger.charge(root, "k", command="t", query_id="q", seed_id=f"k{i}",
                  reserve=[PrivacyEvent("pure", "x", epsilon=Fraction(1, 1000))])
    print(i, flush=True)  # "released" only after the charge returned
"""


@pytest.mark.parametrize("kills", [12, pytest.param(500, marks=pytest.mark.slow)])
def test_sigkill_never_corrupts_or_undercounts(state_dir, tmp_path, kills):
    """SIGKILLs of a busy writer at varied moments (interpreter start-up is ~0.1 s, so some land
    mid-write): the ledger always parses and verifies, and is never below what was released."""
    ledger.init_ledger(state_dir, "k", Limits("pure", {"epsilon": Fraction(10**6)}))
    script = tmp_path / "child.py"
    script.write_text(_KILL_CHILD)
    released = 0
    for round_ in range(kills):
        p = subprocess.Popen([sys.executable, str(script), str(state_dir), str(round_ * 100000)],
                             stdout=subprocess.PIPE, text=True)
        time.sleep(0.15 + 0.03 * (round_ % 5))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        released += len(out.split())
        led = ledger.read_ledger(state_dir, "k")  # always parses and verifies
        assert led.spend().epsilon >= Fraction(released, 1000)
    assert released > 0
