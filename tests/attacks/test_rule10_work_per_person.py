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

from fractions import Fraction
from pathlib import Path

import polars as pl
import pytest
from report_diff import run_cli

from dpcli.tasks.sql.compile import needed_columns
from dpcli.tasks.sql.fanout import MAX_FANOUT, fanout
from dpcli.tasks.sql.ir import scans_of
from dpcli.tasks.sql.query import resolve_query
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


# ---- the per-table row cap (--max-rows-per-table): one person's rows before a join on the unit --------------

def _two_tables(tmp_path: Path, heavy_rows: int) -> tuple[Path, Path]:
    """D (``heavy_rows`` = 300) vs D′ (3): person u0 has that many rows in each of two private tables, the
    39 others 2 each (floats, nulls and repeated rows included: every word type the cap hashes)."""
    rows = [("u0", float(i % 7) / 3 if i % 11 else None, i % 5) for i in range(heavy_rows)]
    rows += [(f"u{j}", 1.5, j) for j in range(1, 40) for _ in range(2)]
    a = tmp_path / f"a{heavy_rows}.parquet"
    b = tmp_path / f"b{heavy_rows}.parquet"
    pl.DataFrame(rows, schema={"user": pl.String, "x": pl.Float64, "k": pl.Int64}, orient="row").write_parquet(a)
    pl.DataFrame(rows, schema={"user": pl.String, "y": pl.Float64, "k": pl.Int64}, orient="row"
                 ).sample(fraction=1.0, shuffle=True, seed=3).write_parquet(b)
    return a, b


JOINED = "SELECT ANON_COUNT(*, 5) AS c, ANON_SUM(x + y, 0, 10) AS s FROM a JOIN b USING (user)"


def _joined_frame(a: Path, b: Path, cap: int, salt: int = 99) -> pl.DataFrame:
    from dpcli.tasks.sql import Budget, SqlOptions, SqlTask
    from dpcli.tasks.sql.run import per_user_frame

    decls = {"a": TableDecl("a", "user", ("user", "x", "k")), "b": TableDecl("b", "user", ("user", "y", "k"))}
    task = SqlTask.from_text(JOINED, decls, SqlOptions(Budget(epsilon=Fraction(1)), max_rows_per_table=cap))
    plan = task.plan("pure", {})
    tables = task.capped_tables({"a": pl.scan_parquet(a), "b": pl.scan_parquet(b)}, salt)
    frame, _ = per_user_frame(task.query, plan, tables, task.query.group_names)
    return frame.collect()


@pytest.mark.parametrize("heavy", [300, 3])
def test_attack_one_persons_joined_rows_are_at_most_the_cap_squared(tmp_path, heavy):
    a, b = _two_tables(tmp_path, heavy)
    cap = 10
    frame = _joined_frame(a, b, cap)
    per_user = frame.group_by("__dp_unit").len()
    assert per_user["len"].max() <= cap * cap
    heavy_rows = per_user.filter(pl.col("__dp_unit") == "u0")["len"].item()
    assert heavy_rows <= cap * cap and (heavy_rows < heavy * heavy if heavy > cap else heavy_rows == heavy * heavy)
    # the others' rows are within the cap: they join as they are (2 × 2 each)
    assert per_user.filter(pl.col("__dp_unit") != "u0")["len"].to_list() == [4] * 39


def test_the_cap_keeps_the_same_rows_on_a_replay_whatever_the_file_order(tmp_path):
    a, b = _two_tables(tmp_path, 300)
    first = _joined_frame(a, b, 10).sort(pl.all())
    assert first.equals(_joined_frame(a, b, 10).sort(pl.all()))
    shuffled = tmp_path / "a-shuffled.parquet"
    pl.read_parquet(a).sample(fraction=1.0, shuffle=True, seed=11).write_parquet(shuffled)
    assert first.equals(_joined_frame(shuffled, b, 10).sort(pl.all()))
    assert not first.equals(_joined_frame(a, b, 10, salt=100).sort(pl.all()))  # keyed: another salt, other rows


def test_the_cap_in_the_cli_dry_run_json_and_refusals(tmp_path):
    a, b = _two_tables(tmp_path, 300)
    base = ["sql", JOINED, "--table", f"a={a}", "--table", f"b={b}", "--privacy-unit", "a.user",
            "--privacy-unit", "b.user", "--epsilon", "1"]
    dry = run_cli([*base, "--max-rows-per-table", "10", "--dry-run", "--json"], tmp_path / "s1", SETUP)
    assert dry.exit_code == 0, dry.stderr
    assert '"max_rows_per_table": 10,' in dry.stdout.replace("\n", ",")
    done = run_cli([*base, "--max-rows-per-table", "10", "--json"], tmp_path / "s2", SETUP)
    assert done.exit_code == 0, done.stderr
    assert '"max_rows_per_table": 10,' in done.stdout.replace("\n", ",")
    default = run_cli([*base, "--dry-run", "--json"], tmp_path / "s3", SETUP)
    assert '"max_rows_per_table": 10000' in default.stdout
    for bad in ("auto", "0", "x"):
        r = run_cli([*base, "--max-rows-per-table", bad], tmp_path / f"s-{bad}", SETUP)
        assert r.exit_code == 2 and "--max-rows-per-table" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert r.ledger == [] or all(not e for e in r.ledger)


def test_the_cap_is_in_the_seed(tmp_path):
    """The same query at another cap keeps other rows: a new release, charged (never a free replay)."""
    a, b = _two_tables(tmp_path, 300)
    base = ["sql", JOINED, "--table", f"a={a}", "--table", f"b={b}", "--privacy-unit", "a.user",
            "--privacy-unit", "b.user", "--epsilon", "1", "--json"]
    state = tmp_path / "state"
    first = run_cli([*base, "--max-rows-per-table", "10"], state, SETUP)
    again = run_cli([*base, "--max-rows-per-table", "10"], state, ())
    other = run_cli([*base, "--max-rows-per-table", "11"], state, ())
    assert first.exit_code == again.exit_code == other.exit_code == 0, (first.stderr, other.stderr)
    assert first.json["summary"]["charged"] is True and again.json["summary"]["charged"] is False  # a replay
    assert again.json["result"] == first.json["result"]  # the same rows kept, the same noise
    assert other.json["summary"]["charged"] is True
