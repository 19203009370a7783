"""h-attack (review of issue 37), rule 10 and rule 4: one person's *value* could be multiplied without a bound.

FIXED (h-textcap). Rule 10 bounded how many *rows* one person's rows become (join fan-out,
``--max-rows-per-table``, ``MAX_SCANS``), but nothing bounded how large one row's *value* may grow.
``g || g`` doubles a text value; a chain of CTEs, each reading the previous one, is one scan
(``MAX_SCANS`` counts table reads, not CTE depth) and adds one level to the syntax tree per CTE only
at the top (``MAX_QUERY_DEPTH`` is never reached), so 30 CTEs made one 8-byte value 8 GiB. Nested
sub-queries did it too, within ``MAX_QUERY_DEPTH``: 15 levels of ``SELECT user, g || g || g || g AS g
FROM (…)`` are 4^15 = 2^30. A CASE keeps the value only for one record (``diag = 'X'``): every other
row is the empty string. The run then finished in a second, or the allocator aborted the process
(exit 134, a Rust backtrace on stderr: foreign text) after the private data was read: a noise-free
one-record oracle in the exit code, stderr, run time and memory, at any ε, uncharged.

Now (:mod:`dpcli.tasks.sql.lengths`) every text value read from a table is cut to its first
``MAX_TEXT_LENGTH`` (10,000) characters where it is read, on both engines, every expression's longest
value follows from its arguments' (``||`` adds them, UPPER/LOWER triple, …), and a query in which one
may exceed ``MAX_COMPUTED_TEXT_LENGTH`` (100,000) is refused (``text-length``, exit 2) before any
read: both runs below are that same refusal.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from dpcli.errors import UsageError
from dpcli.tasks.sql.compile import compile_relation, needed_columns
from dpcli.tasks.sql.lengths import MAX_COMPUTED_TEXT_LENGTH, MAX_TEXT_LENGTH
from dpcli.tasks.sql.rules import RULES
from dpcli.tasks.sql.query import resolve_query
from dpcli.tasks.sql.scope import TableDecl

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
    assert outcomes[0] == outcomes[1], outcomes  # was: (0, '') vs (134, 'memory allocation … failed …')
    assert outcomes[0][0] == 2 and "refused (text-length)" in outcomes[0][1], outcomes


TABLES = {"t": TableDecl("t", "user", ("user", "diag", "g", "h"))}


def _resolves(query: str) -> bool:
    try:
        resolve_query(query, TABLES)
    except UsageError as exc:
        assert str(exc).startswith("refused (text-length)"), exc
        return False
    return True


def test_nested_sub_queries_are_refused_too():
    inner = "t"
    for _ in range(15):
        inner = f"(SELECT user, g || g || g || g AS g FROM {inner})"
    assert not _resolves(f"SELECT ANON_COUNT(*) AS n FROM {inner} s")


@pytest.mark.parametrize("expr", [
    "g || g || g || g || g || g || g || g || g || g || g",  # 11 × 10,000
    "UPPER(UPPER(UPPER(UPPER(g))))",  # 3^4 × 10,000
    "LENGTH(g || g || g || g || g || g || g || g || g || g || g)",  # the inner value is computed all the same
    "COALESCE(h, CASE WHEN diag = 'X' THEN g || g || g || g || g || g || g || g || g || g || g END)",
    "CAST(g AS VARCHAR) || CAST(h AS VARCHAR) || LOWER(LOWER(g))",  # 10,000 + 10,000 + 90,000
])
def test_an_expression_that_may_exceed_the_cap_is_refused(expr):
    assert not _resolves(f"SELECT {expr} AS k, ANON_COUNT(*) AS n FROM t GROUP BY 1")


@pytest.mark.parametrize("query", [
    "SELECT UPPER(g || ' ' || h) AS k, ANON_COUNT(*) AS n FROM t GROUP BY 1",
    "SELECT LOWER(g) || '-' || diag || '-' || CAST(LENGTH(h) AS VARCHAR) AS k, ANON_COUNT(*) AS n FROM t GROUP BY 1",
    "WITH a AS (SELECT user, g || g || g || g || g AS g FROM t), b AS (SELECT user, g || g AS g FROM a) "
    "SELECT ANON_COUNT(*) AS n FROM b",  # exactly 100,000
    "SELECT k, ANON_COUNT(*) AS n FROM (SELECT user, MAX(g || h) AS k FROM t GROUP BY user) s GROUP BY k",
])
def test_ordinary_text_expressions_resolve(query):
    assert _resolves(query)


def test_text_is_read_as_its_first_characters():
    """A text column (and another type's text: a categorical) is cut to MAX_TEXT_LENGTH where it is read,
    so the bound holds whatever the records hold."""
    long = "é" * (MAX_TEXT_LENGTH + 5)
    frame = pl.LazyFrame({"user": ["u1", "u2"], "diag": ["X", "Y"], "g": [long, "ab"],
                          "h": pl.Series([long, "cd"], dtype=pl.Categorical)})
    query = resolve_query("SELECT ANON_COUNT(*) AS n FROM (SELECT user, g || '' AS a, h || '' AS b, "
                          "UPPER(g) AS c FROM t) s", TABLES)
    rel = query.relation
    out = compile_relation(rel, {"t": frame}, needed_columns(rel, [])).collect()
    lengths = out.select(pl.col("c1", "c2", "c3").str.len_chars().max()).row(0)
    assert lengths == (MAX_TEXT_LENGTH,) * 3, (out.columns, lengths)


def test_the_rule_states_the_constants():
    assert f"{MAX_COMPUTED_TEXT_LENGTH:,}" in RULES["text-length"] and f"{MAX_TEXT_LENGTH:,}" in RULES["text-length"]
