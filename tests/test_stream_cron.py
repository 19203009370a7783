"""``stream-replay --state`` as a daily cron job (issue 31): no event is lost to timing, a retry never
unpublishes, 0-row runs say why, and the ledger shows the stream and its retries.

The simulation: events happen at random times and arrive a little later (a few reach dpcli after their
trigger already ran: late); each day a job runs at a random minute and feeds the events that arrived
since the job before. One day is missed, one day runs twice, one run fails to write its output and is
retried. The distinct rows published must equal one full replay of every input with the same seed,
minus the late events.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dptest import cli, init_ledger

from dpcli.errors import OutputError
from dpcli.io.outputs import render
from dpcli.tasks import stream as sr
from dpcli.tasks.stream.algorithm import TIME_COLUMNS

START = datetime(2026, 11, 1, tzinfo=UTC)
ARGS = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "7d", "--trigger-every", "1d",
        "--max-contributions", "2", "--epsilon", "8", "--delta", "1e-9"]
QUERY = sr.StreamQuery(time="ts", keys=("page",), unit="user", window=7 * 86400, triggers=7, max_records=2,
                       epsilon=Fraction(8), delta=Fraction(1, 10**9))


def _events(rng: np.random.Generator, days: int) -> pl.DataFrame:
    """Events over ``days`` days: when they happened (``ts``) and when they reach the job (``arrival``):
    most within 3 hours, one in ten within 30 hours (some of those arrive after their trigger ran)."""
    n = 110 * days
    ts = rng.integers(0, days * 86400, n)
    delay = np.where(rng.random(n) < 0.1, rng.integers(0, 30 * 3600, n), rng.integers(0, 3 * 3600, n))
    return pl.DataFrame({"ts": [(START + timedelta(seconds=int(s))).strftime("%Y-%m-%dT%H:%M:%SZ") for s in ts],
                         "user": [f"u{u}" for u in rng.integers(0, 1200, n)],
                         "page": [f"p{p}" for p in rng.choice(3, n, p=[0.5, 0.3, 0.2])],
                         "t": ts, "arrival": ts + delay})


def _run_times(rng: np.random.Generator, days: int) -> list[int]:
    """Each day's job at a random minute (seconds since START); day 12 missed, day 20 runs twice."""
    times = []
    for d in range(days):
        if d == 12:
            continue
        times.append(d * 86400 + int(rng.integers(0, 1440)) * 60)
        if d == 20:
            times.append(times[-1] + int(rng.integers(1, 1440 - (times[-1] - d * 86400) // 60)) * 60)
    return times


def _moment(seconds: int) -> str:
    return (START + timedelta(seconds=seconds)).isoformat()


@pytest.mark.parametrize(("days", "seed"), [pytest.param(30, 31, id="30-days"),
                                            pytest.param(120, 7, marks=pytest.mark.audit, id="120-days")])
def test_cron_runs_publish_one_full_replay_minus_late_events(tmp_path, monkeypatch, days, seed):
    rng = np.random.default_rng(seed)
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    events, times = _events(rng, days), _run_times(rng, days)
    state = tmp_path / "s.stream"
    published: set[str] = set()
    fed, watermark, previous = [], 0, -1
    for k, now in enumerate(times):
        batch = events.filter((pl.col("arrival") > previous) & (pl.col("arrival") <= now))
        previous = now
        f = tmp_path / f"in{k}.csv"
        batch.select("ts", "user", "page").write_csv(f)
        # late: its trigger (the end of its day, counted in days from START) ran in an earlier run
        fed.append(batch.filter(pl.col("t") // 86400 + 1 > watermark))
        watermark = now // 86400  # the last trigger this run executes
        out = tmp_path / f"out{k}.csv"
        args = ["stream-replay", f, *ARGS, "--state", state, "--through", _moment(now), "-o", out]
        if k == 7:  # the output write fails after the ledger and the state were written: retried later
            with monkeypatch.context() as m:
                m.setattr("dpcli.cli.render.write_output", _failing_write)
                assert cli(*args).exit_code != 0 and not out.exists()
            args[-3] = _moment(now + 600)
        r = cli(*args)
        assert r.exit_code == 0, r.stderr
        published |= set(out.read_text().splitlines()[1:])
    body = json.loads(state.read_text())["body"]
    full_input = pl.concat(fed).with_columns(pl.col("t") + int(START.timestamp()))
    full = sr.run_stream(full_input.select(pl.col("t").alias("ts"), "user", "page").lazy(), QUERY,
                         sr.plan_stream(QUERY), bytes.fromhex(body["seed"]),
                         (START + timedelta(seconds=times[-1])).replace(tzinfo=None))
    expected = set(render(full.table, "csv", times=TIME_COLUMNS).decode().splitlines()[1:])
    assert len(expected) > 40 and published == expected
    history = json.loads(cli("budget", "history", "--json").stdout)
    assert sum(1 for e in history if e["events"]) == 1  # the stream's reservation, once
    assert sum(1 for e in history if e.get("replay_of")) == 1  # the retry, shown


def _failing_write(*args, **kwargs):
    raise OutputError("cannot write the output (simulated: disk full)")


def _day(path: Path, day: int, hours: range, users: range) -> Path:
    """Events of 2026-11-DAY at minute 7 of each hour in ``hours``, one per user, on three pages."""
    rows = [(f"2026-11-{day:02d}T{h:02d}:07:00Z", f"u{u}", f"p{u % 3}") for h in hours for u in users]
    pl.DataFrame(rows, schema=["ts", "user", "page"], orient="row").write_csv(path)
    return path


def _stream(*args: object) -> list[object]:
    return ["stream-replay", *args[:1], *ARGS, *args[1:]]


def test_a_retry_returns_the_published_rows_and_a_correction_is_refused(tmp_path):
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    state, out = tmp_path / "s.stream", tmp_path / "out.csv"
    day1 = _day(tmp_path / "d1.csv", 1, range(24), range(0, 400, 2))
    day2 = _day(tmp_path / "d2.csv", 2, range(0, 5), range(400, 700))
    assert cli(*_stream(day1, "--state", state, "--through", "2026-11-01T23:00:00Z")).exit_code == 0
    first = cli(*_stream(day2, "--state", state, "--through", "2026-11-02T05:30:00Z", "-o", out))
    assert first.exit_code == 0, first.stderr
    published = out.read_bytes()
    assert published.count(b"\n") > 1  # day 1's events, kept past --through, released at midnight
    entries = len(json.loads(cli("budget", "history", "--json").stdout))
    for through in ("2026-11-02T05:30:00Z", "2026-11-02T09:00:00Z", "2026-11-03T01:00:00Z"):
        again = cli(*_stream(day2, "--state", state, "--through", through, "-o", out))
        assert again.exit_code == 0 and out.read_bytes() == published, again.stderr
        assert "a retry, returning the rows that run released (free)" in again.stderr
    assert "the triggers after 2026-11-02T00:00:00Z run with the next new input" in again.stderr
    history = json.loads(cli("budget", "history", "--json").stdout)
    assert len(history) == entries + 3 and all(e["replay_of"] == history[entries - 1]["seq"]
                                               for e in history[entries:])
    corrected = tmp_path / "d2-fixed.csv"
    corrected.write_text(day2.read_text().replace("u400,", "u999,"))
    before = state.read_bytes()
    r = cli(*_stream(corrected, "--state", state, "--through", "2026-11-02T05:30:00Z", "-o", out))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "already ran up to 2026-11-02T05:30:00Z with another input: a late correction is a new release, " \
           "not a rewrite (feed only events not fed before, with a later --through" in r.stderr
    assert out.read_bytes() == published and state.read_bytes() == before
    assert len(json.loads(cli("budget", "history", "--json").stdout)) == entries + 3  # no debit, no entry
    day3 = _day(tmp_path / "d3.csv", 2, range(6, 8), range(700, 800))
    assert cli(*_stream(day3, "--state", state, "--through", "2026-11-02T08:30:00Z")).exit_code == 0
    kept = pl.read_parquet(base64.b64decode(json.loads(state.read_text())["body"]["stream"]["kept"]))
    refed = cli(*_stream(day2, "--state", state, "--through", "2026-11-02T09:00:00Z"))  # an older input again
    assert refed.exit_code == 0 and "this input was fed at run 2 (up to 2026-11-02T05:30:00Z)" in refed.stderr
    again = json.loads(state.read_text())["body"]["stream"]["kept"]
    assert pl.read_parquet(base64.b64decode(again)).equals(kept)  # its events are not kept twice
    from dpcli.errors import UsageError
    from dpcli.release.streams import StateInput, _is_retry

    last = json.loads(state.read_text())["body"]["last"]
    same = StateInput(pl.LazyFrame(), last["input"], "d2.csv", reading=last["reading"])
    assert _is_retry(last, same, "s") and not _is_retry(last, StateInput(pl.LazyFrame(), "other", "x"), "s")
    with pytest.raises(UsageError, match="read these same bytes another way"):  # e.g. as NDJSON: other events
        _is_retry(last, StateInput(pl.LazyFrame(), last["input"], "d2.jsonl", reading={"format": "ndjson"}), "s")


def test_zero_row_runs_say_why_unless_quiet(tmp_path):
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    state = tmp_path / "s.stream"
    morning = _day(tmp_path / "m.csv", 1, range(0, 9), range(300))
    evening = _day(tmp_path / "e.csv", 1, range(9, 20), range(300, 600))
    r = cli(*_stream(morning, "--state", state, "--through", "2026-11-01T09:00:00Z"))
    assert r.exit_code == 0 and r.stdout.count("\n") == 1, r.stderr
    assert "0 rows: no key was released by the triggers up to 2026-11-01T00:00:00Z" in r.stderr
    assert "events of later triggers are kept in the state" in r.stderr
    r = cli(*_stream(evening, "--state", state, "--through", "2026-11-01T20:00:00Z"))
    assert r.exit_code == 0 and r.stdout.count("\n") == 1
    assert "0 rows: no trigger has ended since the last run (the next ends at 2026-11-02T00:00:00Z)" in r.stderr
    quiet = cli("-q", *_stream(evening, "--state", state, "--through", "2026-11-01T21:00:00Z"))
    assert quiet.exit_code == 0 and quiet.stderr == ""
    empty = tmp_path / "none.csv"
    empty.write_text("ts,user,page\n")
    night = cli(*_stream(empty, "--state", state, "--through", "2026-11-02T00:30:00Z"))
    assert night.exit_code == 0 and night.stdout.count("\n") > 3, night.stderr  # the kept events, released
    assert "0 rows" not in night.stderr
    whole = cli(*_stream(morning, "--through", "2026-11-01T00:00:00Z"))
    assert "events after --through are not part of this release" in whole.stderr


def test_budget_show_lists_the_stream_and_history_its_retries(tmp_path):
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    state = tmp_path / "daily.stream"
    day = _day(tmp_path / "d.csv", 1, range(3), range(50))
    for _ in range(2):
        assert cli(*_stream(day, "--state", state, "--through", "2026-11-02T00:00:00Z")).exit_code == 0
    shown = json.loads(cli("budget", "show", "--json").stdout)
    assert shown["streams"] == [{"name": "daily.stream", "entry": 1, "time": shown["streams"][0]["time"],
                                 "reserved": [{"kind": "approx", "mechanism": "stream-replay/dp-sqlp", "epsilon": "8",
                                               "delta": "0.000000001", "detail": {"C": "2", "triggers": "7"}}],
                                 "runs": 1, "retries": 1}]
    text = cli("budget", "show").stdout
    assert "stream       daily.stream (entry #1): 1 run(s), 1 retry, epsilon=8, delta=1e-09 reserved" in text
    step = next(e for e in json.loads(cli("budget", "history", "--json").stdout) if e["step"] and not e["replay_of"])
    assert f"replay of #{step['seq']}" in cli("budget", "history").stdout.splitlines()[-1]


def test_dry_run_shows_the_next_runs_costs_margins_and_the_ledgers_answer(tmp_path):
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    state = tmp_path / "s.stream"
    day = _day(tmp_path / "d.csv", 1, range(3), range(50))

    def plan(*extra: object) -> dict:
        r = cli(*_stream(day, "--dry-run", "--json", "--through", "2026-11-03T10:00:00Z", *extra))
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)

    once = plan("--runs", "3")
    assert once["stream"]["state"] is None and [len(r["cost"]) for r in once["stream"]["runs"]] == [1, 1, 1]
    assert once["stream"]["spend"] == {"epsilon": "24", "delta": "0.000000003"}
    assert once["ledger"]["accepts"] is False and "needs 24" in once["ledger"]["refusal"]
    margins = once["moe95_by_trigger"]["count"]
    assert len(margins) == 7 and margins == sorted(margins) and margins[-1] == once["moe95"]["count"]
    fresh = plan("--state", state, "--runs", "30")
    assert not state.exists() and not list(tmp_path.glob("s.stream*"))  # nothing written
    assert [len(r["cost"]) for r in fresh["stream"]["runs"]] == [1] + [0] * 29
    assert fresh["stream"]["spend"] == {"epsilon": "8", "delta": "0.000000001"} and fresh["ledger"]["accepts"]
    assert cli(*_stream(day, "--state", state, "--through", "2026-11-01T12:00:00Z")).exit_code == 0
    after = plan("--state", state, "--runs", "5")
    assert after["stream"]["covered_by"] == 1 and after["stream"]["runs_recorded"] == 1
    assert after["stream"]["spend"] == {"epsilon": "0", "delta": "0"} and after["ledger"]["accepts"]
    assert after["stream"]["triggers"]["count"] == 2 and after["stream"]["triggers"]["new_input_accepted"]
    text = cli(*_stream(day, "--dry-run", "--state", state, "--through", "2026-11-01T11:00:00Z")).stdout
    assert "triggers: none due until 2026-11-02T00:00:00Z" in text and "only its input again (a retry)" in text
    assert cli(*_stream(day, "--runs", "2")).exit_code == 2


def test_an_empty_stream_release_is_drawn_as_an_empty_chart(tmp_path):
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    day = _day(tmp_path / "d.csv", 1, range(3), range(50))
    for ext in ("csv", "parquet"):
        out = tmp_path / f"empty.{ext}"
        assert cli(*_stream(day, "--through", "2026-11-01T00:00:00Z", "-o", out)).exit_code == 0
        r = cli("plot", out)
        assert r.exit_code == 0 and f"release {out}: no rows were released, nothing to draw" in r.stdout, r.stderr
    doc = tmp_path / "empty.summary.json"
    doc.write_text(cli(*_stream(day, "--through", "2026-11-01T00:00:00Z", "--json")).stdout)
    assert cli("plot", doc).exit_code == 0
    records = tmp_path / "records.json"
    records.write_text("[]")
    r = cli("plot", records)
    assert r.exit_code == 65 and "holds no rows and no columns" in r.stderr
    pytest.importorskip("matplotlib")
    svg = tmp_path / "empty.svg"
    assert cli("plot", tmp_path / "empty.csv", "-o", svg).exit_code == 0 and svg.stat().st_size > 1000


def test_a_restored_older_state_neither_feeds_its_kept_events_again_nor_runs_free(tmp_path):
    """The kept events are part of the state the ledger binds: an older copy (restored from a backup) can
    repeat the run the ledger recorded after it (the same rows and the same kept events, free), and is
    refused (78, no debit, no output) for any other input."""
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    state = tmp_path / "s.stream"
    days = [_day(tmp_path / f"d{d}.csv", d, range(0, 24, 2), range(100 * d, 100 * d + 150)) for d in (1, 2, 3)]
    assert cli(*_stream(days[0], "--state", state, "--through", "2026-11-01T12:00:00Z")).exit_code == 0
    backup = state.read_bytes()
    second = cli(*_stream(days[1], "--state", state, "--through", "2026-11-02T12:00:00Z"))
    assert second.exit_code == 0 and second.stdout.count("\n") > 1, second.stderr
    after_second = json.loads(state.read_text())["body"]["stream"]
    entries = len(json.loads(cli("budget", "history", "--json").stdout))
    state.write_bytes(backup)
    other = cli(*_stream(days[2], "--state", state, "--through", "2026-11-03T12:00:00Z", "-o", tmp_path / "o.csv"))
    assert other.exit_code == 78 and "behind the ledger" in other.stderr, other.stderr
    assert not (tmp_path / "o.csv").exists() and len(json.loads(cli("budget", "history", "--json").stdout)) == entries
    again = cli(*_stream(days[1], "--state", state, "--through", "2026-11-02T12:00:00Z"))
    assert again.exit_code == 0 and again.stdout == second.stdout, again.stderr
    assert _same_stream(json.loads(state.read_text())["body"]["stream"], after_second)  # the same kept events, once
    history = json.loads(cli("budget", "history", "--json").stdout)
    assert history[-1]["replay_of"] == history[entries - 1]["seq"] and not history[-1]["events"]


def _same_stream(a: dict, b: dict) -> bool:
    """Two states' stream parts hold the same (per-unit record counts compared as mappings: their order is
    the order polars grouped them in)."""
    def used(doc: dict) -> dict:
        return dict(zip(doc["used"]["units"], doc["used"]["records"], strict=True))

    return used(a) == used(b) and {**a, "used": None} == {**b, "used": None}


def test_a_long_stream_says_when_its_units_may_have_used_up_their_records(tmp_path):
    """C (here 2) counts each unit's first records over the whole stream: once the stream has run more triggers
    than C, a note says later triggers undercount active units (public: the triggers run and C)."""
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    state = tmp_path / "s.stream"
    said = []
    for day in (1, 2, 3):
        path = _day(tmp_path / f"d{day}.csv", day, range(0, 3), range(60))
        r = cli(*_stream(path, "--state", state, "--through", f"2026-11-{day + 1:02d}T00:00:00Z"))
        assert r.exit_code == 0, r.stderr
        said.append("units active in more than 2 triggers have stopped counting" in r.stderr)
        if said[-1]:
            assert "this stream has run 3 triggers since its first run" in r.stderr
    assert said == [False, False, True]


def test_the_run_that_chooses_a_streams_bounds_says_so_and_later_runs_do_not(tmp_path):
    """``--max-contributions auto`` on a persisted stream is chosen from its first run's records and kept: that run
    names what it chose (released values) and says it holds for the whole stream (found by the new-user trial:
    the choice was silent, C = 2 for a stream of daily flights)."""
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    state = tmp_path / "s.stream"
    args = [a if a != "2" else "auto" for a in ARGS]  # --max-contributions auto
    said = []
    for day in (1, 2):
        path = _day(tmp_path / f"d{day}.csv", day, range(0, 3), range(300))
        r = cli("stream-replay", path, *args, "--state", state, "--through", f"2026-11-{day + 1:02d}T00:00:00Z")
        assert r.exit_code == 0, r.stderr
        said.append(r.stderr)
    assert "chosen from this first run's records for the whole stream: --max-contributions " in said[0]
    assert "chosen from this first run's records" not in said[1]
