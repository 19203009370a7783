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
    """A state written before issue 31 (no kept events, no run end): its last run is a free retry, new
    events run on under the reservation it made, and events past --through are kept from now on."""
    assert cli("budget", "verify", "--reseal").exit_code == 0
    args = ["stream-replay", "--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d",
            "--triggers", "2", "--max-contributions", "2", "--epsilon", "1", "--delta", "1e-7",
            "--state", "stream.state"]
    again = cli(args[0], "events.csv", *args[1:], "--through", "2026-11-02T00:00:00Z")  # the run it recorded
    assert again.exit_code == 0 and "a retry" in again.stderr, again.stderr
    day2 = old_state / "day2.csv"
    day2.write_text("ts,user,page\n" + "".join(f"2026-11-02T{h:02d}:30:00Z,w{h}-{i},/p/{i % 3}\n"
                                              for h in range(24) for i in range(40)))
    noon = cli(args[0], day2, *args[1:], "--through", "2026-11-02T12:00:00Z")
    assert noon.exit_code == 0, noon.stderr
    assert cli(args[0], "events.csv", *args[1:], "--through", "2026-11-02T00:00:00Z").exit_code == 2  # a rewrite
    body = json.loads((old_state / "stream.state").read_text())["body"]
    assert body["stream"]["kept"] and body["last"]["until"] == "2026-11-02T12:00:00+00:00"
    empty = old_state / "none.csv"
    empty.write_text("ts,user,page\n")
    night = cli(args[0], empty, *args[1:], "--through", "2026-11-03T00:00:00Z")
    assert night.exit_code == 0 and night.stdout.count("\n") > 1, night.stderr  # the afternoon's kept events
    history = json.loads(cli("budget", "history", "--json").stdout)
    assert not any(e["events"] for e in history[6:])  # covered by the old reservation: nothing new charged
    assert [e["replay_of"] is not None for e in history[-3:]] == [True, False, False]


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
