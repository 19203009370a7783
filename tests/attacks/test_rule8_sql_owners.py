"""Rule 8 for ``dpcli sql`` with owned tables (issue 41, item 2): in service mode a chain of foreign keys is the
operator's, declared in the catalog (``owned_by``); the analyst names the datasets, never the links.

A link given on the command line is refused like ``--privacy-unit`` for a dataset; a parent the catalog names
cannot be swapped for another dataset by declaring a table of its name; a parent the analyst may not use is
refused; a dataset owned through another is read by ``sql`` only; and the catalog refuses, at ``catalog set``, a
link whose parent is no dataset, a circle of links, and a dataset with both a unit and a link.
"""

from __future__ import annotations

import json

import pytest
from service_checks import _one_line

Q1 = "SELECT l_returnflag, ANON_COUNT(*, 5) AS n FROM lineitem GROUP BY l_returnflag"


def _chain(svc, orders_analysts: str = '["*"]', link: str | None = None) -> None:
    """The operator's orders (unit ``o_custkey``) and lineitem (owned through orders' ``o_orderkey``)."""
    (svc.data / "orders.csv").write_text("o_orderkey,o_custkey\n" + "".join(f"{i},c{i % 150}\n" for i in range(600)))
    (svc.data / "lineitem.csv").write_text("l_orderkey,l_returnflag\n"
                                           + "".join(f"{i % 600},{'ANR'[i % 3]}\n" for i in range(1800)))
    link = link or '{ column = "l_orderkey", parent = "orders", key = "o_orderkey", max_keys = 4 }'
    svc.catalog_toml += (f'[datasets.orders]\nlocation = "{svc.data / "orders.csv"}"\nprivacy_unit = "o_custkey"\n'
                         f'analysts = {orders_analysts}\n'
                         f'[datasets.lineitem]\nlocation = "{svc.data / "lineitem.csv"}"\nowned_by = {link}\n'
                         'analysts = ["*"]\n')
    svc.setup(ledgers=False)


def test_an_analyst_queries_a_dataset_owned_through_another_by_its_name(svc):
    _chain(svc)
    r = svc.run("alice", "sql", Q1, "--max-partitions", "3", "--epsilon", "5", "--delta", "1e-6", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["stability"] == 9 and doc["summary"]["tables"] == ["lineitem", "orders"]
    assert {row["l_returnflag"] for row in doc["result"]} <= {"A", "N", "R"}
    r = svc.run("alice", "sql", Q1, "--epsilon", "1", "--delta", "1e-6", "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["owned"] == {"lineitem": {"through": "orders", "max_keys_per_owner": 4}}
    assert "l_orderkey" not in r.stdout and "o_orderkey" not in r.stdout  # the dry run names no link column
    r = svc.owner("--analyst", "ops", "sql", Q1, "--max-partitions", "3", "--epsilon", "1", "--delta", "1e-6", "--json")
    assert r.exit_code == 0, r.stderr  # the operator (personal mode) reads the catalog's chain alike
    assert json.loads(r.stdout)["summary"]["stability"] == 9


@pytest.mark.parametrize("option", [["--owned-by", "lineitem.l_orderkey=orders.o_custkey"],
                                    ["--max-keys-per-owner", "1000"]])
def test_attack_a_link_on_the_command_line_is_the_operators(svc, option):
    _chain(svc)
    r = svc.run("alice", "sql", Q1, *option, "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2, r.stderr
    assert "the operator's" in _one_line(r)


def test_attack_a_table_named_like_the_parent_cannot_replace_it(svc):
    """lineitem's owners are orders' customers: naming visits ``orders`` would resolve lines through another
    dataset's keys (its rows then owned by no one, or by the wrong unit)."""
    _chain(svc)
    r = svc.run("alice", "sql", "SELECT ANON_COUNT(*, 5) AS n FROM lineitem l JOIN orders o ON l.l_orderkey = "
                "o.o_orderkey", "--table", "orders=visits", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2, r.stderr
    assert "another input than the dataset 'lineitem' is owned through" in _one_line(r)


def test_attack_a_parent_the_analyst_may_not_use_is_refused(svc):
    _chain(svc, orders_analysts='["bob"]')
    r = svc.run("alice", "sql", Q1, "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2, r.stderr
    assert "owned through a dataset you may not use" in _one_line(r)
    r = svc.run("bob", "sql", Q1, "--max-partitions", "3", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 0, r.stderr


def test_a_dataset_owned_through_another_is_read_by_sql_only(svc):
    _chain(svc)
    r = svc.run("alice", "histogram", "lineitem", "--by", "l_returnflag", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2, r.stderr
    assert "only dpcli sql reads it" in _one_line(r)


@pytest.mark.parametrize(("link", "text"), [
    ('{ column = "l_orderkey", parent = "ghost", key = "o_orderkey" }', "'ghost' is not a dataset of the catalog"),
    ('{ column = "l_orderkey", parent = "lineitem", key = "l_orderkey" }', "circle"),
    ('{ column = "l_orderkey", parent = "orders", key = "o_orderkey", max_keys = 0 }', "max_keys"),
    ('{ column = "l_orderkey", parent = "orders" }', "owned_by.key: is required"),
    ('{ column = "l_orderkey", parent = "orders", key = "o_orderkey", unit = "x" }', "unknown key 'unit'"),
])
def test_the_catalog_refuses_bad_links_when_it_is_set(svc, link, text):
    (svc.data / "orders.csv").write_text("o_orderkey,o_custkey\n1,c\n")
    (svc.data / "lineitem.csv").write_text("l_orderkey\n1\n")
    cat = svc.home / "bad.toml"
    cat.write_text(svc.catalog_toml + f'[datasets.orders]\nlocation = "{svc.data / "orders.csv"}"\n'
                   'privacy_unit = "o_custkey"\nanalysts = ["*"]\n'
                   f'[datasets.lineitem]\nlocation = "{svc.data / "lineitem.csv"}"\nowned_by = {link}\n'
                   'analysts = ["*"]\n')
    r = svc.owner("catalog", "set", cat)
    assert r.exit_code == 2, r.stderr
    assert "catalog: datasets." in _one_line(r) and text in _one_line(r)


def test_a_dataset_has_a_unit_or_a_link_not_both(svc):
    (svc.data / "lineitem.csv").write_text("l_orderkey\n1\n")
    cat = svc.home / "both.toml"
    cat.write_text(svc.catalog_toml + f'[datasets.lineitem]\nlocation = "{svc.data / "lineitem.csv"}"\n'
                   'privacy_unit = "l_orderkey"\nowned_by = { column = "l_orderkey", parent = "visits", key = "user" }\n'
                   'analysts = ["*"]\n')
    r = svc.owner("catalog", "set", cat)
    assert r.exit_code == 2 and "one of privacy_unit and owned_by" in _one_line(r)
