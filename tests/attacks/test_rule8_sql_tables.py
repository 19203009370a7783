"""Rule 8 for ``dpcli sql`` (issue 32): in service mode a query's tables are catalog names, read as the
operator declared them, and nothing else is opened for the analyst.

A table the query names is the catalog dataset (private, with the operator's unit) or public entry of
that name; ``--table``/``--public-table`` may rename one but never give a path; ``--privacy-unit`` is
refused for a catalog dataset (naming a unit would tell whether a guess is the unit column); a query
file given as a path is refused like every typed path; and a refusal quotes the analyst's own query,
never a record.
"""

from __future__ import annotations

from service_checks import _nothing_private, _one_line

JOIN = "SELECT p.page, ANON_COUNT(*) AS n FROM visits v JOIN pages p ON v.page = p.page GROUP BY p.page"


def test_an_analyst_joins_a_dataset_and_a_public_table_by_their_names(svc):
    r = svc.run("alice", "sql", JOIN, "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 0, r.stderr
    assert "/p/" in r.stdout
    _nothing_private(r)
    r = svc.run("alice", "sql", JOIN.replace("visits v", "v").replace("pages p", "p"), "--table", "v=visits",
                "--public-table", "p=pages", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 0, r.stderr


def test_attack_tables_given_as_paths_are_refused(svc):
    private = svc.data / "visits.csv"
    for option in (["--table", f"t={private}", "--privacy-unit", "t.user"], ["--public-table", f"t={private}"]):
        r = svc.run("alice", "sql", "SELECT page, ANON_COUNT(*) FROM t GROUP BY page", *option, "--epsilon", "1",
                    "--delta", "1e-6")
        assert r.exit_code == 2, r.stderr
        assert "catalog" in _one_line(r) and str(private) not in r.stderr
        _nothing_private(r, "u17")


def test_attack_a_public_table_naming_the_private_dataset_is_no_public_table(svc):
    """A private dataset declared public would be joined without bounds: it is not a public entry."""
    r = svc.run("alice", "sql", "SELECT v.page, ANON_COUNT(*) FROM visits v JOIN x ON v.user = x.user "
                "GROUP BY v.page", "--public-table", "x=visits", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2, r.stderr
    assert "not a public list of the catalog" in _one_line(r)


def test_the_privacy_unit_of_a_catalog_dataset_is_the_operators(svc):
    r = svc.run("alice", "sql", "SELECT page, ANON_COUNT(*) FROM visits GROUP BY page", "--table", "visits=visits",
                "--privacy-unit", "visits.secret", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2, r.stderr
    assert "the operator declared" in _one_line(r)


def test_attack_a_table_outside_the_catalog_and_a_query_file_by_path(svc):
    r = svc.run("alice", "sql", "SELECT page, ANON_COUNT(*) FROM secrets GROUP BY page", "--epsilon", "1")
    assert r.exit_code == 2 and "not a dataset or public table of the catalog" in _one_line(r)
    r = svc.run("alice", "sql", "-f", svc.data / "visits.csv", "--epsilon", "1")
    assert r.exit_code == 2, r.stderr
    _nothing_private(r, "u17", "user,page")
    r = svc.run("alice", "sql", "-f", "-", "--epsilon", "1", "--delta", "1e-6",
                input="SELECT page, ANON_COUNT(*) AS n FROM visits GROUP BY page")
    assert r.exit_code == 0, r.stderr


def test_a_refused_query_quotes_the_analysts_clause_only(svc):
    r = svc.run("alice", "sql", "SELECT page, ANON_COUNT(*) FROM visits v, visits w GROUP BY page", "--epsilon",
                "1", "--delta", "1e-6")
    assert r.exit_code == 2 and "refused (ownership/join)" in _one_line(r)
    _nothing_private(r, "u17")


def test_attack_a_dry_run_shows_no_column_name_the_analyst_did_not_give(svc):
    """Review of issue 32: ``--dry-run`` printed the resolved plan, which for ``SELECT *`` listed every
    column of the dataset (``secret`` here) and named the unit column. The analyst names ``page`` only."""
    for query in ("SELECT page, ANON_COUNT(*) AS n FROM visits GROUP BY page",
                  "SELECT page, ANON_COUNT(*) AS n FROM (SELECT * FROM visits) t GROUP BY page"):
        for form in ([], ["--json"]):
            r = svc.run("alice", "sql", query, "--epsilon", "1", "--delta", "1e-6", "--dry-run", *form)
            assert r.exit_code == 0, r.stderr
            shown = r.stdout + r.stderr
            assert "secret" not in shown and ".user" not in shown and '"user"' not in shown, shown
