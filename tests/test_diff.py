"""``dpcli diff`` (issue 42, item 1, for histogram counts and sums): the difference's margin is the difference of
two noises' (exact where the support is small, a bound that covers more beyond it), changes are flagged under
Benjamini–Hochberg, replays differ by exactly 0, and nothing but released values and summaries is read."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dptest import cli, history, init_ledger

from dpcli.core import differences as d
from dpcli.core.mechanisms import Noise
from dpcli.core.prf import KeyedStream


@pytest.mark.parametrize("scale", [1, 3, 21, 400])
def test_the_margin_of_two_laplace_noises_is_the_exact_convolutions(scale):
    """Against a brute-force convolution of the two pmfs: the smallest m with P[|A − B| ≤ m] ≥ 0.95."""
    a, b = Noise("laplace", Fraction(scale)), Noise("laplace", Fraction(scale * 3, 2))
    k = np.arange(-60 * scale * 2, 60 * scale * 2 + 1)
    pa = np.exp(-np.abs(k) / scale) * math.tanh(1 / (2 * scale))
    pb = np.exp(-np.abs(k) / (scale * 1.5)) * math.tanh(1 / (3 * scale))
    pz = np.convolve(pa, pb)  # support from −2·W to 2·W
    w = len(k) - 1
    cover = np.array([pz[w - m:w + m + 1].sum() for m in range(0, 20 * scale)])
    assert d.difference_margin(a, b) == int(np.argmax(cover >= 0.95))


def test_beyond_the_exact_support_the_bounds_cover_more():
    """Large scales: the Laplace coupling bound (+2) and the sub-Gaussian bound are at or above the normal
    approximation's margins, and close to them for Laplace (4.11·b for two equal scales)."""
    b = Noise("laplace", Fraction(10**6))
    assert 4.11e6 <= d.difference_margin(b, b) <= 4.12e6
    g = Noise("gaussian", Fraction(10**12))
    assert d.difference_margin(g, g) >= 1.96 * math.sqrt(2e12)


def test_sampled_differences_are_covered():
    """20,000 pairs of discrete Laplace draws (scales 5 and 8): the exact margin covers between 95% and 95% plus
    the mass at its edge; ±4 binomial standard deviations (0.0062) around it."""
    a, b = Noise("laplace", Fraction(5)), Noise("laplace", Fraction(8))
    stream = KeyedStream(bytes(range(32)), "diff-audit")
    z = a.sample(stream.child("a"), 20_000) - b.sample(stream.child("b"), 20_000)
    m = d.difference_margin(a, b)
    covered = float(np.mean(np.abs(z) <= m))
    edge = d.difference_tail(a, b, m) - d.difference_tail(a, b, m + 1)
    assert 0.95 - 0.0062 <= covered <= 0.95 + 2 * edge + 0.0062


def test_benjamini_hochberg():
    assert d.benjamini_hochberg([0.01, 0.04, 0.03, 0.5], 0.05) == [True, False, False, False]
    assert d.benjamini_hochberg([0.01, 0.02, 0.03, 0.04], 0.05) == [True, True, True, True]
    assert d.benjamini_hochberg([], 0.05) == []


def _release(tmp_path: Path, name: str, rows: pl.DataFrame, *extra: str) -> Path:
    data = tmp_path / f"{name}.csv"
    rows.write_csv(data)
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n" + "".join(f"g{i}\n" for i in range(40)))
    r = cli("histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--agg", "count,sum,mean",
            "--value", "v", "--bounds", "0:10", "--max-contributions", "1", "--max-partitions", "1", "--json", *extra)
    assert r.exit_code == 0, r.stderr
    out = tmp_path / f"{name}.json"
    out.write_text(r.stdout)
    return out


def _rows(units: int, boost: int = 0) -> pl.DataFrame:
    g = [f"g{i % 40}" for i in range(units)] + ["g0"] * boost
    return pl.DataFrame({"user": [f"u{i}" for i in range(units + boost)], "g": g, "v": [5.0] * (units + boost)})


def test_a_real_change_is_flagged_and_the_rest_is_not(tmp_path, state_dir):
    """40 groups; g0 grows by 3,000 units (far beyond the noise at ε 1), the others stay: only g0 is changed."""
    init_ledger("pure", "--epsilon", "10")
    old = _release(tmp_path, "old", _rows(8000), "--epsilon", "1")
    new = _release(tmp_path, "new", _rows(8000, boost=3000), "--epsilon", "1")
    before = history()
    r = cli("diff", old, new, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    table = pl.DataFrame(doc["result"])
    assert table.filter(pl.col("changed") == "changed")["g"].to_list() == ["g0"]
    assert doc["summary"]["not_compared"] == [] and doc["summary"]["columns"] == ["count", "sum_v", "mean_v"]
    assert set(table.columns) >= {"count_old", "count_new", "count_diff", "count_diff_moe95", "changed"}
    assert history() == before  # the diff is charged nothing and writes nothing to the ledger


def test_a_replay_differs_by_exactly_zero(tmp_path, state_dir):
    init_ledger("pure", "--epsilon", "10")
    old = _release(tmp_path, "old", _rows(2000), "--epsilon", "1")
    again = _release(tmp_path, "old", _rows(2000), "--epsilon", "1")  # the same release: a free replay
    doc = json.loads(cli("diff", old, again, "--json").stdout)
    assert doc["summary"]["shared_noise"] and all(v == 0 for v in doc["summary"]["diff_moe95"].values())
    assert {r["changed"] for r in doc["result"]} == {"unchanged"}  # the same noise and values: exactly unchanged


def test_at_least_calls_small_differences_unchanged(tmp_path, state_dir):
    init_ledger("pure", "--epsilon", "10")
    old = _release(tmp_path, "old", _rows(8000), "--epsilon", "2")
    new = _release(tmp_path, "new", _rows(8000), "--epsilon", "2")
    doc = json.loads(cli("diff", old, new, "--at-least", "100000", "--json").stdout)
    assert {r["changed"] for r in doc["result"]} == {"unchanged"}


@pytest.mark.parametrize("case", ["csv without summary", "another query", "not a release"])
def test_what_cannot_be_matched_is_refused_65(case, tmp_path, state_dir):
    init_ledger("pure", "--epsilon", "10")
    old = _release(tmp_path, "old", _rows(500), "--epsilon", "1")
    if case == "csv without summary":
        other = tmp_path / "x.csv"
        pl.DataFrame(json.loads(old.read_text())["result"]).write_csv(other)
    elif case == "another query":
        other = tmp_path / "q.json"
        doc = json.loads(old.read_text())
        doc["summary"]["command"] = "topk"
        other.write_text(json.dumps(doc))
    else:
        other = tmp_path / "n.json"
        other.write_text('{"result": [{"a": 1}]}')
    r = cli("diff", old, other)
    assert r.exit_code == 65 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr


def test_a_summary_of_another_run_is_refused(tmp_path, state_dir):
    """A CSV written with --with-error states its margins: the summary of another run (another ε) gives other
    margins, and is refused (65) instead of calibrating the difference wrongly; the file's own summary works."""
    init_ledger("pure", "--epsilon", "10")
    one = _release(tmp_path, "one", _rows(500), "--epsilon", "1", "--with-error")
    other = _release(tmp_path, "other", _rows(500), "--epsilon", "0.5", "--with-error")
    csv = tmp_path / "one.csv"
    pl.DataFrame(json.loads(one.read_text())["result"]).write_csv(csv)
    wrong = cli("diff", csv, other, "--old-summary", other)
    assert wrong.exit_code == 65 and "not its summary" in wrong.stderr, wrong.stderr
    right = cli("diff", csv, other, "--old-summary", one, "--json")
    assert right.exit_code == 0, right.stderr
    row = json.loads(right.stdout)["result"][0]
    assert isinstance(row["count_diff_moe95"], int) and 0 <= row["p"] <= 1


def test_two_gaussian_releases_margin_is_that_of_their_difference(tmp_path, state_dir):
    """zCDP releases (discrete Gaussian noise): the difference's margin is 1.96·√(σ₁² + σ₂²) (exact convolution at
    these σ, within 1 of the normal figure), and the file's own margins match its summary (no refusal)."""
    init_ledger("zcdp", "--rho", "1", "--delta", "1e-6")
    old = _release(tmp_path, "old", _rows(4000), "--rho", "0.01", "--with-error")
    new = _release(tmp_path, "new", _rows(4000), "--rho", "0.02", "--with-error")
    r = cli("diff", old, new, "--json")
    assert r.exit_code == 0, r.stderr
    sig = [float(json.loads(p.read_text())["summary"]["measurements"]["rows"]["sigma"]) for p in (old, new)]
    margin = json.loads(r.stdout)["result"][0]["count_diff_moe95"]
    assert abs(margin - 1.959964 * math.sqrt(sig[0] ** 2 + sig[1] ** 2)) <= 1.5, (margin, sig)
