"""``dpcli budget plan`` counts releases from the dry run's *events* only and drops the dry run's own refusal
(``Planned.refusal``). A refusal that is not about the balance is then lost: a stream whose ``--state`` file was
restored from an older backup (rule 2) is refused by every run (exit 78, "is at run 1 but the ledger recorded
3"), and its dry run says so, yet ``budget plan`` prints "fits now: N more like it" with N > 0. The count is
higher than what the ledger accepts (0). (The same holds for a stream or schedule state whose reservation is
missing or from another ledger period: those dry runs plan no events with a refusal, and the plan then says
"any number (it costs nothing more: covered by a reservation)".)

Fix: ``releases_that_fit`` (or ``budget plan``) must report ``Fit(0, refusal=planned.refusal)`` whenever the
dry run refuses for a reason the balance does not explain."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from dptest import cli, init_ledger

import dpcli.tasks.stream as sr

_PLANS: dict = {}
_plan_stream = sr.plan_stream


@pytest.fixture(autouse=True)
def _plan_once(monkeypatch):
    monkeypatch.setattr(sr, "plan_stream", lambda q: _PLANS.get(q) or _PLANS.setdefault(q, _plan_stream(q)))


STREAM = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "2d", "--trigger-every", "12h",
          "--max-contributions", "4", "--epsilon", "2", "--delta", "1e-9"]


def _half_day(path: Path, d: int) -> Path:
    ts = [f"2026-11-{1 + d // 2:02d}T{12 * (d % 2) + i // 6:02d}:{(i % 6) * 10:02d}:00" for i in range(60)]
    pl.DataFrame({"ts": ts, "user": [f"u{(i + 60 * d) % 150}" for i in range(60)],
                  "page": [f"p{i % 3}" for i in range(60)]}).write_csv(path)
    return path


def test_a_restored_stream_state_plans_zero_more(tmp_path, state_dir):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-6")
    days = [_half_day(tmp_path / f"d{d}.csv", d) for d in range(3)]
    s = tmp_path / "s.state"
    assert cli("stream-replay", days[0], *STREAM, "--state", s).exit_code == 0
    old = s.read_bytes()
    assert cli("stream-replay", days[1], *STREAM, "--state", s).exit_code == 0
    assert cli("stream-replay", days[2], *STREAM, "--state", s).exit_code == 0
    s.write_bytes(old)  # the operator restores yesterday's backup of the state file
    release = ["stream-replay", str(days[2]), *STREAM, "--state", str(s)]
    dry = cli(*release, "--dry-run", "--json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["ledger"]["accepts"] is False  # the dry run refuses it
    run = cli(*release)
    assert run.exit_code == 78, run.stderr  # and so does every run
    plan = cli("budget", "plan", "--json", "--", *release)
    assert plan.exit_code == 0, plan.stderr
    fit = json.loads(plan.stdout)["fit"]
    assert fit["count"] == 0 and fit["next_refused"], fit  # BUG: the plan counts several more
    runs = cli("budget", "plan", "--json", "--runs", "30", "--", *release)
    assert runs.exit_code == 0, runs.stderr
    planned = json.loads(runs.stdout)["runs"]
    assert planned["value"] is None and planned["refused"]  # not "covered": the command refuses its runs


def test_a_reserved_stream_is_not_any_number_in_a_fresh_period(tmp_path, state_dir):
    """On a ledger with ``--refresh-days`` a stream's state is covered by a reservation *of the current period*
    only: in the next period every run of it is refused ("the reservation of … is not in this ledger period",
    ``dpcli/state/ledger/steps.py`` and ``dpcli/release/stream_runs.py`` ``_covered``). ``budget plan`` computes a
    fresh period's count from the same (empty) events and says "a fresh period fits any number": higher than the
    ledger accepts (0)."""
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-6", "--refresh-days", "7")
    days = [_half_day(tmp_path / f"d{d}.csv", d) for d in range(2)]
    s = tmp_path / "s.state"
    assert cli("stream-replay", days[0], *STREAM, "--state", s).exit_code == 0
    plan = cli("budget", "plan", "--json", "--", "stream-replay", str(days[1]), *STREAM, "--state", str(s))
    assert plan.exit_code == 0, plan.stderr
    doc = json.loads(plan.stdout)
    assert doc["fit"]["count"] is None  # now: covered by the reservation (right)
    assert doc["period"]["fresh"]["count"] is not None, doc["period"]  # BUG: "any number" in the next period
