"""Rule 4, control flow depends only on public inputs and released values: bounds chosen from the data (``auto``).

A release is computed before it is charged (bad data fails before any debit), so a run that fails after the
bounds were chosen is free, and its exit code tells the choice: an analyst who varies ``--auto-share`` by a hair
gets a fresh seed each time and so as many uncharged draws of the choice as they like. Two ways it failed:

* ``--keys`` with ``--agg count-units`` and ``--max-partitions auto``: the plan (made before any data was read,
  at the placeholder K = 1) recorded the discrete Laplace's own RDP curve, which holds for K = 1 only; a K > 1
  chosen from the data then failed the release's check of its cost (exit 1, an AssertionError, no debit).
  Now the plan records the generic curve whenever K is chosen at run time, on every ledger.
* a tiny ε with chosen bounds whose noise is too large to sample (a large K·C or wide limits): exit 2, "noise too
  large to sample", no debit. Now the chosen caps, then the chosen limits, fall back to the placeholders the plan
  was checked with, and the release says ``reduced``.
"""

from __future__ import annotations

import json
from fractions import Fraction
from unittest import mock

import polars as pl
import pytest
from dptest import cli, init_ledger
from dptest import history as entries

from dpcli.tasks import auto_bounds
from dpcli.tasks.auto_bounds import choose


def _spread(tmp_path, groups: int) -> tuple[str, str]:
    """300 units, each in ``groups`` of 6 groups (one row each), and the public list of the 6 groups."""
    data, keys = tmp_path / f"spread{groups}.csv", tmp_path / "keys.csv"
    pl.DataFrame({"u": [u for u in range(300) for _ in range(groups)],
                  "g": [f"p{g}" for _ in range(300) for g in range(groups)]}).write_csv(data)
    keys.write_text("g\n" + "".join(f"p{g}\n" for g in range(6)))
    return str(data), str(keys)


@pytest.mark.parametrize("mode", ["pure", "rdp"])
def test_a_partition_bound_chosen_from_the_data_never_fails_the_cost_check(tmp_path, mode):
    # ε = 40 for the release, 4 for the one choice (AboveThreshold's noise ≤ 10 ranks in units of 300): K = 1
    # on one dataset and K = 6 on the other, but for a draw beyond ~25 scales.
    init_ledger(mode, "--epsilon", "1000", *(["--delta", "1e-6"] if mode == "rdp" else []))
    events = []
    for groups, k in ((1, 1), (6, 6)):
        data, keys = _spread(tmp_path, groups)
        r = cli("histogram", data, "--by", "g", "--privacy-unit", "u", "--agg", "count-units", "--keys", keys,
                "--max-partitions", "auto", "--epsilon", "40", "--json")
        assert r.exit_code == 0, r.stderr
        summary = json.loads(r.stdout)["summary"]
        assert summary["charged"] is True and summary["auto"]["max_partitions"] == k
        events.append(entries()[-1]["events"])
    assert events[0] == events[1]  # the same charge whatever K was chosen: the generic curve
    assert {e.get("rdp_curve", "pure") for e in events[0]} == {"pure"}


def _huge(frame, shape, request, given, epsilon, stream, salt, name="the input", model=None):
    """A choice at the top of every grid (what a few heavy units and a tiny ε can draw)."""
    v = auto_bounds.VALUE_CANDIDATES
    return auto_bounds.ChosenBounds(auto_bounds.COUNT_CANDIDATES[-1], auto_bounds.COUNT_CANDIDATES[-1], (v[0], v[-1]),
                                    ("max_partitions", "max_contributions", "bounds"))


def test_bounds_whose_noise_cannot_be_sampled_fall_back_instead_of_failing(tmp_path):
    data, _ = _spread(tmp_path, 2)
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    args = ["histogram", data, "--by", "g", "--privacy-unit", "u", "--agg", "count,sum", "--value", "u",
            "--max-partitions", "auto", "--max-contributions", "auto", "--bounds", "auto", "--epsilon", "0.001",
            "--delta", "1e-6", "--json"]
    with mock.patch.object(auto_bounds, "choose_bounds", _huge):
        r = cli(*args)
    assert r.exit_code == 0, r.stderr  # before: exit 2 "noise too large to sample", nothing charged
    summary = json.loads(r.stdout)["summary"]
    assert summary["charged"] is True and summary["auto"]["reduced"] is True
    assert (summary["max_partitions"], summary["max_contributions"]) == (1, 1)
    assert sum(float(e["epsilon"]) for e in entries()[-1]["events"]) == pytest.approx(0.001)
    # without the mock, the same command is charged the same (only released values differ)
    r = cli(*args[:-4], "0.002", *args[-3:])
    assert r.exit_code == 0, r.stderr
    assert [e["mechanism"] for e in entries()[-1]["events"]] == [e["mechanism"] for e in entries()[-2]["events"]]


def test_only_the_caps_fall_back_when_the_chosen_limits_can_be_sampled():
    from fractions import Fraction

    from dpcli.tasks.histogram import HistogramQuery, plan_histogram
    from dpcli.tasks.histogram.auto import plannable

    q = HistogramQuery(by=("g",), unit="u", aggregations=("count", "sum"), value="v", epsilon=Fraction(1, 1000),
                       delta=Fraction(1, 10**6), auto=auto_bounds.AutoBounds(True, True, True))
    plan = plan_histogram(q, "approx", {})
    top = auto_bounds.COUNT_CANDIDATES[-1]
    _, _, in_force = plannable(q, plan, auto_bounds.ChosenBounds(top, top, (-1.0, 1.0)))
    assert (in_force.max_partitions, in_force.max_contributions, in_force.bounds, in_force.reduced) == (
        1, 1, (-1.0, 1.0), True)
    _, _, kept = plannable(q, plan, auto_bounds.ChosenBounds(4, 2, (-1.0, 1.0)))
    assert (kept.max_partitions, kept.max_contributions, kept.reduced) == (4, 2, False)


def test_a_topk_tau_whose_noise_cannot_be_sampled_falls_back_instead_of_failing(tmp_path):
    """topk's τ chosen at the top of its grid with a tiny ε: the count noise cannot be sampled, and a refusal
    after the choice would be free and data-dependent; τ falls back to 1 (what the plan was checked with)."""
    data, keys = _spread(tmp_path, 2)
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    args = ["topk", data, "--by", "g", "--privacy-unit", "u", "-k", "2", "--keys", keys, "--count", "rows",
            "--max-contributions", "auto", "--epsilon", "1e-9", "--json"]
    with mock.patch.object(auto_bounds, "choose_bounds", _huge):
        r = cli(*args)
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    assert summary["charged"] is True
    assert (summary["auto"]["reduced"], summary["auto"]["max_contributions"]) == (True, 1)


def test_a_sql_bound_whose_noise_cannot_be_sampled_falls_back_instead_of_failing(tmp_path):
    """sql's K and C chosen at the top of their grids with a tiny ε: both fall back to 1 (reduced)."""
    data, _ = _spread(tmp_path, 2)
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    args = ["sql", "SELECT g, ANON_COUNT(*) AS c FROM T GROUP BY g", "--table", f"T={data}", "--privacy-unit",
            "T.u", "--delta", "1e-6", "--max-partitions", "auto", "--max-contributions", "auto", "--epsilon",
            "1e-9", "--json"]
    with mock.patch.object(auto_bounds, "choose_bounds", _huge):
        r = cli(*args)
    assert r.exit_code == 0, r.stderr
    auto = json.loads(r.stdout)["summary"]["auto"]
    assert (auto["reduced"], auto["max_partitions"], auto["max_contributions"]) == (True, 1, 1)


# ---- the bias–variance rule (histogram): nothing the choice draws or computes may fail after the data is read ----
# Found: (1) a choice whose parts' ε was too small to draw its own noise (ε = 1e-12, within --epsilon's range, a
# ρ of 1e-17 whose ε per part rounded to 0, or a tiny --auto-share) failed after the data was read with an internal
# error (exit 1, no debit); it is now refused by the plan, before any data is read (exit 2). (2) The noisy sizes the
# rule reads are noised at the sensitivity of the bounds chosen before them (K for pairs, K·C for rows): a large K
# chosen at a small ε (a walk pushed to the top of its grid by its threshold's noise, or heavy data) made the count
# of pairs impossible to sample, so the run failed (free, and telling the choice). Such a count is now skipped (it
# says nothing at that noise). (3) A huge allowance (many public groups, a tiny ε, large given K·C) overflowed
# int64 in first_within (OverflowError after the data was read); it is now capped.


@pytest.mark.parametrize("budget", [["--epsilon", "1e-12"], ["--rho", "1e-17"],
                                    ["--epsilon", "1", "--auto-share", "1e-14"]])
def test_a_choice_whose_noise_cannot_be_drawn_is_refused_before_the_data_is_read(tmp_path, budget):
    data, _ = _spread(tmp_path, 2)
    init_ledger(*(["zcdp", "--rho", "1"] if "--rho" in budget else ["approx", "--epsilon", "10", "--delta", "1e-5"]))
    args = ["--by", "g", "--privacy-unit", "u", "--max-partitions", "auto", "--max-contributions", "auto", *budget,
            "--delta", "1e-6"]
    r = cli("histogram", data, *args)
    assert r.exit_code == 2 and "--auto-share" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert entries() == []
    r = cli("histogram", str(tmp_path / "absent.csv"), *args, "--dry-run")  # the plan refuses it, without data
    assert r.exit_code == 2 and "--auto-share" in r.stderr, r.stderr


def _to_the_top(above, allowed, sensitivity, epsilon, stream, *how):
    """A walk that ends at the last candidate (what the threshold's noise can draw, with probability ~e^−3)."""
    return len(above) - 1


def test_a_large_bound_chosen_at_a_small_epsilon_never_fails_the_sizes_read_after_it(tmp_path):
    # Every walk pushed to its last candidate: K stops at the 2 groups listed (K never exceeds them), C at 65,536.
    # At ε = 5e-9 the release's noise at K·C = 131,072 would need a scale of about 2.9e13, beyond the sampler's
    # 2^44: the chosen caps fall back (reduced) instead of failing after the choice (before: exit 1, ValueError,
    # nothing charged). The one-row and one-group checks are held at "no" so that K and C are walked.
    data, keys = _spread(tmp_path, 2)
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    with mock.patch.object(choose, "first_within", _to_the_top), \
            mock.patch.object(choose, "one_row_each", lambda *args, **kwargs: False), \
            mock.patch.object(choose, "one_group_each", lambda *args, **kwargs: False):
        r = cli("histogram", data, "--by", "g", "--privacy-unit", "u", "--keys", keys, "--max-partitions", "auto",
                "--max-contributions", "auto", "--epsilon", "5e-9", "--json")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    assert summary["charged"] is True and summary["auto"]["reduced"] is True


def test_a_huge_allowance_stays_within_int64():
    import numpy as np
    from dptest import stream

    big = auto_bounds.ErrorModel(groups=10**7, noise=1e13).allowed(before=10**6)
    assert big > 2**63
    assert auto_bounds.first_within(np.array([10**9, 5, 0]), big, 1, Fraction(1), stream(0)) == 0


@pytest.mark.parametrize("argv", [
    ["topk", "{data}", "--by", "g", "--privacy-unit", "u", "-k", "2", "--keys", "{keys}", "--count", "rows",
     "--max-contributions", "auto", "--auto-share", "1e-13", "--epsilon", "1"],
    ["topk", "{data}", "--by", "g", "--privacy-unit", "u", "-k", "2", "--keys", "{keys}", "--count", "rows",
     "--report-bias", "--bias-share", "1e-20", "--epsilon", "1"],
    ["sql", "SELECT g, ANON_COUNT(*) AS c FROM T GROUP BY g", "--table", "T={data}", "--privacy-unit", "T.u",
     "--delta", "1e-6", "--max-partitions", "auto", "--auto-share", "1e-13", "--epsilon", "1"],
    ["sql", "SELECT g, ANON_COUNT(*) AS c FROM T GROUP BY g", "--table", "T={data}", "--privacy-unit", "T.u",
     "--delta", "1e-6", "--report-bias", "--bias-share", "1e-20", "--epsilon", "1"],
    ["histogram", "{data}", "--by", "g", "--privacy-unit", "u", "--keys", "{keys}", "--report-bias",
     "--bias-share", "1e-20", "--epsilon", "1"],
], ids=["topk-auto", "topk-bias", "sql-auto", "sql-bias", "histogram-bias"])
def test_a_part_whose_noise_cannot_be_drawn_is_refused_before_the_data_is_read(tmp_path, argv):
    """Every command: a share so small that its noise cannot be drawn is exit 2 with one line at plan time (the
    dry run says it too), never an internal error after the data was read."""
    data, keys = _spread(tmp_path, 2)
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    args = [a.format(data=data, keys=keys) for a in argv]
    for extra in (["--dry-run"], []):
        r = cli(*args, *extra)
        assert r.exit_code == 2, r.stderr
        assert "too little budget to draw its noise" in r.stderr and r.stderr.count("\n") == 1
    assert entries() == []


def test_stream_bounds_whose_noise_cannot_be_drawn_fall_back_instead_of_failing(monkeypatch):
    """stream-replay: if DP-SQLP's noise could not be drawn at the chosen C and L (its plan refuses), the choice
    falls back to the placeholders its plan was checked with (C = 1, L = 1), reported as reduced. (DP-SQLP's plan
    holds at every candidate today: this keeps a future limit from turning into a refusal after the choice.)"""
    from dpcli.errors import UsageError
    from dpcli.tasks.stream import auto as stream_auto
    from dpcli.tasks.stream.query import StreamQuery

    def refuses_large(q):
        if q.max_records > 1:
            raise UsageError("stream-replay noise too large to sample")

    monkeypatch.setattr(stream_auto, "plan_stream", refuses_large)
    q = StreamQuery(time="ts", keys=("page",), unit="user", window=86400, triggers=4, max_records=1,
                    epsilon=Fraction(1, 10**4), delta=Fraction(1, 10**6), value="x", clamp=1.0,
                    auto=auto_bounds.AutoBounds(contributions=True, values=True))
    chosen = stream_auto._plannable(q, stream_auto.StreamChoice(65536, 1e12))
    assert (chosen.max_records, chosen.clamp, chosen.reduced) == (1, 1.0, True)
    assert stream_auto.StreamChoice.from_json(chosen.to_json()) == chosen  # kept as such in a --state file
    kept = stream_auto._plannable(q, stream_auto.StreamChoice(1, 4.0))
    assert not kept.reduced
