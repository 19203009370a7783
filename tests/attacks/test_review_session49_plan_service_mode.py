"""A probe that holds (review session 49): ``dpcli budget plan`` runs the command's dry run without the root
callback, under the outer run's settings and gate. In service mode the plan is the caller's own ledger's, a path
typed as the inner command's data is refused by the gate as the command itself refuses it, an inner
``--analyst``/``--state-dir`` is no option of the command (so never another ledger or state directory), an
inner ``-o`` writes nothing, and nothing is charged to anyone. It would
fail if the inner command got settings or a gate of its own."""

from __future__ import annotations

import json

from service_checks import QUERY


def _entries(svc, analyst: str) -> list:
    r = svc.owner("budget", "history", analyst, "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_the_plan_is_the_callers_under_the_outer_gate(svc):
    own = svc.run("alice", "budget", "plan", "--json", "--", *QUERY)
    assert own.exit_code == 0, own.stderr
    assert json.loads(own.stdout)["analyst"] == "alice"
    typed = ["histogram", str(svc.data / "visits.csv"), "--by", "page", "--privacy-unit", "user", "--epsilon", "1",
             "--delta", "1e-6"]
    r = svc.run("alice", "budget", "plan", "--", *typed)
    assert r.exit_code == 2 and "not a dataset of the catalog" in r.stderr and str(svc.data) not in r.stderr
    for extra in (["--analyst", "bob"], ["--state-dir", str(svc.data)]):
        r = svc.run("alice", "budget", "plan", "--", *QUERY, *extra)
        assert r.exit_code == 2 and "budget plan for" not in r.stdout, (extra, r.stderr)
    # a dry run does not check -o (the command's own --dry-run neither), but writes nothing
    assert svc.run("alice", "budget", "plan", "--", *QUERY, "-o", svc.data / "x.csv").exit_code == 0
    r = svc.run("alice", "budget", "plan", "--", *QUERY, "-o")  # the trailing-option attack, in service mode
    assert r.exit_code == 2
    assert _entries(svc, "alice") == [] and _entries(svc, "bob") == []
    assert not (svc.data / "x.csv").exists()
