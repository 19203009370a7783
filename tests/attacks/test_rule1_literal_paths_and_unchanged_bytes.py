"""Rule 1, the bytes fingerprinted are the bytes parsed: paths are literal, a file changed while read is refused.

Attacks on input identity (issue 15, finding 1). A release's seed is HMAC(key, query + the
fingerprints of its inputs), and a release whose seed was already charged is a free replay. So two
runs that the ledger calls replays of each other must have read the same bytes, or the second one
releases other data under the same noise for free. Each test names or swaps a file so that a reader
which expands the path again (globs, ``~``) or opens it again (a symlink swapped, a file renamed over
or rewritten between hashing and reading) would parse other bytes than it hashed. The last three came
with the early hash (the data hashed on a thread while dpcli loads: ``test_rule1_early_hash.py``): a
dry run never opens the input, a read error met by the thread and a usage error after the early open
are the usual one line, with no debit.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import polars as pl
import pytest
from dptest import N_UNITS as N
from dptest import history, init_ledger, released_nothing, runner
from dptest import one_group_csv as data
from tabulate_specs import spec_toml

from dpcli.cli.app import app
from dpcli.io import inputs, tables


class Run:
    """One ``histogram --keys`` release through the CLI, with its summary and its output table."""

    def __init__(self, tmp_path: Path, source: str | Path, out: str, keys: str | Path | None = None,
                 command: str = "histogram") -> None:
        if keys is None:
            keys = tmp_path / "keys.csv"
            keys.write_text("g\na\nb\n")
        self.out = tmp_path / out
        opts = (["--keys", str(keys)] if command == "histogram" else ["--keys", str(keys), "-k", "1"])
        self.result = runner.invoke(app, [command, str(source), "--by", "g", "--privacy-unit", "user",
                                          *(["--epsilon", "1"] if command == "histogram" else ["--epsilon-per", "1"]),
                                          *opts, "-o", str(self.out), "--json"])
        self.ok = self.result.exit_code == 0
        self.summary = json.loads(self.result.stdout) if self.ok else None
        self.bytes = self.out.read_bytes() if self.ok else None

    def counts(self) -> dict[str, float]:
        df = pl.read_csv(self.out)
        return dict(zip(df["g"].to_list(), df["count"].to_list()))

    def read_group(self) -> str:
        """Which file's group this release counted (the noise, scale 1, is far below N/2)."""
        counts = self.counts()
        big = [g for g, c in counts.items() if c > N / 2]
        assert len(big) == 1, counts
        return big[0]


def assert_replays_are_identical(*runs: Run) -> None:
    """Every free replay in the ledger repeats its original's output byte for byte."""
    by_seed: dict[str, bytes] = {}
    for r in runs:
        assert r.ok, r.result.stderr
        seen = by_seed.setdefault(r.summary["seed_id"], r.bytes)
        assert seen == r.bytes, "a free replay (same seed) released different data"
    replays = [e for e in history() if e.get("replay_of")]
    assert all(not e["events"] for e in replays)


@pytest.mark.parametrize("name, other", [("r[1].csv", "r1.csv"), ("r*.csv", "rzz.csv")])
def test_glob_characters_name_one_literal_file(tmp_path, monkeypatch, name, other):
    """``r[1].csv`` is that file, never ``r1.csv``: the second run on it after ``r1.csv`` changed is
    a free replay only because it reads the same bytes (and releases the same table)."""
    init_ledger()
    monkeypatch.chdir(tmp_path)
    Path(name).write_text(data("a"))
    Path(other).write_text(data("b"))
    first = Run(tmp_path, name, "o1.csv")
    assert first.ok, first.result.stderr
    assert first.read_group() == "a"
    Path(other).write_text(data("b", extra=50))  # the file a glob would match changes
    second = Run(tmp_path, name, "o2.csv")
    assert second.summary["charged"] is False  # same bytes: a free replay …
    third = Run(tmp_path, other, "o3.csv")
    assert third.read_group() == "b" and third.summary["charged"] is True
    assert_replays_are_identical(first, second, third)  # … and an identical one


@pytest.mark.parametrize("command", ["histogram", "topk"])
def test_glob_characters_in_the_public_list_name_one_file(tmp_path, monkeypatch, command):
    """``--keys``/``--domain k[1].csv`` reads k[1].csv: the released groups are the ones it lists."""
    init_ledger()
    monkeypatch.chdir(tmp_path)
    Path("d.csv").write_text(data("a"))
    Path("k[1].csv").write_text("g\na\nb\n")
    Path("k1.csv").write_text("g\nb\nc\n")
    run = Run(tmp_path, "d.csv", "o.csv", keys="k[1].csv", command=command)
    assert run.ok, run.result.stderr
    released = pl.read_csv(run.out)["g"].to_list()
    assert sorted(released) == (["a", "b"] if command == "histogram" else ["a"])  # top-1 of {a, b} is a


def test_tilde_is_a_literal_directory_name(tmp_path, monkeypatch):
    """``~/x.csv`` (quoted, so no shell expanded it) is the file x.csv in a directory named ``~``,
    for the hash and for the parser alike, never $HOME/x.csv."""
    init_ledger()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "~").mkdir()
    (tmp_path / "~" / "x.csv").write_text(data("a"))
    (home / "x.csv").write_text(data("b"))
    monkeypatch.chdir(tmp_path)
    first = Run(tmp_path, "~/x.csv", "o1.csv")
    assert first.ok, first.result.stderr
    assert first.read_group() == "a"
    (home / "x.csv").write_text(data("b", extra=50))
    second = Run(tmp_path, "~/x.csv", "o2.csv")
    assert second.summary["charged"] is False
    assert_replays_are_identical(first, second)


def test_symlink_swapped_between_hashing_and_reading_reads_the_hashed_file(tmp_path, monkeypatch):
    """The symlink named on the command line is pointed at other data right after the fingerprint:
    the release still parses the bytes it hashed (the file opened once, which did not change), so it
    is an exact replay of the release on those bytes."""
    init_ledger()
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(data("a"))
    b.write_text(data("b"))
    cur = tmp_path / "cur.csv"
    cur.symlink_to(a)
    reference = Run(tmp_path, a, "o1.csv")
    assert reference.read_group() == "a"

    def swap(path: str) -> None:
        if Path(path) == cur:
            tmp = tmp_path / "swap.tmp"
            tmp.symlink_to(b)
            os.replace(tmp, cur)

    monkeypatch.setattr(inputs, "after_fingerprint_hook", swap, raising=False)
    swapped = Run(tmp_path, cur, "o2.csv")
    assert swapped.ok, swapped.result.stderr
    assert swapped.summary["charged"] is False and swapped.read_group() == "a"
    assert_replays_are_identical(reference, swapped)


def _rewrite_in_place(path: str, content: str) -> None:
    # At least one tick of a coarse file-system clock after the file was written, as any real rewrite
    # is (Linux 6.13+ ext4/xfs/btrfs/tmpfs need no pause: their times are fine-grained once queried).
    time.sleep(0.02)
    with open(path, "r+") as fh:  # same inode, new bytes
        fh.truncate(0)
        fh.write(content)


def _rename_over(path: str, content: str) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(content)
    os.replace(tmp, path)  # a new inode under the name; the open one is unlinked (its ctime moves)


@pytest.mark.parametrize("target, how, content", [
    ("data.csv", _rewrite_in_place, data("b")),           # same size, other bytes: caught by the file's times
    ("data.csv", _rewrite_in_place, data("b", extra=3)),  # other size
    ("data.csv", _rename_over, data("b")),                # replaced by rename while held open
    ("keys.csv", _rewrite_in_place, "g\nb\na\n"),
    ("keys.csv", _rewrite_in_place, "g\na\n"),
    ("keys.csv", _rename_over, "g\nb\n"),
])
def test_file_replaced_between_hashing_and_reading_is_refused(tmp_path, monkeypatch, target, how, content):
    """The input file is rewritten (same inode) or replaced by a rename after its fingerprint: the
    release is refused (exit 66, "rerun") before any debit, and nothing is written."""
    init_ledger()
    (tmp_path / "data.csv").write_text(data("a"))

    def replace(path: str) -> None:
        if Path(path).name == target:
            how(path, content)

    monkeypatch.setattr(inputs, "after_fingerprint_hook", replace, raising=False)
    run = Run(tmp_path, tmp_path / "data.csv", "o.csv")
    assert run.result.exit_code == 66, (run.result.stdout, run.result.stderr)
    assert "changed while it was read; rerun" in run.result.stderr and run.result.stderr.count("\n") == 1
    assert history() == [] and not run.out.exists() and released_nothing(run.result)


def _tabulate_setup(tmp_path: Path, blocks_name: str) -> tuple[Path, Path]:
    levels = '[[levels]]\ngeography = "state"\niterations = "reg"\nepsilon = 1\nstability = 4\n'
    spec = spec_toml(levels, geography="levels.nation = { prefix = 0 }\nlevels.state = { prefix = 2 }")
    (tmp_path / "spec.toml").write_text(spec.replace('blocks = "blocks.csv"', f'blocks = "{blocks_name}"'))
    persons = tmp_path / "p.csv"
    pl.DataFrame({"block": ["01001", "02001"] * 30, "race": ["1000", "2000"] * 30, "eth": [1, 2] * 30,
                  "sex": ["1", "2"] * 30, "age": [30, 70] * 30}).write_csv(persons)
    init_ledger("pure", "--epsilon", "50")
    return tmp_path / "spec.toml", persons


def test_tabulate_block_list_with_glob_characters_is_that_file(tmp_path):
    """geography.blocks = "b[1].csv" enumerates the blocks of b[1].csv, not of b1.csv."""
    spec, persons = _tabulate_setup(tmp_path, "b[1].csv")
    (tmp_path / "b[1].csv").write_text("block\n01001\n02001\n")
    (tmp_path / "b1.csv").write_text("block\n03001\n04001\n")
    r = runner.invoke(app, ["tabulate", str(persons), "--spec", str(spec)])
    assert r.exit_code == 0, r.stderr
    geo = set(pl.read_csv(r.stdout.encode(), schema_overrides={"geo_id": pl.String})["geo_id"].to_list())
    assert geo == {"01", "02", "ALL"} or geo == {"01", "02"}


def test_tabulate_block_list_rewritten_in_place_is_refused(tmp_path, monkeypatch):
    spec, persons = _tabulate_setup(tmp_path, "blocks.csv")
    (tmp_path / "blocks.csv").write_text("block\n01001\n02001\n")

    def rewrite(path: str) -> None:
        if Path(path).name == "blocks.csv":
            _rewrite_in_place(path, "block\n03001\n04001\n")

    monkeypatch.setattr(inputs, "after_fingerprint_hook", rewrite, raising=False)
    out = tmp_path / "o.csv"
    r = runner.invoke(app, ["tabulate", str(persons), "--spec", str(spec), "-o", str(out)])
    assert r.exit_code == 66, (r.stdout, r.stderr)
    assert "changed while it was read" in r.stderr and history() == [] and not out.exists()


def test_spec_fingerprint_is_of_the_parsed_bytes(tmp_path):
    """The spec enters the seed by the hash of the very bytes parsed (read once)."""
    from dpcli.tasks.tabulate.query import read_spec

    spec_path, _ = _tabulate_setup(tmp_path, "blocks.csv")
    raw = spec_path.read_bytes()
    spec, fingerprint = read_spec(str(spec_path))
    assert fingerprint == tables.fingerprint_bytes(raw) and spec.levels[0].geography == "state"


def test_scheduled_run_on_a_file_rewritten_while_read_saves_nothing(tmp_path, monkeypatch):
    """A --schedule run whose input is rewritten after hashing is refused before its epoch is saved
    or recorded (the change is seen before the schedule's reservation is debited, so nothing is):
    the next call on the unchanged file computes the epoch afresh."""
    init_ledger()
    (tmp_path / "data.csv").write_text(data("a"))
    (tmp_path / "keys.csv").write_text("g\na\nb\n")
    args = ["histogram", str(tmp_path / "data.csv"), "--by", "g", "--privacy-unit", "user", "--keys",
            str(tmp_path / "keys.csv"), "--schedule", "s", "--scheduler", "fixed", "--epsilon", "1",
            "--total-epsilon", "5", "--json", "-o", "-"]
    monkeypatch.setattr(inputs, "after_fingerprint_hook",
                        lambda path: _rewrite_in_place(path, data("b")) if path.endswith("data.csv") else None)
    r = runner.invoke(app, args)
    assert r.exit_code == 66 and "changed while it was read" in r.stderr and released_nothing(r)
    assert history() == []  # neither the reservation nor a run
    monkeypatch.setattr(inputs, "after_fingerprint_hook", None)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    assert summary["schedule"]["cached"] is False and summary["schedule"]["runs"] == 1


@pytest.mark.parametrize("command", [
    ["histogram", "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6"],
    ["topk", "--by", "g", "--privacy-unit", "user", "--epsilon-per", "1", "-k", "1", "--delta", "1e-6"],
    ["stream-replay", "--time", "t", "--by", "g", "--privacy-unit", "user", "--window", "1h", "--triggers", "2",
     "--epsilon", "1", "--delta", "1e-6", "--max-contributions", "1"],
])
def test_a_dry_run_reads_the_header_and_no_record(tmp_path, monkeypatch, command):
    """The input is hashed early, while dpcli loads, but never by a run that promises to read no data: a dry run
    opens it only to read its schema (a CSV's header line, a Parquet footer: public), never to hash or parse it."""
    import sys

    from dpcli.io import columns, opening

    init_ledger()
    (tmp_path / "d.csv").write_text("user,g,t\nu1,a,2026-01-01T00:00:00\n")
    real, opened = opening.open_binary, []

    def header_only(*args, **kwargs):
        caller = sys._getframe(1).f_code.co_name
        if caller != "declared_schema":
            raise AssertionError(f"the input was opened by {caller}")
        opened.append(caller)
        return real(*args, **kwargs)

    monkeypatch.setattr(opening, "open_binary", header_only)
    monkeypatch.setattr(inputs, "open_binary", header_only)
    monkeypatch.setattr(columns, "open_binary", header_only)
    r = runner.invoke(app, [command[0], str(tmp_path / "d.csv"), *command[1:], "--dry-run"])
    assert r.exit_code == 0, r.stderr
    assert opened == ["declared_schema"]  # once, for the header (which the dry run checks the columns against)


def test_an_early_hash_error_is_one_line_and_no_debit(tmp_path, monkeypatch):
    """A read error met by the background hash is reported like any unreadable input: exit 66, one
    line, nothing charged or written."""
    import errno

    from dpcli.io import opening

    def broken(fh):
        raise OSError(errno.EIO, "input/output error")

    init_ledger()
    (tmp_path / "d.csv").write_text(data("a"))
    monkeypatch.setattr(opening, "fingerprint_fileobj", broken)
    run = Run(tmp_path, tmp_path / "d.csv", "o.csv")
    assert run.result.exit_code == 66, run.result.stderr
    assert run.result.stderr.count("\n") == 1 and "is not readable (input/output error)" in run.result.stderr
    assert history() == [] and not run.out.exists()


def test_a_usage_error_after_the_early_open_is_one_line(tmp_path):
    """The early hash runs on, unseen, when the command then stops on a bad option."""
    init_ledger()
    (tmp_path / "d.csv").write_text(data("a"))
    r = runner.invoke(app, ["histogram", str(tmp_path / "d.csv"), "--by", "g", "--privacy-unit", "user",
                            "--epsilon", "-1"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert history() == []
