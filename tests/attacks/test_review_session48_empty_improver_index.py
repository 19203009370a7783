"""Review session 48, item 3 (schedules): ``--improver-index ""`` was refused (exit 2, "--improver-index must be
runs or rows, got ''") up to 0028eb9; now ``schedule_spec`` turns it into ``runs`` (``o.improver_index or "runs"``)
before ``ScheduleSpec.check`` sees it, and the run creates and charges a schedule (rule 7: a bad public input is a
usage error with no debit)."""

from __future__ import annotations

import pytest
from dptest import PAGES, PV_SMALL, cli, history, init_ledger


@pytest.mark.parametrize("given", [["--improver-index", ""], ["--improver-index="]])
def test_an_empty_improver_index_is_refused_before_any_charge(given):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    r = cli("histogram", PV_SMALL, "--by", "page", "--keys", PAGES, "--privacy-unit", "user_id", "--max-partitions",
            "1", "--max-contributions", "1", "--schedule", "s", "--scheduler", "bbimprover", "--total-epsilon", "1",
            "--total-delta", "1e-6", *given, "--json")
    assert r.exit_code == 2, r.stderr
    assert "--improver-index must be runs or rows" in r.stderr
    assert not [e for e in history() if e["events"]]
