"""Ledgers and the ``budget`` command: arithmetic, replays, refusals, tamper detection, parallel and crash
safety, the key, and the command's views and exit codes (stdout and stderr checked apart).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
from dptest import cli, history, init_ledger

from dpcli.core.accounting.budget import Limits
from dpcli.core.events import PrivacyEvent
from dpcli.errors import BudgetError, StateError, UsageError
from dpcli.state import ledger
from dpcli.state.ledger import charges as ledger_charges
from dpcli.state.ledger import document as ledger_document
from dpcli.state.ledger import format as ledger_format


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
    for n in range(3):
        ledger.charge(state_dir, "r", command="t", query_id="q", seed_id=f"r{n}", reserve=[lap])
    led = ledger.read_ledger(state_dir, "r")
    # RDP composition beats the 100 releases basic composition would allow: 150 more still fit
    assert led.accountant.fits(led.spend(), led.accountant.spend([lap] * 153)) is None
    with pytest.raises(BudgetError):  # and the ledger refuses what does not fit
        ledger.charge(state_dir, "r", command="t", query_id="q", seed_id="big", reserve=[lap] * 400)
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
    doc = ledger_format.load_document(path, original)[0]
    doc["entries"][1]["events"][0]["epsilon"] = "0.01"
    path.write_bytes(ledger_format.dump_document(doc))
    with pytest.raises(StateError, match="modified"):
        ledger.read_ledger(state_dir, "a")
    doc = ledger_format.load_document(path, original)[0]
    del doc["entries"][1]
    path.write_bytes(ledger_format.dump_document(doc))
    with pytest.raises(StateError, match="entry 2"):
        ledger.read_ledger(state_dir, "a")
    doc = ledger_format.load_document(path, original)[0]
    del doc["entries"][2]  # drop the last entry: a rollback
    path.write_bytes(ledger_format.dump_document(doc))
    with pytest.raises(StateError, match="high-water"):
        ledger.read_ledger(state_dir, "a")
    path.write_text("{not json")
    with pytest.raises(StateError, match="corrupt"):
        ledger.read_ledger(state_dir, "a")
    doc = ledger_format.load_document(path, original)[0]
    doc["schema_version"] = 99
    path.write_bytes(ledger_format.dump_document(doc))
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


@pytest.mark.parametrize("workers,per_worker,fit", [(4, 30, 80), pytest.param(8, 200, 1000, marks=pytest.mark.audit)])
def test_parallel_debits_never_overspend_or_lose_entries(state_dir, workers, per_worker, fit):
    """``workers`` processes × per_worker debits of 0.01 against a limit that fits exactly ``fit`` of them (4
    processes in ``make test``: each spawn imports dpcli, the cost of this test; 8 under ``make audit``)."""
    ledger.init_ledger(state_dir, "p", Limits("pure", {"epsilon": Fraction(fit, 100)}))
    with mp.get_context("spawn").Pool(workers) as pool:
        oks = pool.map(_worker, [(str(state_dir), w, per_worker) for w in range(workers)])
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


@pytest.mark.parametrize("kills", [12, pytest.param(500, marks=pytest.mark.audit)])
def test_sigkill_never_corrupts_or_undercounts(state_dir, tmp_path, kills):
    """SIGKILLs of a busy writer at varied moments after its first release (a charge takes ~10-30 ms, so
    many land mid-write): the ledger always parses and verifies, and is never below what was released."""
    ledger.init_ledger(state_dir, "k", Limits("pure", {"epsilon": Fraction(10**6)}))
    script = tmp_path / "child.py"
    script.write_text(_KILL_CHILD)
    released = 0
    for round_ in range(kills):
        p = subprocess.Popen([sys.executable, str(script), str(state_dir), str(round_ * 100000)],
                             stdout=subprocess.PIPE, text=True)
        first = p.stdout.readline()  # start-up time varies with the machine's load: wait for it
        time.sleep(0.003 + 0.011 * (round_ % 7))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        released += len((first + out).split())
        led = ledger.read_ledger(state_dir, "k")  # always parses and verifies
        assert led.spend().epsilon >= Fraction(released, 1000)
    assert released > 0


# ---- schema 2: keyed seal, high-water mark, reseal, reservations and steps -------------------------


def test_a_charge_of_an_unchanged_ledger_reads_no_entries(state_dir, monkeypatch):
    """O(1) charges: the sealed mark's running totals are used while the file is the one it was written for."""
    ledger.init_ledger(state_dir, "a", Limits("pure", {"epsilon": Fraction(1)}))
    calls = []
    real = ledger_document.parse_ledger
    monkeypatch.setattr(ledger_document, "parse_ledger", lambda *a, **k: calls.append(1) or real(*a, **k))
    r = ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="s", reserve=[ev()])
    assert calls == [] and r.remaining == {"epsilon": "0.9"} and r.spent.epsilon == Fraction(1, 10)
    assert ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="s", reserve=[ev()]).replay
    assert calls == []
    path = state_dir / "ledgers" / "a.json"
    os.utime(path)  # any touch of the file: the full path reads and verifies it once
    with pytest.raises(StateError, match="replaced"):
        ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="s2", reserve=[ev()])
    assert calls == [1]


@pytest.mark.parametrize("mode", ["pure", "approx", "zcdp", "rdp", "br"])
def test_running_totals_equal_a_full_recount_bit_for_bit(state_dir, mode):
    """The cached spend after many charges (with replays) is exactly what folding every entry gives."""
    limits = {"pure": {"epsilon": Fraction(100)}, "approx": {"epsilon": Fraction(100), "delta": Fraction(1, 10)},
              "zcdp": {"rho": Fraction(100), "delta": Fraction(1, 10)},
              "rdp": {"epsilon": Fraction(10**6), "delta": Fraction(1, 10)},
              "br": {"epsilon_per": Fraction(1, 10), "delta": Fraction(1, 10**10), "info_budget": 10**6,
                     "call_budget": 10**6, "delta_prime": Fraction(1, 10**9)}}[mode]
    ledger.init_ledger(state_dir, "a", Limits(mode, limits))
    if mode == "br":
        events = [PrivacyEvent("br", "t", epsilon=Fraction(1, 10), delta=Fraction(1, 10**10), units=3, calls=1)]
    else:
        events = [PrivacyEvent("pure", "t", epsilon=Fraction(1, 7)),
                  PrivacyEvent("approx", "t", epsilon=Fraction(1, 3), delta=Fraction(1, 10**8))]
        if mode in ("zcdp", "rdp", "approx"):
            events.append(PrivacyEvent("zcdp", "t", rho=Fraction(1, 9), delta=Fraction(1, 10**8)))
        if mode == "pure":
            events = events[:1]
    for i in range(12):
        r = ledger.charge(state_dir, "a", command="t", query_id="q", seed_id=f"s{i % 8}", reserve=[events[i % len(events)]])
    assert r.replay and r.spent == ledger.read_ledger(state_dir, "a").spend()


def _crash_in_append(monkeypatch, keep: int | str | None):
    """Make the next append die after writing ``keep`` bytes (None: before the call; "ctime": no byte,
    but the file's ctime moved, as a SIGKILL inside write(2) can leave it)."""
    real = ledger_charges.append_at

    def dying(path, at, data):
        if keep == "ctime":  # killed inside write(2) after the kernel stamped the ctime, before any byte
            time.sleep(0.002)
            os.utime(path)
        elif keep is not None:
            real(path, at, data[:keep])
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(ledger_charges, "append_at", dying)
    return real


@pytest.mark.parametrize("keep", [None, "ctime", 0, 17, -1])
def test_a_crash_mid_append_is_completed_from_the_sealed_intent(state_dir, monkeypatch, keep):
    """Killed between the intent mark and the end of the append: the ledger reads, counting the charge."""
    _charged(state_dir, 2)
    real = _crash_in_append(monkeypatch, keep if keep != -1 else 10**6)
    with pytest.raises(KeyboardInterrupt):
        ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="dying", reserve=[ev()])
    led = ledger.read_ledger(state_dir, "a")
    assert len(led.entries) == 3 and led.spend().epsilon == Fraction(3, 10)  # counted, never under-counted
    monkeypatch.setattr(ledger_charges, "append_at", real)
    assert ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="dying", reserve=[ev()]).replay
    ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="after", reserve=[ev()])
    assert ledger.read_ledger(state_dir, "a").spend().epsilon == Fraction(4, 10)


def test_bytes_appended_to_a_restored_ledger_are_not_taken_for_a_crash(state_dir):
    """A restore (ledger + mark from a backup) with junk appended to look like a torn append is refused."""
    path = _charged(state_dir, 1)
    hwm = path.with_suffix(".hwm")
    backup = path.read_bytes(), hwm.read_bytes()
    ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="later", reserve=[ev()])
    path.write_bytes(backup[0] + b'{"seq": 2, "ti')
    hwm.write_bytes(backup[1])
    with pytest.raises(StateError):
        ledger.read_ledger(state_dir, "a")
    with pytest.raises(StateError):
        ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="x", reserve=[ev()])


def test_a_schema_2_ledger_is_read_and_becomes_schema_3_at_its_next_charge(state_dir):
    path = _charged(state_dir, 2)
    doc = ledger_format.load_document(path, path.read_bytes())[0]
    doc["schema_version"] = 2
    key = ledger_format.current_mac_key(state_dir)
    ledger_format.seal(doc, key)
    path.write_text(json.dumps(doc, indent=1))
    body = {"ledger_id": doc["ledger_id"], "count": 2, "hash": doc["entries"][-1]["hash"],
            "ctime_ns": os.stat(path).st_ctime_ns}
    path.with_suffix(".hwm").write_text(json.dumps({**body, "mac": ledger_format.mac(key, ledger_format.HWM_DOMAIN, body)}))
    assert ledger.read_ledger(state_dir, "a").spend().epsilon == Fraction(2, 10)
    ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="v3", reserve=[ev()])
    assert path.read_bytes().startswith(b'{"schema_version": 3')
    assert ledger.read_ledger(state_dir, "a").spend().epsilon == Fraction(3, 10)


def test_the_seal_key_is_derived_and_never_stored(state_dir):
    path = _charged(state_dir, 1)
    key = (state_dir / "secret.key").read_text().split()[-1]
    from dpcli.state import keys
    derived = keys.derive_key(bytes.fromhex(key), "ledger-mac/v2").hex()
    for f in (path, path.with_suffix(".hwm")):
        text = f.read_text()
        assert key not in text and derived not in text


def test_a_crash_between_ledger_and_mark_write_is_accepted_but_not_two_entries(state_dir):
    path = _charged(state_dir, 1)
    hwm = path.with_suffix(".hwm")
    mark = hwm.read_bytes()
    ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="x1", reserve=[ev()])
    hwm.write_bytes(mark)  # as if killed after the ledger's rename, before the mark's
    assert len(ledger.read_ledger(state_dir, "a").entries) == 2
    ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="x2", reserve=[ev()])  # repairs the mark
    assert len(ledger.read_ledger(state_dir, "a").entries) == 3
    hwm.write_bytes(mark)
    with pytest.raises(StateError, match="high-water mark .* is older"):
        ledger.read_ledger(state_dir, "a")


def test_reseal_accepts_a_restore_and_says_so(state_dir):
    path = _charged(state_dir, 1)
    hwm = path.with_suffix(".hwm")
    backup = path.read_bytes(), hwm.read_bytes()
    ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="later", reserve=[ev()])
    time.sleep(0.02)
    path.write_bytes(backup[0])
    hwm.write_bytes(backup[1])
    with pytest.raises(StateError, match="replaced"):
        ledger.read_ledger(state_dir, "a")
    led, reason = ledger.reseal(state_dir, "a")
    assert "replaced" in reason and led.entries[-1]["command"] == "budget reseal"
    assert "accepted" in led.entries[-1]["summary"] and led.spend().epsilon == Fraction(1, 10)
    assert ledger.reseal(state_dir, "a")[1] is None  # nothing left to accept
    doc = ledger_format.load_document(path, path.read_bytes())[0]
    doc["entries"][0]["events"][0]["epsilon"] = "0.0001"
    path.write_bytes(ledger_format.dump_document(doc))
    with pytest.raises(StateError, match="modified"):
        ledger.reseal(state_dir, "a")  # edits are never accepted


def test_a_schema_1_ledger_is_refused_until_resealed(state_dir):
    from dptest import runner

    from dpcli.cli.app import app

    (state_dir / "ledgers").mkdir(parents=True)
    entries, prev = [], "0" * 64
    for i in (1, 2):
        e = {"seq": i, "time": "2026-01-01T00:00:00.000000Z", "period": 0, "command": "t", "query_id": "q",
             "seed_id": f"s{i}", "events": [ev("0.25").to_json()], "prev": prev}
        e["hash"] = ledger_format.v1_entry_hash(e)
        prev = e["hash"]
        entries.append(e)
    v1 = {"schema_version": 1, "analyst": "old", "created": "2026-01-01T00:00:00.000000Z",
          "limits": {"mode": "pure", "epsilon": "1"}, "refresh_days": None, "report_delta": 1e-9,
          "genesis": "0" * 64, "entries": entries}
    (state_dir / "ledgers" / "old.json").write_text(json.dumps(v1))
    (state_dir / "ledgers" / "old.hwm").write_text(json.dumps({"count": 2, "hash": prev}))
    r = runner.invoke(app, ["budget", "show", "old"])
    assert r.exit_code == 78 and "schema_version 1" in r.stderr and "--reseal" in r.stderr
    r = runner.invoke(app, ["budget", "verify", "old", "--reseal"])
    assert r.exit_code == 0 and "upgraded from schema_version 1" in r.stdout, r.stderr
    led = ledger.read_ledger(state_dir, "old")
    assert led.spend().epsilon == Fraction(1, 2) and len(led.entries) == 3
    assert runner.invoke(app, ["budget", "verify", "old"]).exit_code == 0


def test_a_rotated_key_still_verifies_and_the_next_write_reseals(state_dir):
    from dpcli.state import keys
    path = _charged(state_dir, 1)
    old_genesis = ledger_format.load_document(path, path.read_bytes())[0]["genesis"]
    keys.rotate_key(state_dir)
    assert len(ledger.read_ledger(state_dir, "a").entries) == 1
    ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="after", reserve=[ev()])
    assert ledger_format.load_document(path, path.read_bytes())[0]["genesis"] != old_genesis
    for old in state_dir.glob("secret.key.*.old"):
        old.unlink()
    assert len(ledger.read_ledger(state_dir, "a").entries) == 2  # sealed with the current key only


def _res(rid="r1", kind="schedule", key="k", lid=None, state_dir=None):
    lid = lid or ledger.read_ledger(state_dir, "a").ledger_id
    return ledger.Reservation(id=rid, kind=kind, key=key, ledger_id=lid, events=(ev("0.5"),), command="t")


def _step(state_dir, start, digest, rid="r1", create=True, **kw):
    st = ledger.Step(rid, start, digest, "schedule 'x'", _res(rid, state_dir=state_dir, **kw) if create else None)
    return ledger.charge(state_dir, "a", command="t", query_id="q", seed_id=f"{rid}-{start}-{digest}",
                         reserve=[ev()], step=st)


def test_steps_new_repeat_fork_ahead_and_recreate(state_dir):
    ledger.init_ledger(state_dir, "a", Limits("pure", {"epsilon": Fraction(1)}))
    r = _step(state_dir, 0, "d0")
    assert r.reserved and r.covered_by == 1 and not r.replay and r.spent.epsilon == Fraction(1, 2)
    r = _step(state_dir, 1, "d1", create=False)
    assert not r.reserved and not r.replay
    r = _step(state_dir, 0, "d0")  # a crash-retry (or an old copy) on the same input: free repeat
    assert r.replay and r.spent.epsilon == Fraction(1, 2)
    before = (state_dir / "ledgers" / "a.json").read_bytes()
    with pytest.raises(StateError, match="behind the ledger"):
        _step(state_dir, 1, "other", create=False)  # a fork on other data
    with pytest.raises(StateError, match="ahead of the ledger"):
        _step(state_dir, 5, "d5", create=False)
    with pytest.raises(StateError, match="not in analyst"):
        _step(state_dir, 1, "d1", rid="unknown", create=False)
    with pytest.raises(StateError, match="already has reservation #1"):
        _step(state_dir, 0, "d0", rid="r2")  # the same schedule key, re-created
    with pytest.raises(StateError, match="another ledger"):
        _step(state_dir, 0, "d0", rid="r3", key="k3", lid="f" * 32)
    assert (state_dir / "ledgers" / "a.json").read_bytes() == before
    r = _step(state_dir, 0, "d0", rid="s1", kind="stream", key="k")  # streams may share a query
    assert r.reserved and r.spent.epsilon == 1


# ---- the budget command ------------------------------------------------------------------------


def test_init_show_history_json():
    r = cli("budget", "init", "alice", "--mode", "zcdp", "--rho", "0.5", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["mode"] == "zcdp"
    r = cli("budget", "show", "alice", "--json")
    data = json.loads(r.stdout)
    assert data["remaining"]["rho"] == "0.5" and data["spent"]["rho"] == "0"
    assert cli("budget", "history", "alice", "--json").stdout.strip() == "[]"
    assert cli("budget", "verify", "alice").exit_code == 0


def test_bad_values_give_one_line_and_exit_2():
    for args in (["--mode", "pure", "--epsilon", "0"], ["--mode", "pure", "--epsilon", "-1"],
                 ["--mode", "approx", "--epsilon", "1", "--delta", "1"], ["--mode", "pure"],
                 ["--mode", "nope", "--epsilon", "1"], ["--mode", "pure", "--epsilon", "abc"]):
        r = cli("budget", "init", "x", *args)
        assert r.exit_code == 2, (args, r.stderr)
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert cli("budget", "init", "../evil", "--epsilon", "1").exit_code == 2


def test_missing_ledger_is_budget_refusal(state_dir):
    state_dir.mkdir()  # no ledger in it: exit 77 (a state directory that does not exist: 78)
    r = cli("budget", "show", "ghost")
    assert r.exit_code == 77 and "budget init ghost" in r.stderr


def test_corrupt_ledger_exit_78(state_dir):
    init_ledger("pure", "--epsilon", "1", analyst="c")
    (state_dir / "ledgers" / "c.json").write_text("garbage")
    r = cli("budget", "show", "c")
    assert r.exit_code == 78 and "corrupt" in r.stderr and "Traceback" not in r.stderr


def test_key_is_private_and_never_printed(state_dir):
    r = cli("budget", "key", "--json")
    assert r.exit_code == 0
    key_file = state_dir / "secret.key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert oct(state_dir.stat().st_mode & 0o777) == "0o700"
    secret_hex = key_file.read_text().splitlines()[1]
    assert secret_hex not in r.stdout + r.stderr
    os.chmod(key_file, 0o644)
    r = cli("budget", "key")
    assert r.exit_code == 78 and "chmod 600" in r.stderr
    os.chmod(key_file, 0o600)
    r = cli("budget", "key", "--rotate", "--json")
    d = json.loads(r.stdout)
    assert d["fingerprint"] != d["old_fingerprint"]
    assert secret_hex not in r.stdout


def test_a_ledger_that_can_never_pay_refuses_before_reading_the_data(tmp_path):
    """The tour's first histogram on a pure ledger: refused at once (exit 77), with what to do,
    without reading the data (here: a file that is not even there)."""
    init_ledger("pure", "--epsilon", "1")
    r = cli("histogram", tmp_path / "missing.csv", "--by", "country", "--privacy-unit", "user_id", "--epsilon", "0.5",
            "--delta", "1e-7")
    assert r.exit_code == 77 and "has a δ, which a pure ε-DP ledger cannot pay" in r.stderr
    assert "public list of groups" in r.stderr and history() == []
