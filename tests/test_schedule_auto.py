"""A ``--schedule`` with ``auto`` bounds (issue 33): the first run that releases chooses them from its own ε (paid
by the reservation, like the run), the schedule's state keeps the choice, and every later run gives it as its
bounds, spending its whole ε on the release (docs/commands/schedules.md, "Bounds chosen from the data")."""

from __future__ import annotations

import json
from fractions import Fraction

import polars as pl
import pytest
from dptest import cli, init_ledger, use_fixed_key

from dpcli.release.schedules import scheduled_run
from dpcli.release.seeds import task_material
from dpcli.state import schedules as store
from dpcli.tasks.auto_bounds import AT_RUN_TIME, AutoBounds
from dpcli.tasks.histogram import HistogramQuery, HistogramTask

AUTO = ["--max-partitions", "auto", "--max-contributions", "auto", "--bounds", "auto"]


@pytest.fixture(autouse=True)
def fixed_key(state_dir):
    """The same data and command choose the same bounds on every run of the suite (no flaky draw)."""
    use_fixed_key(state_dir)


@pytest.fixture
def snapshots(tmp_path):
    """Three daily snapshots of a growing table (each unit in 2 of 4 groups, 3 rows in each, values in
    [10, 20)) and its public group list."""
    paths = {}
    for day, units in ((1, 400), (2, 450), (3, 500)):
        rows = [(u, (u + j) % 4, 10 + (7 * u + 3 * r) % 10) for u in range(units) for j in (0, 1) for r in range(3)]
        p = tmp_path / f"day{day}.csv"
        pl.DataFrame(rows, schema=["u", "g", "v"], orient="row").write_csv(p)
        paths[day] = p
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n0\n1\n2\n3\n")
    return paths, keys


def scheduled(path, keys, *extra, name="daily", bounds=AUTO):
    return cli("histogram", path, "--by", "g", "--privacy-unit", "u", "--agg", "count,sum", "--value", "v",
               "--keys", keys, *bounds, "--schedule", name, "--scheduler", "fixed", "--epsilon", "2",
               "--total-epsilon", "10", *extra)


def summary_of(r):
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)["summary"]


def history():
    return json.loads(cli("budget", "history", "--json").stdout)


def state_of(state_dir, name="daily"):
    return next(s for s in store.all_schedules(state_dir, "default") if s["spec"]["name"] == name)


def test_the_first_run_chooses_from_its_own_epsilon_and_later_runs_keep_the_choice(snapshots, state_dir):
    paths, keys = snapshots
    init_ledger("pure", "--epsilon", "20")
    first = summary_of(scheduled(paths[1], keys, "--json", "-o", "-"))
    chosen = {k: first["auto"][k] for k in ("max_partitions", "max_contributions", "bounds")}
    # the choice spends the --auto-share of this run's ε (2 · 0.1); the run's whole ε is the run's, no more
    assert first["auto"]["epsilon"] == "0.2" and first["epsilon"] == "2" and first["schedule"]["run_epsilon"] == "2"
    assert first["reserved"] == [{"kind": "pure", "mechanism": "schedule/fixed", "epsilon": "10"}]
    assert first["cost"] == [] and first["max_contributions"] == chosen["max_contributions"]
    assert state_of(state_dir)["auto"] == chosen  # kept in the state, without the choice's budget

    second = summary_of(scheduled(paths[2], keys, "--json", "-o", "-"))
    assert second["auto"] == {**chosen, "kept": True}  # given as the run's bounds: no auto part, no budget
    assert (second["max_partitions"], second["max_contributions"]) == (chosen["max_partitions"],
                                                                       chosen["max_contributions"])
    assert second["granularity"] == first["granularity"]  # the grid of the same value bounds
    assert second["epsilon"] == "2" and second["schedule"]["runs"] == 2 and second["charged"] is False
    third = summary_of(scheduled(paths[3], keys, "--json", "-o", "-"))  # the state, saved again, still keeps it
    assert third["auto"] == {**chosen, "kept": True} and state_of(state_dir)["auto"] == chosen

    entries = history()
    assert [e["events"] for e in entries] == [first["reserved"], [], [], []]  # steps: covered by the reservation
    assert "; chosen: max_partitions" in entries[1]["summary"] and "kept from its first run" in entries[2]["summary"]
    show = json.loads(cli("budget", "show", "--json").stdout)
    assert show["spent"]["epsilon"] == "10" and show["schedules"][0]["epsilon_spent"] == "6"


def test_a_run_that_chooses_pays_its_epsilon_in_two_parts_and_a_run_that_keeps_in_one():
    """The plans each run is charged by (their events must fit the run's ε: dpcli.release.schedules)."""
    q = HistogramQuery(unit="u", by=("g",), aggregations=("count", "sum"), value="v", domain="keys",
                       auto=AutoBounds(contributions=True, values=True))
    task = HistogramTask(q)
    choosing = scheduled_run(task, Fraction(2), None).plan("pure", {})
    by_part = {e.mechanism: e.epsilon for e in choosing.events}
    assert by_part.pop("histogram/auto-bounds") == Fraction(1, 5) and sum(by_part.values()) == Fraction(9, 5)
    kept = scheduled_run(task, Fraction(2), {"max_contributions": 3, "bounds": [8.0, 22.627]})
    assert kept.query.auto is None and kept.query.max_contributions == 3 and kept.query.bounds == (8.0, 22.627)
    events = kept.plan("pure", {}).events
    assert all("auto" not in e.mechanism for e in events) and sum(e.epsilon for e in events) == 2
    material = task_material(kept)["task"]["query"]
    assert material["auto"] is None and material["max_contributions"] == 3
    pending = scheduled_run(task, Fraction(2), {})  # a dry run's later runs, before the first has chosen
    calibration = pending.describe(pending.plan("pure", {}))["calibration"]
    assert calibration["sum"]["moe95"] == AT_RUN_TIME and calibration["rows"]["moe95"] == AT_RUN_TIME


def test_a_later_epoch_keeps_the_choice_and_a_retry_of_the_first_run_is_free(tmp_path, state_dir):
    """bbscheduler: epoch 0 chooses (from its own ε, a tenth of it), epoch 1 keeps. One row per unit: with
    --gamma 0.5 day 3 (2.25× day 1's units) starts epoch 1 whatever the noise, as in test_schedule_runs.days."""
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    paths = {}
    for day, size in ((1, 8000), (3, 18000)):
        paths[day] = tmp_path / f"day{day}.csv"
        pl.DataFrame({"user": [f"u{i}" for i in range(size)], "g": ["abc"[i % 3] for i in range(size)]}).write_csv(
            paths[day])
    init_ledger("pure", "--epsilon", "2")
    args = ["--by", "g", "--privacy-unit", "user", "--keys", keys, "--max-contributions", "auto", "--schedule",
            "daily", "--total-epsilon", "1", "--gamma", "0.5", "--json", "-o", "-"]
    epoch0 = summary_of(cli("histogram", paths[1], *args, "--through", "2026-11-01"))
    eps0 = Fraction(epoch0["schedule"]["run_epsilon"])
    assert Fraction(epoch0["auto"]["epsilon"]) == eps0 / 10 and epoch0["schedule"]["epoch"] == 0
    c = epoch0["auto"]["max_contributions"]
    epoch1 = summary_of(cli("histogram", paths[3], *args, "--through", "2026-11-03"))
    assert epoch1["schedule"]["epoch"] >= 1 and epoch1["auto"] == {"max_contributions": c, "kept": True}
    assert epoch1["max_contributions"] == c and state_of(state_dir)["auto"] == {"max_contributions": c}
    retry = summary_of(cli("histogram", paths[1], *args, "--through", "2026-11-01"))
    assert retry["auto"] == epoch0["auto"] and retry["schedule"]["replay_of_run"] == 1 and not retry["charged"]
    assert len([e for e in history() if e["events"]]) == 1  # the reservation alone was ever debited


def test_a_changed_auto_request_names_another_schedule(snapshots, state_dir):
    """The schedule's identity holds the auto request (which bounds, the share), not the values chosen: a job
    that gives the bounds its schedule chose, or asks for another share, is another schedule (its own
    reservation), never a run of this one."""
    paths, keys = snapshots
    init_ledger("pure", "--epsilon", "40")
    first = summary_of(scheduled(paths[1], keys, "--json", "-o", "-"))
    lo, hi = first["auto"]["bounds"]
    given = ["--max-partitions", str(first["auto"]["max_partitions"]), "--max-contributions",
             str(first["auto"]["max_contributions"]), "--bounds", f"{lo!r}:{hi!r}"]
    other = summary_of(scheduled(paths[2], keys, "--json", "-o", "-", bounds=given))
    assert "auto" not in other and other["reserved"] and other["schedule"]["runs"] == 1
    share = summary_of(scheduled(paths[2], keys, "--auto-share", "0.2", "--json", "-o", "-"))
    assert share["auto"]["epsilon"] == "0.4" and share["reserved"] and share["schedule"]["runs"] == 1
    assert [len(s["runs"]) for s in store.all_schedules(state_dir, "default")] == [1, 1, 1]
    assert sum("auto" in s for s in store.all_schedules(state_dir, "default")) == 2


def test_a_dry_run_shows_the_first_run_choosing_and_then_the_kept_bounds(snapshots):
    paths, keys = snapshots
    init_ledger("pure", "--epsilon", "20")
    plan = json.loads(scheduled(paths[1], keys, "--dry-run", "--runs", "3", "--rows", "400", "--json").stdout)
    first, later = plan["runs"][0], plan["runs"][1]
    assert first["parts"] == {"bounds": "ε=0.2", "release": "ε=1.8"} and first["epsilon"] == "2"
    assert "parts" not in later and later["moe95"] == {"count": AT_RUN_TIME, "sum_v": AT_RUN_TIME}
    assert "count" not in later.get("moe95_relative", {})
    text = scheduled(paths[1], keys, "--dry-run", "--runs", "3", "--rows", "400")
    assert text.exit_code == 0, text.stderr
    assert "new release, ε = 2 (bounds ε=0.2, release ε=1.8); count chosen at run time" in text.stdout
    chosen = summary_of(scheduled(paths[1], keys, "--json", "-o", "-"))["auto"]
    plan = json.loads(scheduled(paths[1], keys, "--dry-run", "--runs", "2", "--rows", "400", "--json").stdout)
    lo, hi = chosen["bounds"]
    given = ["--max-partitions", str(chosen["max_partitions"]), "--max-contributions",
             str(chosen["max_contributions"]), "--bounds", f"{lo!r}:{hi!r}"]
    same = json.loads(scheduled(paths[1], keys, "--dry-run", "--runs", "2", "--rows", "400", "--json",
                                bounds=given, name="given").stdout)
    assert plan["runs"][0]["moe95"] == same["runs"][0]["moe95"] and "parts" not in plan["runs"][0]
