"""Notes (``dpcli.advice``): what a release says on stderr about its caps, its noise and its schedule, even
in a pipe (issue 17, "the first hour").
"""

from __future__ import annotations

import re

import polars as pl
from dptest import PAGES, PV, PV_SMALL, cli, init_ledger


def notes(stderr: str) -> list[str]:
    """The notes, without the job each names outside a terminal (`` [histogram]``)."""
    return [re.sub(r" \[[^\]]*\]$", "", ln) for ln in stderr.splitlines() if ln.startswith("dpcli: note:")]


def test_left_out_caps_are_chosen_and_say_so_in_plain_words_even_in_a_pipe():
    """Caps left out are chosen from the data, and a note says which and at what cost; where dpcli cannot choose
    them (unklap here; a br ledger, Spark, a schedule, a margin target) they stay at 1 and the notes say so and
    why. CliRunner's stderr is not a terminal: the notes must appear anyway, and -q silences them."""
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    chosen = notes(cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon",
                       "1").stderr)
    assert any(n.startswith("dpcli: note: left out, so chosen from the data with ε = 0.1 of the budget: "
                            "--max-partitions ") and "--max-contributions " in n for n in chosen), chosen
    assert not any("at most 1 row" in n for n in chosen)
    args = ("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--selection", "unklap", "--delta",
            "1e-6", "--epsilon", "1")
    said = notes(cli(*args).stderr)
    assert ("dpcli: note: counts are per user_id-group pair, at most 1 row per user_id: raise --max-contributions "
            "to count more rows") in said
    assert any("--max-partitions" in n for n in said)
    assert ("dpcli: note: --max-contributions and --max-partitions left at 1: dpcli chooses left-out caps from the "
            "data, but not with --selection unklap") in said
    assert notes(cli("-q", *args).stderr) == []
    explicit = cli(*args, "--max-contributions", "1", "--max-partitions", "1")
    assert not any("--max-" in n for n in notes(explicit.stderr))
    units_only = cli(*args, "--agg", "count-units", "--max-partitions", "2")  # distinct units: no row cap to raise
    assert not any("--max-contributions" in n for n in notes(units_only.stderr))


def test_mostly_noise_is_said_and_follows_the_released_values():
    init_ledger("pure", "--epsilon", "10")
    r = cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "0.001",
            "--max-contributions", "1", "--max-partitions", "1")
    assert r.exit_code == 0
    assert any("count is mostly noise" in n for n in notes(r.stderr)), r.stderr
    big = cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "5",
              "--max-contributions", "1", "--max-partitions", "1")
    assert not any("mostly noise" in n for n in notes(big.stderr)), big.stderr


def test_advice_mostly_noise_uses_the_median_released_value():
    from dpcli.advice import mostly_noise

    assert mostly_noise("count", [1, -3, 2], 10) is not None
    assert mostly_noise("count", [100, 300, 200], 10) is None
    assert mostly_noise("count", [], 10) is None


def test_bottom_and_empty_releases_are_noted_in_a_pipe():
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    r = cli("topk", PV_SMALL, "--by", "page", "-k", "60", "--privacy-unit", "user_id", "--epsilon-per", "0.05",
            "--delta", "1e-9", "--max-groups", "100")
    assert r.exit_code == 0, r.stderr
    assert any("(⊥)" in n for n in notes(r.stderr)), r.stderr
    r = cli("histogram", PV_SMALL, "--by", "ts", "--privacy-unit", "user_id", "--epsilon", "0.1", "--delta", "1e-9",
            "--max-contributions", "1", "--max-partitions", "1")
    assert r.exit_code == 0 and r.stdout.strip() == "ts,count", r.stderr
    assert any("0 groups released" in n for n in notes(r.stderr)), r.stderr


def test_a_schedule_run_with_a_tiny_share_of_its_epsilon_says_so(tmp_path):
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    snap = tmp_path / "snap.parquet"
    pl.read_parquet(PV).head(20000).write_parquet(snap)  # about 9,000 units: epoch 0 gets ε ≈ 0.005
    r = cli("histogram", snap, "--by", "page", "--privacy-unit", "user_id", "--agg", "count-units", "--keys", PAGES,
            "--schedule", "daily", "--total-epsilon", "1", "--max-partitions", "1")
    assert r.exit_code == 0, r.stderr
    assert any("this run of the schedule used ε =" in n for n in notes(r.stderr)), r.stderr


def test_a_count_beside_a_value_says_it_counts_rows_with_a_value(tmp_path):
    """With --value the bounding drops rows whose value is null (found by the new-user trial on ACS: a count
    beside a mean was 16% below the persons, silently); the note is public (the query alone)."""
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    data = tmp_path / "d.parquet"
    pl.DataFrame({"u": list(range(200)), "g": ["a"] * 200, "x": [None if i % 4 == 0 else float(i) for i in range(200)]},
                 schema={"u": pl.Int64, "g": pl.String, "x": pl.Float64}).write_parquet(data)
    keys = tmp_path / "k.csv"
    keys.write_text("g\na\n")
    base = ("histogram", data, "--by", "g", "--privacy-unit", "u", "--keys", keys, "--epsilon", "1",
            "--max-partitions", "1", "--max-contributions", "1")
    said = notes(cli(*base, "--agg", "count,mean", "--value", "x", "--bounds", "0:200").stderr)
    assert any(n.startswith("dpcli: note: count counts the rows with a x") for n in said), said
    assert not any("counts the rows with a" in n for n in notes(cli(*base, "--agg", "count").stderr))
