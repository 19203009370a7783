"""h-attack (review of issue 37): function arguments the resolver drops without a word.

FIXED (h-textcap): :data:`dpcli.tasks.sql.exprs.READ_ARGS` names the arguments the resolver reads of
every node it takes; any other one is refused (``unsupported``, naming the function). Low severity: a correctness
defect of the class issue 37 fixed for sub-query column aliases, not a leak (what is computed is what
the seed binds, so two spellings that compute alike replay alike).

:data:`dpcli.tasks.sql.exprs.FUNCTIONS` maps a sqlglot node to a one-argument operator and resolves
``node.this`` only, so every other argument of the node is ignored: ``TRIM(BOTH 'x' FROM g)`` and
``TRIM(LEADING 'x' FROM g)`` are ``TRIM(g)`` (spaces only: ``xxAxx`` stays ``xxAxx``), ``FLOOR(x, 1)``
and ``CEIL(x, 2)`` are ``FLOOR(x)``/``CEIL(x)``; the release says nothing, and ``FLOOR(x, 1)`` after
``FLOOR(x)`` is even recorded as a free replay of it.

Was: :data:`FUNCTIONS` resolved ``node.this`` only. Also dropped then: ``MAX(a, b)``'s second argument
in a sub-query, and a type's length or precision in ``CAST(x AS VARCHAR(3))``, ``CAST(x AS DECIMAL(10, 2))``.
"""

from __future__ import annotations

import pytest

from dpcli.errors import UsageError
from dpcli.tasks.sql.query import resolve_query
from dpcli.tasks.sql.scope import TableDecl

TABLES = {"t": TableDecl("t", "user", ("user", "g", "x"))}


@pytest.mark.parametrize(("plain", "spelled"), [
    ("TRIM(g)", "TRIM(BOTH 'x' FROM g)"),
    ("TRIM(g)", "TRIM(LEADING 'x' FROM g)"),
    ("FLOOR(x)", "FLOOR(x, 1)"),
    ("CEIL(x)", "CEIL(x, 2)"),
    ("CAST(g AS VARCHAR)", "CAST(g AS VARCHAR(3))"),
    ("CAST(x AS DECIMAL)", "CAST(x AS DECIMAL(10, 2))"),
])
def test_an_argument_is_honoured_or_refused(plain, spelled):
    def query(e: str) -> str:
        return f"SELECT {e} AS h, ANON_COUNT(*) AS n FROM t GROUP BY {e}"

    try:
        other = resolve_query(query(spelled), TABLES).canonical()
    except UsageError:
        return  # refused: fine
    assert other != resolve_query(query(plain), TABLES).canonical()


def test_a_per_user_aggregate_with_two_arguments_is_refused():
    query = "SELECT ANON_COUNT(*) AS n FROM (SELECT user, MAX(x, g) AS m FROM t GROUP BY user) s"
    with pytest.raises(UsageError, match=r"^refused \(unsupported\): MAX with its expressions argument"):
        resolve_query(query, TABLES)


@pytest.mark.parametrize("expr", ["TRIM(g)", "FLOOR(x)", "ROUND(x, 2)", "g || x", "CONCAT(g, x)", "IFNULL(g, x)",
                                  "x BETWEEN 1 AND 2", "x IN (1, 2)", "x IS NOT NULL", "CAST(x AS INT)",
                                  "CASE x WHEN 1 THEN g ELSE x END", "IF(x = 1, g, 'a')"])
def test_the_arguments_read_are_accepted(expr):
    resolve_query(f"SELECT {expr} AS h, ANON_COUNT(*) AS n FROM t GROUP BY 1", TABLES)
