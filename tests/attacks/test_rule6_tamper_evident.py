"""Rule 6, ledgers and the catalog are tamper-evident.

Attacks on the ledger's tamper evidence (issue 15, findings 7 and 10). Whoever edits a ledger without
the secret key (header, entries, a full rewrite with recomputed hashes, a ledger copied from another
analyst or state directory) must be caught with exit 78; so must an operator's restore of an old ledger
together with its old high-water mark. Analyst names with a trailing newline or control characters are
refused.

The review of issue 15 added a rolled-back ledger accepted by ``--reseal`` (the newer sealed mark
proves entries are missing, so a reseal is refused; a ledger restored with its mark is refused with a
message that warns against resealing), and issue 29 a catalog edited by hand (its seal fails).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from fractions import Fraction

import pytest
from dptest import init_ledger, runner
from small_tables import csv_rows, write

from dpcli.cli.app import app
from dpcli.core.accounting.budget import Limits
from dpcli.core.events import PrivacyEvent
from dpcli.errors import StateError, UsageError
from dpcli.state import ledger
from dpcli.state.paths import validate_analyst


def _ev(eps: str = "0.25") -> PrivacyEvent:
    return PrivacyEvent("pure", "discrete_laplace", epsilon=Fraction(eps))


def _spent_ledger(state_dir, analyst="a", n=2):
    ledger.init_ledger(state_dir, analyst, Limits("pure", {"epsilon": Fraction(1)}))
    for i in range(n):
        ledger.charge(state_dir, analyst, command="t", query_id="q", seed_id=f"s{i}", reserve=[_ev()])
    return state_dir / "ledgers" / f"{analyst}.json", state_dir / "ledgers" / f"{analyst}.hwm"


def _refused(*args):
    r = runner.invoke(app, list(args))
    assert r.exit_code == 78, (args, r.exit_code, r.stdout, r.stderr)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    return r


def test_a_header_edit_is_caught(state_dir):
    """Raising the limit from 1 to 1000 in the header (outside the old hash chain) is tampering."""
    path, _ = _spent_ledger(state_dir)
    doc = ledger.load_document(path, path.read_bytes())[0]
    assert doc["limits"]["epsilon"] == "1"
    for field, value in (("limits", {**doc["limits"], "epsilon": "1000"}), ("refresh_days", 1),
                         ("created", "2000-01-01T00:00:00.000000Z"), ("report_delta", 0.5)):
        path.write_bytes(ledger.dump_document({**doc, field: value}))
        _refused("budget", "verify", "a")
        _refused("budget", "show", "a")
        with pytest.raises(StateError):
            ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="x", reserve=[_ev()])


def _sha_chain(doc):
    """Recompute every hash the way anyone can without a key (the old, unkeyed chain)."""
    prev = doc.get("genesis", "0" * 64)
    for i, e in enumerate(doc["entries"], start=1):
        e["seq"], e["prev"] = i, prev
        body = {k: v for k, v in e.items() if k != "hash"}
        e["hash"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        prev = e["hash"]
    return prev


def test_a_full_rewrite_with_recomputed_hashes_is_caught(state_dir):
    """Dropping entries or shrinking costs, then recomputing the whole chain and the mark, needs the key."""
    path, hwm = _spent_ledger(state_dir)
    original = ledger.load_document(path, path.read_bytes())[0]
    for edit in ("drop", "shrink"):
        doc = json.loads(json.dumps(original))
        if edit == "drop":
            doc["entries"] = doc["entries"][:1]
        else:
            for e in doc["entries"]:
                e["events"][0]["epsilon"] = "0.0001"
        last = _sha_chain(doc)
        path.write_bytes(ledger.dump_document(doc))
        mark = json.loads(hwm.read_text())
        mark.update(count=len(doc["entries"]), hash=last)
        hwm.write_text(json.dumps(mark))
        _refused("budget", "verify", "a")
    hwm.unlink()  # no mark at all
    _refused("budget", "verify", "a")


def test_an_old_ledger_restored_with_its_old_mark_is_caught(state_dir):
    """An operator restores ledger and .hwm from a backup taken before the last charges: a refund."""
    path, hwm = _spent_ledger(state_dir, n=1)
    backup = path.read_bytes(), hwm.read_bytes()
    time.sleep(0.02)
    ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="later", reserve=[_ev("0.5")])
    time.sleep(0.02)
    path.write_bytes(backup[0])
    hwm.write_bytes(backup[1])
    r = _refused("budget", "verify", "a")
    assert "restore" in r.stderr or "replaced" in r.stderr
    with pytest.raises(StateError):
        ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="free?", reserve=[_ev("0.5")])


def test_an_old_ledger_restored_without_a_mark_is_caught(state_dir):
    path, hwm = _spent_ledger(state_dir, n=1)
    old = path.read_bytes()
    ledger.charge(state_dir, "a", command="t", query_id="q", seed_id="later", reserve=[_ev("0.5")])
    path.write_bytes(old)
    hwm.unlink()
    _refused("budget", "verify", "a")


def test_a_foreign_ledger_is_caught(state_dir, tmp_path):
    """A fresh ledger from another state directory (another key), or another analyst's, is not this one."""
    path, hwm = _spent_ledger(state_dir)
    other = tmp_path / "other-state"
    ledger.init_ledger(other, "a", Limits("pure", {"epsilon": Fraction(1)}))
    shutil.copy(other / "ledgers" / "a.json", path)
    shutil.copy(other / "ledgers" / "a.hwm", hwm)
    _refused("budget", "verify", "a")
    ledger.init_ledger(state_dir, "b", Limits("pure", {"epsilon": Fraction(1)}))
    _spent_ledger(state_dir, "c", n=0)
    for suffix in ("json", "hwm"):  # b's unspent ledger renamed to c
        shutil.copy(state_dir / "ledgers" / f"b.{suffix}", state_dir / "ledgers" / f"c.{suffix}")
    _refused("budget", "verify", "c")


@pytest.mark.parametrize("name", ["a\n", "a\r", "a\tb", "a\x00", "a\x1b[31m", "a\u2028", "", "-a", "a" * 65])
def test_analyst_names_are_matched_in_full(name):
    with pytest.raises(UsageError):
        validate_analyst(name)
    if name:  # an empty name means "the default analyst" on the command line
        r = runner.invoke(app, ["budget", "init", name, "--epsilon", "1"])
        assert r.exit_code == 2 and r.stdout == ""


def test_a_trailing_newline_does_not_make_a_second_ledger(state_dir):
    init_ledger("pure", "--epsilon", "1", analyst="a")
    assert runner.invoke(app, ["--analyst", "a\n", "budget", "show"]).exit_code == 2
    assert sorted(p.name for p in (state_dir / "ledgers").iterdir() if p.suffix == ".json") == ["a.json"]


# ---- a rolled-back ledger and --reseal (review of issue 15) --------------------------------------


def _spend_then_restore(tmp_path, state_dir, with_mark: bool) -> None:
    """Back up the ledger (and its mark if ``with_mark``), spend ε = 5, restore the backup."""
    init_ledger()
    ledger_file = state_dir / "ledgers" / "default.json"
    mark = ledger_file.with_suffix(".hwm")
    backup = ledger_file.read_bytes(), mark.read_bytes()
    rows = csv_rows(50)
    r = runner.invoke(app, ["histogram", str(write(tmp_path / "a.csv", rows)), "--by", "g", "--privacy-unit", "uid",
                            "--epsilon", "5", "--keys", str(write(tmp_path / "k.csv", ["g", "0", "1", "2"]))])
    assert r.exit_code == 0, r.stderr
    time.sleep(0.02)
    ledger_file.write_bytes(backup[0])  # the operator restores last night's backup of the state dir
    if with_mark:
        mark.write_bytes(backup[1])


def test_reseal_refuses_a_ledger_its_mark_shows_is_missing_entries(tmp_path, state_dir):
    """The ledger alone restored: the newer sealed mark proves entries are missing, so the message does
    not offer a reseal and a reseal is refused (it would hand back ε = 5)."""
    _spend_then_restore(tmp_path, state_dir, with_mark=False)
    r = runner.invoke(app, ["budget", "show", "default"])
    assert r.exit_code == 78 and "restore the newest copy" in r.stderr and "accept it with" not in r.stderr
    r = runner.invoke(app, ["budget", "verify", "default", "--reseal"])
    assert r.exit_code == 78, r.stderr
    assert runner.invoke(app, ["budget", "show", "default"]).exit_code == 78  # still refused, nothing refunded


def test_a_ledger_restored_with_its_mark_is_refused_and_the_message_warns_against_resealing(tmp_path, state_dir):
    """Ledger and mark restored together: only the file's new ctime tells. dpcli refuses it, and the
    message says a restored backup must not be resealed (that would hand back the budget spent since;
    an operator who holds key and state and reseals anyway cannot be stopped: README, "Not covered")."""
    _spend_then_restore(tmp_path, state_dir, with_mark=True)
    r = runner.invoke(app, ["budget", "show", "default"])
    assert r.exit_code == 78 and "restored backup, restore the newest copy instead" in r.stderr


# ---- the catalog's seal (issue 29) --------------------------------------------------------------


def test_a_catalog_edited_by_hand_fails_its_seal(svc):
    path = svc.state / "catalog.json"
    doc = json.loads(path.read_text())
    doc["body"]["datasets"]["visits"]["analysts"] = ["mallory"]
    path.write_text(json.dumps(doc))
    r = svc.run("alice", "budget", "show")
    assert r.exit_code == 78 and "seal" in r.stderr
