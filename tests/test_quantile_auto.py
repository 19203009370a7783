"""``auto`` bounds for a release of quantiles only (issue 38: it exited with an internal error, the bias–variance
model looking for a noisy count): the rule aims at the quantile's rank error (histogram.quantile_model_noise)."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from dptest import cli, init_ledger, use_fixed_key

from dpcli.tasks import histogram as hist


@pytest.fixture(autouse=True)
def fixed_key(state_dir):
    use_fixed_key(state_dir)


@pytest.fixture
def incomes(tmp_path):
    """2,000 units in 4 groups, 1 to 6 rows each, values lognormal around 30 (a median near 30)."""
    rng = np.random.default_rng(11)  # test data only; never noise
    rows = rng.integers(1, 7, 2000)
    unit = np.repeat(np.arange(2000), rows)
    frame = pl.DataFrame({"u": unit, "g": rng.integers(0, 4, 2000)[unit],
                          "v": np.exp(rng.normal(np.log(30), 0.6, unit.size))})
    path = tmp_path / "incomes.parquet"
    frame.write_parquet(path)
    pl.DataFrame({"g": [0, 1, 2, 3]}).write_csv(tmp_path / "groups.csv")
    return str(path), frame, str(tmp_path / "groups.csv")


# With --keys the release has no noisy count at all (a discovered group's unit count gave the model one before).
@pytest.mark.parametrize("extra", [("--bounds", "auto", "--max-contributions", "6"),
                                   ("--bounds", "0:1000", "--max-contributions", "auto"),
                                   ("--bounds", "auto", "--max-contributions", "auto", "--max-partitions", "auto")])
def test_a_quantile_only_query_chooses_its_bounds(incomes, extra):
    path, frame, groups = incomes
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    r = cli("histogram", path, "--by", "g", "--privacy-unit", "u", "--agg", "median,p90", "--value", "v",
            "--epsilon", "2", "--keys", groups, *extra, "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    chosen = out["summary"]["auto"]
    assert ("bounds" in chosen) == (extra[1] == "auto"), chosen
    if extra[1] == "auto":  # the limits hold the median and p90 (both far inside the data: 30 and ≈ 65)
        lo, hi = chosen["bounds"]
        assert lo <= 20 and hi >= 70, chosen
    truth = frame.group_by("g").agg(pl.col("v").median().alias("m"))
    got = pl.DataFrame(out["result"]).join(truth, on="g")
    # Each group holds ≈ 1,750 rows; the release's 95% rank margin at these caps is a few hundred rows at most, so
    # the median stays within its 20%–80% rank range (≈ 18 … 50 for this lognormal).
    assert got.height > 0 and got["median_v"].is_between(15, 55).all(), got


def test_the_model_noise_scales_with_the_far_side_of_the_quantile():
    q = hist.HistogramQuery(by=("g",), unit="u", aggregations=("median",), value="v", bounds=(0.0, 100.0),
                            epsilon=Fraction(1), domain="keys")
    q99 = hist.HistogramQuery(by=("g",), unit="u", aggregations=("p99",), value="v", bounds=(0.0, 100.0),
                              epsilon=Fraction(1), domain="keys")
    m = hist.quantile_model_noise(hist.plan_histogram(q, "approx", {}), q.grid)
    m99 = hist.quantile_model_noise(hist.plan_histogram(q99, "approx", {}), q99.grid)
    assert m > 0 and m99 < m / 10  # p99: 2·0.01 of its margin (its margin is itself larger than the median's)
