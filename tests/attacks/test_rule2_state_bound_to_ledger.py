"""Rule 2, state that can make a run free is bound to the ledger: copied, restored, moved or recreated state is refused.

Attacks through copied, restored, deleted or moved state files (issue 15, finding 2). A
``stream-replay --state`` file holds a stream's seed and pre-drawn noise; a ``--schedule`` state says
which runs its reservation already paid for. A fork (``cp -p``), a rollback (an older copy restored), a
deleted-and-recreated schedule or a state moved to another analyst must never give reused noise on
other data, nor fresh noise for free: each is refused (exit 78, one line, no debit, no output). A crash
between the ledger write and the state write is retried with the same release, never under-counted.

Later reviews added: a restored state replayed after an upgrade that changed the noise (noise stream
v2, issue 20); a restored state that recomputes a recorded run from the same bytes read another way
(another delimiter, NDJSON instead of CSV: issue 29's seed review); and BBImprover's runs index, which
a state restored with fewer runs would spend again (the review of noise stream v2 and BBImprover for
cron).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dptest import cli, init_ledger, released_nothing, runner
from polyglots import N, comma_and_semicolon, csv_and_ndjson, hard_link, write

import dpcli.state.documents as documents
import dpcli.tasks.stream as sr
from dpcli.cli.app import app
from dpcli.state import ledger

_PLANS: dict = {}
_plan_stream = sr.plan_stream


@pytest.fixture(autouse=True)
def _plan_once(monkeypatch):
    """The stream's calibration (a slow numeric search, a pure function of the query) is computed once."""
    monkeypatch.setattr(sr, "plan_stream", lambda q: _PLANS.get(q) or _PLANS.setdefault(q, _plan_stream(q)))


STREAM = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "2d", "--trigger-every", "12h",
          "--max-contributions", "4", "--epsilon", "2", "--delta", "1e-9"]


def _half_day(path: Path, d: int, variant: int = 0) -> Path:
    """Events of half-day ``d`` (Nov 2026): 60 events; ``variant`` changes one user's page."""
    ts = [f"2026-11-{1 + d // 2:02d}T{12 * (d % 2) + i // 6:02d}:{(i % 6) * 10:02d}:00" for i in range(60)]
    pages = [f"p{i % 3}" for i in range(60)]
    if variant:
        pages[0] = "p9"
    pl.DataFrame({"ts": ts, "user": [f"u{(i + 60 * d) % 150}" for i in range(60)], "page": pages}).write_csv(path)
    return path


@pytest.fixture
def stream(tmp_path):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-6")
    days = [_half_day(tmp_path / f"d{d}.csv", d) for d in range(4)]
    other = [_half_day(tmp_path / f"d{d}x.csv", d, variant=1) for d in range(4)]
    return days, other


def _ledger_files(state_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((state_dir / "ledgers").glob("*.*")) if p.suffix != ".lock"}


def _run(data: Path, state: Path, *extra: str, out: Path | None = None):
    args = ["stream-replay", str(data), *STREAM, "--state", str(state), *extra]
    return runner.invoke(app, [*args, "-o", str(out)] if out else args)


def _refused(result, state_dir: Path, before: dict[str, bytes], out: Path | None = None) -> None:
    assert result.exit_code == 78, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert _ledger_files(state_dir) == before  # no debit, no entry
    assert out is None or not out.exists()


def _charged(state_dir: Path) -> list[dict]:
    h = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
    return [e for e in h if e["events"] and not e.get("replay_of")]


def test_a_forked_stream_state_is_refused_on_other_data(stream, tmp_path, state_dir):
    days, other = stream
    s1, s2 = tmp_path / "s1.state", tmp_path / "s2.state"
    assert _run(days[0], s1).exit_code == 0
    shutil.copy2(s1, s2)  # cp -p
    first = _run(days[1], s1)
    assert first.exit_code == 0, first.stderr
    before = _ledger_files(state_dir)
    out = tmp_path / "fork.csv"
    _refused(_run(other[1], s2, out=out), state_dir, before, out)
    # The fork on the very same input is an exact repeat: the same rows again, charged nothing.
    same = _run(days[1], s2)
    assert same.exit_code == 0 and same.stdout == first.stdout
    assert len(_charged(state_dir)) == 1


def test_a_fork_made_before_the_first_run_is_refused(stream, tmp_path, state_dir):
    """Copies of a state at step 0 (e.g. left by a crash) share the seed: only one may run on data."""
    days, other = stream
    s1, s2 = tmp_path / "s1.state", tmp_path / "s2.state"
    assert _run(days[0], s1).exit_code == 0
    before = _ledger_files(state_dir)
    body = json.loads(s1.read_text())["body"]
    body.update(step=0, stream=None, last=None)  # what a crash before the first ledger write leaves
    documents.write(s2, "dpcli-stream-state", body)
    _refused(_run(other[0], s2), state_dir, before)


def test_a_rolled_back_stream_state_is_refused(stream, tmp_path, state_dir):
    days, other = stream
    s = tmp_path / "s.state"
    assert _run(days[0], s).exit_code == 0
    old = s.read_bytes()
    assert _run(days[1], s).exit_code == 0
    assert _run(days[2], s).exit_code == 0
    s.write_bytes(old)  # restored from yesterday's backup
    before = _ledger_files(state_dir)
    out = tmp_path / "o.csv"
    _refused(_run(days[2], s, out=out), state_dir, before, out)  # skipping day 1 after a restore: other data
    _refused(_run(other[1], s, out=out), state_dir, before, out)
    assert len(_charged(state_dir)) == 1


def test_a_stream_state_under_another_analyst_or_state_dir_is_refused(stream, tmp_path, state_dir):
    days, _ = stream
    s = tmp_path / "s.state"
    assert _run(days[0], s).exit_code == 0
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-6", analyst="bob")
    before = _ledger_files(state_dir)
    bob = runner.invoke(app, ["--analyst", "bob", "stream-replay", str(days[1]), *STREAM, "--state", str(s)])
    _refused(bob, state_dir, before)
    other_dir = tmp_path / "other-state"
    env = {"DPCLI_STATE_DIR": str(other_dir)}
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-6", env=env)
    other_before = _ledger_files(other_dir)
    r = runner.invoke(app, ["stream-replay", str(days[1]), *STREAM, "--state", str(s)], env=env)
    _refused(r, other_dir, other_before)


class Crash(Exception):
    """Stands for a power cut right after the ledger write."""


def _crash_after_ledger_write(monkeypatch, state_dir: Path, kind: str, captured: list) -> None:
    """Make the next write of a ``kind`` document raise if the ledger grew during this run."""
    real = documents.write
    start = len(ledger.load_document(state_dir / "ledgers" / "default.json", (state_dir / "ledgers" / "default.json").read_bytes())[0]["entries"])

    def write(path, k, body):
        grown = len(ledger.load_document(state_dir / "ledgers" / "default.json", (state_dir / "ledgers" / "default.json").read_bytes())[0]["entries"]) > start
        if k == kind and grown and not captured:
            captured.append(body)
            raise Crash("power cut")
        real(path, k, body)

    monkeypatch.setattr(documents, "write", write)


@pytest.mark.parametrize("crash_run", [0, 1])
def test_a_crash_between_ledger_and_state_write_retries_the_same_release(stream, tmp_path, state_dir, monkeypatch,
                                                                         crash_run):
    days, _ = stream
    s = tmp_path / "s.state"
    if crash_run:
        assert _run(days[0], s).exit_code == 0
    captured: list = []
    with monkeypatch.context() as m:
        _crash_after_ledger_write(m, state_dir, "dpcli-stream-state", captured)
        out = tmp_path / "o.csv"
        r = _run(days[crash_run], s, out=out)
        assert r.exit_code != 0 and captured and not out.exists()
    retry = _run(days[crash_run], s, "--json")
    assert retry.exit_code == 0, retry.stderr
    import base64
    import io
    lost = pl.read_parquet(io.BytesIO(base64.b64decode(captured[0]["last"]["release"])))
    assert json.loads(retry.stdout)["result"] == json.loads(lost.write_json())  # same input, same release
    assert len(_charged(state_dir)) == 1  # charged once: not twice, not zero
    assert _run(days[crash_run + 1], s).exit_code == 0  # and the stream goes on


# ---- schedules ----------------------------------------------------------------------------------


@pytest.fixture
def snapshots(tmp_path):
    """One row per unit. With γ = 0.5 and ε = 1, epoch 1 starts near 30,000 units and epoch 2 near 45,000; the
    crossing tests' noise has a scale of a few hundred units, so 21,000 is epoch 0 and 37,000 epoch 1 for sure
    (and 85,000 an epoch past 1)."""
    paths = {}
    for size in (20000, 21000, 37000, 85000):
        p = tmp_path / f"snap{size}.csv"
        pl.DataFrame({"user": [f"u{i}" for i in range(size)], "g": ["abc"[i % 3] for i in range(size)]}).write_csv(p)
        paths[size] = p
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    init_ledger("pure", "--epsilon", "3")
    return paths, keys


def _hist(path, keys, *extra, out=None):
    return runner.invoke(app, ["histogram", str(path), "--by", "g", "--privacy-unit", "user", "--keys", str(keys),
                               "--schedule", "daily", "--total-epsilon", "1", "--gamma", "0.5", *extra,
                               *(["-o", str(out)] if out else ["--json", "-o", "-"])])


def test_a_deleted_and_recreated_schedule_gets_no_free_release(snapshots, tmp_path, state_dir):
    paths, keys = snapshots
    assert _hist(paths[20000], keys).exit_code == 0
    for f in (state_dir / "schedules" / "default").glob("*"):
        if f.suffix != ".lock":
            f.unlink()
    before = _ledger_files(state_dir)
    out = tmp_path / "o.csv"
    _refused(_hist(paths[20000], keys, out=out), state_dir, before, out)
    _refused(_hist(paths[85000], keys, out=out), state_dir, before, out)
    assert len(_charged(state_dir)) == 1


def test_a_rolled_back_schedule_state_is_refused(snapshots, tmp_path, state_dir):
    """The old state still holds epoch 1's crossing test, which has passed since: asked about a new snapshot it
    would answer from its threshold noise again. Whether it would say "not yet" (a cached release) or "yes" (a
    new epoch), it is refused; only the recorded run, recomputed exactly, is allowed (free)."""
    paths, keys = snapshots
    assert _hist(paths[20000], keys).exit_code == 0
    (state,) = (state_dir / "schedules" / "default").glob("*.json")
    old = state.read_bytes()
    assert json.loads(_hist(paths[37000], keys).stdout)["summary"]["schedule"]["epoch"] == 1
    state.write_bytes(old)
    before = _ledger_files(state_dir)
    out = tmp_path / "o.csv"
    _refused(_hist(paths[85000], keys, out=out), state_dir, before, out)  # a new epoch from a state that forgot epoch 1
    _refused(_hist(paths[21000], keys, out=out), state_dir, before, out)  # "not yet" from the passed test
    again = _hist(paths[37000], keys)  # the recorded epoch 1, exactly: the same release
    assert again.exit_code == 0, again.stderr
    assert len(_charged(state_dir)) == 1


def test_a_schedule_state_moved_to_another_analyst_is_refused(snapshots, tmp_path, state_dir):
    paths, keys = snapshots
    assert _hist(paths[20000], keys).exit_code == 0
    init_ledger("pure", "--epsilon", "3", analyst="bob")
    bob = state_dir / "schedules" / "bob"
    shutil.copytree(state_dir / "schedules" / "default", bob)
    before = _ledger_files(state_dir)
    out = tmp_path / "o.csv"
    r = runner.invoke(app, ["--analyst", "bob", "histogram", str(paths[37000]), "--by", "g", "--privacy-unit", "user",
                            "--keys", str(keys), "--schedule", "daily", "--total-epsilon", "1", "--gamma", "0.5",
                            "-o", str(out)])
    _refused(r, state_dir, before, out)


def test_a_crash_between_ledger_and_schedule_state_write_retries_the_same_release(snapshots, state_dir, monkeypatch):
    paths, keys = snapshots
    assert _hist(paths[20000], keys).exit_code == 0
    captured: list = []
    with monkeypatch.context() as m:
        _crash_after_ledger_write(m, state_dir, "dpcli-schedule", captured)
        assert _hist(paths[37000], keys).exit_code != 0 and captured
    retry = _hist(paths[37000], keys)
    assert retry.exit_code == 0, retry.stderr
    summary = json.loads(retry.stdout)["summary"]
    assert summary["schedule"]["epoch"] == 1 and summary["schedule"]["runs"] == 2
    assert len(_charged(state_dir)) == 1
    again = _hist(paths[37000], keys)
    assert json.loads(again.stdout)["result"] == json.loads(retry.stdout)["result"]


def test_the_first_scheduled_run_reports_its_reservation(snapshots):
    paths, keys = snapshots
    first = json.loads(_hist(paths[20000], keys).stdout)["summary"]
    assert first["charged"] is True and first["reserved"][0]["epsilon"] == "1"
    later = json.loads(_hist(paths[37000], keys).stdout)["summary"]
    assert later["charged"] is False and "reserved" not in later


# -- noise stream v2 (issue 20): a restored state replayed after an upgrade draws other noise ----------


def test_a_restored_stream_state_replayed_under_another_noise_definition_is_refused(stream, tmp_path, state_dir,
                                                                                      monkeypatch):
    """An older copy may repeat a recorded run for free only if it recomputes the same rows. After an
    upgrade that changes the noise, the new trees of that run would get other noise: two noisy answers
    for one charge. The run's ledger digest binds the noise version, so the copy is refused."""
    import dpcli.release.streams as statefile

    days, _ = stream
    s = tmp_path / "s.state"
    assert _run(days[0], s).exit_code == 0
    old = s.read_bytes()
    assert _run(days[1], s).exit_code == 0
    s.write_bytes(old)  # yesterday's backup restored
    monkeypatch.setattr(statefile, "NOISE_VERSION", statefile.NOISE_VERSION + 1)  # the upgrade
    before = _ledger_files(state_dir)
    out = tmp_path / "o.csv"
    _refused(_run(days[1], s, out=out), state_dir, before, out)
    assert len(_charged(state_dir)) == 1


def test_a_restored_schedule_state_replayed_under_another_noise_definition_is_refused(snapshots, tmp_path,
                                                                                        state_dir, monkeypatch):
    """The same for a schedule: its run digest binds the run's seed, which holds the noise version."""
    import dpcli.release.seeds as release

    paths, keys = snapshots
    assert _hist(paths[20000], keys).exit_code == 0
    (state,) = (state_dir / "schedules" / "default").glob("*.json")
    old = state.read_bytes()
    assert json.loads(_hist(paths[37000], keys).stdout)["summary"]["schedule"]["epoch"] == 1
    state.write_bytes(old)
    version = release.NOISE_VERSION
    monkeypatch.setattr(release, "NOISE_VERSION", version + 1)
    before = _ledger_files(state_dir)
    out = tmp_path / "o.csv"
    _refused(_hist(paths[37000], keys, out=out), state_dir, before, out)
    monkeypatch.setattr(release, "NOISE_VERSION", version)
    again = _hist(paths[37000], keys)  # under the noise it was recorded with: the same release, free
    assert again.exit_code == 0, again.stderr
    assert len(_charged(state_dir)) == 1


# -- issue 29: a restored copy replays a recorded run only when it is read alike ----------------------


def _events(columns_csv: Sequence[Sequence[str]], columns_json: Sequence[Sequence[str]]) -> bytes:
    return csv_and_ndjson(["ts", "user", "page"], columns_csv, columns_json)


def test_a_restored_schedule_state_replays_a_run_only_under_the_same_delimiter(tmp_path, keys, state_dir):
    """A schedule's run digest binds the run's seed: a restored state that recomputes a recorded epoch
    from the same bytes split on another delimiter (other units, other groups) is refused."""
    init_ledger()
    # 1,000 → 40,000 units: past epoch 1's start by ~40 scales of the crossing test's noise (~700 units at
    # ε = 1, γ = 0.1: docs/commands/schedules.md), so the epoch starts whatever the key.
    small, big = write(tmp_path / "s1.csv", comma_and_semicolon(1000)), write(tmp_path / "s2.csv",
                                                                            comma_and_semicolon(40000))

    def run(path: Path, *extra: str) -> Any:
        return cli("histogram", path, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--schedule", "daily",
                   "--total-epsilon", "1", "--gamma", "0.1", *extra, "--json")

    assert run(small).exit_code == 0
    (state,) = (state_dir / "schedules" / "default").glob("*.json")
    old = state.read_bytes()
    assert run(big).exit_code == 0  # epoch 1
    state.write_bytes(old)  # yesterday's backup
    before = _ledger_files(state_dir)
    refused = run(big, "--delimiter", ";")
    assert refused.exit_code == 78, (refused.stdout, refused.stderr)
    assert _ledger_files(state_dir) == before
    again = run(big)  # the recorded epoch 1, read as it was: the same release, free
    assert again.exit_code == 0, again.stderr
    assert len(_charged(state_dir)) == 1


def test_a_restored_stream_state_replays_a_run_only_under_the_same_reading(tmp_path, state_dir):
    """A stream's run digest binds how its input was read: an older copy of the state that recomputes
    a recorded run from the same bytes read as NDJSON instead of CSV is refused (it would draw the
    run's noise over other events)."""
    init_ledger("approx")
    opts = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "12h",
            "--max-contributions", "2", "--epsilon", "2", "--delta", "1e-9"]
    day1 = write(tmp_path / "d1.csv", _events([["2026-11-01T01:00:00", f"u{i}", "p1"] for i in range(N)],
                                              [["2026-11-01T01:00:00", f"v{i}", "p2"] for i in range(N + 1)]))
    day2 = write(tmp_path / "d2.csv", _events([["2026-11-02T01:00:00", f"u{i}", "p1"] for i in range(N)],
                                              [["2026-11-02T01:00:00", f"v{i}", "p2"] for i in range(N + 1)]))
    day2_json = hard_link(day2, "d2.jsonl")
    s = tmp_path / "s.state"

    def run(path: Path, through: str) -> Any:
        return cli("stream-replay", path, *opts, "--state", s, "--through", through, "--json")

    assert run(day1, "2026-11-02").exit_code == 0
    old = s.read_bytes()
    assert run(day2, "2026-11-03").exit_code == 0
    s.write_bytes(old)  # yesterday's backup
    before = _ledger_files(state_dir)
    refused = run(day2_json, "2026-11-03")
    assert refused.exit_code == 78, (refused.stdout, refused.stderr)
    assert _ledger_files(state_dir) == before
    again = run(day2, "2026-11-03")  # the recorded run, read as it was: the same rows, free
    assert again.exit_code == 0, again.stderr
    assert len(_charged(state_dir)) == 1


# ---- BBImprover runs index: a rolled-back state, and a snapshot seen before (resisted) ---------------


def test_runs_index_rollback_is_refused_and_a_repeated_snapshot_is_a_replay(tmp_path, state_dir):
    """t = k counts the state's runs, so a state restored with fewer runs would re-spend the larger ε_k:
    a new snapshot on it is refused (exit 78, nothing debited); the recorded one comes back free and
    identical. A snapshot seen at run 1 and again after run 2 (A, B, A) is run 1's release again (issue 31:
    a retry never unpublishes), free: never run 1's noise at another scale, never a second release of A."""
    snaps = {}
    for name, n in (("A", 40), ("B", 40), ("C", 60)):
        p = tmp_path / f"{name}.csv"
        rows = [(f"u{i}", "ab"[i % 2]) for i in range(n)]
        if name == "B":
            rows[0] = ("u0", "b")
        pl.DataFrame(rows, schema=["user", "g"], orient="row").write_csv(p)
        snaps[name] = p
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\n")
    init_ledger("approx", "--epsilon", "5", "--delta", "1e-5")

    def run(name):
        r = runner.invoke(app, ["histogram", str(snaps[name]), "--by", "g", "--privacy-unit", "user", "--keys",
                                str(keys), "--schedule", "cron", "--total-epsilon", "1", "--scheduler", "bbimprover",
                                "--total-delta", "1e-6", "--json", "-o", "-"])
        return r, (json.loads(r.stdout) if r.exit_code == 0 else None)

    r1, d1 = run("A")
    (state,) = (state_dir / "schedules" / "default").glob("*.json")
    after_one = state.read_bytes()
    r2, d2 = run("B")
    r3, d3 = run("A")
    assert d1["summary"]["schedule"]["run"] == 1 and d3["summary"]["schedule"]["replay_of_run"] == 1
    assert d1["summary"]["seed_id"] == d3["summary"]["seed_id"] and d1["result"] == d3["result"]
    assert d3["summary"]["charged"] is False and d3["summary"]["schedule"]["runs"] == 2
    ledger_before = {p.name: p.read_bytes() for p in (state_dir / "ledgers").glob("*.*") if p.suffix != ".lock"}
    state.write_bytes(after_one)  # the operator restores the state from after run 1
    r, _ = run("C")
    assert r.exit_code == 78 and released_nothing(r) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert {p.name: p.read_bytes() for p in (state_dir / "ledgers").glob("*.*") if p.suffix != ".lock"} == ledger_before
    r, again = run("B")  # run 2, exactly as recorded: the same release, free
    assert r.exit_code == 0, r.stderr
    assert again["result"] == d2["result"] and again["summary"]["charged"] is False
