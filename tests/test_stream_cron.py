"""``stream-replay --state`` as a daily cron job (issue 31): no event is lost to timing, a retry never
unpublishes, 0-row runs say why, and the ledger shows the stream and its retries.

The simulation: events happen at random times and arrive a little later (a few reach dpcli after their
trigger already ran: late); each day a job runs at a random minute and feeds the events that arrived
since the job before. One day is missed, one day runs twice, one run fails to write its output and is
retried. The distinct rows published must equal one full replay of every input with the same seed,
minus the late events.
"""

from __future__ import annotations

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
from dpcli.tasks import stream_replay as sr

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


def test_thirty_days_of_cron_runs_publish_one_full_replay_minus_late_events(tmp_path, monkeypatch):
    rng = np.random.default_rng(31)
    days = 30
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
    expected = set(render(full.table, "csv").decode().splitlines()[1:])
    assert len(expected) > 40 and published == expected
    history = json.loads(cli("budget", "history", "--json").stdout)
    assert sum(1 for e in history if e["events"]) == 1  # the stream's reservation, once
    assert sum(1 for e in history if e.get("replay_of")) == 1  # the retry, shown


def _failing_write(*args, **kwargs):
    raise OutputError("cannot write the output (simulated: disk full)")
