"""Rule 1 under the early hash (``dpcli/io/opening.py``): the bytes hashed on a thread are the bytes parsed.

The data file is opened and hashed on a thread first thing in ``histogram``, ``topk``, ``tabulate``
and ``stream-replay``, long before the parser takes it (settings, the ledger, the options and the
output path are checked in between). Each test below acts in that window, during the hash, or on a
path that fails before the data is read, and checks the rules of the threat model: the bytes
fingerprinted are the bytes parsed (a change is exit 66 before any debit), a replay is free only
over the same bytes, a dry run or an early error reads no data and prints one line, and nothing of
the thread is ever seen. (The same review's attacks on the race's uniform proposals are in
``test_rule5_noise_in_exact_arithmetic.py``.)
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import polars as pl
import pytest
from dptest import N_UNITS as N
from dptest import history, init_ledger, released_nothing, runner
from dptest import one_group_csv as data
from tabulate_specs import spec_toml

from dpcli.cli.app import app
from dpcli.io import inputs, opening
from dpcli.release import path as release_path

HIST = ["--by", "g", "--privacy-unit", "user", "--epsilon", "1"]


def hist(tmp_path: Path, source, out: str, *extra: str):
    keys = tmp_path / "keys.csv"
    if not keys.exists():
        keys.write_text("g\na\nb\n")
    return runner.invoke(app, ["histogram", str(source), *HIST, "--keys", str(keys), "-o", str(tmp_path / out),
                               "--json", *extra])


def group_of(out: Path) -> str:
    df = pl.read_csv(out)
    big = [g for g, c in zip(df["g"], df["count"]) if c > N / 2]
    assert len(big) == 1, df
    return big[0]


def in_the_window(monkeypatch, action) -> None:
    """Run ``action()`` after the early open and before the data is taken: in the release path's output
    check, which comes between ``hash_early`` and ``open_input`` in every command."""
    original = release_path.check_output_path

    def plan(*args, **kwargs):
        action()
        return original(*args, **kwargs)

    monkeypatch.setattr(release_path, "check_output_path", plan)


def hashing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dpcli-hash"]


def wait_for_hashes() -> None:
    for t in hashing_threads():
        t.join(5)


# ---- the window between the early open and the parse ----------------------------------------------


def _rename_over(path: Path, content: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(content)
    os.replace(tmp, path)


def _rewrite_in_place(path: Path, content: str) -> None:
    time.sleep(0.02)  # one tick of a coarse clock, as in test_attack_inputs
    with open(path, "r+") as fh:
        fh.truncate(0)
        fh.write(content)


def _unlink(path: Path, content: str) -> None:
    path.unlink()


def _chmod_000(path: Path, content: str) -> None:
    path.chmod(0)


@pytest.mark.parametrize("how, content", [
    (_rename_over, data("b")),
    (_rewrite_in_place, data("b")),           # same size
    (_rewrite_in_place, data("b", extra=5)),  # other size
    (_unlink, ""),
    (_chmod_000, ""),
])
def test_a_change_between_the_early_open_and_the_parse_is_refused(tmp_path, monkeypatch, how, content):
    """The early handle is held across the ledger and option checks: anything done to the file
    meanwhile is refused before the charge (exit 66, one line), never parsed under the old hash."""
    init_ledger()
    d = tmp_path / "d.csv"
    d.write_text(data("a"))
    in_the_window(monkeypatch, lambda: how(d, content))
    r = hist(tmp_path, d, "o.csv")
    assert r.exit_code == 66, (r.stdout, r.stderr)
    assert "changed while it was read; rerun" in r.stderr and r.stderr.count("\n") == 1
    assert history() == [] and not (tmp_path / "o.csv").exists() and released_nothing(r)


def test_stream_replay_file_renamed_over_in_the_window_is_refused(tmp_path, monkeypatch):
    # an approx ledger: a pure one can never pay the stream's δ, which is refused before any data is read
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    d = tmp_path / "s.csv"
    rows = "t,user,g\n" + "".join(f"2024-01-01T00:{i % 60:02d}:00,u{i},a\n" for i in range(N))
    d.write_text(rows)
    in_the_window(monkeypatch, lambda: _rename_over(d, rows.replace(",a\n", ",b\n")))
    r = runner.invoke(app, ["stream-replay", str(d), "--time", "t", "--by", "g", "--privacy-unit", "user",
                            "--window", "1h", "--triggers", "2", "--epsilon", "1", "--delta", "1e-6",
                            "--max-contributions", "1", "-o", str(tmp_path / "o.csv")])
    assert r.exit_code == 66, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and history() == [] and not (tmp_path / "o.csv").exists()


def test_a_symlink_swapped_in_the_window_is_an_exact_replay_of_the_file_opened(tmp_path, monkeypatch):
    """The link named points at a.csv at the early open and at b.csv before the parse: the release is
    of a.csv (hashed and parsed), so it is a free and identical replay of a run on a.csv itself."""
    init_ledger()
    a, b, cur = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "cur.csv"
    a.write_text(data("a"))
    b.write_text(data("b"))
    cur.symlink_to(a)
    ref = hist(tmp_path, a, "o1.csv")
    assert ref.exit_code == 0, ref.stderr

    def swap() -> None:
        (tmp_path / "l.tmp").symlink_to(b)
        os.replace(tmp_path / "l.tmp", cur)

    with monkeypatch.context() as m:
        in_the_window(m, swap)
        swapped = hist(tmp_path, cur, "o2.csv")
    assert swapped.exit_code == 0, swapped.stderr
    first, second = json.loads(ref.stdout), json.loads(swapped.stdout)
    assert second["seed_id"] == first["seed_id"] and second["charged"] is False
    assert (tmp_path / "o1.csv").read_bytes() == (tmp_path / "o2.csv").read_bytes()
    after = hist(tmp_path, cur, "o3.csv")  # now the link names b.csv: other bytes, a new seed and a charge
    assert after.exit_code == 0 and json.loads(after.stdout)["seed_id"] != first["seed_id"]
    assert group_of(tmp_path / "o3.csv") == "b"


def test_a_relative_path_with_the_cwd_changed_in_the_window_is_the_file_opened(tmp_path, monkeypatch):
    """``d.csv`` is opened relative to the working directory at the start; if the directory changed
    before the parse, the parse still reads the file hashed (an exact replay of it), never the other."""
    init_ledger()
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "d.csv").write_text(data("a"))
    (two / "d.csv").write_text(data("b"))
    ref = hist(tmp_path, one / "d.csv", "o1.csv")
    monkeypatch.chdir(one)
    with monkeypatch.context() as m:
        in_the_window(m, lambda: os.chdir(two))
        moved = hist(tmp_path, "d.csv", "o2.csv")
    assert moved.exit_code == 0, moved.stderr
    assert json.loads(moved.stdout)["seed_id"] == json.loads(ref.stdout)["seed_id"]
    assert (tmp_path / "o1.csv").read_bytes() == (tmp_path / "o2.csv").read_bytes()


def test_a_file_replaced_by_a_dataset_in_the_window_reads_the_dataset_and_prints_nothing_else(tmp_path, monkeypatch):
    """The path turns into a directory before the parse: the dataset is what is read (its manifest
    the fingerprint); the early handle, never taken, is closed silently (no ResourceWarning)."""
    init_ledger()
    d = tmp_path / "d.csv"
    d.write_text(data("a"))

    def to_dataset() -> None:
        os.replace(d, tmp_path / "old.csv")
        d.mkdir()
        pl.DataFrame({"user": [f"u{i}" for i in range(N)], "g": ["b"] * N}).write_parquet(d / "part.parquet")

    in_the_window(monkeypatch, to_dataset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = hist(tmp_path, d, "o.csv")
        wait_for_hashes()
        gc.collect()
    assert r.exit_code == 0, r.stderr
    assert group_of(tmp_path / "o.csv") == "b"
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


# ---- during the hash ---------------------------------------------------------------------------------


def _during_hash(monkeypatch, action_after_hash) -> None:
    original = opening.fingerprint_fileobj

    def hashed_then(fh):
        digest = original(fh)
        action_after_hash()
        return digest

    monkeypatch.setattr(opening, "fingerprint_fileobj", hashed_then)


@pytest.mark.parametrize("change", ["append", "truncate", "same-size"])
def test_a_file_changed_by_the_time_the_thread_has_hashed_it_is_refused(tmp_path, monkeypatch, change):
    """The thread hashes the file, then it grows (the parse would see rows the hash did not), is
    cut to a valid shorter file, or rewritten in place: refused, exit 66, before any debit."""
    init_ledger()
    d = tmp_path / "d.csv"
    d.write_text(data("a"))

    def act() -> None:
        if change == "append":
            with open(d, "a") as fh:
                fh.write("".join(f"x{i},b\n" for i in range(3 * N)))
        elif change == "truncate":
            _rewrite_in_place(d, data("a")[: len(data("a")) // 2].rsplit("\n", 1)[0] + "\n")
        else:
            _rewrite_in_place(d, data("b"))

    _during_hash(monkeypatch, act)
    r = hist(tmp_path, d, "o.csv")
    assert r.exit_code == 66, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and history() == [] and not (tmp_path / "o.csv").exists()


@pytest.mark.parametrize("size", list(range(0, 14)))
def test_the_chunked_hash_is_sha256_of_the_whole_file(tmp_path, monkeypatch, size):
    """8 MiB chunks, patched to 4 bytes: every boundary (0, 1, 4, 5, 8, 9, …) hashes the whole file,
    from offset 0 whatever the file's offset, and leaves it at 0."""
    monkeypatch.setattr(opening, "CHUNK", 4)
    raw = bytes(range(65, 65 + size))
    p = tmp_path / "f.bin"
    p.write_bytes(raw)
    with open(p, "rb") as fh:
        fh.seek(min(size, 3))
        assert opening.fingerprint_fileobj(fh) == "sha256:" + hashlib.sha256(raw).hexdigest()
        assert fh.tell() == 0
    assert opening.fingerprint_fileobj(io.BytesIO(raw)) == "sha256:" + hashlib.sha256(raw).hexdigest()


def test_a_gz_input_hashed_early_is_its_bytes_on_disk_and_parsed_from_them(tmp_path):
    import gzip

    raw = gzip.compress(data("a").encode())
    p = tmp_path / "d.csv.gz"
    p.write_bytes(raw)
    early = opening.hash_early(str(p))
    assert early is not None
    t = inputs.open_input(str(p), early=early)
    assert t.fingerprint == "sha256:" + hashlib.sha256(raw).hexdigest() and t.source is early.fh
    assert t.frame.collect()["g"].unique().to_list() == ["a"]
    t.verify_unchanged()


# ---- who takes the early handle ------------------------------------------------------------------


def test_the_data_file_named_again_as_keys_is_opened_twice_and_taken_once(tmp_path, monkeypatch):
    """Data and --keys are the same path: the early handle goes to the data only; the keys are opened
    (and hashed) on their own, and the run ends as it does with a separate copy of the keys."""
    init_ledger()
    d = tmp_path / "d.csv"
    d.write_text("g,user\na,u1\nb,u2\n")
    (tmp_path / "copy.csv").write_text(d.read_text())
    taken: list[str] = []
    original = opening.EarlyInput.take

    def take(self):
        taken.append(self.path)
        return original(self)

    monkeypatch.setattr(opening.EarlyInput, "take", take)
    same = runner.invoke(app, ["histogram", str(d), *HIST, "--keys", str(d)])
    other = runner.invoke(app, ["histogram", str(d), *HIST, "--keys", str(tmp_path / "copy.csv")])
    assert taken == [str(d), str(d)]
    assert same.exit_code == other.exit_code
    assert same.stderr.replace(str(d), "K") == other.stderr.replace(str(tmp_path / "copy.csv"), "K")


def test_an_early_handle_is_taken_once(tmp_path):
    d = tmp_path / "d.csv"
    d.write_text("u\na\n")
    early = opening.hash_early(str(d))
    inputs.open_input(str(d), early=early)
    with pytest.raises(RuntimeError):
        early.take()


def test_nothing_carries_over_between_runs_in_one_process(tmp_path):
    """Two CliRunner runs on one path rewritten in between: the second hashes the new bytes (a new
    seed, a charge, the new group); no early handle or digest is kept between invocations."""
    init_ledger()
    d = tmp_path / "d.csv"
    d.write_text(data("a"))
    first = hist(tmp_path, d, "o1.csv")
    _rewrite_in_place(d, data("b"))
    second = hist(tmp_path, d, "o2.csv")
    assert first.exit_code == second.exit_code == 0, (first.stderr, second.stderr)
    s1, s2 = json.loads(first.stdout), json.loads(second.stdout)
    assert s1["seed_id"] != s2["seed_id"] and s2["charged"] is not False
    assert group_of(tmp_path / "o2.csv") == "b"


# ---- runs that read no data, and errors before the data ----------------------------------------------


def _tabulate_spec(tmp_path: Path) -> Path:
    levels = '[[levels]]\ngeography = "state"\niterations = "reg"\nepsilon = 1\nstability = 4\n'
    spec = spec_toml(levels, geography="levels.nation = { prefix = 0 }\nlevels.state = { prefix = 2 }")
    (tmp_path / "spec.toml").write_text(spec)
    (tmp_path / "blocks.csv").write_text("block\n01001\n02001\n")
    return tmp_path / "spec.toml"


def test_a_tabulate_dry_run_never_opens_the_person_file(tmp_path, monkeypatch):

    init_ledger()
    spec = _tabulate_spec(tmp_path)
    persons = tmp_path / "p.csv"
    persons.write_text("block,race,eth,sex,age\n01001,1000,1,1,30\n")
    real = opening.open_binary

    def guarded(path, *args, **kwargs):
        assert Path(path) != persons, "the person file was opened"
        return real(path, *args, **kwargs)

    monkeypatch.setattr(opening, "open_binary", guarded)
    monkeypatch.setattr(inputs, "open_binary", guarded)
    r = runner.invoke(app, ["tabulate", str(persons), "--spec", str(spec), "--dry-run"])
    assert r.exit_code == 0, r.stderr


COMMANDS = {
    "histogram": ["histogram", "{d}", *HIST, "--keys", "{k}"],
    "topk": ["topk", "{d}", "--by", "g", "--privacy-unit", "user", "--epsilon-per", "1", "-k", "1", "--keys", "{k}"],
    "stream-replay": ["stream-replay", "{d}", "--time", "t", "--by", "g", "--privacy-unit", "user", "--window", "1h",
                      "--triggers", "2", "--epsilon", "1", "--delta", "1e-6", "--max-contributions", "1"],
    "tabulate": ["tabulate", "{d}", "--spec", "{s}"],
}


def _argv(tmp_path: Path, command: str, d: Path) -> list[str]:
    (tmp_path / "keys.csv").write_text("g\na\nb\n")
    spec = _tabulate_spec(tmp_path)
    return [a.format(d=d, k=tmp_path / "keys.csv", s=spec) for a in COMMANDS[command]]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_ledger_is_exit_77_in_one_line_whatever_the_input(tmp_path, state_dir, command):
    """No ledger: exit 77 and its one line for a good file, a missing one, a directory, a FIFO and an
    empty file alike (the early open neither reports nor blocks on any of them)."""
    state_dir.mkdir()  # an empty state directory (one that does not exist is exit 78)
    (tmp_path / "d.csv").write_text(data("a"))
    (tmp_path / "e.csv").write_text("")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "f.csv")
    old = signal.alarm(5)  # a FIFO opened without O_NONBLOCK would hang here
    try:
        for name in ("d.csv", "missing.csv", "dir", "f.csv", "e.csv"):
            r = runner.invoke(app, _argv(tmp_path, command, tmp_path / name))
            assert r.exit_code == 77, (name, r.stderr)
            assert r.stderr.count("\n") == 1 and "no budget ledger" in r.stderr and r.stdout == "", (name, r.stderr)
    finally:
        signal.alarm(old)


@pytest.mark.parametrize("name, code, words", [
    ("missing.csv", 66, "does not exist"),
    ("f.csv", 66, "is a pipe: pipe data in with '-'"),
    ("e.csv", 65, "is empty"),
    ("dir", 66, "holds no data files"),
])
def test_special_inputs_are_reported_as_before(tmp_path, name, code, words):
    init_ledger()
    (tmp_path / "e.csv").write_text("")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "f.csv")
    old = signal.alarm(5)
    try:
        r = hist(tmp_path, tmp_path / name, "o.csv")
    finally:
        signal.alarm(old)
    assert r.exit_code == code and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert history() == []


def test_output_or_state_naming_the_input_is_refused_and_the_input_untouched(tmp_path):
    init_ledger()
    d = tmp_path / "d.csv"
    d.write_text(data("a"))
    before = d.read_bytes()
    r = runner.invoke(app, ["histogram", str(d), *HIST, "--keys", str(tmp_path / "keys.csv"), "-o", str(d)])
    assert r.exit_code == 73 and r.stderr.count("\n") == 1, r.stderr
    s = runner.invoke(app, [*_argv(tmp_path, "stream-replay", d), "--state", str(d)])
    assert s.exit_code == 73 and s.stderr.count("\n") == 1, s.stderr
    assert d.read_bytes() == before and history() == []


def test_an_early_handle_never_taken_is_closed_without_a_warning(tmp_path):
    """A usage error right after the early open: the thread finishes unseen, and the file it held is
    closed by its finalizer (no ResourceWarning, nothing printed)."""
    init_ledger()
    d = tmp_path / "d.csv"
    d.write_text(data("a"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = runner.invoke(app, ["histogram", str(d), "--by", "g", "--privacy-unit", "user", "--epsilon", "-1"])
        wait_for_hashes()
        gc.collect()
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert not hashing_threads()


def test_a_process_that_exits_while_the_thread_hashes_prints_one_line(tmp_path):
    """The process ends (exit 77) while the daemon thread is still reading a slow disk (4 KiB every
    10 ms, without end, so that no load on the host lets it finish first): the exit code and the one line are unchanged; the file is closed under the thread at
    exit, whose next read fails unseen (no fatal error on the file's lock at shutdown)."""
    d = tmp_path / "d.csv"
    d.write_text("user,g\n" + "u,a\n" * 50_000)
    (tmp_path / "keys.csv").write_text("g\na\n")
    argv = ["histogram", str(d), *HIST, "--keys", str(tmp_path / "keys.csv")]
    (tmp_path / "state").mkdir()  # an empty state directory: no ledger (one that does not exist is exit 78)
    code = f"""
import hashlib, sys, threading, time
import dpcli.io.opening as o

def slow(fh):  # never finishes (it rereads from the start), so the thread is alive at exit, however slow the host
    fh.seek(0)
    digest, buffer = hashlib.sha256(), bytearray(4096)
    while True:
        n = fh.readinto(buffer)
        if not n:
            fh.seek(0)
        digest.update(buffer[:n])
        time.sleep(0.01)

o.fingerprint_fileobj = slow
from dpcli.cli.app import main
try:
    main({argv!r})
finally:
    print(sorted(t.name for t in threading.enumerate() if t.daemon))
"""
    env = {**os.environ, "DPCLI_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(Path(__file__).parents[2])}
    p = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 77 and p.stderr.count("\n") == 1 and "no budget ledger" in p.stderr, p.stderr
    assert "dpcli-hash" in p.stdout  # the thread was still hashing when the process exited


def test_a_thread_that_cannot_start_does_not_fail_the_run(tmp_path, monkeypatch):
    """FINDING: a host out of threads (a container's pids limit, RLIMIT_NPROC) made ``hash_early``
    raise RuntimeError("can't start new thread") on the command's first line: exit 1, "internal
    error", for a run that needs no thread. Fixed: the early hash is an optimisation, so without a
    thread the file is closed and opened and hashed as before."""
    init_ledger()
    d = tmp_path / "d.csv"
    d.write_text(data("a"))
    ref = hist(tmp_path, d, "o1.csv")

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(opening.threading.Thread, "start", no_thread)
    r = hist(tmp_path, d, "o2.csv")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["seed_id"] == json.loads(ref.stdout)["seed_id"]
    assert (tmp_path / "o1.csv").read_bytes() == (tmp_path / "o2.csv").read_bytes()
