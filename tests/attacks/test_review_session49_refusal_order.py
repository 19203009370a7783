"""Review session 49 (commit 81d5aa7, the continuation refactor), a finding of low severity: ``histogram`` and
``topk`` with ``--schedule`` now refuse a bad ``--through`` before a bad output target, so a command with both
errors gets another refusal than before.

Before 81d5aa7 both commands checked the output target (``output_target``: ``--format table`` to a file, ``--json``
with ``--format`` and no ``-o``, …) and only then parsed ``--through`` (``schedule_through``, when building the
``Continuation``). The refactor builds ``release.Scheduled(spec, schedule_through(options), size)`` before the
dry-run branch, ahead of ``output_target``: the same command line now says "cannot read --through …" where it
said "--format table is for reading on a terminal …". Both are exit 2 before anything is read or charged (no
privacy rule is broken), but the refactor was to keep the same refusals in the same order.

Fix: build the continuation after ``target = output_target(...)`` in the run branch (the dry run gives no
``--through`` anyway: ``schedule_spec`` refuses it there).
"""

from __future__ import annotations

import pytest
from dptest import cli, init_ledger


@pytest.mark.parametrize("command", ["histogram", "topk"])
def test_the_output_target_is_refused_before_the_schedules_through_as_before(command, tmp_path, state_dir):
    init_ledger("pure", "--epsilon", "5")
    data, keys = tmp_path / "d.csv", tmp_path / "keys.csv"
    data.write_text("user,g\n" + "".join(f"u{i},{'abc'[i % 3]}\n" for i in range(30)))
    keys.write_text("g\na\nb\nc\n")
    shape = ["-k", "2"] if command == "topk" else ["--agg", "count-units"]
    r = cli(command, data, "--by", "g", "--privacy-unit", "user", *shape, "--keys", keys, "--schedule", "daily",
            "--total-epsilon", "1", "--through", "2026-13-45", "--format", "table", "-o", tmp_path / "out.csv")
    assert r.exit_code == 2, r.stderr
    assert "--format table is for reading on a terminal" in r.stderr, r.stderr  # as before 81d5aa7
