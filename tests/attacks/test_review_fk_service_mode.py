"""Adversarial review of ``dpcli sql``'s ownership through foreign keys (issue 41, item 2) in service mode.

Found, two small leaks of the catalog and one way around "only dpcli sql reads it":

* A dataset owned through one the analyst may not use was refused with that dataset's *name* ("owned through a
  dataset you may not use ('orders')"): ``catalog show`` lists only the names an analyst may use, and the gate
  refuses every other name with one message whether it exists or not. Now the message names no parent.
* Declaring a table of a guessed name (``--table GUESS=visits``, a dataset they may use) told a guess of that
  parent's name from a wrong one: a right guess was refused as "declared as another input than the dataset
  'lineitem' is owned through (the catalog's 'GUESS')", a wrong one as a parent they may not use. Now a parent they
  may not use is refused alike whatever the query names.
* ``tabulate`` took a dataset owned through another (no unit of its own) as a person file, each record one person:
  each line of one customer counted as a person. ``histogram``, ``topk`` and ``stream-replay`` refused it; now
  ``tabulate`` does too, before the file is opened.
"""

from __future__ import annotations

import json

from service_checks import _one_line

Q = "SELECT ANON_COUNT(*, 5) AS n FROM lineitem"


def _chain(svc, orders_analysts: str) -> None:
    (svc.data / "orders.csv").write_text("o_orderkey,o_custkey\n" + "".join(f"{i},c{i % 50}\n" for i in range(200)))
    (svc.data / "lineitem.csv").write_text("l_orderkey,block,race,eth,sex,age\n"
                                           + "".join(f"{i % 200},01001,1000,1,1,{20 + i % 40}\n" for i in range(600)))
    svc.catalog_toml += (f'[datasets.orders]\nlocation = "{svc.data / "orders.csv"}"\nprivacy_unit = "o_custkey"\n'
                         f'analysts = {orders_analysts}\n'
                         f'[datasets.lineitem]\nlocation = "{svc.data / "lineitem.csv"}"\n'
                         'owned_by = { column = "l_orderkey", parent = "orders", key = "o_orderkey", max_keys = 4 }\n'
                         'analysts = ["*"]\n')
    svc.setup(ledgers=False)


def test_attack_a_parent_the_analyst_may_not_use_is_not_named(svc):
    _chain(svc, '["bob"]')
    r = svc.run("alice", "sql", Q, "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2, r.stderr
    line = _one_line(r)
    assert "owned through a dataset you may not use" in line and "orders" not in line


def test_attack_a_guess_of_the_parents_name_is_not_confirmed(svc):
    _chain(svc, '["bob"]')
    lines = []
    for guess in ("orders", "purchases"):
        r = svc.run("alice", "sql", f"SELECT ANON_COUNT(*, 5) AS n FROM lineitem l JOIN {guess} o ON "
                    "l.l_orderkey = o.page", "--table", f"{guess}=visits", "--epsilon", "1", "--delta", "1e-6")
        assert r.exit_code == 2, r.stderr
        lines.append(_one_line(r).replace(guess, "GUESS"))
    assert lines[0] == lines[1], lines
    assert "orders" not in lines[0]


def test_attack_tabulate_does_not_take_an_owned_dataset_for_a_person_file(svc):
    from tabulate_specs import spec_toml

    _chain(svc, '["*"]')
    (svc.data / "blocks.csv").write_text("block,aiannh\n01001,A1\n")
    svc.catalog_toml += f'[public.blocks]\nlocation = "{svc.data / "blocks.csv"}"\nanalysts = ["*"]\n'
    svc.setup(ledgers=False)
    levels = '[[levels]]\ngeography = "nation"\niterations = "reg"\nepsilon = 1\nstability = 4\n'
    spec = spec_toml(levels).replace('blocks = "blocks.csv"', 'blocks = "blocks"')
    r = svc.run("alice", "tabulate", "lineitem", "--spec", "-", input=spec)
    assert r.exit_code == 2, r.stderr
    assert "only dpcli sql reads it" in _one_line(r)
    assert json.loads(svc.run("alice", "budget", "show", "--json").stdout)["spent"]["epsilon"] == "0"
