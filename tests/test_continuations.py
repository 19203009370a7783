"""Issue 40, item 2: one continuation protocol. Plain, scheduled and stream runs are three continuations of the one
path (``release.run``, ``release.plan``); a library caller who names a continuation meets the refusals and gets
the plans the CLI gives, and the CLI builds a continuation and calls the path, never a path of its own."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import polars as pl
import pytest
from dptest import cli, init_ledger

from dpcli import release
from dpcli.access import Source
from dpcli.core.schedules import ScheduleSpec
from dpcli.errors import UsageError
from dpcli.tasks import ExpectedSize
from dpcli.tasks.histogram import HistogramQuery, HistogramTask
from dpcli.tasks.stream.task import StreamTask

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "d.csv"
    pl.DataFrame({"user": [f"u{i}" for i in range(300)], "g": ["abc"[i % 3] for i in range(300)]}).write_csv(path)
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    return path, keys


def _spec(**given) -> ScheduleSpec:
    fields = dict(name="daily", scheduler="bbscheduler", total_epsilon=Fraction(1), total_delta=Fraction(0),
                  gamma=None, beta=0.05, c=0.1, run_epsilon=None)
    return ScheduleSpec(**{**fields, **given})


def _payer(state_dir: Path) -> release.LedgerRef:
    return release.LedgerRef(state_dir, "default")


def test_a_library_schedule_refuses_a_query_no_schedule_runs_as_the_cli_does(data, state_dir):
    """Without a public list a histogram is thresholded, which no schedule runs: the same words, the same
    exit code, before anything is read or charged, from the CLI and from ``release.run``."""
    path, _ = data
    init_ledger("pure", "--epsilon", "5")
    r = cli("histogram", path, "--by", "g", "--privacy-unit", "user", "--schedule", "daily", "--total-epsilon", "1")
    assert r.exit_code == 2
    task = HistogramTask(HistogramQuery(by=("g",), unit="user", aggregations=("count",), epsilon=Fraction(1),
                                        domain="threshold", delta=Fraction(1, 10**6)))
    with pytest.raises(UsageError) as err:
        release.run(task, release.Sources(Source(str(path), str(path))), _payer(state_dir),
                    continuation=release.Scheduled(_spec()))
    assert err.value.detail in r.stderr
    assert json.loads(cli("budget", "history", "--json").stdout) == []


def test_only_a_stream_runs_against_a_state_file(data, state_dir, tmp_path):
    path, keys = data
    init_ledger("pure", "--epsilon", "5")
    task = HistogramTask(HistogramQuery(by=("g",), unit="user", aggregations=("count",), epsilon=Fraction(1),
                                        domain="keys"))
    sources = release.Sources(Source(str(path), str(path)), {"keys": Source(str(keys), str(keys), public=True)})
    with pytest.raises(UsageError, match="does not run against a --state file"):
        release.run(task, sources, _payer(state_dir), continuation=release.StreamRuns(tmp_path / "s.json"))
    with pytest.raises(UsageError, match="does not run against a --state file"):  # nor is it planned so
        release.plan(task, _payer(state_dir), sources, continuation=release.StreamRuns(tmp_path / "s.json"))
    # without a state file a stream's continuation is one release: the same release as the default's
    done = release.run(task, sources, _payer(state_dir), continuation=release.StreamRuns())
    again = release.run(task, sources, _payer(state_dir))
    assert done.report["charged"] and not again.report["charged"] and done.table.equals(again.table)


def test_the_library_dry_run_of_a_schedule_is_the_clis(data, state_dir):
    path, keys = data
    init_ledger("pure", "--epsilon", "5")
    r = cli("histogram", path, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--schedule", "daily",
            "--total-epsilon", "1", "--dry-run", "--units", "1000:3000", "--runs", "5", "--json")
    assert r.exit_code == 0, r.stderr
    shown = json.loads(r.stdout)
    task = HistogramTask(HistogramQuery(by=("g",), unit="user", aggregations=("count",), epsilon=None,
                                        domain="keys"), defaulted=("max_contributions", "max_partitions"))
    sources = release.Sources(Source(str(path), str(path)), {"keys": Source(str(keys), str(keys), public=True)})
    planned = release.plan(task, _payer(state_dir), sources, runs=5,
                           continuation=release.Scheduled(_spec(), size=ExpectedSize(1000, 3000, counts="units")))
    assert planned.refusal is None and {k: v for k, v in shown.items() if k != "ledger"} == planned.description


def test_the_library_dry_run_of_a_stream_is_the_clis(tmp_path, state_dir):
    init_ledger("approx", "--epsilon", "5", "--delta", "1e-5")
    path = tmp_path / "events.csv"
    path.write_text("ts,user,g\n2026-11-01T00:10:00,u1,a\n")
    r = cli("stream-replay", path, "--time", "ts", "--by", "g", "--privacy-unit", "user", "--window", "1d",
            "--trigger-every", "1h", "--epsilon", "1", "--delta", "1e-6", "--max-contributions", "3",
            "--through", "2026-11-02T00:00:00", "--dry-run", "--runs", "3", "--json")
    assert r.exit_code == 0, r.stderr
    shown = json.loads(r.stdout)
    from datetime import datetime

    from dpcli.cli.stream_replay import _query  # the options turned into a query, as the command does

    moment = datetime(2026, 11, 2)
    query = _query("ts", "g", "user", "1d", None, "1h", "3", "1", "1e-6", None, None, 0)
    planned = release.plan(StreamTask(query, moment), _payer(state_dir), release.Sources(Source(str(path), str(path))),
                           runs=3, continuation=release.StreamRuns(through=moment))
    assert {k: v for k, v in shown.items() if k != "ledger"} == planned.description
    assert len(planned.description["stream"]["runs"]) == 3


#: What only the release path may name: the continuations' modules (but the values the CLI renders) and their internals.
INTERNAL_MODULES = {"dpcli.release.plain", "dpcli.release.scheduled", "dpcli.release.schedules",
                    "dpcli.release.schedule_runs", "dpcli.release.schedule_state",
                    "dpcli.release.schedule_plan", "dpcli.release.streams", "dpcli.release.stream_runs",
                    "dpcli.release.path", "dpcli.release.steps"}
INTERNAL_NAMES = {"run_scheduled", "plan_schedule", "state_run", "prepare", "OneRelease", "show_dry_run"}
RENDERED = {("dpcli.release.steps", n) for n in ("LedgerRef", "Output", "Planned", "Release", "cost_text", "grid_step")}


def internals_named(code: str) -> list[str]:
    """The continuation internals ``code`` imports or names (docstrings and comments aside)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module in INTERNAL_MODULES:
            found += [f"{node.module}.{a.name}" for a in node.names if (node.module, a.name) not in RENDERED]
        elif (isinstance(node, ast.Attribute) and node.attr in INTERNAL_NAMES
              or isinstance(node, ast.Name) and node.id in INTERNAL_NAMES):
            found.append(ast.unparse(node))
    return found


def test_the_cli_never_takes_a_path_of_its_own():
    """The commands build a continuation and call ``release.run`` or ``release.plan``: no CLI module imports or
    calls a continuation's internals (the run or dry run of a schedule or a stream)."""
    found = {m.name: internals_named(m.read_text()) for m in sorted((ROOT / "dpcli" / "cli").glob("*.py"))}
    assert {name: f for name, f in found.items() if f} == {}


def test_the_check_sees_a_cli_that_plans_a_schedule_itself():
    code = ('"""Docs may name plan_schedule."""\n'
            "def dry(task):\n"
            "    from dpcli.release.schedule_plan import DEFAULT_RUNS, plan_schedule\n"
            "    from dpcli.release.steps import Planned\n"
            "    return streams.state_run(task)\n")
    assert internals_named(code) == ["dpcli.release.schedule_plan.DEFAULT_RUNS",
                                     "dpcli.release.schedule_plan.plan_schedule", "streams.state_run"]


def test_a_stream_state_run_is_computed_by_its_task_with_the_seed_its_state_keeps(tmp_path, state_dir, monkeypatch):
    """Issue 40, item 2: a ``--state`` run is computed by ``Task.run`` as every release is (the task fed the stream
    its state holds), with the stream's seed, made once (``seeds.stream_seed``) and kept in the state file; a retry
    of the last run computes nothing (its rows again, from the state)."""
    from dpcli.release import seeds, streams
    from dpcli.state import documents
    from dpcli.tasks.stream.state import STATE_KIND

    init_ledger("approx", "--epsilon", "50", "--delta", "1e-5")
    calls: list[tuple[bool, bytes]] = []
    made: list[seeds.ReleaseSeed] = []
    real_run, real_seed = StreamTask.run, seeds.stream_seed

    def run(self, frames, plan, seed, engine):
        calls.append((self.feed is not None, seed))
        return real_run(self, frames, plan, seed, engine)

    def stream_seed(*args):
        made.append(real_seed(*args))
        return made[-1]

    monkeypatch.setattr(StreamTask, "run", run)
    monkeypatch.setattr(streams, "stream_seed", stream_seed)
    state = tmp_path / "s.state"
    args = ["--time", "ts", "--by", "g", "--privacy-unit", "user", "--window", "2d", "--trigger-every", "1d",
            "--epsilon", "8", "--delta", "1e-6", "--max-contributions", "2", "--state", state]
    days = []
    for day in (1, 2):
        days.append(tmp_path / f"day{day}.csv")
        pl.DataFrame({"ts": [f"2026-11-0{day}T0{i % 9}:00:00" for i in range(60)],
                      "user": [f"u{i}" for i in range(60)], "g": ["ab"[i % 2] for i in range(60)]}).write_csv(days[-1])
        r = cli("stream-replay", days[-1], *args, "--through", f"2026-11-0{day + 1}", "--json")
        assert r.exit_code == 0, r.stderr
    body = documents.read(state, STATE_KIND)
    assert len(made) == 1 and made[0].seed.hex() == body["seed"] and made[0].id == body["seed_id"]
    assert calls == [(True, made[0].seed)] * 2
    r = cli("stream-replay", days[-1], *args, "--through", "2026-11-03", "--json")  # the last run again: a retry
    assert r.exit_code == 0 and json.loads(r.stdout)["summary"]["retry"] is True, r.stderr
    assert len(calls) == 2


def test_every_seed_is_made_in_seeds_py():
    """Issue 40, item 2: every seed is built in one place. Only ``release/seeds.py`` derives one (``derive_seed``)
    and gives it its material (``release_seed``: the release's, by ``steps.prepare`` from the task's material; a
    stream state's, ``stream_seed``, and a schedule's size noise's, ``schedule_sizes_seed``)."""
    import ast

    wanted = ("derive_seed", "release_seed", "stream_seed", "schedule_sizes_seed")
    callers: dict[str, set[str]] = {}
    for path in sorted((ROOT / "dpcli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in wanted:
                    callers.setdefault(name, set()).add(path.relative_to(ROOT / "dpcli").as_posix())
    assert callers == {"derive_seed": {"release/seeds.py"}, "release_seed": {"release/seeds.py", "release/steps.py"},
                       "stream_seed": {"release/streams.py"}, "schedule_sizes_seed": {"release/schedule_runs.py"}}
