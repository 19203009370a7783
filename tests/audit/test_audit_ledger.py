"""Audit: the ledger under a crash at every write step (random kills and parallel writers: test_ledger.py).

A crash is a SIGKILL the child sends itself at a chosen step (functions patched in the child only,
no hook in dpcli). After each: the ledger parses and verifies, what was released (an output file
exists) is covered by the debits, and retrying the same command is a free replay, so the query is
charged exactly once overall.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from dptest import init_ledger, runner

from dpcli.cli.app import app
from dpcli.state import ledger

_CHILD = """
import os, signal, sys
step, n = sys.argv[1], int(sys.argv[2])
calls = {"fsync": 0, "replace": 0}

def die():
    os.kill(os.getpid(), signal.SIGKILL)

import dpcli.state.atomic as atomic
real_fsync, real_replace = os.fsync, os.replace

def fsync(fd):
    calls["fsync"] += 1
    if step == "before-fsync" and calls["fsync"] == n:
        die()
    real_fsync(fd)

def replace(a, b, **kw):
    calls["replace"] += 1
    if step == "before-rename" and calls["replace"] == n:
        die()
    real_replace(a, b, **kw)
    if step == "after-rename" and calls["replace"] == n:
        die()

atomic.os.fsync, atomic.os.replace = fsync, replace
if step == "between-debit-and-output":
    import dpcli.cli.render as rel
    def write_output(*a, **k):
        die()
    rel.write_output = write_output
from dpcli.cli.app import app
sys.argv = ["dpcli", *sys.argv[3:]]
app()
"""

STEPS = [("before-fsync", 1), ("before-fsync", 2), ("before-rename", 1), ("after-rename", 1), ("after-rename", 2),
         ("between-debit-and-output", 1)]


@pytest.mark.parametrize("step,n", STEPS)
def test_a_kill_at_each_write_step_never_corrupts_or_undercounts(tmp_path, state_dir, step, n):
    init_ledger("pure", "--epsilon", "5")
    data, out = tmp_path / "d.csv", tmp_path / "out.csv"
    data.write_text("u,g\n" + "".join(f"u{i},g{i % 3}\n" for i in range(50)))
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    args = ["histogram", str(data), "--by", "g", "--privacy-unit", "u", "--keys", str(tmp_path / "k.csv"),
            "--epsilon", "1", "-o", str(out)]
    (tmp_path / "k.csv").write_text("g\ng0\ng1\ng2\n")
    env = {**os.environ, "DPCLI_STATE_DIR": str(state_dir)}
    p = subprocess.run([sys.executable, str(script), step, str(n), *args], env=env, capture_output=True)
    assert p.returncode == -signal.SIGKILL, (step, n, p.returncode, p.stderr[-300:])
    verify = runner.invoke(app, ["budget", "verify"])
    assert verify.exit_code == 0, verify.stderr  # parses, hash chain and high-water mark intact
    spent = ledger.read_ledger(state_dir, "default").spend().epsilon
    assert spent >= (1 if out.exists() else 0)
    retry = runner.invoke(app, args)
    assert retry.exit_code == 0, retry.stderr
    assert out.exists()
    charged = [e for e in json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
               if e["events"] and not e.get("replay_of")]
    assert len(charged) == 1 and ledger.read_ledger(state_dir, "default").spend().epsilon == 1


# ---- runs against state files (--schedule, stream-replay --state) ----------------------------------
# Renames in a first run: 1 the new state at step 0, 2 the ledger, 3 its high-water mark, (schedule: 4 the
# cached release,) then the state, then the -o output. In a later run there is no step-0 write.

STATE_KILLS = [("schedule", 0, n) for n in range(1, 7)] + [("schedule", 1, n) for n in range(1, 6)] + \
    [("stream", 0, n) for n in range(1, 6)] + [("stream", 1, n) for n in range(1, 5)]
FAST_STATE_KILLS = {("schedule", 1, 2), ("stream", 0, 3)}


def _state_job(kind, tmp_path, run):
    if kind == "schedule":
        (tmp_path / "k.csv").write_text("g\ng0\ng1\ng2\n")
        # The second snapshot grows far past the next epoch's start: the crossing test's noise (scale ~700 units
        # here, docs/commands/schedules.md) is then 40 scales short of answering "not yet".
        for i, n in enumerate((100, 30000)):
            (tmp_path / f"d{i}.csv").write_text("u,g\n" + "".join(f"u{j},g{j % 3}\n" for j in range(n)))
        return ["histogram", str(tmp_path / f"d{run}.csv"), "--by", "g", "--privacy-unit", "u", "--keys",
                str(tmp_path / "k.csv"), "--schedule", "s", "--total-epsilon", "1", "--gamma", "0.1",
                "-o", str(tmp_path / "out.csv")]
    for i in range(2):
        (tmp_path / f"d{i}.csv").write_text("ts,u,g\n" + "".join(
            f"2026-11-01T{12 * i + j // 4:02d}:{(j % 4) * 15:02d}:00,u{j},g{j % 3}\n" for j in range(40)))
    return ["stream-replay", str(tmp_path / f"d{run}.csv"), "--time", "ts", "--by", "g", "--privacy-unit", "u",
            "--window", "1d", "--triggers", "2", "--max-contributions", "2", "--epsilon", "1", "--delta", "1e-9",
            "--state", str(tmp_path / "s.state"), "-o", str(tmp_path / "out.csv")]


@pytest.mark.parametrize("kind,run,n", [k if k in FAST_STATE_KILLS else pytest.param(*k, marks=pytest.mark.audit)
                                        for k in STATE_KILLS])
def test_a_kill_at_each_write_of_a_state_run_never_undercounts_or_reuses(tmp_path, state_dir, kind, run, n):
    """Killed after the n-th rename of run ``run``: the ledger verifies, the same command then succeeds, the
    reservation is charged exactly once and every run is recorded once in the ledger and in the state."""
    init_ledger("approx", "--epsilon", "5", "--delta", "1e-6")
    if run:
        first = runner.invoke(app, _state_job(kind, tmp_path, 0))
        assert first.exit_code == 0, first.stderr
    args = _state_job(kind, tmp_path, run)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "DPCLI_STATE_DIR": str(state_dir)}
    p = subprocess.run([sys.executable, str(script), "after-rename", str(n), *args], env=env, capture_output=True)
    assert p.returncode == -signal.SIGKILL, (kind, run, n, p.returncode, p.stderr[-300:])
    assert runner.invoke(app, ["budget", "verify"]).exit_code == 0
    retry = runner.invoke(app, args)
    assert retry.exit_code == 0, retry.stderr
    history = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
    assert len([e for e in history if e["events"]]) == 1  # the reservation, once
    steps = [e for e in history if e["step"] and not e["replay_of"]]
    assert [e["step"]["from"] for e in steps] == list(range(run + 1))
    again = runner.invoke(app, args)  # and now an ordinary repeat: the same release
    assert again.exit_code == 0 and (tmp_path / "out.csv").exists()
