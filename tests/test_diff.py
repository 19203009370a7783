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
from scipy.signal import fftconvolve
from dptest import PERSONS_SMALL, cli, history, init_ledger

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
    # support from −2·W to 2·W; by FFT (np.convolve is quadratic: 5 s at scale 400), exact to ~1e-15 per term
    pz = fftconvolve(pa, pb)
    w = len(k) - 1
    cover = np.cumsum(pz[w:w + 20 * scale]) * 2 - pz[w]  # P[|A − B| ≤ m] for m = 0, 1, …
    m = int(np.argmax(cover >= 0.95))
    # the float error (≪ 1e-9) cannot move the answer: no coverage lies that close to 0.95
    assert cover[m] >= 0.95 + 1e-9 and (m == 0 or cover[m - 1] < 0.95 - 1e-9)
    assert d.difference_margin(a, b) == m


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


def test_json_shows_the_differences_as_the_csv_does(tmp_path, state_dir):
    """``--json`` rows are the CSV's numbers: a difference to its margin's digits (never 1.3099999999999987), a
    margin rounded up."""
    init_ledger("pure", "--epsilon", "10")
    old = _release(tmp_path, "old", _rows(8000), "--epsilon", "1")
    new = _release(tmp_path, "new", _rows(8000, boost=300), "--epsilon", "1")
    rows = json.loads(cli("diff", old, new, "--json").stdout)["result"]
    csv = tmp_path / "d.csv"
    assert cli("diff", old, new, "-o", csv).exit_code == 0
    assert pl.DataFrame(rows).select(pl.col("mean_v_diff", "mean_v_diff_moe95").cast(pl.String)).rows() == \
        pl.read_csv(csv).select(pl.col("mean_v_diff", "mean_v_diff_moe95").cast(pl.String)).rows()
    assert all(len(repr(r["mean_v_diff_moe95"])) <= 8 for r in rows if r["mean_v_diff_moe95"] is not None)


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


@pytest.mark.parametrize("case", ["csv without summary", "another query", "not a release", "sql"])
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
    elif case == "sql":  # a release whose report diff cannot map to its columns
        other = tmp_path / "s.json"
        doc = json.loads(old.read_text())
        doc["summary"]["command"] = "sql"
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


# ---- issue 42: every command, the trees' shared nodes, means, the ledger's reports --------------------------------


def test_a_trees_difference_variance_is_its_exact_coefficients():
    """Against the Honaker estimates themselves: the prefix estimates are linear in the node noises, so feeding each
    node a unit noise in turn (an identity matrix) gives every coefficient; the variance of P̂(i2) − P̂(i1) is the
    sum of the squared differences of two prefixes' coefficients. One prefix alone is λ²(i) (eq. 2)."""
    from dpcli.core import tree

    n = 23
    nodes = sum(n >> ell for ell in range(tree.levels(n)))
    coef = tree.noise_only_prefixes(np.eye(nodes), 1.0, n)  # row: a node, column: a prefix
    for i1, i2 in [(1, 2), (3, 4), (5, 12), (2, 13), (7, 8), (1, 23), (16, 17), (8, 16)]:
        exact = float(np.sum((coef[:, i2 - 1] - coef[:, i1 - 1]) ** 2))
        assert d.shared_tree_variance(2.5, i1, i2) == pytest.approx(2.5 * exact, rel=1e-12)
        assert d.shared_tree_variance(2.5, i1, i2) < d.independent_trees_variance(2.5, i1, 2.5, i2)
    assert d.shared_tree_variance(2.5, 0, 9) == pytest.approx(float(tree.prefix_variances(2.5, 9)[-1]))
    assert d.shared_tree_variance(2.5, 6, 6) == 0.0


def test_a_mean_range_holds_the_bounded_mean_whenever_its_two_intervals_hold():
    """Random truths (N rows, centred sum S within the bounds), noises anywhere within the count's and the centred
    sum's margins, the release's clamp and its rounding to one decimal: the range always holds the true mean, and
    it is the whole grid when the count's interval reaches below 1."""
    grid = d.MeanGrid(0.0, 600.0, Fraction(1, 8))
    rng = np.random.default_rng(7)
    lo_u, hi_u, mid = grid.lo_units, grid.hi_units, grid.mid_units
    n_true = rng.integers(1, 400, 5000)
    s_true = np.round(rng.uniform(lo_u - mid, hi_u - mid, 5000) * n_true * rng.uniform(0, 1, 5000) ** 3)
    m_n, m_s = 30.0, 9000.0
    n = n_true + rng.integers(-30, 31, 5000)
    s = s_true + rng.integers(-9000, 9001, 5000)
    released = np.clip((mid + s / np.maximum(n, 1)) * 0.125, 0.0, 600.0)
    shown = np.round(released, 1)
    lo, hi = d.released_mean_range(grid, n, shown, 0.05, m_n, m_s)
    truth = (mid + s_true / n_true) * 0.125
    assert np.all((lo <= truth + 1e-9) & (truth <= hi + 1e-9))
    assert np.all(lo[n + m_n < 1] == lo_u * 0.125)


def test_what_a_file_shows_is_rounded_no_finer_than_diff_allows_for():
    """display_half follows dpcli.io.outputs.rounded: a CSV's floats are within it of the values computed."""
    from dpcli.io.outputs import rounded
    from dpcli.plot.diff_pairs import display_half
    from dpcli.plot.release_view import recognise

    rng = np.random.default_rng(3)
    raw = pl.DataFrame({"g": [f"g{i}" for i in range(50)], "count": rng.integers(0, 100, 50),
                        "mean_v": rng.uniform(0, 600, 50), "mean_v_moe95": rng.uniform(0.5, 40, 50),
                        "sum_v": rng.uniform(-1e4, 1e4, 50)})
    shown = rounded(raw, 0.125)
    view = recognise(shown, "x.csv", {})
    for column, step in (("mean_v", None), ("sum_v", 0.125)):
        off = (shown[column] - raw[column]).abs().max()
        assert isinstance(off, float) and off <= display_half(view, column, step) + 1e-12
    assert display_half(view, "count", None) == 0.0
    assert display_half(recognise(shown, "x.parquet", {}, shown=False), "mean_v", None) == 0.0


def _written(tmp_path: Path, name: str, data: pl.DataFrame, *extra: str) -> Path:
    """A histogram release written with -o (its digest and report in the ledger), its summary not kept."""
    src = tmp_path / f"{name}-data.csv"
    data.write_csv(src)
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n" + "".join(f"g{i}\n" for i in range(40)))
    out = tmp_path / f"{name}.csv"
    r = cli("-q", "histogram", src, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--value", "v",
            "--bounds", "0:10", "--max-contributions", "1", "--max-partitions", "1", "-o", out, *extra)
    assert r.exit_code == 0, r.stderr
    return out


def test_a_file_written_with_o_is_calibrated_from_its_ledger_entry(tmp_path, state_dir):
    """No summary given: the entry that wrote the file (found by its digest) keeps the release's report, so the
    means are compared with the count beside them; the same margins as with the summaries given; a file no entry
    wrote is refused (65); the diff reads the ledger and writes nothing to it."""
    init_ledger("pure", "--epsilon", "10")
    old = _written(tmp_path, "old", _rows(4000), "--agg", "count,mean", "--epsilon", "1", "--with-error")
    new = _written(tmp_path, "new", _rows(4000, boost=500), "--agg", "count,mean", "--epsilon", "1")
    before = history()
    r = cli("diff", old, new, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["columns"] == ["count", "mean_v"] and history() == before
    assert "union bound" in doc["summary"]["margins"]["mean_v"]
    row = next(x for x in doc["result"] if x["g"] == "g0")
    assert row["changed"] == "changed" and row["mean_v_diff_moe95"] > 0
    stray = tmp_path / "stray.csv"
    stray.write_text(old.read_text().replace("g1,", "g1 ,"))
    bad = cli("diff", old, stray)
    assert bad.exit_code == 65 and "has no summary" in bad.stderr and bad.stdout == ""


def test_a_mean_without_its_count_is_not_compared_and_says_why(tmp_path, state_dir):
    init_ledger("pure", "--epsilon", "10")
    old = _written(tmp_path, "old", _rows(2000), "--agg", "sum,mean", "--epsilon", "1")
    new = _written(tmp_path, "new", _rows(2000), "--agg", "sum,mean", "--epsilon", "1.5")
    doc = json.loads(cli("diff", old, new, "--json").stdout)
    assert doc["summary"]["columns"] == ["sum_v"] and doc["summary"]["not_compared"] == ["mean_v"]
    assert "no count" in doc["summary"]["not_compared_why"]["mean_v"]


def _tabulate(tmp_path: Path, name: str, persons: pl.DataFrame) -> Path:
    src = tmp_path / f"{name}.parquet"
    persons.write_parquet(src)
    out = tmp_path / f"{name}.csv"
    r = cli("-q", "tabulate", src, "--spec", "sample_data/safetab_spec.toml", "--with-error", "-o", out)
    assert r.exit_code == 0, r.stderr
    return out


def test_tabulate_cells_are_compared_with_their_levels_noise(tmp_path, state_dir):
    """Two tabulations of the same persons under fresh noise (other bytes): each cell's margin is the exact margin
    of its level's two noises (cells, or a TotalOnly group's total); the same file twice is exact."""
    from dpcli.plot import diff_reports as rep

    init_ledger("pure", "--epsilon", "40")
    persons = pl.read_parquet(PERSONS_SMALL)  # (the margins compared do not depend on the data's size)
    old = _tabulate(tmp_path, "old", persons)
    new = _tabulate(tmp_path, "new", persons.sample(fraction=1.0, shuffle=True, seed=1))
    r = cli("diff", old, new, "--json", "-o", tmp_path / "d.parquet")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)
    table = pl.read_parquet(tmp_path / "d.parquet")
    assert summary["kind"] == "tabulate" and summary["groups"].get("changed", 0) <= 3  # the same persons
    from dpcli.state import ledger

    entry = next(e for e in ledger.read_ledger(state_dir, "default").entries if e.get("report"))
    levels = rep.tabulate_levels("x", rep.report_of_entry(entry))
    for level, lv in list(levels.items())[:3]:
        cells = table.filter((pl.col("level") == level) & (pl.col("age") != "total")).drop_nulls("count_diff")
        assert set(cells["count_diff_moe95"].to_list()) == {d.difference_margin(lv.cells, lv.cells)}, level
    same = json.loads(cli("diff", old, old, "--json").stdout)["summary"]
    assert same["shared_noise"] and same["groups"] == {"unchanged": pl.read_csv(old).height}


def test_topk_counts_are_compared_and_ranks_are_not(tmp_path, state_dir):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    outs = []
    for name, frac in (("old", 0.9), ("new", 1.0)):
        src = tmp_path / f"{name}.parquet"
        pl.read_parquet("sample_data/page_views.parquet").head(int(200_000 * frac)).write_parquet(src)
        out = tmp_path / f"{name}.csv"
        assert cli("-q", "topk", src, "--by", "page", "-k", "5", "--privacy-unit", "user_id", "--keys",
                   "sample_data/pages_public.csv", "--epsilon", "1", "-o", out).exit_code == 0
        outs.append(out)
    doc = json.loads(cli("diff", *outs, "--json").stdout)
    assert doc["summary"]["kind"] == "topk" and doc["summary"]["columns"] == ["count"]
    assert doc["summary"]["not_compared"] == ["rank"] and all("rank" not in r for r in doc["result"])


def _stream(tmp_path: Path, src: Path, through: str, *extra: str) -> Path:
    out = tmp_path / f"s-{through}-{len(extra)}.csv"
    r = cli("-q", "stream-replay", src, "--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "7d",
            "--trigger-every", "1d", "--max-contributions", "4", "--epsilon", "6", "--delta", "1e-9",
            "--through", through, "--with-error", "-o", out, *extra)
    assert r.exit_code == 0, r.stderr
    return out


def _events(tmp_path: Path) -> Path:
    """2,000 users a day for 7 days from 2026-10-29 (a window's start: windows are aligned to the epoch), each with
    one event at noon on one of 3 pages."""
    days = ["2026-10-29", "2026-10-30", "2026-10-31", "2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
    rows = [(f"u{day}-{i}", f"/p/{i % 3}", f"{days[day]}T12:00:00Z") for day in range(7) for i in range(2000)]
    src = tmp_path / "events.csv"
    pl.DataFrame(rows, schema=["user", "page", "ts"], orient="row").write_csv(src)
    return src


def test_two_triggers_of_one_stream_share_their_trees_nodes(tmp_path, state_dir):
    """Replays of one file through two later triggers read one tree per key (the same seed): the margin of the
    difference is 1.96 σ √(the exact variance of the two prefixes' difference + the roundings'), below the sum of
    two independent trees' and below either release's own margin; the same trigger twice is exactly 0."""
    from dpcli.core import tree

    init_ledger("approx", "--epsilon", "20", "--delta", "1e-6")
    src = _events(tmp_path)
    a, b = _stream(tmp_path, src, "2026-11-02"), _stream(tmp_path, src, "2026-11-05")
    r = cli("diff", a, b, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["shared_trees"] and doc["summary"]["kind"] == "stream-replay"
    sigma2 = float(doc["summary"]["noise"]["count"]["old"]["sigma2"])
    rows = [x for x in doc["result"] if x["trigger_old"] is not None and x["trigger_new"] is not None]
    assert rows and {(x["trigger_old"], x["trigger_new"]) for x in rows} == {(4, 7)}
    s = 1  # every page is released from the window's first trigger on
    var = sigma2 * d.shared_tree_variance(1.0, 4 - s + 1, 7 - s + 1) + d.ROUNDING_VARIANCE
    assert {x["count_diff_moe95"] for x in rows} == {math.ceil(1.959964 * math.sqrt(var))}
    assert math.ceil(1.959964 * math.sqrt(var)) < 1.96 * math.sqrt(sigma2 * float(tree.prefix_variances(1.0, 7)[-1]))
    assert all(x["changed"] == "changed" for x in rows)  # 3 days of 667 users a page: far beyond the noise
    same = json.loads(cli("diff", b, b, "--json").stdout)
    assert {x["changed"] for x in same["result"]} == {"unchanged"} and same["summary"]["shared_trees"]


def test_a_schedules_epoch_released_again_is_exactly_unchanged(tmp_path, state_dir):
    """bbscheduler at γ 0.5 (as tests/test_schedule_runs.py): 21,000 units after 20,000 stay in epoch 0 (the
    epoch's release again, the same seed and bytes), so the diff is exact; 37,000 start epoch 1, with independent
    noise: 17,000 more units are a change far beyond it."""
    init_ledger("pure", "--epsilon", "2")
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\n")
    outs = []
    for day, size in ((1, 20000), (2, 21000), (3, 37000)):
        p = tmp_path / f"day{day}.csv"
        pl.DataFrame({"user": [f"u{i}" for i in range(size)], "g": ["abc"[i % 3] for i in range(size)]}).write_csv(p)
        out = tmp_path / f"r{day}.csv"
        r = cli("-q", "histogram", p, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--schedule", "daily",
                "--total-epsilon", "1", "--gamma", "0.5", "-o", out)
        assert r.exit_code == 0, r.stderr
        outs.append(out)
    cached = json.loads(cli("diff", outs[0], outs[1], "--json").stdout)
    assert cached["summary"]["shared_noise"] and {x["changed"] for x in cached["result"]} == {"unchanged"}
    grown = json.loads(cli("diff", outs[0], outs[2], "--json").stdout)
    assert not grown["summary"]["shared_noise"] and {x["changed"] for x in grown["result"]} == {"changed"}


def test_plot_draws_a_diff(tmp_path, state_dir):
    """dpcli plot recognises a diff's output: one line per group, its difference either side of 0 with its margin,
    the changed ones starred; diff --plot - draws the same."""
    init_ledger("pure", "--epsilon", "10")
    old = _written(tmp_path, "old", _rows(8000), "--agg", "count,sum", "--epsilon", "1")
    new = _written(tmp_path, "new", _rows(8000, boost=3000), "--agg", "count,sum", "--epsilon", "1")
    out = tmp_path / "d.csv"
    assert cli("-q", "diff", old, new, "-o", out).exit_code == 0
    r = cli("plot", out, "--width", "80", "--top", "5")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "count: new − old by g" and len(lines) == 7 and "│" in lines[1]
    assert lines[1].startswith("g0") and lines[1].endswith("*") and "+" in lines[1]
    drawn = cli("diff", old, new, "--plot", "-")
    assert drawn.exit_code == 0 and drawn.stdout.splitlines()[1].startswith("g0")


def test_diff_draws_a_picture(tmp_path, state_dir):
    pytest.importorskip("matplotlib")
    init_ledger("pure", "--epsilon", "10")
    old = _written(tmp_path, "old", _rows(2000), "--agg", "count,sum", "--epsilon", "1")
    new = _written(tmp_path, "new", _rows(2000, boost=900), "--agg", "count,sum", "--epsilon", "1")
    picture = tmp_path / "d.svg"
    r = cli("diff", old, new, "--plot", picture, "-o", tmp_path / "d.csv")
    assert r.exit_code == 0, r.stderr
    svg = picture.read_text()
    assert svg.startswith("<?xml") and "<path" in svg
    refused = cli("diff", old, new, "--plot", tmp_path / "d.txt")
    assert refused.exit_code == 2 and "--plot" in refused.stderr and not (tmp_path / "d.txt").exists()
