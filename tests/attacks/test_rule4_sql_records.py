"""Rule 4 for ``dpcli sql``: no record decides whether a query runs (review of issue 32).

D and D′ = D plus ONE user are released under one forced seed (``report_diff``); the exit code,
stderr, the ``--json`` summary and the ledger must agree. The attack record is a value that a
strict cast in the per-user stage cannot convert: an unsigned 64-bit identifier past 2^63 joined
with a signed one (Parquet keeps both types). A strict cast there fails the whole run for D′ only,
so the exit code tells whether that user is in the data.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from report_diff import APPROX, report_diff, run_cli

BIG = 2**63  # one past the largest signed 64-bit integer


def _write(tmp_path: Path, extra: bool) -> tuple[Path, Path]:
    """A private table ``a`` (uid: UInt64) and a second one ``b`` (uid: Int64); D′ adds user 2^63 to ``a``."""
    uids = [*range(1, 41), *([BIG] if extra else [])]
    a, b = tmp_path / f"a-{extra}.parquet", tmp_path / "b.parquet"
    pl.DataFrame({"uid": pl.Series(uids, dtype=pl.UInt64), "page": [i % 3 for i in range(len(uids))]}
                 ).write_parquet(a)
    pl.DataFrame({"uid": pl.Series(range(1, 41), dtype=pl.Int64), "page": pl.Series([i % 3 for i in range(40)],
                                                                                    dtype=pl.Int64)}).write_parquet(b)
    return a, b


QUERIES = {
    "private join on units": "SELECT ANON_COUNT(*, 2) AS c FROM a JOIN b USING (uid)",
    "left join on units": "SELECT ANON_COUNT(*, 2) AS c FROM a LEFT JOIN b ON a.uid = b.uid",
    "public join on a key": "SELECT ANON_COUNT(*, 2) AS c FROM a JOIN p ON a.uid = p.uid",
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_a_join_key_past_the_signed_range_does_not_fail_the_run(tmp_path: Path, name: str) -> None:
    reports = []
    for extra in (False, True):
        a, b = _write(tmp_path, extra)
        args = ["sql", QUERIES[name], "--table", f"a={a}", "--privacy-unit", "a.uid", "--epsilon", "10",
                "--json"]
        args += ["--public-table", f"p={b}"] if "p." in QUERIES[name] else ["--table", f"b={b}", "--privacy-unit",
                                                                            "b.uid"]
        reports.append(run_cli(args, tmp_path / f"state-{extra}", [APPROX]))
    assert reports[0].exit_code == 0, reports[0].stderr
    diff = report_diff(*reports)
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)


def test_a_per_user_sum_past_the_decimal_range_does_not_fail_the_run(tmp_path: Path) -> None:
    """A sub-query's per-user SUM of a Decimal(38, 1) column: two values near its limit add past it, which
    polars' Decimal sum raises on. The query, schema and options are the same for D and D′."""
    big = Decimal("9" * 37 + ".5")
    reports = []
    for extra in (False, True):
        uids = [f"u{i}" for i in range(40)] + (["zz"] * 2 if extra else [])
        values = [Decimal(i % 7) for i in range(40)] + ([big, big] if extra else [])
        path = tmp_path / f"d-{extra}.parquet"
        pl.DataFrame({"uid": uids, "d": pl.Series(values, dtype=pl.Decimal(38, 1))}).write_parquet(path)
        query = "SELECT ANON_SUM(s, 0, 10) AS total FROM (SELECT uid, SUM(d) AS s FROM t GROUP BY uid) per_user"
        args = ["sql", query, "--table", f"t={path}", "--privacy-unit", "t.uid", "--epsilon", "10", "--json"]
        reports.append(run_cli(args, tmp_path / f"state-{extra}", [APPROX]))
    assert reports[0].exit_code == 0, reports[0].stderr
    diff = report_diff(*reports)
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)


def test_an_integer_past_a_decimals_range_does_not_fail_the_run(tmp_path: Path) -> None:
    """COALESCE of a Decimal(38, 30) column and an integer one: polars makes the integer a decimal, which
    fails for a value past 10^8, so one user with a large value would fail the run."""
    reports = []
    for extra in (False, True):
        n = 41 if extra else 40
        path = tmp_path / f"c-{extra}.parquet"
        pl.DataFrame({"uid": [f"u{i}" for i in range(n)],
                      "d": pl.Series([None] * n, dtype=pl.Decimal(38, 30)),
                      "i": [i % 5 for i in range(40)] + ([10**18] if extra else [])}).write_parquet(path)
        query = "SELECT ANON_SUM(COALESCE(d, i), 0, 10) AS total FROM t"
        args = ["sql", query, "--table", f"t={path}", "--privacy-unit", "t.uid", "--epsilon", "10", "--json"]
        reports.append(run_cli(args, tmp_path / f"state-{extra}", [APPROX]))
    assert reports[0].exit_code == 0, reports[0].stderr
    diff = report_diff(*reports)
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)
