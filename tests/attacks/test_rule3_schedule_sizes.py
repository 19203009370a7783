"""Rule 3 for ``--schedule``: no run tells anyone how big its snapshot is.

Attack (issue 29). An analyst runs a schedule over daily snapshots and reads what dpcli makes public.
Before the fix each snapshot's exact row count was in the ``--json`` summary (``computed_on_rows``), in
the ledger line of each run ("epoch 4 (computed on 6000 rows)"), in ``budget show --json``
(``last_size``), and in the error of a snapshot smaller than the last ("snapshot has N rows, fewer than
the M …", exit 65). Epochs also started at exact row counts, so whether a run was new or cached told
the row count to within one row.

Both tests here use only the command line, so they run on the code before the fix too (and fail
there): ``PYTHONPATH=<old checkout> pytest tests/attacks/test_rule3_schedule_sizes.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from dptest import cli, init_ledger, ledger_argv
from report_diff import Report, counted_tokens, report_diff, run_cli

#: The golden tests' key: the noise (and so every noisy estimate checked below) is fixed.
FIXED_KEY = b"dpcli-secret-key-v1\n" + bytes(range(32)).hex().encode() + b"\n"

#: Rows of each day's snapshot; the last one shrank. Every fourth row repeats the previous row's unit.
DAYS = (2311, 2789, 4153, 2011)
SCHEDULES = {
    "bbscheduler": [],
    "bbscheduler-gamma": ["--gamma", "0.1"],
    "bbimprover": ["--scheduler", "bbimprover", "--total-delta", "1e-6"],
    "fixed": ["--scheduler", "fixed", "--epsilon", "0.1"],
}


def _snapshot(rows: int, extra_unit: bool = False) -> str:
    """``rows`` rows of units u0, u1, … (every fourth row repeats a unit); ``extra_unit`` adds one unit of 3 rows."""
    lines = [f"u{i - i // 4},{'abc'[i % 3]}" for i in range(rows)]
    if extra_unit:
        lines += ["newcomer,a", "newcomer,b", "newcomer,a"]
    return "user,g\n" + "\n".join(lines) + "\n"


def _units(rows: int) -> int:
    return len({i - i // 4 for i in range(rows)})


def _exact_sizes() -> set[int]:
    return {n for rows in DAYS for n in (rows, _units(rows))}


def _numbers(text: str) -> set[int]:
    """Every integer written on its own in ``text`` (not inside a decimal, a hex digest or a word)."""
    return {int(m) for m in re.findall(r"(?<![0-9A-Za-z.])\d+(?![0-9A-Za-z.])", text)}


def _fixed_key(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (state_dir / "secret.key").write_bytes(FIXED_KEY)
    (state_dir / "secret.key").chmod(0o600)


@pytest.mark.parametrize("scheduler", sorted(SCHEDULES))
def test_no_output_of_a_schedule_holds_a_snapshot_size(scheduler, tmp_path, state_dir):
    """Summaries, --json, messages, exit codes, the ledger and budget show hold no row or unit count."""
    _fixed_key(state_dir)
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    public = []
    # The schedule's reservation id and secret come from a counter too: with the fixed key the whole run is
    # fixed (a random secret made this test flaky: a noisy value can equal a size when its noise is 0).
    with counted_tokens():
        for day, rows in enumerate(DAYS):
            snap = tmp_path / f"day{day}.csv"
            snap.write_text(_snapshot(rows))
            r = cli("histogram", snap, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--schedule", "daily",
                    "--total-epsilon", "1", *SCHEDULES[scheduler], "--json", "-o", "-")
            assert r.exit_code == 0, (day, r.stderr)  # a smaller snapshot is no error either
            public += [r.stdout, r.stderr]
    for args in (["budget", "history", "--json"], ["budget", "show", "--json"], ["budget", "show"]):
        public.append(cli(*args).stdout)
    leaked = _exact_sizes() & _numbers("\n".join(public))
    assert not leaked, f"exact snapshot sizes in the public output: {sorted(leaked)}"


# ---- D and D′ = D plus one privacy unit, under one forced seed ------------------------------------


def _run_days(tmp: Path, label: str, extra_unit: bool, schedule: Sequence[str]) -> list[Report]:
    """One schedule over the days' snapshots (one path, rewritten each day), in a fresh state directory,
    its state ids and secrets from a counter restarted here (so D's and D′'s are the same)."""
    keys, data = tmp / "keys.csv", tmp / "snapshot.csv"
    keys.write_text("g\na\nb\nc\n")
    state = tmp / f"state-{label}"
    init = [ledger_argv("approx", "--epsilon", "10", "--delta", "1e-5")]
    reports = []
    with counted_tokens():
        for day, rows in enumerate((20000, 20500, 37000, 85000, 30000)):
            data.write_text(_snapshot(rows, extra_unit))
            args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--schedule", "daily",
                    "--total-epsilon", "1", *schedule, "--json", "-o", "-"]
            reports.append(run_cli([str(a) for a in args], state, init if day == 0 else ()))
    return reports


#: Noisy values, or functions of noisy values only (the start estimate ñ gives α).
NOISY = {"json.summary.schedule.units_noisy", "json.summary.schedule.alpha",
         # the run's input digest is keyed by the state's secret over the snapshot's fingerprint
         "ledger.*.step.input"}

#: With γ from Algorithm 1, γ is a function of ñ, and so is every ε computed from it.
NOISY_GAMMA = {"json.summary.schedule.gamma", "json.summary.schedule.run_epsilon", "json.summary.schedule.*_spent",
               "json.summary.epsilon", "json.summary.seed_id",
               "json.summary.measurements.*", "ledger.*.summary", "ledger.*.seed_id", "ledger.*.query_id"}


@pytest.mark.parametrize("scheduler", sorted(SCHEDULES))
def test_a_schedule_cannot_tell_d_from_d_plus_one_unit(scheduler, tmp_path):
    """Five days (a first run, a day inside epoch 0, two growths, a shrink) on D and on D′ = D plus one
    unit of three rows, with the noise forced equal: every run's exit code, stderr, --json and the
    ledger agree but for noisy values. The sizes are far from the epoch boundaries (γ = 0.5 there),
    so that the noisy decisions agree too."""
    schedule = SCHEDULES[scheduler] if scheduler != "bbscheduler-gamma" else ["--gamma", "0.5"]
    noisy = NOISY | (NOISY_GAMMA if scheduler == "bbscheduler" else set())
    d = _run_days(tmp_path, "D", False, schedule)
    d2 = _run_days(tmp_path, "D-prime", True, schedule)
    for day, (a, b) in enumerate(zip(d, d2)):
        assert a.exit_code == 0, (day, a.stderr)
        if scheduler == "bbscheduler":  # the run's ε follows γ, from the noisy start estimate: the note's too
            for r in (a, b):
                r.stderr = re.sub(r"used ε = \S+ of", "used ε = (noisy) of", r.stderr)
        diff = report_diff(a, b, noisy)
        assert diff == [], f"day {day}: D and D′ are told apart by:\n" + "\n".join(diff)
    if scheduler == "bbscheduler-gamma":
        cached = [json.loads(r.stdout)["summary"]["schedule"]["cached"] for r in d]
        assert cached == [False, True, False, False, True]  # the decisions themselves were exercised
