"""Rule 1, the invariant behind "the seed binds everything that shapes the output" (issue 37).

Whatever a release's options and inputs, two runs that get one seed must put the same noise on the
same values: the same released groups, and for every (group, measurement) both report, the same
number. A field that changes which noise lands on which value without changing the seed breaks it
(the Parquet list's columns under seed material v2 did: `test_rule1_seed_binds_what_is_read.py`).

Each command gets a base release and variants that change one field of its query or reading at a
time (a grouping column, a list and its column, the order of aggregates, bounds, caps, ε, the
output's format, `--with-error`, a copy of the data in another format). Every pair of runs is
compared: either their seeds differ, or their noisy tables agree. Both outcomes are allowed for any
one field, so the test does not encode which fields are free replays (`FREE_REPLAY` has its own
tests); it fails only if one seed gives two noise placements.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import polars as pl
from dptest import history, init_ledger, runner

from dpcli.cli.app import app


def _inputs(tmp_path: Path) -> dict[str, Path]:
    """Units with two grouping columns and two values; lists of groups; the data again as NDJSON."""
    rows = [{"user": f"u{i % 60}", "a": "PQR"[i % 3], "b": "XY"[i % 2], "v": i % 7, "w": (i * 5) % 9}
            for i in range(240)]
    frame = pl.DataFrame(rows)
    paths = {"csv": tmp_path / "d.csv", "ndjson": tmp_path / "d.jsonl", "list": tmp_path / "k.parquet",
             "list2": tmp_path / "k2.parquet"}
    frame.write_csv(paths["csv"])
    frame.write_ndjson(paths["ndjson"])
    pl.DataFrame({"a": ["P", "Q", "R"], "b": ["X", "Y", "Z"]}).write_parquet(paths["list"])
    pl.DataFrame({"a": ["P", "Q", "S"]}).write_parquet(paths["list2"])
    return paths


def _release(args: list[str], out: Path | None, by: list[str]) -> tuple[str, dict[tuple[Any, ...], dict[str, Any]]]:
    """Run one release; its seed id (from the ledger) and its table as (group) → {column: value}."""
    r = runner.invoke(app, args)
    assert r.exit_code == 0, (args, r.stdout, r.stderr)
    seed = history()[-1]["seed_id"]
    table = pl.read_parquet(out) if out is not None else pl.read_csv(r.stdout.encode())
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in table.iter_rows(named=True):
        key = tuple(str(row[c]) for c in by)
        rows[key] = {c: v for c, v in row.items() if c not in by}
    return seed, rows


def _check_pairs(runs: list[tuple[str, str, dict[tuple[Any, ...], dict[str, Any]]]]) -> int:
    """Every pair with one seed has one noisy table (same groups; equal values in the columns both have)."""
    shared = 0
    for (n1, s1, t1), (n2, s2, t2) in itertools.combinations(runs, 2):
        if s1 != s2:
            continue
        shared += 1
        assert t1.keys() == t2.keys(), f"{n1} and {n2}: one seed, other groups"
        for group in t1:
            common = t1[group].keys() & t2[group].keys()
            assert common, (n1, n2, group)
            for column in common:
                assert t1[group][column] == t2[group][column], f"{n1} and {n2}: one seed, other noise ({column})"
    return shared


def test_histogram_one_seed_one_noise_placement(tmp_path):
    init_ledger("approx", "--epsilon", "1000", "--delta", "1e-3")
    p = _inputs(tmp_path)
    base = ["histogram", str(p["csv"]), "--privacy-unit", "user", "--agg", "count,sum", "--value", "v",
            "--bounds", "0:10", "--max-contributions", "2", "--epsilon", "1", "--delta", "1e-6"]

    def variant(old: str, new: str) -> list[str]:
        i = base.index(old)
        return [*base[:i], new, *base[i + 1:]]

    cases: list[tuple[str, list[str], list[str], Path | None]] = [
        ("base", [*base, "--by", "a"], ["a"], None),
        ("again", [*base, "--by", "a"], ["a"], None),
        ("by b", [*base, "--by", "b"], ["b"], None),
        ("by a,b", [*base, "--by", "a,b"], ["a", "b"], None),
        ("keys", [*base, "--by", "a", "--keys", str(p["list"])], ["a"], None),
        ("keys2", [*base, "--by", "a", "--keys", str(p["list2"])], ["a"], None),
        ("keys by b", [*base, "--by", "b", "--keys", str(p["list"])], ["b"], None),
        ("agg order", [*variant("count,sum", "sum,count"), "--by", "a"], ["a"], None),
        ("value w", [*variant("v", "w"), "--by", "a"], ["a"], None),
        ("bounds", [*variant("0:10", "0:20"), "--by", "a"], ["a"], None),
        ("cap", [*variant("2", "3"), "--by", "a"], ["a"], None),
        ("epsilon", [*variant("1", "2"), "--by", "a"], ["a"], None),
        ("with error", [*base, "--by", "a", "--with-error"], ["a"], None),
        ("parquet out", [*base, "--by", "a", "-o", str(tmp_path / "o.parquet")], ["a"], tmp_path / "o.parquet"),
        ("ndjson", [*variant(str(p["csv"]), str(p["ndjson"])), "--by", "a"], ["a"], None),
    ]
    runs = [(name, *_release(args, out, by)) for name, args, by, out in cases]
    assert _check_pairs(runs) >= 3  # base/again/--with-error/-o are replays: the invariant is exercised


def test_sql_one_seed_one_noise_placement(tmp_path):
    init_ledger("approx", "--epsilon", "1000", "--delta", "1e-3")
    p = _inputs(tmp_path)

    def sql(query: str, *extra: str, by: list[str]) -> tuple[list[str], list[str]]:
        return (["sql", query, "--table", f"t={p['csv']}", "--privacy-unit", "t.user", "--epsilon", "1",
                 "--delta", "1e-6", *extra], by)

    keys = ["--keys", str(p["list"])]
    count = "ANON_COUNT(*, 2) AS n"
    cases = {
        "base": sql(f"SELECT a, {count} FROM t GROUP BY a", *keys, by=["a"]),
        "again": sql(f"SELECT a, {count} FROM t GROUP BY a", *keys, by=["a"]),
        "alias b": sql(f"SELECT a AS b, {count} FROM t GROUP BY a", *keys, by=["b"]),
        "group b": sql(f"SELECT b, {count} FROM t GROUP BY b", *keys, by=["b"]),
        "keys2": sql(f"SELECT a, {count} FROM t GROUP BY a", "--keys", str(p["list2"]), by=["a"]),
        "order": sql(f"SELECT a, {count} FROM t GROUP BY a ORDER BY n DESC", *keys, by=["a"]),
        "limit": sql(f"SELECT a, {count} FROM t GROUP BY a LIMIT 2", *keys, by=["a"]),
        "sum": sql(f"SELECT a, {count}, ANON_SUM(v, 0, 10) AS s FROM t GROUP BY a", *keys, by=["a"]),
        "row cap": sql(f"SELECT a, {count} FROM t GROUP BY a", *keys, "--max-rows-per-table", "3", by=["a"]),
    }
    runs = []
    for name, (args, by) in cases.items():
        seed, table = _release(args, None, by)
        runs.append((name, seed, table))
    # LIMIT keeps a subset of the groups: compare it on the groups it kept, by its own seed only
    limited = [r for r in runs if r[0] == "limit"]
    full = [r for r in runs if r[0] != "limit"]
    assert _check_pairs(full) >= 1
    for _, seed, table in limited:
        for name, other_seed, other in full:
            if other_seed == seed:
                for group, values in table.items():
                    assert other[group] == values, f"limit and {name}: one seed, other noise"

