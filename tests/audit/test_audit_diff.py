"""Audit of ``dpcli diff``'s margins end to end: for two independent releases of the same data (each under a
fresh key, so fresh noise), the difference of the bounded truths is 0 for every group, and each group's released
difference must lie within its ``*_diff_moe95`` at least 95% of the time.

8 pairs × 400 groups × 2 columns (count, sum) = 6,400 trials per column class; the one-sided exact binomial test
of H0 "coverage ≥ 95%" at the 1% level (:func:`auditstats.coverage_rejected`) must not reject. The same trials
must reject the single release's margin used as the difference's (about 83% coverage for two equal Laplace
noises), which shows they have the power to see a margin that is too small.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from auditstats import coverage_rejected
from dptest import cli

pytestmark = pytest.mark.audit

GROUPS = 400
PAIRS = 8


def _release(tmp_path, name: str, data, keys) -> str:
    state = tmp_path / f"state-{name}"
    assert cli("--state-dir", state, "budget", "init", "default", "--mode", "pure", "--epsilon", "5").exit_code == 0
    r = cli("--state-dir", state, "histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--agg",
            "count,sum", "--value", "v", "--bounds", "0:10", "--max-contributions", "1", "--max-partitions", "1",
            "--epsilon", "1", "--json", "--with-error")
    assert r.exit_code == 0, r.stderr
    out = tmp_path / f"{name}.json"
    out.write_text(r.stdout)
    return str(out)


def test_diff_margins_cover_the_difference_of_the_bounded_truths(tmp_path):
    data = tmp_path / "d.csv"
    units = GROUPS * 20
    pl.DataFrame({"user": [f"u{i}" for i in range(units)], "g": [f"g{i % GROUPS}" for i in range(units)],
                  "v": [float(i % 11) for i in range(units)]}).write_csv(data)
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n" + "".join(f"g{i}\n" for i in range(GROUPS)))
    covered = {"count": 0, "sum_v": 0}
    naive = {"count": 0, "sum_v": 0}
    trials = 0
    for p in range(PAIRS):
        old, new = _release(tmp_path, f"a{p}", data, keys), _release(tmp_path, f"b{p}", data, keys)
        r = cli("diff", old, new, "--json")
        assert r.exit_code == 0, r.stderr
        table = pl.DataFrame(json.loads(r.stdout)["result"])
        single = pl.DataFrame(json.loads(open(old).read())["result"])
        trials += table.height
        for c in covered:
            covered[c] += int((table[f"{c}_diff"].abs() <= table[f"{c}_diff_moe95"]).sum())
            naive[c] += int((table[f"{c}_diff"].abs() <= single[f"{c}_moe95"][0]).sum())
    for c in covered:
        assert not coverage_rejected(covered[c], trials), (c, covered[c], trials)
        assert coverage_rejected(naive[c], trials), (c, naive[c], trials)  # the test's power
