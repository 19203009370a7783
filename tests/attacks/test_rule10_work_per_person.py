"""Rule 10: the work done per person is bounded by public parameters (issue 37, class 3).

A join with a public table used to accept any condition: ``JOIN pub a ON v.user = 'u17' AND
v.d = 'X'`` twenty times over a 3-row table made one person's row 3^21 rows and everyone else's none,
so the run time alone (0.3 s or hours) told whether that one record exists, at any ε and never charged.
Now every join has an equality key between a column of each side (``join-key``), and the product over
the query's public joins of each key's largest multiplicity in the public table, read from the public
tables alone, is at most :data:`dpcli.tasks.sql.fanout.MAX_FANOUT` (``join-fan-out``); both are usage
errors before any private byte is read (the release path is never entered) and nothing is charged.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from report_diff import run_cli

from dpcli.tasks.sql.compile import needed_columns
from dpcli.tasks.sql.fanout import MAX_FANOUT, fanout
from dpcli.tasks.sql.ir import scans_of
from dpcli.tasks.sql.resolve import resolve_query
from dpcli.tasks.sql.scope import TableDecl

SETUP = (("budget", "init", "default", "--mode", "approx", "--epsilon", "10", "--delta", "1e-3"),)


def _files(tmp_path: Path) -> tuple[Path, Path]:
    views = tmp_path / "views.csv"
    pl.DataFrame({"user": [f"u{i}" for i in range(40)], "d": ["X" if i == 17 else "Y" for i in range(40)]}
                 ).write_csv(views)
    pub = tmp_path / "pub.csv"
    pl.DataFrame({"k": ["X", "X", "X"], "z": [1, 2, 3]}).write_csv(pub)
    return views, pub


def _sql(tmp_path: Path, query: str, monkeypatch: pytest.MonkeyPatch):
    import dpcli.release as release

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("the release path (which reads private data) was entered")

    monkeypatch.setattr(release, "run", never)
    views, pub = _files(tmp_path)
    return run_cli(["sql", query, "--table", f"v={views}", "--privacy-unit", "v.user", "--public-table",
                    f"pub={pub}", "--epsilon", "1", "--json"], tmp_path / "state", SETUP)


ONE_RECORD = " ".join(f"JOIN pub a{i} ON v.user = 'u17' AND v.d = 'X'" for i in range(20))
FAN_OUT = " ".join(f"JOIN pub a{i} ON v.d = a{i}.k" for i in range(20))


@pytest.mark.parametrize("joins", [ONE_RECORD, "CROSS JOIN pub", "JOIN pub ON TRUE", ", pub",
                                   "JOIN pub a ON v.d = 'X'", "JOIN pub a ON a.k = 'X'", "JOIN pub a ON v.d <> a.k"])
def test_attack_a_public_join_without_an_equality_key_is_refused_before_reading(tmp_path, monkeypatch, joins):
    r = _sql(tmp_path, f"SELECT ANON_COUNT(*) AS c FROM v {joins}", monkeypatch)
    assert r.exit_code == 2, r.stderr
    assert "refused (join-key)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.ledger == [] or all(not e for e in r.ledger)


def test_attack_the_3_to_the_21_fan_out_is_refused_before_reading(tmp_path, monkeypatch):
    r = _sql(tmp_path, f"SELECT ANON_COUNT(*) AS c FROM v {FAN_OUT}", monkeypatch)
    assert r.exit_code == 2, r.stderr
    assert "refused (join-fan-out)" in r.stderr and f"more than {MAX_FANOUT} rows" in r.stderr
    assert "2187" in r.stderr  # the public multiplicities are public: the product read so far is named


def test_a_fan_out_within_the_cap_runs(tmp_path):
    views, pub = _files(tmp_path)
    r = run_cli(["sql", "SELECT ANON_COUNT(*, 9) AS c FROM v JOIN pub a ON v.d = a.k JOIN pub b ON v.d = b.k",
                 "--table", f"v={views}", "--privacy-unit", "v.user", "--public-table", f"pub={pub}",
                 "--epsilon", "1", "--json"], tmp_path / "state", SETUP)
    assert r.exit_code == 0, r.stderr


def test_the_fan_out_is_the_product_of_the_largest_key_multiplicities():
    tables = {"v": TableDecl("v", "user", ("user", "d", "e")), "pub": TableDecl("pub", None, ("k", "j", "z"))}
    pub = pl.LazyFrame({"k": ["X", "X", "X", "Y", None], "j": [1, 1, 2, 1, 1], "z": [1, 2, 3, 4, 5]})
    frames = {"pub": pub}
    one = resolve_query("SELECT ANON_COUNT(*) FROM v JOIN pub a ON v.d = a.k", tables)
    assert fanout(one.relation, frames) == 3
    composite = resolve_query("SELECT ANON_COUNT(*) FROM v JOIN pub a ON v.d = a.k AND v.e = a.j", tables)
    assert fanout(composite.relation, frames) == 2  # (X, 1) twice: a composite key counts as one key
    two = resolve_query("SELECT ANON_COUNT(*) FROM v JOIN pub a ON v.d = a.k JOIN pub b ON v.e = b.j", tables)
    assert fanout(two.relation, frames) == 3 * 4
    nested = resolve_query("SELECT ANON_COUNT(*) FROM v JOIN (SELECT a.k, b.z FROM pub a JOIN pub b ON a.j = b.j) s "
                           "ON v.d = s.k", tables)
    # the public side is itself a join: X's rows with j = 1 (two) meet 4 rows each, X's with j = 2 one
    assert fanout(nested.relation, frames) == 2 * 4 + 1 * 1


ACCEPTED = [
    "SELECT ANON_COUNT(*) FROM v JOIN pub ON v.d = pub.k",
    "SELECT ANON_COUNT(*) FROM v JOIN pub ON v.d = pub.k AND pub.z > 1",
    "SELECT ANON_COUNT(*) FROM v LEFT JOIN pub ON v.d = pub.k",
    "SELECT ANON_COUNT(*) FROM pub JOIN v ON v.d = pub.k",
    "SELECT ANON_COUNT(*) FROM v JOIN w USING (user) JOIN pub ON w.f = pub.k",
    "SELECT ANON_COUNT(*) FROM v JOIN (SELECT k FROM pub WHERE z > 1) p ON v.d = p.k",
]


@pytest.mark.parametrize("query", ACCEPTED)
def test_no_accepted_query_scans_zero_columns_of_a_table(query):
    """With keyless joins refused, every table read is read for at least one column (issue 37, class 4:
    ``CROSS JOIN pub`` scanned none and counted 0 rows)."""
    tables = {"v": TableDecl("v", "user", ("user", "d")), "w": TableDecl("w", "user", ("user", "f")),
              "pub": TableDecl("pub", None, ("k", "z"))}
    q = resolve_query(query, tables)
    needed = needed_columns(q.relation, list(q.groups))
    assert all(needed[s.prefix] for s in scans_of(q.relation))


def test_attack_service_mode_a_keyless_join_with_a_catalog_public_table_is_refused(svc):
    for joins in ("CROSS JOIN pages", "JOIN pages p ON v.user = 'u17'", "JOIN pages p ON TRUE"):
        r = svc.run("alice", "sql", f"SELECT ANON_COUNT(*) AS c FROM visits v {joins}", "--epsilon", "1")
        assert r.exit_code == 2, r.stderr
        assert "refused (join-key)" in r.stderr and "u17" not in r.stderr.replace("'u17'", "")
    # keyed joins with a public table whose key is unique: a fan-out of 1, however many joins
    many = " ".join(f"JOIN pages p{i} ON v.page = p{i}.page" for i in range(12))
    r = svc.run("alice", "sql", f"SELECT ANON_COUNT(*) AS c FROM visits v {many}", "--epsilon", "1")
    assert r.exit_code == 0, r.stderr
