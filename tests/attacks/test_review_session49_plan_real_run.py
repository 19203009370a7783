"""``dpcli budget plan`` promises "nothing read, nothing charged", and runs the command's dry run by *appending*
``--dry-run`` (and ``--json``) to the command line it was given (``dpcli/cli/budget_plan.py`` ``_dry_run``). A
command line that ends in an option taking a value makes the appended ``--dry-run`` that option's *value*
(click takes the next token as the value): ``budget plan -- histogram DATA ... -o`` runs
``histogram DATA ... -o --dry-run``, a **real release**: the records are read, the ledger is charged, and the
release is written to a file named ``--dry-run``; then ``budget plan`` ends with "planned no release" and exit 2,
a usage error after a debit and an output (rule 7: a bad public input is a usage error with no debit and no
partial output). The privacy accounting holds (the release is debited), but the command that says it charges
nothing charged, read the data and wrote a file.

Fix (one line): put the flags first, ``args=["--dry-run", *(["--json"] if as_json else []), *args]``: a
trailing ``-o`` is then "requires an argument", and an inner ``--`` can no longer turn ``--dry-run`` into a
positional argument."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from dptest import cli, history, init_ledger


def _data(path: Path) -> Path:
    pl.DataFrame({"user": [f"u{i}" for i in range(60)], "g": ["abc"[i % 3] for i in range(60)]}).write_csv(path)
    return path


def test_a_trailing_value_option_does_not_turn_the_plan_into_a_release(tmp_path, state_dir, monkeypatch):
    init_ledger("pure", "--epsilon", "2")
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    monkeypatch.chdir(tmp_path)
    release = ["histogram", str(_data(tmp_path / "d.csv")), "--by", "g", "--privacy-unit", "user", "--keys",
               str(keys), "--max-contributions", "1", "--epsilon", "0.5"]
    for tail in (["-o"], ["--json", "-o"]):
        r = cli("budget", "plan", *tail[:-1], "--", *release, tail[-1])
        assert r.exit_code == 2, (r.exit_code, r.stderr)  # a usage error...
        assert history() == [], "budget plan made a real, charged release"  # BUG: ...after a debit
        assert not (tmp_path / "--dry-run").exists(), "budget plan wrote a release"  # BUG: and an output
