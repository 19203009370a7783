"""h-attack (review of issue 37), rule 10 and rule 4: one person's *value* can be multiplied without a bound.

OPEN — this test FAILS today (kept as a strict xfail until fixed).

Rule 10 bounds how many *rows* one person's rows become (join fan-out, ``--max-rows-per-table``,
``MAX_SCANS``), but nothing bounds how large one row's *value* may grow. ``g || g`` doubles a text
value; a chain of CTEs, each reading the previous one, is one scan (``MAX_SCANS`` counts table reads,
not CTE depth) and adds one level to the syntax tree per CTE only at the top (``MAX_QUERY_DEPTH`` is
never reached), so 30 CTEs make one 8-byte value 8 GiB. Nested sub-queries do it too, within
``MAX_QUERY_DEPTH``: 15 levels of ``SELECT user, g || g || g || g AS g FROM (…)`` are 4^15 = 2^30.
A CASE keeps the value only for one record (``diag = 'X'``, or ``user = 'u17' AND …``): every other
row is the empty string. The run then finishes in a second, or the allocator aborts the process
(exit 134, a Rust backtrace on stderr: foreign text) after the private data was read — a noise-free
one-record oracle in the exit code, stderr, run time and memory, at any ε. Nothing is charged (the
abort kills the process before the debit), and debiting before reading would not fix it: the exit
code itself is a deterministic function of one record. (Below the abort, 26 doublings take 4 s and
1.4 GB for the one record against 1 s and 150 MB without it: a timing oracle too.)

Suggested fix: bound every computed text value by a public constant in the compiler (``concat`` and
every function that can lengthen text: ``.str.slice(0, MAX_TEXT)`` after each, on polars and Spark,
documented; a value over the bound is truncated inside the bounded transformation), or refuse before
any read a query whose static length multiplier (the product, along the CTE and sub-query chain, of
the times a column appears in one concatenation) exceeds a documented cap; counting CTEs alone is
not enough (nested sub-queries above).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

#: Doublings: 8 bytes × 2^30 = 8 GiB for the one record, under a 2 GiB address-space limit (safe to run).
LEVELS = 30


def _query(levels: int) -> str:
    ctes = ["c0 AS (SELECT user, CASE WHEN diag = 'X' THEN g ELSE '' END AS g FROM t)"]
    ctes += [f"c{i} AS (SELECT user, g || g AS g FROM c{i - 1})" for i in range(1, levels + 1)]
    return "WITH " + ", ".join(ctes) + f" SELECT ANON_COUNT(*) AS n FROM c{levels} WHERE LENGTH(g) > 0"


def _data(path: Path, diag_of_u17: str) -> Path:
    rows = "".join(f"u{i},{diag_of_u17 if i == 17 else 'Y'},abcdefgh\n" for i in range(200))
    path.write_text("user,diag,g\n" + rows)
    return path


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _dpcli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpcli", *args], env=env, capture_output=True, text=True,
                          preexec_fn=_limit, timeout=300, check=False)


def test_one_record_decides_the_exit_code(tmp_path):
    env = {**os.environ, "DPCLI_STATE_DIR": str(tmp_path / "state"), "DPCLI_ANALYST": "me"}
    assert _dpcli("budget", "init", "me", "--epsilon", "100", env=env).returncode == 0
    outcomes = []
    for name, diag in (("d0", "Y"), ("d1", "X")):  # D and D′: one record's diag differs
        data = _data(tmp_path / f"{name}.csv", diag)
        r = _dpcli("sql", _query(LEVELS), "--table", f"t={data}", "--privacy-unit", "t.user", "--epsilon", "1",
                   "-q", env=env)
        outcomes.append((r.returncode, r.stderr.strip()))
    assert outcomes[0] == outcomes[1], outcomes  # today: (0, '') vs (134, 'memory allocation … failed …')
