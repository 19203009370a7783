"""Rule 7: bad public inputs are usage errors with one line on stderr, *no debit* and no partial output.

Since issue 37 a release is debited once its seed is known and before it reads its first private record.
Every check of a public input (an option against a public list, a public list's columns and rows) must
therefore run before that debit: one left inside the task's run fails *after* it, and the analyst pays
the release's whole cost for a refusal that depends on nothing private. Found by the full audit fuzz run
(``tests/audit/test_audit_fuzz.py::test_numeric_options_topk_full`` and ``..._histogram_full`` fail on main:
"a failed run was debited"): ``topk -k 10000`` with a known domain of 3 candidates was charged ε = 15,000.

Each case runs once on a fresh ledger and requires a refusal with nothing charged. ``histogram --keys`` with
a list that lacks the group column is the control. The others were found open by the second review of
issue 37 and are fixed: topk's k against its domain, and ``sql --keys`` with a list that lacks a GROUP BY
key's output name or lists no groups, are checked by the task's ``check_lists`` before the debit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dptest import init_ledger, runner

from dpcli.cli.app import app


def _charged(state: Path) -> list[dict]:
    path = state / "ledgers" / "default.json"
    lines = [json.loads(line) for line in path.read_bytes().splitlines()[1:] if line.strip()]
    return [e for e in lines if e.get("events")]


def _files(tmp: Path) -> dict[str, str]:
    rows = "".join(f"u{i},g{i % 3}\n" for i in range(40))
    (tmp / "d.csv").write_text("u,g\n" + rows)
    (tmp / "keys.csv").write_text("g\ng0\ng1\ng2\n")
    (tmp / "other.csv").write_text("h\ng0\n")
    (tmp / "none.csv").write_text("g\n")
    return {name: str(tmp / f"{name}.csv") for name in ("d", "keys", "other", "none")}


SQL = ["sql", "SELECT g, ANON_COUNT(*, 2) AS n FROM t GROUP BY g", "--privacy-unit", "t.u", "--epsilon", "1"]
CASES = {
    "histogram --keys lacking the column (control)": (
        lambda f: ["histogram", f["d"], "--by", "g", "--privacy-unit", "u", "--keys", f["other"], "--epsilon", "1"],
        False),
    "topk -k larger than its domain": (
        lambda f: ["topk", f["d"], "--by", "g", "--privacy-unit", "u", "--keys", f["keys"], "-k", "10",
                   "--epsilon-per", "1"],
        True),
    "sql --keys lacking a GROUP BY key's name": (lambda f: [*SQL, "--table", f"t={f['d']}", "--keys", f["other"]],
                                                 True),
    "sql --keys listing no groups": (lambda f: [*SQL, "--table", f"t={f['d']}", "--keys", f["none"]], True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attack_a_bad_public_input_is_refused_before_the_debit(tmp_path, state_dir, name):
    init_ledger("approx", "--epsilon", "1000", "--delta", "0.5")
    args = CASES[name][0](_files(tmp_path))
    r = runner.invoke(app, args)
    assert r.exit_code in (2, 65) and r.stdout == "", (r.exit_code, r.stderr)
    assert len([line for line in r.stderr.splitlines() if line.strip()]) == 1, r.stderr
    assert _charged(state_dir) == [], f"{name}: refused ({r.stderr.strip()}) and charged"
