"""Writes tests/data/legacy_schedules/: schedule states made before sizes were noisy (issue 29).

The state directory here was written by dpcli at commit 554e946 (main before issue 29), whose
schedules stored exact row counts (``n0``, each run's ``size``, γ computed from ``n0``). The
migration tests (tests/test_schedules.py) copy it and run today's code on it. To write it again,
from a checkout of that commit::

    PYTHONPATH=/path/to/checkout python tests/data/legacy_schedules/make.py tests/data/legacy_schedules

It makes four schedules over two snapshots: ``daily`` (bbscheduler, --gamma 0.1, two epochs),
``imp`` (bbimprover, --improver-index rows, c = 0.2, two runs), ``old`` (bbimprover as dpcli 0.2
made it: c = 0.25 and rows, one run) and ``weekly`` (fixed, one run). The key is a test key.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

KEY = b"dpcli-secret-key-v1\n" + bytes(range(32)).hex().encode() + b"\n"  # the golden tests' key


def snapshot(rows: int) -> str:
    """One row per privacy unit, three groups; the first rows of every snapshot are the same."""
    return "user,g\n" + "".join(f"u{i},{'abc'[i % 3]}\n" for i in range(rows))


def main(out: Path) -> None:
    from dpcli.cli import _schedule
    from dpcli.cli.app import app

    state, data = out / "state", out / "data"
    for d in (state, data):
        shutil.rmtree(d, ignore_errors=True)
    data.mkdir(parents=True)
    state.mkdir(mode=0o700)
    (state / "secret.key").write_bytes(KEY)
    (state / "secret.key").chmod(0o600)
    (data / "keys.csv").write_text("g\na\nb\nc\n")
    for name, rows in (("snap1.csv", 1500), ("snap2.csv", 2600)):
        (data / name).write_text(snapshot(rows))
    os.environ["DPCLI_STATE_DIR"] = str(state)
    runner = CliRunner()

    def run(*args: str) -> None:
        r = runner.invoke(app, list(args))
        assert r.exit_code == 0, (args, r.stderr)

    run("budget", "init", "default", "--mode", "approx", "--epsilon", "20", "--delta", "1e-5")
    hist = ["--by", "g", "--privacy-unit", "user", "--keys", str(data / "keys.csv"), "--total-epsilon", "1", "--json"]
    imp = ["--scheduler", "bbimprover", "--total-delta", "1e-6"]
    for snap in ("snap1.csv", "snap2.csv"):
        run("histogram", str(data / snap), *hist, "--schedule", "daily", "--gamma", "0.1")
        run("histogram", str(data / snap), *hist, "--schedule", "imp", *imp, "--improver-index", "rows",
            "--improver-c", "0.2")
    real = _schedule.schedule_spec
    _schedule.schedule_spec = lambda *a, **k: replace(real(*a, **k), c=0.25, index="rows")  # dpcli 0.2's defaults
    run("histogram", str(data / "snap1.csv"), *hist, "--schedule", "old", *imp)
    _schedule.schedule_spec = real
    run("histogram", str(data / "snap1.csv"), *hist, "--schedule", "weekly", "--scheduler", "fixed", "--epsilon", "0.3")
    for lock in state.rglob("*.lock"):
        lock.unlink()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
