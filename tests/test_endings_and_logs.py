"""How a run ends and what a log shows of it (issue 39, items 10-13): a JSON error object under ``--json``, a
SIGTERM that says (as SIGINT does) what the run charged and wrote, notes that name their job outside a terminal,
and a long header listed with how many columns it leaves out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dptest import PV_SMALL, cli, history, init_ledger

HIST = ["histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--epsilon", "1", "--delta", "1e-6"]


def _dpcli(env: dict[str, str], *args: object, before: str = "") -> subprocess.CompletedProcess[str]:
    """dpcli in a process of its own (its SIGTERM handler, its usage errors), after the Python ``before``."""
    code = f"import sys\n{before}\nsys.argv = ['dpcli', *sys.argv[1:]]\nfrom dpcli.cli.app import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def env(tmp_path):
    e = {**os.environ, "DPCLI_STATE_DIR": str(tmp_path / "state")}
    subprocess.run([sys.executable, "-m", "dpcli", "budget", "init", "default", "--mode", "approx", "--epsilon",
                    "10", "--delta", "1e-3"], env=e, check=True, capture_output=True)
    return e


# --- 10. --json on an error ----------------------------------------------------------------------------------


def test_an_error_under_json_writes_its_line_and_code_as_an_object(state_dir):
    init_ledger("approx", "--epsilon", "1", "--delta", "1e-3")
    for args, code in (([*HIST[:-4], "--epsilon", "5", "--delta", "1e-6"], 77),
                       ([*HIST, "--by", "nope"], 65),
                       (["budget", "show", "nobody"], 77)):
        r = cli(*args, "--json")
        line = r.stderr.strip().splitlines()[-1]
        assert r.exit_code == code and line.startswith("dpcli: error: "), r.stderr
        assert json.loads(r.stdout) == {"error": line, "exit": code}
        plain = cli(*args)
        assert plain.exit_code == code and plain.stdout == "" and plain.stderr == r.stderr
    assert history() == []


def test_a_usage_error_under_json_is_an_object_too(env):
    """typer finds these before the command runs: the same one line and object, exit 2."""
    r = _dpcli(env, *HIST, "--json", "--no-such-option")
    assert r.returncode == 2 and r.stderr == "dpcli: error: No such option: --no-such-option\n", r.stderr
    assert json.loads(r.stdout) == {"error": r.stderr.strip(), "exit": 2}
    plain = _dpcli(env, *HIST, "--no-such-option")  # without --json: typer's usage text, nothing on stdout
    assert plain.returncode == 2 and plain.stdout == "" and "No such option" in plain.stderr


# --- 13. SIGTERM, like SIGINT, says what was charged and written ---------------------------------------------

#: Sends this process SIGTERM the first time the run collects records (after its debit: it reads nothing before).
TERM_AT_FIRST_READ = """
import os, signal, polars as pl
_collect = pl.LazyFrame.collect
def _term(self, *a, **k):
    os.kill(os.getpid(), signal.SIGTERM)
    return _collect(self, *a, **k)
pl.LazyFrame.collect = _term
"""
#: Sends SIGTERM before the ledger is read (nothing charged yet).
TERM_BEFORE_THE_LEDGER = """
import os, signal, dpcli.state.ledger as ledger
_read = ledger.read_ledger
def _term(*a, **k):
    os.kill(os.getpid(), signal.SIGTERM)
    return _read(*a, **k)
ledger.read_ledger = _term
"""


def _charges(env: dict[str, str]) -> int:
    r = subprocess.run([sys.executable, "-m", "dpcli", "budget", "history", "--json"], env=env, capture_output=True,
                       text=True, check=True)
    return sum(1 for e in json.loads(r.stdout) if e.get("events"))


def test_sigterm_says_what_the_run_charged_and_wrote_and_leaves_no_partial_file(env, tmp_path):
    out = tmp_path / "o.csv"
    r = _dpcli(env, *HIST, "-o", out, before=TERM_BEFORE_THE_LEDGER)
    assert r.returncode == 143 and r.stderr == "dpcli: interrupted by SIGTERM: this run charged nothing and wrote " \
                                               "nothing\n", r.stderr
    assert not out.exists() and _charges(env) == 0
    r = _dpcli(env, *HIST, "-o", out, "--json", before=TERM_AT_FIRST_READ)
    line = ("dpcli: interrupted by SIGTERM: this run charged ledger 'default' (it had begun reading its data; its "
            "rerun on the same input is free: see dpcli budget history) and wrote nothing")
    assert r.returncode == 143 and r.stderr.strip().splitlines()[-1] == line, r.stderr
    assert json.loads(r.stdout) == {"error": line, "exit": 143}
    assert not out.exists() and _charges(env) == 1 and not list(tmp_path.glob(".*o.csv*"))
    again = _dpcli(env, *HIST, "-o", out)  # the rerun completes the charged run, for free
    assert again.returncode == 0 and out.exists() and _charges(env) == 1, again.stderr


def test_sigint_says_the_same_with_its_own_name_and_code(env, tmp_path):
    r = _dpcli(env, *HIST, "-o", tmp_path / "o.csv", before=TERM_AT_FIRST_READ.replace("SIGTERM", "SIGINT"))
    assert r.returncode == 130 and r.stderr.strip().splitlines()[-1].startswith(
        "dpcli: interrupted by SIGINT: this run charged ledger 'default'"), r.stderr


# --- 12. notes in a log name their job -------------------------------------------------------------------------


def test_notes_name_their_job_in_a_log_and_not_on_a_terminal(state_dir, tmp_path, monkeypatch):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-3")
    out = tmp_path / "daily.csv"
    r = cli(*HIST, "-o", out)
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("dpcli: note:")]
    assert r.exit_code == 0 and notes and all(ln.endswith(f" [histogram -o {out}]") for ln in notes), r.stderr
    r = cli(*HIST, "--epsilon", "0.9")  # no -o: the command alone
    assert all(ln.endswith(" [histogram]") for ln in r.stderr.splitlines() if ln.startswith("dpcli: note:"))
    from dpcli.cli import _common

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert _common.job_suffix(_common.Settings(Path("s"), "a", 0, 30.0, job="histogram -o x.csv")) == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert _common.job_suffix(_common.Settings(Path("s"), "a", 0, 30.0, job="histogram -o x.csv")) == \
        " [histogram -o x.csv]"


# --- 11. a long header says how much it leaves out -------------------------------------------------------------


def test_a_missing_column_lists_the_first_columns_and_how_many_more(state_dir, tmp_path):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-3")
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(19)) + "\n" + ",".join("1" * 19) + "\n")
    r = cli("histogram", wide, "--by", "dest", "--privacy-unit", "c0", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 65 and "(columns: c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, … and 7 more)" in \
        r.stderr, r.stderr
    narrow = tmp_path / "narrow.csv"
    narrow.write_text("a,b\n1,2\n")
    r = cli("histogram", narrow, "--by", "dest", "--privacy-unit", "a", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 65 and "(columns: a, b)" in r.stderr and "more" not in r.stderr, r.stderr
