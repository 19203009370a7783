"""h-attack (review of issue 37), rule 10: the two work bounds are checked apart, and they multiply.

Found open by the review (low to medium severity); fixed: one bound, ``cap ** reads × fanout`` ≤ 10^8,
checked after the public multiplicities are read and before anything private is.

``check_private_work`` bounds one person's rows through the private reads (``cap ** reads`` ≤ 10^8:
the default ``--max-rows-per-table`` 10,000 read twice) and ``check_fanout`` bounds one private row
through the public joins (≤ 1,000), each on its own. A self-join on the unit followed by one public
join of multiplicity 1,000 passes both, and makes 10^4 · 10^4 · 10^3 = 10^11 rows of one person with
10,000 rows (3 rows for a person with one): run time, memory and an out-of-memory abort depend on
one person's row count by a factor of 10^8 beyond what README's "Not covered" states ("that product
may be at most 10^8"). Every such probe will cost ε once the run is debited before reading (known
open), but a crash or a timeout is still a deterministic function of one person's rows.

"""

from __future__ import annotations

from dptest import cli, init_ledger


def test_a_self_join_times_a_public_fan_out_is_bounded_as_one_product(tmp_path):
    init_ledger()
    (tmp_path / "v.csv").write_text("user,g\n" + "".join(f"u{i},A\n" for i in range(50)))
    (tmp_path / "p.csv").write_text("k,j\n" + "".join(f"A,{i}\n" for i in range(1000)))  # multiplicity 1,000
    r = cli("sql", "SELECT ANON_COUNT(*) AS n FROM v a JOIN v b ON a.user = b.user JOIN p ON a.g = p.k",
            "--table", f"v={tmp_path / 'v.csv'}", "--privacy-unit", "v.user", "--public-table",
            f"p={tmp_path / 'p.csv'}", "--epsilon", "1")
    # 10,000² rows per person through the self-join, × 1,000 through p: 10^11 > 10^8
    assert r.exit_code == 2 and "join-fan-out" in r.stderr, (r.exit_code, r.stdout, r.stderr)
    assert "--max-rows-per-table 316 or less" in r.stderr  # 316² × 1,000 ≤ 10^8 < 317² × 1,000
    ok = cli("sql", "SELECT ANON_COUNT(*) AS n FROM v a JOIN v b ON a.user = b.user JOIN p ON a.g = p.k",
             "--table", f"v={tmp_path / 'v.csv'}", "--privacy-unit", "v.user", "--public-table",
             f"p={tmp_path / 'p.csv'}", "--epsilon", "1", "--max-rows-per-table", "316")
    assert ok.exit_code == 0, ok.stderr
