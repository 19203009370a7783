"""The bias report (dpcli.tasks.bias_report): noisy average shares of each unit's rows that the bounds cut or
clamped, on by default in ``histogram`` wherever the release can pay for it (issue 38)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from dptest import PAGES, PV_SMALL, cli, init_ledger, use_fixed_key
from dptest import history as entries

from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.tasks import auto_bounds as ab
from dpcli.tasks import bias_report as br

SALT = 20240533
SHAPE = ab.DataShape("user", ("g",), "x")
BOUNDS = ab.ChosenBounds(2, 3, (0.0, 10.0))
EXACT = mech.Noise("laplace", Fraction(0))  # a scale of 0 draws zeros: the report shows its true sums


def stream(label: str) -> KeyedStream:
    return KeyedStream(b"\x11" * 32, label)


def true_sums(frame: pl.DataFrame, bounds: ab.ChosenBounds = BOUNDS, shape: ab.DataShape = SHAPE) -> dict[str, int]:
    return br._true_sums(frame.lazy(), shape, bounds, br.bias_parts(shape, bounds), SALT, "x")


def base_frame() -> pl.DataFrame:
    return pl.DataFrame({"user": [1, 1, 1, 2, 2, 2, 2, 3, 4, 4, 4],
                         "g": ["a", "b", "c", "a", "a", "a", "a", "a", "a", "b", "b"],
                         "x": [1.0, 2.0, 3.0, 20.0, 1.0, 1.0, 1.0, -5.0, 1.0, 1.0, 1.0]})


def test_each_units_shares_of_its_rows_in_thousandths():
    # K = 2, C = 3, bounds 0:10. Unit 1: 3 groups of 1 row, one dropped by K: 1/3 of its rows (333‰). Unit 2: 4
    # rows in one group, C keeps 3: 1/4 cut (250‰); one of its 4 values (20) is above 10, and the sample keeps 3/4
    # of each kind, so 0.75 of its 4 rows are kept and clamped above (187‰, rounded down). Unit 3: its one value
    # −5 is clamped below (1000‰). Unit 4: nothing cut. The rest of each unit's share: 667 + 563 + 0 + 1000.
    assert true_sums(base_frame()) == {"max_partitions": 333, "max_contributions": 250, "below": 1000,
                                       "above": 187, "rest": 2230}


def giant(rows: int = 10_000) -> pl.DataFrame:
    """One unit with ``rows`` rows over every bound: many groups, many rows per group, extreme values."""
    i = np.arange(rows)
    return pl.DataFrame({"user": np.full(rows, 99), "g": (i % 50).astype(str), "x": np.where(i % 2, 1e12, -1e12)})


def neighbours() -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    base = base_frame()
    yield base, pl.concat([base, giant()])
    for u in (1, 2, 3, 4):  # each unit removed in turn
        yield base, base.filter(pl.col("user") != u)
    yield base.clear(), giant()


def test_one_unit_moves_the_five_sums_by_scale_in_all():
    """Neighbouring inputs (one unit added or removed, the added one with 10,000 rows over every bound): the four
    share sums and the rest move by exactly SCALE together (ℓ1), every one the same way: ℓ1 sensitivity SCALE (and
    ℓ2 at most SCALE), the noise's calibration (bias_noise)."""
    for a, b in neighbours():
        sa, sb = true_sums(a), true_sums(b)
        assert sa.keys() == sb.keys()
        assert sum(abs(sa[k] - sb[k]) for k in sa) == br.SCALE, (sa, sb)
        assert all(sa[k] <= sb[k] for k in sa) or all(sa[k] >= sb[k] for k in sa)
    # the giant: 9,600 of 10,000 rows in groups beyond K (960‰), 394 beyond C (39‰), its 6 kept rows ±1e12
    # clamped, 3 each side in expectation (0.3‰ each, rounded down to 0), the rest 1‰: SCALE in all
    assert true_sums(giant()) == {"max_partitions": 960, "max_contributions": 39, "below": 0, "above": 0,
                                  "rest": 1}


def test_a_units_five_coordinates_add_up_to_scale():
    """Whatever a unit holds (random shapes: groups, rows, values on both sides), its four shares, each rounded
    down and each capped by what the ones before it left, and the rest are ≥ 0 and add up to exactly SCALE: the
    sensitivity's premise."""
    rng = np.random.default_rng(38)
    for _ in range(60):
        rows = int(rng.integers(1, 400))
        frame = pl.DataFrame({"user": np.zeros(rows, dtype=np.int64), "g": rng.integers(0, 9, rows).astype(str),
                              "x": rng.normal(5, 20, rows)})
        bounds = ab.ChosenBounds(int(rng.integers(1, 4)), int(rng.integers(1, 20)), (0.0, 10.0))
        sums = true_sums(frame, bounds)
        assert min(sums.values()) >= 0 and sum(sums.values()) == br.SCALE


def test_the_parts_follow_the_bounds_in_force_and_what_is_counted():
    assert br.bias_parts(SHAPE, BOUNDS) == ["max_partitions", "max_contributions", "below", "above"]
    assert br.bias_parts(ab.DataShape("user", (), "x"), BOUNDS) == ["max_contributions", "below", "above"]
    assert br.bias_parts(SHAPE, ab.ChosenBounds(2, 3, None)) == ["max_partitions", "max_contributions"]
    assert br.bias_parts(ab.DataShape("user", ("g",)), BOUNDS, rows=False) == ["max_partitions"]  # count-units
    report = br.report_bias(base_frame().lazy(), SHAPE, ab.ChosenBounds(None, 3, None), EXACT, stream("p"), SALT)
    assert list(report.shares) == ["share_cut_by_max_contributions"]
    # unit 2 lost 1 of its 4 rows: 250‰ over 4 units = 0.0625
    assert report.shares == {"share_cut_by_max_contributions": 0.0625} and report.units == 4


def test_the_noise_is_calibrated_to_the_vectors_sensitivity():
    assert br.bias_noise(Fraction(1), None, Fraction(1, 40)) == mech.laplace(br.SCALE, Fraction(1, 40))
    assert br.bias_noise(None, Fraction(1, 2), Fraction(1, 10)) == mech.gaussian(br.SCALE ** 2, Fraction(1, 20))
    noisy = br.report_bias(base_frame().lazy(), SHAPE, BOUNDS, br.bias_noise(Fraction(1), None, Fraction(1, 40)),
                           stream("n"), SALT)
    assert noisy.noise == {"noise": "discrete_laplace", "scale": "40000"}  # 1000 / (1 · 1/40)
    assert set(noisy.to_json()) == {*noisy.shares, "units", "moe95", "noise"}
    assert all(0 <= v <= 1 for v in noisy.shares.values())  # post-processing clips the noisy shares
    assert not br.can_report(Fraction(1, 10**30), None, br.BIAS_SHARE)
    assert br.can_report(Fraction(1), None, br.BIAS_SHARE)


def test_the_shares_are_within_their_margin_on_a_large_input():
    # 20,000 units, each with 10 rows in one group: C = 5 cuts half of every unit's rows. At ε = 1/40 the noise
    # has scale 40,000‰ per coordinate: the share's 95% margin is ~3·40,000/(1000·20,000) = 0.6%; the check allows
    # 10 scales (2%: fails with probability ~e^-10 per coordinate), the unit count (five noises, standard deviation
    # √10·40) eight standard deviations.
    n = 20_000
    frame = pl.DataFrame({"user": np.repeat(np.arange(n), 10), "g": ["a"] * (10 * n), "x": np.ones(10 * n)})
    report = br.report_bias(frame.lazy(), SHAPE, ab.ChosenBounds(1, 5, (0.0, 10.0)),
                            br.bias_noise(Fraction(1), None, Fraction(1, 40)), stream("large"), SALT)
    assert abs(report.shares["share_cut_by_max_contributions"] - 0.5) <= 0.02
    assert report.shares["share_cut_by_max_partitions"] <= 0.02 and abs(report.units - n) <= 1000
    assert 0.004 <= report.moe95 <= 0.008


# ---- histogram: on by default -----------------------------------------------------------------------

@pytest.fixture(autouse=False)
def fixed(state_dir):
    use_fixed_key(state_dir)


@pytest.fixture
def heavy(tmp_path):
    """2,000 units with 40 rows each in one of 4 groups, values 0…99: caps of 5 cut 7/8 of every unit's rows."""
    rng = np.random.default_rng(3)
    n = 2000
    frame = pl.DataFrame({"u": np.repeat(np.arange(n), 40), "g": np.repeat(rng.integers(0, 4, n), 40),
                          "v": rng.integers(0, 100, 40 * n).astype(float)})
    path = tmp_path / "heavy.parquet"
    frame.write_parquet(path)
    return str(path)


def _histogram(path: str, *extra: str) -> list[str]:
    return ["histogram", path, "--by", "g", "--privacy-unit", "u", "--epsilon", "1", "--delta", "1e-6", *extra]


def test_a_default_histogram_reports_its_bias_and_says_when_it_exceeds_the_margin(heavy, fixed):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    r = cli(*_histogram(heavy, "--max-contributions", "5", "--max-partitions", "1", "--json"))
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    bias = summary["bias"]
    # 35/40 = 87.5% of each unit's rows cut; 2,000 units: the share's noise has scale 40,000/(1000·2000) = 2%, and
    # the check allows 10 scales (fails with probability ~e^-10)
    assert abs(bias["share_cut_by_max_contributions"] - 0.875) <= 0.2 and bias["epsilon"] == "0.025"
    assert [e["mechanism"] for e in summary["cost"]] == ["histogram/laplace+threshold", "histogram/bias-shares"]
    assert sum(Fraction(e["epsilon"]) for e in entries()[0]["events"]) == 1  # one charge, the query's ε
    assert "bounds cut (noisy average shares of each u's rows" in r.stderr
    assert "count: the caps cut about" in r.stderr and "beyond its margin" in r.stderr
    assert "raise --max-contributions, or leave it out" in r.stderr
    # caps that keep every row: the report says so, and no note of a cut beyond the margin
    r = cli(*_histogram(heavy, "--max-contributions", "40", "--max-partitions", "1"))
    assert r.exit_code == 0 and "bounds cut" in r.stderr and "beyond its margin" not in r.stderr, r.stderr


def test_clamped_values_are_said_for_quantiles_and_means(heavy, fixed):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    r = cli(*_histogram(heavy, "--agg", "p90,mean", "--value", "v", "--bounds", "0:50", "--max-contributions", "40",
                        "--max-partitions", "1"))
    assert r.exit_code == 0, r.stderr
    # half the values (50…99) lie above 50: p90 sits at the bound, and the means lean towards it
    assert "p90: about" in r.stderr and "clamped to 50, enough to put this quantile at the bound" in r.stderr
    assert "which pulls means towards the bounds" in r.stderr


@pytest.mark.parametrize("extra,why", [
    (["--no-report-bias"], "asked for none"),
    (["--target-moe", "count=50", "--max-contributions", "2"], "a margin target"),
    (["--rho", "0.5", "--noise", "gaussian"], "ρ on an approx ledger"),
])
def test_no_default_report_where_the_release_cannot_have_one(extra, why):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-5")
    args = ["histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--delta", "1e-6", "--json", *extra]
    if "--target-moe" not in extra and "--rho" not in extra:
        args += ["--epsilon", "1"]
    r = cli(*args)
    assert r.exit_code == 0, (why, r.stderr)
    summary = json.loads(r.stdout)["summary"]
    assert "bias" not in summary and all("bias" not in e["mechanism"] for e in summary["cost"]), why


def test_no_default_report_on_a_br_ledger_nor_with_a_schedule():
    init_ledger("br", "--epsilon-per", "0.5", "--delta", "1e-9", "--info-budget", "10", "--call-budget", "3",
                "--delta-prime", "1e-9")
    r = cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--json")
    assert r.exit_code == 0, r.stderr
    assert "bias" not in json.loads(r.stdout)["summary"]
    init_ledger("pure", "--epsilon", "10", analyst="sched")
    r = cli("--analyst", "sched", "histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES,
            "--max-contributions", "3", "--schedule", "daily", "--total-epsilon", "5", "--json")
    assert r.exit_code == 0, r.stderr
    assert "bias" not in r.stdout


def test_the_dry_run_shows_the_default_reports_part():
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    base = ["histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--epsilon", "1", "--delta", "1e-6",
            "--max-contributions", "3", "--max-partitions", "1", "--dry-run", "--json"]
    doc = json.loads(cli(*base).stdout)
    assert doc["parts"] == {"bias": "ε=0.025", "release": "ε=0.975"}
    assert "parts" not in json.loads(cli(*base, "--no-report-bias").stdout)
    assert entries() == []
