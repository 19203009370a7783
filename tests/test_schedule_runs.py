"""A schedule's runs as a daily job sees them (issue 31): the plan before paying (``--dry-run --rows --runs``),
retries that never unpublish, corrections refused, backfills answered (``--through``), and one exit code for
a broken input whatever a crossing test would have said."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import polars as pl
import pytest
from dptest import cli, init_ledger

from dpcli.core import mechanisms
from dpcli.core import schedules as sch
from dpcli.core.exact import fraction_text


@pytest.fixture
def days(tmp_path):
    """Four daily snapshots of one growing table (one row per unit, three groups) and its public group list.
    With --gamma 0.5 and ε = 1, epoch k starts near 20,000·1.5^k units and the crossing tests' noise has a
    scale of a few hundred units: day 2 (21,000) stays in epoch 0 and day 3 (37,000) starts epoch 1 with
    overwhelming probability, whatever the key (as in test_schedules.growing)."""
    paths = {}
    for day, size in ((1, 20000), (2, 21000), (3, 37000), (4, 38000)):
        p = tmp_path / f"day{day}.csv"
        pl.DataFrame({"user": [f"u{i}" for i in range(size)], "g": ["abc"[i % 3] for i in range(size)]}).write_csv(p)
        paths[day] = p
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    return paths, keys


def scheduled(path, keys, *extra, name="daily"):
    return cli("histogram", path, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--schedule", name,
               "--total-epsilon", "1", *extra)


def history():
    return json.loads(cli("budget", "history", "--json").stdout)


# ---- plan before paying ------------------------------------------------------------------------------


def test_a_dry_run_shows_a_new_schedules_runs_before_anything_is_read_or_paid(tmp_path, state_dir):
    """The issue's schedule (default bbscheduler, ε = 1) planned at stated sizes: each run's ε is Algorithm 1's
    at the γ of the stated first size, its margin is the count noise's at that ε, nothing is read (the input
    does not even exist), charged or written, and the fixed alternative spends the total over the same runs."""
    init_ledger("pure", "--epsilon", "2")
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n" + "".join(f"p{i}\n" for i in range(50)))
    r = scheduled(tmp_path / "not-there.csv", keys, "--dry-run", "--units", "7000:22000", "--runs", "7", "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    gamma = sch.default_gamma(0.9, 7000, 0.0, 0.05)
    assert plan["schedule"]["gamma"] == fraction_text(gamma) and plan["schedule"]["new"] and plan["groups"] == 50
    first = plan["runs"][0]
    eps0 = sch.bbscheduler_epsilon(0, gamma, Fraction(9, 10), 0.0)
    assert first["release"] == "new" and first["epoch"] == 0 and Fraction(first["epsilon"]) == eps0
    assert first["moe95"] == {"count": mechanisms.laplace(1, eps0).margin95()}
    assert first["moe95_relative"] == {}  # stated units give no size to a count of rows
    assert [r["units"] for r in plan["runs"]] == [round(7000 * (22000 / 7000) ** (j / 6)) for j in range(7)]
    assert plan["rows"] is None
    new = [Fraction(r["epsilon"]) for r in plan["runs"] if r["release"] == "new"]
    assert plan["spend"]["releases"] == pytest.approx(float(sum(new)), abs=1e-6)
    assert plan["spend"]["epsilon_used"] + plan["spend"]["unused"] == pytest.approx(1.0, abs=1e-6)
    assert plan["fixed_alternative"]["epsilon"] == "0.1428" and plan["fixed_alternative"]["runs"] == 7
    assert plan["ledger"] == {"analyst": "default", "accepts": True, "refusal": None}
    assert plan["cost"] == [{"kind": "pure", "mechanism": "schedule/bbscheduler", "epsilon": "1"}]
    assert history() == [] and not (state_dir / "schedules").exists()
    text = scheduled(tmp_path / "not-there.csv", keys, "--dry-run", "--units", "7000:22000", "--runs", "7")
    assert text.exit_code == 0, text.stderr
    assert f"epoch 0, ε = {float(eps0):.4g}; count ±{first['moe95']['count']:,}" in text.stdout
    assert "--scheduler fixed --epsilon 0.1428 spends the total evenly over 7 runs" in text.stdout
    assert "would accept the reservation" in text.stdout
    assert "growing to 22,000 at run 7 by a constant factor per run (geometric" in text.stdout
    assert plan["units"]["growth"] == "growing by a constant factor per run (geometric)"
    assert "sizes stated with --units (never read from the data): 7,000 at the next run" in text.stdout
    assert "     run       units  release" in text.stdout


def test_a_dry_run_follows_the_sizes_stated_run_by_run(tmp_path):
    """Real snapshots rarely grow geometrically: --units N1,N2,… plans each run at its own size (the last stated
    holds after it), so a run whose size barely grew repeats its epoch's release, as the schedule will."""
    init_ledger("pure", "--epsilon", "2")
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n" + "".join(f"p{i}\n" for i in range(50)))
    stated = [7000, 7100, 7150, 15000]
    r = scheduled(tmp_path / "not-there.csv", keys, "--dry-run", "--units", ",".join(map(str, stated)), "--runs", "6",
                  "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert [run["units"] for run in plan["runs"]] == [*stated, 15000, 15000]
    assert plan["units"] == {"first": 7000, "last": 15000, "growth": "as stated run by run", "each": stated}
    releases = [run["release"] for run in plan["runs"]]
    assert releases[0] == "new" and releases[3] == "new" and releases[1] != "new" and releases[5] != "new"
    bad = scheduled(tmp_path / "not-there.csv", keys, "--dry-run", "--units", "7000,x", "--runs", "2")
    assert bad.exit_code == 2 and "N1,N2,…" in bad.stderr


def test_a_dry_run_of_a_schedule_that_ran_goes_on_from_its_state(days):
    """After two runs the plan starts at run 3 with the ε the runs will really get; the ledger's answer is the
    reservation already held. A fixed schedule's plan stops where the total runs out, as the runs do."""
    paths, keys = days
    init_ledger("approx", "--epsilon", "5", "--delta", "1e-5")
    imp = ["--scheduler", "bbimprover", "--total-delta", "1e-6"]
    for day in (1, 2):
        assert scheduled(paths[day], keys, *imp, "--json", name="imp").exit_code == 0
    plan = json.loads(scheduled(paths[1], keys, *imp, "--dry-run", "--runs", "2", "--json", name="imp").stdout)
    assert plan["schedule"]["runs_so_far"] == 2 and not plan["schedule"]["new"] and plan["cost"] == []
    assert [Fraction(r["epsilon"]) for r in plan["runs"]] == [sch.bbimprover_epsilon(k, Fraction(1), 1e-6, 0.1)
                                                             for k in (3, 4)]
    assert plan["reservation"] == 1 and plan["ledger"]["accepts"] and plan["fixed_alternative"]["runs"] == 2
    run3 = json.loads(scheduled(paths[3], keys, *imp, "--json", name="imp").stdout)["summary"]["schedule"]
    assert run3["run_epsilon"] == plan["runs"][0]["epsilon"]
    other = scheduled(paths[1], keys, *imp, "--improver-c", "0.2", "--dry-run", name="imp")
    assert other.exit_code == 2 and "other settings" in other.stderr  # refused before paying, as the run would be
    fixed = ["--scheduler", "fixed", "--epsilon", "0.4"]
    assert scheduled(paths[1], keys, *fixed, name="fx").exit_code == 0
    plan = json.loads(scheduled(paths[1], keys, *fixed, "--dry-run", "--runs", "3", "--json", name="fx").stdout)
    assert [r["release"] for r in plan["runs"]] == ["new", "refused", "refused"]
    assert plan["runs"][1]["refused"] == "the schedule is spent (exit 77)" and plan["fixed_alternative"] is None
    assert scheduled(paths[2], keys, *fixed, name="fx").exit_code == 0
    assert scheduled(paths[3], keys, *fixed, name="fx").exit_code == 77


def test_a_dry_run_of_a_bbscheduler_that_ran_uses_its_noisy_start_and_gamma(days):
    paths, keys = days
    init_ledger("pure", "--epsilon", "2")
    ran = json.loads(scheduled(paths[1], keys, "--gamma", "0.5", "--json").stdout)["summary"]["schedule"]
    plan = json.loads(scheduled(paths[1], keys, "--gamma", "0.5", "--dry-run", "--units", "21000:200000", "--runs",
                                "2", "--json").stdout)
    assert plan["schedule"]["units_noisy"] == ran["units_noisy"] and plan["schedule"]["gamma"] == ran["gamma"]
    assert plan["runs"][0]["release"] == "cached"  # 21,000 units: below epoch 1's threshold, noise aside
    big = plan["runs"][1]
    expected = sch.epoch_of(200000, ran["units_noisy"], Fraction(1, 2))
    assert big["epoch"] == expected and Fraction(big["epsilon"]) == sch.bbscheduler_epsilon(
        expected, Fraction(1, 2), Fraction(9, 10), 0.0)


def test_a_dry_run_gives_rho_in_a_zcdp_ledger_and_says_when_the_ledger_refuses(tmp_path):
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\n")
    init_ledger("zcdp", "--rho", "0.1")
    r = scheduled(tmp_path / "x.csv", keys, "--noise", "laplace", "--scheduler", "fixed", "--epsilon", "0.2",
                  "--dry-run", "--runs", "1", "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert Fraction(plan["runs"][0]["rho"]) == Fraction(1, 50)  # ε²/2
    assert not plan["ledger"]["accepts"] and "ρ" in plan["ledger"]["refusal"]  # the reservation's ρ = 1/2 > 0.1
    text = scheduled(tmp_path / "x.csv", keys, "--noise", "laplace", "--scheduler", "fixed", "--epsilon", "0.2",
                     "--dry-run", "--runs", "1")
    assert "(ρ = 0.02)" in text.stdout and "would refuse it" in text.stdout
    gaussian = scheduled(tmp_path / "x.csv", keys, "--scheduler", "fixed", "--epsilon", "0.2", "--dry-run")
    assert gaussian.exit_code == 2 and "Laplace noise" in gaussian.stderr  # as a run in a zcdp ledger is refused


def test_a_topk_schedule_plans_its_count_margins(tmp_path):
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    init_ledger("pure", "--epsilon", "2")
    r = cli("topk", tmp_path / "x.csv", "--by", "g", "-k", "2", "--privacy-unit", "user", "--keys", keys,
            "--schedule", "tk", "--total-epsilon", "1", "--scheduler", "fixed", "--epsilon", "0.5", "--dry-run",
            "--runs", "2", "--json")
    assert r.exit_code == 0, r.stderr
    runs = json.loads(r.stdout)["runs"]
    assert [x["release"] for x in runs] == ["new", "new"] and runs[0]["moe95"]["count"] > 0


@pytest.mark.parametrize(("extra", "message"), [
    (["--rows", "1000"], "--rows states the expected size for a plan"),
    (["--runs", "3"], "--runs says how many runs a dry run plans"),
    (["--dry-run", "--through", "2026-11-05"], "drop --through"),
    (["--dry-run"], "a bbscheduler's epochs follow the privacy units: give --units N"),
    (["--dry-run", "--rows", "1000"], "--rows counts rows, but a bbscheduler's epochs follow the privacy units: give "
                                      "--units N"),
    (["--dry-run", "--units", "1000", "--scheduler", "fixed", "--epsilon", "0.1"],
     "--units states a bbscheduler's privacy units; --scheduler fixed plans at the rows you state with --rows"),
    (["--units", "1000"], "--units states the privacy units a bbscheduler's plan follows"),
    (["--dry-run", "--units", "0"], "--units must lie in [1, 10^12]"),
    (["--dry-run", "--units", "1:2:3"], "--units must be N, FIRST:LAST or N1,N2,…"),
    (["--dry-run", "--units", "10", "--rows", "10"], "give one of --rows (rows) and --units (privacy units)"),
    (["--dry-run", "--rows", "0"], "--rows must lie in [1, 10^12]"),
    (["--dry-run", "--rows", "10:x"], "--rows must be N, FIRST:LAST or N1,N2,…"),
    (["--dry-run", "--rows", "1:2:3"], "--rows must be N, FIRST:LAST or N1,N2,…"),
])
def test_plan_options_are_checked(tmp_path, extra, message):
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\n")
    init_ledger("pure", "--epsilon", "2")
    r = scheduled(tmp_path / "x.csv", keys, *extra)
    assert r.exit_code == 2 and message in r.stderr, r.stderr
    r = cli("histogram", tmp_path / "x.csv", "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--dry-run",
            "--rows", "100")
    assert r.exit_code == 2 and "use it with --dry-run --schedule" in r.stderr
    r = cli("histogram", tmp_path / "x.csv", "--by", "g", "--privacy-unit", "user", "--epsilon", "1",
            "--through", "2026-11-05")
    assert r.exit_code == 2 and "need --schedule NAME" in r.stderr


# ---- a retry never unpublishes ------------------------------------------------------------------------


def test_a_retry_returns_exactly_what_was_released_and_a_correction_is_refused(days, tmp_path):
    """Retrying any day (with or without --through) writes the same bytes, free; another file for a day already
    released is refused with one line (exit 65), no debit and no output, whatever it holds (even a broken file:
    only its fingerprint is looked at)."""
    paths, keys = days
    init_ledger("pure", "--epsilon", "2")
    fixed = ["--scheduler", "fixed", "--epsilon", "0.2"]
    outputs = {}
    for day in (1, 2, 3):
        out = tmp_path / f"out{day}.csv"
        r = scheduled(paths[day], keys, *fixed, "--through", f"2026-11-0{day}", "-o", out)
        assert r.exit_code == 0, r.stderr
        outputs[day] = out.read_bytes()
    before = history()
    assert before[-1]["summary"].endswith("of schedule 'daily' through 2026-11-03 (ε = 0.2)")
    for extra in (["--through", "2026-11-01"], []):
        again = tmp_path / "again.csv"
        r = scheduled(paths[1], keys, *fixed, *extra, "-o", again, "--json")
        assert r.exit_code == 0, r.stderr
        assert again.read_bytes() == outputs[1] and json.loads(r.stdout)["schedule"]["replay_of_run"] == 1
        assert "the same input as an earlier call: run 1's release again (free, identical output)" in r.stderr
    broken = tmp_path / "broken.csv"
    broken.write_text('user,g\nu1,"a\n')
    published = tmp_path / "out2.csv"
    for other in (paths[4], broken):
        r = scheduled(other, keys, *fixed, "--through", "2026-11-02", "-o", published)
        assert r.exit_code == 65 and r.stdout == "", r.stderr
        assert r.stderr.strip() == ("dpcli: error: schedule 'daily' already released its run through 2026-11-02 from "
                                    "another input, and a release is never rewritten: publish a correction as a new "
                                    "run (a later --through), or once without --schedule")
        assert published.read_bytes() == outputs[2]
    assert history() == before
    r = scheduled(paths[4], keys, *fixed, "--through", "2026-11-04")  # the correction as a new run
    assert r.exit_code == 0 and len(history()) == len(before) + 1, r.stderr


def test_a_snapshot_answered_not_yet_keeps_its_answer_after_a_new_epoch(days, tmp_path):
    """bbscheduler: day 2 got epoch 0's release (its test said "not yet"); after day 3 started epoch 1, day 2
    again still gets epoch 0's release (the answer is recorded), not epoch 1's."""
    paths, keys = days
    init_ledger("pure", "--epsilon", "2")
    g = ["--gamma", "0.5", "--json"]
    first = scheduled(paths[1], keys, *g)
    day1 = json.loads(first.stdout)
    second = scheduled(paths[2], keys, *g)
    day2 = json.loads(second.stdout)
    assert day2["summary"]["schedule"]["cached"] and day2["result"] == day1["result"]
    # a repeated release says so (a reader comparing the files would otherwise read it as a new measurement)
    assert "no new epoch yet: epoch 0's release again (free, identical output)" in second.stderr
    assert "release again" not in first.stderr
    assert json.loads(scheduled(paths[3], keys, *g).stdout)["summary"]["schedule"]["epoch"] == 1
    third = scheduled(paths[2], keys, *g)
    again = json.loads(third.stdout)
    assert again["result"] == day1["result"] and again["summary"]["schedule"]["replay_of_run"] == 1
    assert "the same input as an earlier call: run 1 (epoch 0)'s release again" in third.stderr
    assert len(history()) == 3  # the reservation, epochs 0 and 1


# ---- backfills --------------------------------------------------------------------------------------------


def test_a_bbscheduler_backfill_gets_the_release_in_force_then(days, tmp_path):
    """Day 2 run after day 3 (a missed day): the release in force through day 2 was day 1's; it comes back free
    with a note, and its retry too. A moment before the schedule's first is refused (exit 2), saying what to do."""
    paths, keys = days
    init_ledger("pure", "--epsilon", "2")
    g = ["--gamma", "0.5"]
    day1 = json.loads(scheduled(paths[1], keys, *g, "--through", "2026-11-01", "--json").stdout)
    assert scheduled(paths[3], keys, *g, "--through", "2026-11-03").exit_code == 0
    before = history()
    notes = []
    for _ in range(2):
        r = scheduled(paths[2], keys, *g, "--through", "2026-11-02", "--json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["result"] == day1["result"] and doc["summary"]["schedule"]["epoch"] == 0
        notes.append(r.stderr)
    assert "a backfill: through 2026-11-02 the schedule's release in force was that of epoch 0, made through " \
           "2026-11-01" in notes[0]
    assert doc["summary"]["schedule"]["replay_of_run"] == 1  # the retry: the same answer again
    assert history() == before
    r = scheduled(paths[4], keys, *g, "--through", "2026-10-31")
    assert r.exit_code == 2 and r.stdout == "", r.stderr
    assert "began through 2026-11-01, after 2026-10-31" in r.stderr and "without --schedule" in r.stderr


def test_a_fixed_or_bbimprover_backfill_is_a_new_run(days):
    paths, keys = days
    init_ledger("pure", "--epsilon", "2")
    fixed = ["--scheduler", "fixed", "--epsilon", "0.1", "--json"]
    for day in (1, 3, 2):
        r = scheduled(paths[day], keys, *fixed, "--through", f"2026-11-0{day}")
        assert r.exit_code == 0 and not json.loads(r.stdout)["summary"]["schedule"]["cached"], r.stderr
    assert history()[-1]["summary"] == "histogram: run 3 of schedule 'daily' through 2026-11-02 (ε = 0.1)"


# ---- a broken input is one exit code ----------------------------------------------------------------------


def _corrupt_group_column(path: Path, size: int) -> None:
    """A Parquet file whose ``user`` column reads and whose ``g`` column does not (its string lengths broken)."""
    df = pl.DataFrame({"user": [f"u{i}" for i in range(size)], "g": [f"{'abc'[i % 3]}{i:06d}" for i in range(size)]})
    df.write_parquet(path, compression="uncompressed", statistics=False)
    data = bytearray(path.read_bytes())
    at = data.find(b"a000000")
    for i in range(at - 4, at + 4000, 7):
        data[i] = 0xFF
    path.write_bytes(bytes(data))


def test_a_broken_input_fails_even_when_the_crossing_test_would_say_not_yet(days, tmp_path):
    """A file whose unit column reads but whose group column does not: exit 65 inside an epoch as outside one
    (it used to return the cached release, exit 0, because only the units were read for the test)."""
    paths, keys = days
    init_ledger("pure", "--epsilon", "2")
    assert scheduled(paths[1], keys, "--gamma", "0.5").exit_code == 0
    bad = tmp_path / "bad.parquet"
    _corrupt_group_column(bad, 21000)
    before = history()
    r = scheduled(bad, keys, "--gamma", "0.5")
    assert r.exit_code == 65 and r.stdout == "" and "does not parse" in r.stderr, r.stderr
    # the schedule's run failed in its size test: it had begun reading, so its mark stays (no cost: the next
    # input at that run is charged the schedule again, the same file again is not)
    opened = history()[len(before):]
    assert len(opened) == 1 and opened[0]["events"] == [] and "began reading" in opened[0]["summary"]
    before = history()
    plain = cli("histogram", bad, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--epsilon", "0.1")
    assert plain.exit_code == 65
    assert [e["events"] != [] for e in history()[len(before):]] == [True]  # read before it failed: charged


def test_a_small_run_points_to_fixed_for_a_known_number_of_runs(days):
    """The note on a run that used under 1% of its total says how to compare with fixed (not under fixed)."""
    from dpcli import advice

    paths, keys = days
    init_ledger("pure", "--epsilon", "2")
    r = scheduled(paths[1], keys)  # γ from Algorithm 1 at 20,000 units: epoch 0 gets ε ≈ 0.002 of 1
    assert r.exit_code == 0, r.stderr
    assert "early runs get a small share" in r.stderr and "compare --scheduler fixed" in r.stderr
    assert "--dry-run --units … --runs N" in r.stderr
    note = advice.small_run_epsilon(0.001, 1.0, "fixed")
    assert note is not None and "compare" not in note.text
    assert advice.small_run_epsilon(0.02, 1.0, "bbimprover") is None


def test_the_issues_schedule_shows_its_first_day_before_paying(tmp_path):
    """Issue 31's job (`--schedule pages-daily --total-epsilon 1`, 8 rows per unit and page) spent ε = 0.0057 on
    day 1 with margins of ±4,204: with about 5,145 units stated, the plan shows the same before anything is paid,
    and the fixed alternative over a week (ε = 1/7 a run) with margins a 25th as wide."""
    keys = tmp_path / "keys.csv"
    keys.write_text("page\n" + "".join(f"/p/{i:03d}\n" for i in range(50)))
    init_ledger("pure", "--epsilon", "2")
    r = cli("histogram", tmp_path / "views.csv", "--by", "page", "--privacy-unit", "user_id", "--keys", keys,
            "--max-contributions", "8", "--schedule", "pages-daily", "--total-epsilon", "1", "--dry-run",
            "--units", "5145", "--runs", "7")
    assert r.exit_code == 0, r.stderr
    assert "epoch 0, ε = 0.005704; count ±4,202" in r.stdout  # ε rounded up (0.0057035…)
    assert "--scheduler fixed --epsilon 0.1428 spends the total evenly over 7 runs: count ±168" in r.stdout
    assert history() == []
