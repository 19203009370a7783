"""State written by older dpcli versions still opens (fixtures in ``tests/data/state-*``).

``state-554e946``: a ledger, a stream state and a schedule written before issue 29. A copied ledger
is a moved ledger (its ctime is new), which the operator accepts once with ``budget verify
--reseal``, as after any move; then everything opens and runs on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from dptest import cli

FIXTURE = Path(__file__).parent / "data" / "state-554e946"


@pytest.fixture
def old_state(tmp_path, monkeypatch):
    work = tmp_path / "old"
    shutil.copytree(FIXTURE, work)
    for private in (work / "state" / "secret.key", work / "stream.state", *(work / "state").rglob("*.json"),
                    *(work / "state").rglob("*.hwm"), *(work / "state").rglob("*.parquet")):
        private.chmod(0o600)
    for directory in (work / "state", *(p for p in (work / "state").rglob("*") if p.is_dir())):
        directory.chmod(0o700)
    monkeypatch.setenv("DPCLI_STATE_DIR", str(work / "state"))
    monkeypatch.chdir(work)
    return work


def test_an_old_ledger_opens_after_the_reseal_of_a_move(old_state):
    assert cli("budget", "show").exit_code == 78  # copied: the documented move, accepted once
    r = cli("budget", "verify", "--reseal")
    assert r.exit_code == 0, r.stderr
    r = cli("budget", "show", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mode"] == "approx" and doc["releases"] >= 4
    history = json.loads(cli("budget", "history", "--json").stdout)
    assert [e["command"] for e in history][:3] == ["histogram", "topk", "stream-replay --state"]


def test_an_old_stream_state_runs_on(old_state):
    assert cli("budget", "verify", "--reseal").exit_code == 0
    args = ["stream-replay", "events.csv", "--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d",
            "--triggers", "2", "--max-contributions", "2", "--epsilon", "1", "--delta", "1e-7",
            "--state", "stream.state"]
    again = cli(*args, "--through", "2026-11-02T00:00:00Z")  # the run it recorded: a free repeat
    assert again.exit_code == 0, again.stderr
    later = cli(*args, "--through", "2026-11-03T00:00:00Z")
    assert later.exit_code == 0, later.stderr
    history = json.loads(cli("budget", "history", "--json").stdout)
    assert not any(e["events"] for e in history[6:])  # covered by the old reservation: nothing new charged


def test_an_old_one_shot_query_is_charged_once_more(old_state):
    """The seed now binds how inputs are read and the calibration (CHANGELOG): a fresh seed, once."""
    assert cli("budget", "verify", "--reseal").exit_code == 0
    query = ["histogram", "views.csv", "--by", "page", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-7",
             "--json", "-o", "out.csv"]
    first = json.loads(cli(*query).stdout)
    second = json.loads(cli(*query).stdout)
    assert first["charged"] is True and second["charged"] is False


def test_an_old_bbscheduler_returns_its_last_release_and_refuses_a_new_snapshot(old_state):
    """Its epochs were defined by exact row counts (docs/commands/schedules.md, migration)."""
    assert cli("budget", "verify", "--reseal").exit_code == 0
    query = ["histogram", "--by", "page", "--privacy-unit", "user", "--keys", "pages.csv", "--schedule", "daily",
             "--total-epsilon", "2"]
    same = cli(query[0], "snap1.csv", *query[1:], "--json", "-o", "cached.csv")
    assert same.exit_code == 0, same.stderr
    assert json.loads(same.stdout)["charged"] is False
    grown = cli(query[0], "views.csv", *query[1:])
    assert grown.exit_code == 78 and "new --schedule name" in grown.stderr, grown.stderr
