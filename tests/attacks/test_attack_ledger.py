"""Attacks on the ledger's tamper evidence (issue 15, findings 7 and 10).

Whoever edits a ledger without the secret key (header, entries, a full rewrite with recomputed hashes,
a ledger copied from another analyst or state directory) must be caught with exit 78; so must an
operator's restore of an old ledger together with its old high-water mark. Analyst names with a
trailing newline or control characters are refused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from fractions import Fraction

import pytest
from typer.testing import CliRunner

from dpcli.cli.app import app
from dpcli.core.accounting.budget import Limits
from dpcli.core.events import PrivacyEvent
from dpcli.errors import StateError, UsageError
from dpcli.state import ledger
from dpcli.state.paths import validate_analyst

runner = CliRunner()


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
    assert runner.invoke(app, ["budget", "init", "a", "--epsilon", "1"]).exit_code == 0
    assert runner.invoke(app, ["--analyst", "a\n", "budget", "show"]).exit_code == 2
    assert sorted(p.name for p in (state_dir / "ledgers").iterdir() if p.suffix == ".json") == ["a.json"]
