"""h-attack (review of issue 37), rule 8: ``sql --table T=DATASET --delimiter C`` parses a catalog dataset the
analyst's way.

Found open by the second review of issue 37 (low severity); fixed as suggested below.

Every other command refuses ``--delimiter``/``--input-format`` for a catalog dataset in service mode
("dataset … is read as the operator declared it", :func:`dpcli.cli._sources.data_source`), because how
private bytes are split is the operator's choice and a refusal or a column found tells the analyst about
a header they may not read. ``dpcli sql`` declares a table by option through
:func:`dpcli.cli._sql_tables._declared`, which builds the Source with ``source.delimiter or delimiter``:
when the entry declares no delimiter (a ``.csv`` or ``.tsv`` read by its suffix) the analyst's
``--delimiter`` splits the private file. Each delimiter tried is one more probe of the private header
(exit 0 or 65 tells whether the unit's name is a field of the header split on it), and a header that
splits on two characters lets records be split so that a person's fields shift into the unit column.

The fix: ``_declared`` refuses ``--delimiter`` for a private table that is a catalog dataset in service
mode, as ``data_source`` does (a table named only in the query, ``_from_catalog``, never takes it).
"""

from __future__ import annotations


def test_sql_refuses_a_delimiter_for_a_catalog_dataset(svc):
    histogram = svc.run("alice", "histogram", "visits", "--by", "page", "--delimiter", ";", "--epsilon", "1",
                        "--keys", "pages")
    assert histogram.exit_code == 2 and "read as the operator declared it" in histogram.stderr
    r = svc.run("alice", "sql", "SELECT page, ANON_COUNT(*) AS n FROM t GROUP BY page", "--table", "t=visits",
                "--delimiter", "s", "--epsilon", "1", "--keys", "pages")
    # before: exit 65, "column 'user' not found in visits": the private file was split on "s"
    assert r.exit_code == 2 and "read as the operator declared it" in r.stderr, (r.exit_code, r.stderr)
