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


#: Issue 39, item 1: a Parquet column's type is schema, and every case below was charged before it was refused
#: (or charged and released nothing but noise): a text column summed by stream-replay or sql, a boolean or a
#: date failing inside the run after the debit. histogram's text ``--value`` is the control (refused since the
#: issue's first fix).
_BUDGET = ["--epsilon", "1", "--delta", "1e-6"]
_STREAM = ["stream-replay", "{p}", "--time", "ts", "--by", "g", "--privacy-unit", "u", "--window", "1d", "--triggers",
           "1", "--max-contributions", "1", "--bounds", "-9:9", "--through", "2026-11-02", *_BUDGET]
_SQL = ["--table", "v={p}", "--privacy-unit", "v.u", *_BUDGET]
TYPED = {
    "histogram --value of a text column (control)": ["histogram", "{p}", "--by", "g", "--privacy-unit", "u", "--agg",
                                                      "mean", "--value", "t", "--bounds", "0:10", *_BUDGET],
    "stream-replay --value of a text column": [*_STREAM, "--value", "t"],
    "stream-replay --value of a boolean column": [*_STREAM, "--value", "b"],
    "sql ANON_SUM of a text column": ["sql", "SELECT g, ANON_SUM(t, 0, 9) AS s FROM v GROUP BY g", *_SQL],
    "sql ANON_VAR of a date column": ["sql", "SELECT g, ANON_VAR(d, 0, 9) AS s FROM v GROUP BY g", *_SQL],
}


@pytest.mark.parametrize("name", list(TYPED))
def test_attack_a_parquet_columns_declared_type_is_refused_before_the_debit(tmp_path, state_dir, name):
    import datetime as dt

    import polars as pl

    path = tmp_path / "typed.parquet"
    pl.DataFrame({"u": [f"u{i}" for i in range(40)], "g": [f"g{i % 3}" for i in range(40)],
                  "t": [str(i % 9) for i in range(40)], "b": [i % 2 == 0 for i in range(40)],
                  "d": [dt.date(2026, 11, 1)] * 40, "ts": [dt.datetime(2026, 11, 1, i % 24) for i in range(40)]}
                 ).write_parquet(path)
    init_ledger("approx", "--epsilon", "1000", "--delta", "0.5")
    r = runner.invoke(app, [a.replace("{p}", str(path)) for a in TYPED[name]])
    assert r.exit_code == 65 and r.stdout == "", (r.exit_code, r.stderr)
    assert len([line for line in r.stderr.splitlines() if line.strip()]) == 1, r.stderr
    assert _charged(state_dir) == [], f"{name}: refused ({r.stderr.strip()}) and charged"


def test_attack_a_tabulate_spec_column_of_an_unusable_type_is_refused_before_the_debit(tmp_path, state_dir):
    """Found beside issue 39's item 1: tabulate checked its spec's columns against the schema inside the run, after
    the debit, so a float age column (the same for every dataset of that schema) cost the whole spec's ε."""
    import shutil

    import polars as pl
    from dptest import SAMPLE

    pl.read_parquet(SAMPLE / "persons.parquet").with_columns(pl.col("age").cast(pl.Float64)).write_parquet(
        tmp_path / "persons.parquet")
    for name in ("safetab_spec.toml", "blocks.csv"):
        shutil.copy(SAMPLE / name, tmp_path / name)
    init_ledger("zcdp", "--rho", "1000", "--delta", "1e-5")
    spec = str(tmp_path / "safetab_spec.toml")
    r = runner.invoke(app, ["tabulate", str(tmp_path / "persons.parquet"), "--spec", spec])
    assert r.exit_code == 65 and "'age' (age) must hold integer codes" in r.stderr, (r.exit_code, r.stderr)
    assert "charged" not in r.stderr and _charged(state_dir) == [], r.stderr
