"""Rule 10's timing clause for the runs after a stream's or a schedule's first: a run killed after it began
reading has paid, and its rerun is a free replay of it, never a fresh probe of other data.

A stream (``--state``) and a schedule reserve their whole budget before their *first* run reads (issue 37,
``test_rule10_killed_runs_pay.py``). A *later* run reads its input (a stream's new events, a schedule's
snapshot: the size test, the release) before the ledger holds anything of it: its step (input digest) is
recorded only once it has been computed. A later run killed (a timeout, Ctrl-C relayed by sudo, SIGKILL)
after it began reading therefore leaves no trace, and the next run may read *other* data at the same step,
covered by the same reservation. In service mode an analyst who names several catalog datasets (or waits
for the operator's next snapshot) times the reading of each one and kills the run before it records its
step, as often as they like, for no ε: every timing probe past the first run is free.

The probe is the killed-run test's (every private collect records what the ledger holds, then kills the
run). Here it requires that a later run's first private read finds the ledger grown by a record of that
run (its step begun, with its input's digest), and that the next run on other data at that step is not a
fresh, free run. The same holds for a *first* run killed after its reservation: the next run, on another
input, finds the reservation made and the state still at step 0, and reads that input under the same
reservation (the last test: three inputs probed for one reservation). Found open by the second review of
issue 37; fixed: every run of a stream or schedule is marked as begun, with its input's digest, before it
reads (``ledger.start_step``), and another input at a run that never ended pays the reservation again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dptest import init_ledger, runner
from killed_runs import kill_at_first_read

from dpcli.cli.app import app


def _entries(state: Path) -> list[dict[str, Any]]:
    path = state / "ledgers" / "default.json"
    return [json.loads(line) for line in path.read_bytes().splitlines()[1:] if line.strip()]


def _paid(state: Path) -> int:
    """How many ledger entries cost something."""
    return sum(1 for e in _entries(state) if e.get("events"))


def _last_step(state: Path) -> int:
    """The step (``from``) of the ledger's last recorded run of a reservation."""
    return max(e["step"]["from"] for e in _entries(state) if isinstance(e.get("step"), dict))


def _probe(monkeypatch: pytest.MonkeyPatch, state: Path) -> list[int]:
    """Every collect of private data records how many ledger entries are on disk, then kills the run."""
    return kill_at_first_read(monkeypatch, lambda: len(_entries(state)))


def _events(path: Path, hours: range, users: int = 40) -> Path:
    rows = [{"user": f"u{i % users}", "g": "ab"[i % 2], "t": f"2026-01-01T{h:02d}:{i % 60:02d}:00"}
            for h in hours for i in range(50)]
    pl.DataFrame(rows).write_csv(path)
    return path


def _stream(data: Path, state: Path, through: str) -> list[str]:
    return ["stream-replay", str(data), "--time", "t", "--by", "g", "--privacy-unit", "user", "--window", "1h",
            "--triggers", "8", "--epsilon", "1", "--delta", "1e-6", "--max-contributions", "1", "--state",
            str(state), "--through", through]


def _schedule(data: Path, keys: Path) -> list[str]:
    return ["histogram", str(data), "--by", "g", "--privacy-unit", "user", "--keys", str(keys), "--schedule", "s",
            "--scheduler", "fixed", "--epsilon", "0.5", "--total-epsilon", "2"]


def test_attack_a_later_stream_run_killed_at_its_first_read_has_left_a_record(tmp_path, monkeypatch, state_dir):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    state = tmp_path / "s.state"
    first = runner.invoke(app, _stream(_events(tmp_path / "day1.csv", range(2)), state, "2026-01-01T02:00:00"))
    assert first.exit_code == 0, first.stderr
    before = len(_entries(state_dir))
    with monkeypatch.context() as patched:
        seen = _probe(patched, state_dir)
        # the probe: other events (one catalog dataset among several), timed, killed before its step is recorded
        probed = runner.invoke(app, _stream(_events(tmp_path / "probe.csv", range(2, 4), users=7), state,
                                            "2026-01-01T04:00:00"))
    assert probed.exit_code != 0 and probed.stdout == "" and seen
    assert all(n > before for n in seen), "the later run read its events before the ledger held a record of it"
    # and the next run on other events at that same step must not be a fresh run the reservation covers for free
    paid = _paid(state_dir)
    other = runner.invoke(app, _stream(_events(tmp_path / "day2.csv", range(2, 4)), state, "2026-01-01T04:00:00"))
    assert other.exit_code != 0 or _last_step(state_dir) > 1 or _paid(state_dir) > paid, (
        "another input got the killed run's step (1) fresh, covered by the reservation")


def test_attack_a_later_schedule_run_killed_at_its_first_read_has_left_a_record(tmp_path, monkeypatch, state_dir):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\n")
    first = runner.invoke(app, _schedule(_events(tmp_path / "snap1.csv", range(2)), keys))
    assert first.exit_code == 0, first.stderr
    before = len(_entries(state_dir))
    with monkeypatch.context() as patched:
        seen = _probe(patched, state_dir)
        probed = runner.invoke(app, _schedule(_events(tmp_path / "probe.csv", range(3), users=7), keys))
    assert probed.exit_code != 0 and probed.stdout == "" and seen
    assert all(n > before for n in seen), "the later run read its snapshot before the ledger held a record of it"
    paid = _paid(state_dir)
    other = runner.invoke(app, _schedule(_events(tmp_path / "snap2.csv", range(3)), keys))
    assert other.exit_code != 0 or _last_step(state_dir) > 1 or _paid(state_dir) > paid, (
        "another snapshot got the killed run's step (run 2) fresh, covered by the reservation")


@pytest.mark.parametrize("command", ["stream", "schedule"])
def test_attack_a_killed_first_run_s_reservation_covers_probes_of_other_inputs(tmp_path, monkeypatch, state_dir,
                                                                              command):
    """The first run reserves before it reads, and is killed: that probe paid. A rerun on the *same* input is a
    free replay (``test_rule10_killed_runs_pay.py``). But a rerun on *another* input finds the reservation made
    and the state still at step 0: it reads that other input covered by the same reservation, and may be killed
    too, as often as the analyst likes. Each probe of a new input must leave a new record (or be refused)."""
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\n")
    state = tmp_path / "s.state"

    def args(data: Path) -> list[str]:
        return _stream(data, state, "2026-01-01T02:00:00") if command == "stream" else _schedule(data, keys)

    counts = []
    for i, users in enumerate((40, 7, 3)):  # three inputs, each read and killed at its first private collect
        with monkeypatch.context() as patched:
            seen = _probe(patched, state_dir)
            probed = runner.invoke(app, args(_events(tmp_path / f"probe{i}.csv", range(2), users=users)))
        assert probed.exit_code != 0 and probed.stdout == "" and seen
        counts.append(seen[0])
    assert counts[0] >= 1, "the first probe found the reservation on disk (issue 37 holds)"
    assert counts[0] < counts[1] < counts[2], f"probes of other inputs found the ledger unchanged: {counts}"
