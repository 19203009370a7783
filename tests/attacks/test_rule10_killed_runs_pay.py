"""Rule 10 (work per person) and its timing clause: a run that has begun reading private data has paid.

Every timing probe must cost ε: an analyst who kills a run (a timeout, Ctrl-C relayed by sudo, SIGKILL)
after it began reading records must find it charged, and its rerun must be a free replay of that one
charge, never a fresh, free run. So each command's release path debits the ledger (or, for a stream or
schedule, reserves its whole budget) once its seed is known and *before* it collects anything.

The attack, for every command: polars' ``LazyFrame.collect`` (every record a release reads is collected
through it or ``collect_all``) is replaced by a probe that first records whether the ledger already holds
a debit, then interrupts the run as a killed process would (public lists, read to build the seed, pass). The run must stop without output, the
probe must never have seen a ledger without a debit, and the ledger must hold exactly one charge, kept
by a second interrupted run (its seed already paid).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from dptest import PV, SAMPLE, init_ledger, runner
from killed_runs import kill_at_first_read

from dpcli.cli.app import app


def _charged(state: Path) -> list[dict]:
    """The ledger's entries that cost something, read from the file as it is now (no lock, no verify)."""
    path = state / "ledgers" / "default.json"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_bytes().splitlines()[1:] if line.strip()]
    return [e for e in lines if e.get("events")]


def _probe(monkeypatch: pytest.MonkeyPatch, state: Path) -> list[bool]:
    """Every collect of private data records whether a charge was already on disk, then kills the run."""
    return kill_at_first_read(monkeypatch, lambda: bool(_charged(state)))


def _csv(tmp_path: Path) -> Path:
    """Events of 40 users in two groups over two hours (for every command but tabulate)."""
    rows = [{"user": f"u{i % 40}", "g": "ab"[i % 2], "v": i % 9, "t": f"2026-01-01T0{i % 2}:{i % 60:02d}:00"}
            for i in range(200)]
    path = tmp_path / "d.csv"
    pl.DataFrame(rows).write_csv(path)
    return path


COMMANDS = {
    "histogram": lambda d: ["histogram", d, "--by", "g", "--privacy-unit", "user", "--epsilon", "1",
                            "--delta", "1e-6"],
    "histogram auto": lambda d: ["histogram", d, "--by", "g", "--privacy-unit", "user", "--agg", "sum",
                                 "--value", "v", "--bounds", "auto", "--epsilon", "1", "--delta", "1e-6"],
    "topk": lambda d: ["topk", d, "--by", "g", "--privacy-unit", "user", "-k", "1", "--epsilon-per", "1",
                       "--delta", "1e-6"],
    "sql": lambda d: ["sql", "SELECT g, ANON_COUNT(*, 2) AS n FROM t GROUP BY g", "--table", f"t={d}",
                      "--privacy-unit", "t.user", "--epsilon", "1", "--delta", "1e-6"],
    "sql, public join": lambda d: ["sql", "SELECT p.label, ANON_COUNT(*, 2) AS n FROM t JOIN pub p ON t.g = p.g "
                                   "GROUP BY p.label", "--table", f"t={d}", "--public-table",
                                   f"pub={Path(d).with_name('pub.csv')}", "--privacy-unit", "t.user",
                                   "--epsilon", "1", "--delta", "1e-6"],
    "tabulate": lambda d: ["tabulate", str(SAMPLE / "persons.parquet"), "--spec", str(SAMPLE / "safetab_spec.toml")],
    "stream-replay --state": lambda d: ["stream-replay", d, "--time", "t", "--by", "g", "--privacy-unit", "user",
                                        "--window", "1h", "--triggers", "2", "--epsilon", "1", "--delta", "1e-6",
                                        "--max-contributions", "1", "--state", str(Path(d).with_suffix(".state")),
                                        "--through", "2026-01-01T02:00:00"],
    "histogram --schedule": lambda d: ["histogram", d, "--by", "g", "--privacy-unit", "user", "--keys",
                                       str(Path(d).with_name("keys.csv")), "--schedule", "s", "--scheduler",
                                       "fixed", "--epsilon", "0.5", "--total-epsilon", "2"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_attack_a_run_killed_at_its_first_read_has_paid_and_its_rerun_is_free(tmp_path, monkeypatch, state_dir,
                                                                               name):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    data = _csv(tmp_path)
    (tmp_path / "keys.csv").write_text("g\na\nb\n")
    (tmp_path / "pub.csv").write_text("g,label\na,A\nb,B\n")
    args = COMMANDS[name](str(data))
    seen = _probe(monkeypatch, state_dir)
    for attempt in range(2):
        r = runner.invoke(app, args)
        assert r.exit_code == 130 and r.stdout == "", (name, attempt, r.stdout, r.stderr)
        # the first attempt says it charged the ledger, its rerun (a free replay) that it charged nothing
        said = ("this run charged ledger 'default' (it had begun reading its data" if attempt == 0 else
                "this run charged nothing and wrote nothing")
        assert r.stderr.startswith(f"dpcli: interrupted by SIGINT: {said}"), (name, attempt, r.stderr)
        assert seen and all(seen), f"{name}: records were collected before the ledger held a charge"
        assert len(_charged(state_dir)) == 1, f"{name}: attempt {attempt + 1} must leave exactly one charge"


def test_the_probe_sees_a_run_that_debits_only_after_reading(tmp_path, monkeypatch, state_dir):
    """The probe itself can fail: with the debit moved back after the run (as before issue 37), the first
    collect finds no charge on disk."""
    from dpcli.release import plain as release_path

    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    original = release_path.prepare
    monkeypatch.setattr(release_path, "prepare", lambda *a, before_run=None, **k: original(*a, **k))
    seen = _probe(monkeypatch, state_dir)
    r = runner.invoke(app, COMMANDS["histogram"](str(_csv(tmp_path))))
    assert r.exit_code != 0 and seen == [False] and _charged(state_dir) == []


def test_a_file_changed_after_hashing_is_refused_before_the_debit(tmp_path, monkeypatch, state_dir):
    """A change seen before the debit (the input rewritten between its hashing and the run) costs nothing."""
    from dpcli.io import inputs

    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    data = _csv(tmp_path)

    def rewrite(path: str) -> None:
        if path.endswith("d.csv"):
            with open(path, "a") as fh:
                fh.write("u99,a,1,2026-01-01T00:00:00\n")

    monkeypatch.setattr(inputs, "after_fingerprint_hook", rewrite)
    r = runner.invoke(app, COMMANDS["histogram"](str(data)))
    assert r.exit_code == 66 and _charged(state_dir) == []
    assert PV  # the sample data the other tests use is untouched


def _day(tmp_path: Path, day: int) -> Path:
    """Day ``day``'s snapshot: the first ``day`` hours of events (each a different input)."""
    rows = [{"user": f"u{i % 40}", "g": "ab"[i % 2], "v": i % 9, "t": f"2026-01-01T{h:02d}:{i % 60:02d}:00"}
            for h in range(day) for i in range(100)]
    path = tmp_path / f"day{day}.csv"
    pl.DataFrame(rows).write_csv(path)
    return path


LATER_RUNS = {
    "histogram --schedule": lambda d, state, day: ["histogram", d, "--by", "g", "--privacy-unit", "user", "--keys",
                                              str(Path(d).with_name("keys.csv")), "--schedule", "s", "--scheduler",
                                              "fixed", "--epsilon", "0.5", "--total-epsilon", "2"],
    "stream-replay --state": lambda d, state, day: ["stream-replay", d, "--time", "t", "--by", "g",
                                                    "--privacy-unit", "user", "--window", "1h", "--triggers", "8",
                                                    "--epsilon", "1", "--delta", "1e-6", "--max-contributions", "1",
                                                    "--state", state, "--through", f"2026-01-01T{day:02d}:00:00"],
}


@pytest.mark.parametrize("name", list(LATER_RUNS))
def test_attack_a_later_run_killed_then_fed_other_inputs_pays_for_each(tmp_path, monkeypatch, state_dir, name):
    """A stream's or schedule's reservation pays for one computation per run. Killing run 2 at its first read
    and feeding that run other inputs (one timing probe each) must not be free: the same input again is (a
    retry), another input pays the whole reservation again; a run that completes ends it."""
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    (tmp_path / "keys.csv").write_text("g\na\nb\n")
    state = str(tmp_path / "s.state")
    assert runner.invoke(app, LATER_RUNS[name](str(_day(tmp_path, 1)), state, 1)).exit_code == 0
    paid = len(_charged(state_dir))  # the reservation
    originals = {"collect": pl.LazyFrame.collect, "collect_all": pl.collect_all}
    seen = _probe(monkeypatch, state_dir)
    for day, extra in ((2, 0), (2, 0), (3, 1), (4, 2), (4, 2)):  # run 2 killed: A, A again, then B, then C twice
        r = runner.invoke(app, LATER_RUNS[name](str(_day(tmp_path, day)), state, day))
        assert r.exit_code != 0 and r.stdout == "", (name, day, r.stderr)
        assert len(_charged(state_dir)) == paid + extra, (name, day, r.stderr)
    assert seen
    monkeypatch.setattr(pl.LazyFrame, "collect", originals["collect"])
    monkeypatch.setattr(pl, "collect_all", originals["collect_all"])
    done = runner.invoke(app, LATER_RUNS[name](str(_day(tmp_path, 4)), state, 4))
    assert done.exit_code == 0, done.stderr
    assert len(_charged(state_dir)) == paid + 2  # completing the run costs nothing more
    nxt = runner.invoke(app, LATER_RUNS[name](str(_day(tmp_path, 5)), state, 5))
    assert nxt.exit_code == 0 and len(_charged(state_dir)) == paid + 2, nxt.stderr  # run 3: a new step, covered


def test_a_killed_run_completed_by_its_free_replay_is_shown_completed(tmp_path, monkeypatch, state_dir):
    """`budget history`: the debit of a run killed while reading says "no output recorded" until a free replay
    of it completes; then it names that replay (the second review of issue 37, finding 4)."""
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    args = COMMANDS["histogram"](str(_csv(tmp_path)))
    originals = {"collect": pl.LazyFrame.collect, "collect_all": pl.collect_all}
    _probe(monkeypatch, state_dir)
    assert runner.invoke(app, args).exit_code == 130
    text = runner.invoke(app, ["budget", "history"]).stdout
    assert "no output recorded" in text
    monkeypatch.setattr(pl.LazyFrame, "collect", originals["collect"])
    monkeypatch.setattr(pl, "collect_all", originals["collect_all"])
    assert runner.invoke(app, args).exit_code == 0
    rows = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
    assert rows[0]["completed_by"] == rows[1]["seq"] and rows[1]["replay_of"] == rows[0]["seq"]
    assert "no output recorded" not in runner.invoke(app, ["budget", "history"]).stdout


def test_attack_in_service_mode_a_killed_run_has_paid_and_its_rerun_is_free(svc, monkeypatch):
    """The same attack by an analyst through the service account: alice's run over the operator's catalog
    dataset, killed at its first private read, is charged to her ledger once, however often she repeats it."""
    args = ["histogram", "visits", "--by", "page", "--keys", "pages", "--epsilon", "1"]
    ledger_file = svc.state / "ledgers" / "alice.json"

    def charged() -> int:
        lines = [json.loads(line) for line in ledger_file.read_bytes().splitlines()[1:] if line.strip()]
        return sum(1 for e in lines if e.get("events"))

    before = charged()
    seen = kill_at_first_read(monkeypatch, lambda: charged() > before)
    for _ in range(3):
        r = svc.run("alice", *args)
        assert r.exit_code == 130 and r.stdout == "", r.stderr
    assert seen and all(seen) and charged() == before + 1
