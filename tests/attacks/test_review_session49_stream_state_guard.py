"""Review session 49 (commit 81d5aa7, the continuation refactor): a probe that passed, kept as a test.

The refactor moved the stream's state file out of the release path into ``StreamRuns.guarded()``, which
``release.run`` adds to the paths the output may never be (before 81d5aa7: ``_open_checked``'s ``extra``). If a
continuation stopped guarding its state file, ``-o`` naming it would write the release over the stream's state
(a fresh stream on the next run: a run made free of its reservation's history), or, with the check moved after
opening, read the input first. The probe: ``-o`` naming the state file is refused (exit 73) from the CLI and from
``release.run`` with ``StreamRuns``, before any input is opened, with nothing written to the ledger and no state
file created; and a stream without a state file (``StreamRuns()``) still pays as one release (its replay free).
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from dptest import cli, init_ledger

from dpcli import release
from dpcli.access import Source
from dpcli.errors import OutputError

ARGS = ["--time", "ts", "--by", "g", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "1h",
        "--epsilon", "1", "--delta", "1e-6", "--max-contributions", "3", "--through", "2026-11-02T00:00:00"]


def _events(tmp_path):
    path = tmp_path / "events.csv"
    path.write_text("ts,user,g\n" + "".join(f"2026-11-01T0{i % 10}:10:00,u{i},{'ab'[i % 2]}\n" for i in range(40)))
    return path


def _history() -> list:
    r = cli("budget", "history", "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def _no_open(monkeypatch):
    from dpcli.release import path as release_path

    monkeypatch.setattr(release_path, "open_sources", lambda *a, **k: pytest.fail("an input was opened"))


def test_the_output_never_overwrites_the_streams_state_file_and_is_refused_before_opening(tmp_path, state_dir,
                                                                                         monkeypatch):
    init_ledger("approx", "--epsilon", "5", "--delta", "1e-5")
    data, state = _events(tmp_path), tmp_path / "s.stream"
    _no_open(monkeypatch)
    r = cli("stream-replay", data, *ARGS, "--state", state, "--format", "csv", "-o", state)
    assert r.exit_code == 73 and "write it elsewhere" in r.stderr, r.stderr
    assert not state.exists() and _history() == []

    from dpcli.cli.stream_replay import _query  # the options turned into a query, as the command does
    from dpcli.tasks.stream.task import StreamTask

    moment = datetime(2026, 11, 2)
    task = StreamTask(_query("ts", "g", "user", "1d", None, "1h", "3", "1", "1e-6", None, None, 0), moment)
    with pytest.raises(OutputError):
        release.run(task, release.Sources(Source(str(data), str(data))), release.LedgerRef(state_dir, "default"),
                    output=release.Output(str(state), "csv"),
                    continuation=release.StreamRuns(state, through=moment))
    assert not state.exists() and _history() == []


def test_a_stream_without_a_state_file_still_pays_as_one_release(tmp_path, state_dir):
    init_ledger("approx", "--epsilon", "5", "--delta", "1e-5")
    data = _events(tmp_path)
    first = cli("stream-replay", data, *ARGS, "-o", tmp_path / "a.csv", "--json")
    again = cli("stream-replay", data, *ARGS, "-o", tmp_path / "b.csv", "--json")
    assert first.exit_code == 0 and again.exit_code == 0, (first.stderr, again.stderr)
    assert json.loads(first.stdout)["charged"] and not json.loads(again.stdout)["charged"]
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    entries = _history()
    assert [e["command"] for e in entries if e["events"]] == ["stream-replay"]  # one debit, before it read
    assert entries[-1]["replay_of"] is not None and entries[-1]["reservation"] is None  # no reservation made
