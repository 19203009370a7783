"""Review (session 57) of sql's fixed-point sums: one more person, however extreme, moves only noisy values.

D and D′ = D plus one person are released under one forced seed (``report_diff.differential``): exit code, stderr,
the ``--json`` summary and the ledger must be identical. The newcomer's values are the fixed-point path's edge
cases: ±inf and ±1e308 (r clamped to ±2^62, +inf with −inf cancelling), NaN (dropped), −0.0, values exactly
half a 2^−F step between two fixed-point integers (half to even), values far past VAR's per-row distance clamp, text
no number parses from, and thousands of rows (the Int128 sums). Found sound: each partial is a function of the
newcomer's rows alone, clamped to its range, and no cast or sum on the path can fail on a value.
"""

from __future__ import annotations

import polars as pl
import pytest
from report_diff import APPROX, csv_text, differential

#: 200 people, 3 rows each over the groups a, b, c, values 0…36 as text (CSV: read as text in D and D′).
BASE = pl.DataFrame({"user": [f"u{i // 3:03d}" for i in range(600)], "g": [("a", "b", "c")[i % 3] for i in range(600)],
                     "v": [str(i % 37) for i in range(600)]})
#: bounds 0:10 → g = 2^−9 and r = x · 2^29: 2^−30 and 3 · 2^−30 are ties (r = 0.5 → 0, 1.5 → 2)
_ODD = ["inf", "-inf", "1e308", "-1e308", "nan", "-0.0", "0.0", "9.313225746154785e-10", "2.7939677238464355e-09",
        "-9.313225746154785e-10", "5e300", "-5e300", "123456789012345", "abc", "", "10", "1e-320"]
NEWCOMER = pl.DataFrame({"user": ["zz-new"] * 6000, "g": [("a", "b", "c")[i % 3] for i in range(6000)],
                         "v": [_ODD[i % len(_ODD)] for i in range(6000)]})
D, D2 = csv_text(BASE), csv_text(pl.concat([BASE, NEWCOMER]))


@pytest.mark.parametrize("group", ["", " GROUP BY g"], ids=["one-partition", "public-list"])
def test_sums_means_variances_of_an_extreme_newcomer(tmp_path, group):
    data, keys = tmp_path / "events.csv", tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    select = "g, " if group else ""
    query = (f"SELECT {select}ANON_SUM(v, 0, 10) AS s, ANON_AVG(v, 0, 10) AS a, ANON_VAR(v, 0, 10) AS w, "
             f"ANON_STDDEV(v, -3, 7) AS sd, ANON_SUM(v, 2, 9) AS s2 FROM T{group}")
    args = ["sql", query, "--table", f"T={data}", "--privacy-unit", "T.user", "--max-partitions", "2",
            "--max-contributions", "5", "--epsilon", "3", "--delta", "1e-6", "--json"]
    if group:
        args += ["--keys", keys]
    a, b, diff = differential(args, data, D, D2, tmp_path, setup=[APPROX])
    assert a.exit_code == 0, a.stderr
    assert b.exit_code == 0, b.stderr
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)
