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
from typer.testing import CliRunner

from dpcli.cli.app import app
from dpcli.state import ledger

runner = CliRunner()

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

def replace(a, b):
    calls["replace"] += 1
    if step == "before-rename" and calls["replace"] == n:
        die()
    real_replace(a, b)
    if step == "after-rename" and calls["replace"] == n:
        die()

atomic.os.fsync, atomic.os.replace = fsync, replace
if step == "between-debit-and-output":
    import dpcli.cli._release as rel
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
    assert runner.invoke(app, ["budget", "init", "default", "--mode", "pure", "--epsilon", "5"]).exit_code == 0
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
