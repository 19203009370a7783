"""Review session 49 (commit 81d5aa7, the continuation refactor): probes that passed, kept as tests.

1. A top-k schedule's state that holds ``auto`` bounds (top-k never chooses any, so only a damaged or hand-edited
   state can) is refused as a damaged state. Before 81d5aa7 ``release.path.scheduled_run`` reached
   ``assert keeping is not None`` (an AssertionError: an internal error, and under ``python -O`` a TypeError); the
   refactor declares ``SchedulableTask.keeping`` and top-k's raises :class:`dpcli.errors.StateError`. The probe
   checks what matters for the ledger rules: exit 78 with dpcli's own words (no library text, no traceback), and
   nothing debited, reserved or marked as begun for the refused run (rule: a refusal costs nothing it need not),
   in the run and in its dry run alike. It fails if the check moved after the run's mark or debit, or if an
   internal error came back.
"""

from __future__ import annotations

import json

import polars as pl
from dptest import cli, init_ledger


def _snapshot(tmp_path, name: str, n: int):
    path = tmp_path / f"{name}.csv"
    pl.DataFrame({"user": [f"u{i}" for i in range(n)], "g": ["abc"[i % 3] for i in range(n)]}).write_csv(path)
    return path


def _history() -> list:
    r = cli("budget", "history", "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_a_topk_schedule_state_holding_chosen_bounds_is_refused_as_damaged_before_any_charge(tmp_path, state_dir):
    from dpcli.state import documents
    from dpcli.state import schedules as store

    init_ledger("pure", "--epsilon", "5")
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    common = ["--by", "g", "-k", "2", "--privacy-unit", "user", "--keys", keys, "--schedule", "tk",
              "--total-epsilon", "1", "--scheduler", "fixed", "--epsilon", "0.1"]
    first = cli("topk", _snapshot(tmp_path, "day1", 300), *common, "--through", "2026-11-01",
                "-o", tmp_path / "t1.csv")
    assert first.exit_code == 0, first.stderr
    (doc,) = store.all_schedules(state_dir, "default")
    assert "auto" not in doc  # top-k never keeps bounds
    doc["auto"] = {"max_contributions": 3}  # a damaged (or hand-edited, re-sealed) state
    documents.write(state_dir / "schedules" / "default" / f"{doc['key']}.json", store.KIND, doc)
    before = _history()

    for extra in (["--through", "2026-11-02", "-o", tmp_path / "t2.csv"], ["--dry-run", "--runs", "3"]):
        r = cli("topk", _snapshot(tmp_path, "day2", 360), *common, *extra)
        assert r.exit_code == 78, (extra, r.exit_code, r.stderr)
        assert "damaged state" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "AssertionError" not in r.stderr and "internal" not in r.stderr
        assert _history() == before, extra  # nothing debited, reserved or marked as begun
    assert not (tmp_path / "t2.csv").exists()
