"""h-attack (review of issue 37), rule 7: an operator's (or a personal-mode user's) ``-o`` is checked, then
written by path.

FIXED (h-walk): see the fix at the end of this docstring. Low severity: it needs someone
else to control a directory on the path of an output the operator names (a shared report folder).

For a service-mode analyst the write goes through the output directory opened without following
symlinks (:mod:`dpcli.access.walk`). For everyone else :meth:`dpcli.access.Gate.check_write` resolves
the path (not in the state directory, not an input) before the data is read and again in
:meth:`dpcli.access.Gate.write`, which then opens ``path.parent`` *by path*, following symlinks
(:func:`dpcli.state.atomic.atomic_write_bytes`). Whoever can rename a directory on that path and
swaps it for a symlink in a loop wins the race between that last check and the open now and then,
and the service account's release lands in the state directory, in a data directory, or over one of
the run's inputs (rule 7: outputs never overwrite state or inputs). Here the swap is made right after
the last check (the window a racing loop hits).

Fixed (h-walk): :meth:`dpcli.access.Gate.write` opens the output's directory once after the last check
and checks that descriptor (:func:`dpcli.access.writes.checked_parent`: it and its ancestors through ``..``
are not the state directory or an input dataset, the name replaced is no input and no private file, by
device and inode), then writes relative to it (:func:`dpcli.state.atomic.atomic_write_at`); a device or a
pipe written in place goes through the same checked directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from dptest import cli, init_ledger

from dpcli import access
from dpcli.state import atomic


def _inputs(tmp_path: Path, data_dir: Path | None = None) -> tuple[Path, Path, Path]:
    """A small data file (in ``data_dir``, default ``tmp_path``), its list of groups, and ``shared/rep``: the
    output directory whose parent someone else can write."""
    (data_dir or tmp_path).mkdir(exist_ok=True)
    data = (data_dir or tmp_path) / "d.csv"
    data.write_text("user,g\n" + "".join(f"u{i},A\n" for i in range(50)))
    keys = tmp_path / "k.csv"
    keys.write_text("g\nA\n")
    shared = tmp_path / "shared"
    (shared / "rep").mkdir(parents=True)
    return data, keys, shared


def _swap(shared: Path, target: Path) -> None:
    """Someone who can write ``shared`` swaps ``rep`` for a link to ``target``."""
    os.rename(shared / "rep", shared / "rep.old")
    os.symlink(target, shared / "rep")


def _swap_at_the_second_check(monkeypatch: pytest.MonkeyPatch, shared: Path, target: Path,
                              name: str = "") -> None:
    """The swap right after the second output check (the one in Gate.write, just before the open)."""
    checked = access.Gate.check_write
    calls = []

    def check_then_swap(self, path, what="output"):
        checked(self, path, what)
        calls.append(path)
        if str(path).endswith(name) and len(calls) == 2:
            _swap(shared, target)

    monkeypatch.setattr(access.Gate, "check_write", check_then_swap)


def test_an_output_directory_swapped_after_the_check_cannot_lead_into_the_state_directory(tmp_path, state_dir,
                                                                                         monkeypatch):
    init_ledger()
    data, keys, shared = _inputs(tmp_path)
    _swap_at_the_second_check(monkeypatch, shared, state_dir / "ledgers", "default.json")
    r = cli("histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--epsilon", "1",
            "-o", shared / "rep" / "default.json")
    after = (state_dir / "ledgers" / "default.json").read_bytes()
    # (the release was debited before its output, as always: the ledger holds that debit, not the release CSV)
    lines = [json.loads(line) for line in after.splitlines()]  # (a CSV release would not parse)
    assert lines[0]["ledger_id"] and len(lines) >= 2, (r.exit_code, after[:60])
    assert r.exit_code == 73 and "inside the state directory" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not list((state_dir / "ledgers").glob(".default.json.*.tmp"))  # no temp file left there either


def test_an_output_directory_swapped_after_the_check_cannot_lead_over_an_input(tmp_path, state_dir, monkeypatch):
    """The same swap, to the directory of the run's data: the name written there is the input, refused on
    the directory's descriptor (by device and inode), and the input is untouched."""
    init_ledger()
    inputs_dir = tmp_path / "in"
    data, keys, shared = _inputs(tmp_path, inputs_dir)
    _swap_at_the_second_check(monkeypatch, shared, inputs_dir)
    before = data.read_bytes()
    r = cli("histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--epsilon", "1",
            "-o", shared / "rep" / "d.csv")
    assert r.exit_code == 73 and "is one of the run's inputs" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert data.read_bytes() == before


@pytest.mark.parametrize("into", ["ledgers", "elsewhere"])
def test_a_pipe_output_swapped_after_the_check_is_not_appended_to(tmp_path, state_dir, monkeypatch, into):
    """`-o` naming a FIFO is written in place (appended, never replaced): its directory swapped after the check
    for a link to the ledgers' (the same name there is a ledger) is refused on the directory's descriptor;
    to a directory where the name is a regular file, the file opened is refused before a byte is appended."""
    init_ledger()
    data, keys, shared = _inputs(tmp_path)
    os.mkfifo(shared / "rep" / "default.json")
    other = tmp_path / "other"
    other.mkdir()
    (other / "default.json").write_text("precious\n")
    target = state_dir / "ledgers" if into == "ledgers" else other
    decide = atomic.writes_in_place

    def decide_then_swap(path):  # Gate.write has decided to write in place: the swap comes just after
        in_place = decide(path)
        if in_place and str(path).endswith("default.json") and not (shared / "rep.old").exists():
            _swap(shared, target)
        return in_place

    monkeypatch.setattr(atomic, "writes_in_place", decide_then_swap)  # (Gate.write imports it when it writes)
    before = (target / "default.json").read_bytes()
    r = cli("histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--epsilon", "1",
            "-o", shared / "rep" / "default.json")
    after = (target / "default.json").read_bytes()
    assert r.exit_code == 73 and r.stderr.count("\n") == 1, r.stderr
    assert after.startswith(before.splitlines()[0]) and b"noisy" not in after and b"A," not in after
    if into == "elsewhere":
        assert after == before and "is a regular file now" in r.stderr
