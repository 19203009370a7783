"""Rule 7, outputs never overwrite state or inputs: nothing dpcli writes lands on its own state or inputs.

Attacks on output paths (issue 15, finding 8). ``-o`` (and stream-replay's ``--state FILE``) are chosen
by the analyst. Pointed into the state directory they would replace e.g. another analyst's ledger
(handing back spent budget) or a key; pointed at an input they would destroy it. Each is refused before
any data is read or budget spent: exit 73, one line, no ledger entry, no file changed. Issue 29's
service-mode review added a write that fails (a directory that cannot be written): exit 73 in one
line, not an internal error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from dptest import init_ledger, runner
from tabulate_specs import write_spec

from dpcli.cli.app import app


def snapshot(*roots: Path) -> dict[str, tuple[bytes | str, int]]:
    """Every file and symlink below ``roots``: its bytes (or link target) and mtime."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                p = os.path.join(dirpath, name)
                if os.path.islink(p):
                    out[p] = (os.readlink(p), 0)
                else:
                    out[p] = (Path(p).read_bytes(), os.stat(p).st_mtime_ns)
    return out


@pytest.fixture
def setup(tmp_path, state_dir):
    """Two analysts' ledgers, a data file and a keys file; returns (data, keys)."""
    for who in ("default", "alice"):
        init_ledger("approx", "--epsilon", "5", "--delta", "1e-6", analyst=who)
    work = tmp_path / "work"
    work.mkdir()
    data = work / "data.csv"
    data.write_text("user,g\n" + "".join(f"u{i},{'ab'[i % 2]}\n" for i in range(100)))
    keys = work / "keys.csv"
    keys.write_text("g\na\nb\n")
    return data, keys


def refused(args: list[str], tmp_path: Path, state_dir: Path, needle: str) -> None:
    before = snapshot(tmp_path)
    r = runner.invoke(app, args)
    assert r.exit_code == 73, (r.exit_code, r.stdout, r.stderr)
    assert needle in r.stderr and r.stderr.count("\n") == 1 and r.stderr.startswith("dpcli: error:")
    assert snapshot(tmp_path) == before  # no ledger entry, no output, no file touched
    h = runner.invoke(app, ["budget", "history", "default", "--json"])
    assert h.exit_code == 0 and json.loads(h.stdout) == []


def hist(data: Path, keys: Path, out: str | Path) -> list[str]:
    return ["histogram", str(data), "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--keys", str(keys),
            "-o", str(out)]


@pytest.mark.parametrize("how", ["direct", "new-file", "symlinked-dir", "dotdot", "dangling-symlink", "key"])
def test_output_into_the_state_dir_is_refused(setup, tmp_path, state_dir, how):
    data, keys = setup
    work = data.parent
    target = state_dir / "ledgers" / "alice.json"
    if how == "direct":
        out: Path | str = target
    elif how == "new-file":
        out = state_dir / "ledgers" / "new.json"
    elif how == "symlinked-dir":
        (work / "link").symlink_to(state_dir / "ledgers")
        out = work / "link" / "alice.json"
    elif how == "dotdot":
        out = f"{work}/../state/ledgers/alice.json"
    elif how == "dangling-symlink":
        (work / "o.json").symlink_to(state_dir / "ledgers" / "bob.json")
        out = work / "o.json"
    else:
        out = state_dir / "secret.key.csv"
    refused(hist(data, keys, out), tmp_path, state_dir, "inside the state directory")


@pytest.mark.parametrize("which", ["data", "data-symlink", "data-hardlink", "keys", "keys-relative"])
def test_output_onto_an_input_is_refused(setup, tmp_path, state_dir, monkeypatch, which):
    data, keys = setup
    work = data.parent
    if which == "data":
        out: Path | str = data
    elif which == "data-symlink":
        (work / "alias.csv").symlink_to(data)
        out = work / "alias.csv"
    elif which == "data-hardlink":
        os.link(data, work / "hard.csv")
        out = work / "hard.csv"
    elif which == "keys":
        out = keys
    else:
        monkeypatch.chdir(work)
        out = "./sub/../keys.csv"
        (work / "sub").mkdir()
    refused(hist(data, keys, out), tmp_path, state_dir, "is the input")


def test_topk_output_onto_its_domain_is_refused(setup, tmp_path, state_dir):
    data, keys = setup
    refused(["topk", str(data), "--by", "g", "--privacy-unit", "user", "-k", "1", "--epsilon-per", "1",
             "--keys", str(keys), "-o", str(keys)], tmp_path, state_dir, "is the input")


@pytest.mark.parametrize("which", ["spec", "blocks", "state"])
def test_tabulate_output_onto_spec_blocks_or_state_is_refused(setup, tmp_path, state_dir, which):
    work = setup[0].parent
    spec = write_spec(work, '[[levels]]\ngeography = "state"\niterations = "reg"\nepsilon = 0.5\nstability = 4\n')
    persons = work / "p.csv"
    pl.DataFrame({"block": ["01001"], "race": ["1000"], "eth": [1], "sex": ["1"], "age": [30]}).write_csv(persons)
    out = {"spec": spec, "blocks": work / "blocks.csv", "state": state_dir / "README.txt.csv"}[which]
    needle = "inside the state directory" if which == "state" else "is the input"
    refused(["tabulate", str(persons), "--spec", str(spec), "-o", str(out), "--format", "csv"], tmp_path, state_dir,
            needle)


def _stream(tmp_path: Path) -> tuple[Path, list[str]]:
    f = tmp_path / "work" / "events.csv"
    pl.DataFrame({"ts": [f"2026-11-01T0{h}:00:00" for h in range(6)], "user": [f"u{h}" for h in range(6)],
                  "page": ["p"] * 6}).write_csv(f)
    return f, ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "12h",
               "--max-contributions", "2", "--epsilon", "1", "--delta", "1e-9"]


@pytest.mark.parametrize("how", ["ledger", "new-file", "symlinked-dir", "input", "output"])
def test_stream_state_file_into_the_state_dir_or_onto_an_input_is_refused(setup, tmp_path, state_dir, how):
    events, args = _stream(tmp_path)
    work = events.parent
    extra: list[str] = []
    needle = "inside the state directory"
    if how == "ledger":
        state: Path = state_dir / "ledgers" / "alice.json"
    elif how == "new-file":
        state = state_dir / "stream.state"
    elif how == "symlinked-dir":
        (work / "link").symlink_to(state_dir)
        state = work / "link" / "stream.state"
    elif how == "input":
        state, needle = events, "is the input"
    else:  # -o onto the --state file
        state, needle = work / "s.state", "is the input"
        extra = ["-o", str(state), "--format", "csv"]
    refused(["stream-replay", str(events), *args, "--state", str(state), *extra], tmp_path, state_dir, needle)


def test_ordinary_outputs_still_work(setup, tmp_path, state_dir):
    """Refusals are about the state dir and inputs only: a fresh file next to the data is fine."""
    data, keys = setup
    out = data.parent / "out.csv"
    r = runner.invoke(app, hist(data, keys, out))
    assert r.exit_code == 0, r.stderr
    assert out.exists()


def test_attack_a_write_that_fails_is_one_line_not_an_internal_error(svc):
    """plot -o / budget show --plot into a directory that cannot be written ended in an internal error
    (exit 1, the OS error's type) instead of exit 73."""
    locked = svc.out / "alice" / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root: the permission does not hold; a missing directory then
            locked.chmod(0o700)
            locked.rmdir()
        r = svc.run("alice", "budget", "show", "--plot", locked / "b.svg")
        assert r.exit_code == 73, r.stderr
        assert "internal error" not in r.stderr
    finally:
        if locked.exists():
            locked.chmod(0o700)


@pytest.mark.parametrize("how", ["file", "pipe"])
@pytest.mark.parametrize("out", ["/dev/stdin", "/proc/self/fd/0"])
def test_attack_output_onto_the_standard_input_read_as_data_is_refused(setup, tmp_path, state_dir, how, out):
    """Issue 31's review: ``-o /dev/stdin`` (a device path, written in place) with the data read from
    ``-`` appended the release to the data file stdin was redirected from; on a pipe, dpcli wrote into
    the pipe it reads itself (the release lost, or a hang after the charge once it fills the pipe)."""
    data, keys = setup
    saved = os.dup(0)
    read, write = os.pipe() if how == "pipe" else (os.open(data, os.O_RDONLY), -1)
    try:
        os.dup2(read, 0)  # the process's standard input, as the shell gives it (the runner feeds sys.stdin)
        before = snapshot(tmp_path)
        r = runner.invoke(app, ["histogram", "-", *hist(data, keys, out)[2:]], input=data.read_text())
        assert r.exit_code == 73 and "is the standard input the run reads" in r.stderr, (r.exit_code, r.stderr)
        assert snapshot(tmp_path) == before
        assert runner.invoke(app, ["budget", "history", "default", "--json"]).stdout.strip() == "[]"
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            if fd >= 0:
                os.close(fd)


@pytest.mark.parametrize("what", ["directory", "closed"])
def test_attack_a_descriptor_that_cannot_be_written_is_refused_before_the_charge(setup, tmp_path, state_dir, what):
    """Issue 31's review: ``-o /dev/fd/N`` on a directory (or ``-o /dev/shm``) was taken for a device written
    in place, passed the checks, and failed after the charge; on a closed descriptor, an attempt to create
    a file in /proc's descriptor directory failed after the charge too (root may write any directory)."""
    data, keys = setup
    fd = os.open(tmp_path, os.O_RDONLY) if what == "directory" else 987  # (a number the run's own files never get)
    try:
        refused(hist(data, keys, f"/dev/fd/{fd}"), tmp_path, state_dir,
                "is a directory" if what == "directory" else "does not exist")
    finally:
        if what == "directory":
            os.close(fd)
