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
import math
from fractions import Fraction
from statistics import NormalDist

import polars as pl
import pytest
from auditstats import coverage_rejected
from dptest import cli

from dpcli.core import differences as d
from dpcli.core.mechanisms import Noise
from dpcli.plot import diff_reports as rep

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


# ---- issue 42: means, tabulate cells, a stream's triggers, a schedule's epochs -------------------------------------


def _band(covered: int, expected: float, variance: float) -> bool:
    """Is ``covered`` within 4 standard deviations of ``expected``, for a sum of independent Bernoulli trials of
    those total mean and variance? (A two-sided band: a false alarm at a random seed has probability < 10⁻⁴.)"""
    return abs(covered - expected) <= 4 * math.sqrt(variance)


def test_mean_margins_cover_at_least_95_percent(tmp_path):
    """Means (a union bound, conservative): 8 pairs × 400 groups of the same data under fresh keys, each group's
    true difference 0; the one-sided binomial test of "coverage ≥ 95%" at 1% must not reject."""
    data = tmp_path / "d.csv"
    units = GROUPS * 30
    pl.DataFrame({"user": [f"u{i}" for i in range(units)], "g": [f"g{i % GROUPS}" for i in range(units)],
                  "v": [float((i * 7) % 11) for i in range(units)]}).write_csv(data)
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n" + "".join(f"g{i}\n" for i in range(GROUPS)))
    covered = trials = 0
    for p in range(PAIRS):
        pair = []
        for side in ("a", "b"):
            state = tmp_path / f"state-{side}{p}"
            assert cli("--state-dir", state, "budget", "init", "default", "--mode", "pure", "--epsilon",
                       "5").exit_code == 0
            r = cli("--state-dir", state, "histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys,
                    "--agg", "count,mean", "--value", "v", "--bounds", "0:10", "--max-contributions", "1",
                    "--max-partitions", "1", "--epsilon", "1", "--json")
            assert r.exit_code == 0, r.stderr
            out = tmp_path / f"{side}{p}.json"
            out.write_text(r.stdout)
            pair.append(out)
        table = pl.DataFrame(json.loads(cli("diff", *pair, "--json").stdout)["result"])
        trials += table.height
        covered += int((table["mean_v_diff"].abs() <= table["mean_v_diff_moe95"]).sum())
    print(f"means: covered {covered} of {trials}")
    assert trials == PAIRS * GROUPS and not coverage_rejected(covered, trials), (covered, trials)


def test_tabulate_cell_margins_are_exact(tmp_path):
    """8 pairs of tabulations of the same persons under fresh keys (true differences 0). Each cell's covered
    probability is known exactly from its level's two noises (1 − 2·P[A − B ≥ m + 1], at least 95% and more by
    the discrete noise's mass at the margin): the count of covered cells must lie within 4 standard deviations of
    the sum of those probabilities (a band of about ±0.2% over some 250,000 cells), so a margin one unit too wide
    or too narrow fails it. Totals (whose noise a level with both kinds of groups leaves open: the larger is
    used) must cover at least 95%."""
    persons = pl.read_parquet("sample_data/persons.parquet")
    covered = trials = 0
    expected = variance = 0.0
    totals_covered = totals = 0
    for p in range(PAIRS):
        pair = []
        for side in ("a", "b"):
            state = tmp_path / f"state-t{side}{p}"
            assert cli("--state-dir", state, "budget", "init", "default", "--mode", "pure", "--epsilon",
                       "40").exit_code == 0
            out = tmp_path / f"t{side}{p}.csv"
            r = cli("--state-dir", state, "-q", "tabulate", "sample_data/persons.parquet", "--spec",
                    "sample_data/safetab_spec.toml", "--json", "-o", out)
            assert r.exit_code == 0, r.stderr
            (tmp_path / f"t{side}{p}.json").write_text(r.stdout)
            pair.append(out)
        summary = json.loads((tmp_path / f"ta{p}.json").read_text())
        levels = rep.tabulate_levels("a", summary)
        r = cli("diff", pair[0], pair[1], "--old-summary", tmp_path / f"ta{p}.json", "--new-summary",
                tmp_path / f"tb{p}.json", "--json", "-o", tmp_path / "d.parquet")
        assert r.exit_code == 0, r.stderr
        table = pl.read_parquet(tmp_path / "d.parquet").drop_nulls("count_diff")
        cells = table.filter(pl.col("age") != "total")
        for level, part in cells.group_by("level"):
            n = levels[str(level[0])].cells
            m = d.difference_margin(n, n)
            q = 1 - 2 * d.difference_tail(n, n, m + 1)
            covered += int((part["count_diff"].abs() <= m).sum())
            trials += part.height
            expected += part.height * q
            variance += part.height * q * (1 - q)
        tot = table.filter(pl.col("age") == "total")
        totals_covered += int((tot["count_diff"].abs() <= tot["count_diff_moe95"]).sum())
        totals += tot.height
    print(f"tabulate cells: covered {covered}, expected {expected:.1f} ± {math.sqrt(variance):.1f} of {trials}; "
          f"totals {totals_covered} of {totals}")
    assert persons.height and trials > 100_000
    assert _band(covered, expected, variance), (covered, expected, trials)
    assert not coverage_rejected(totals_covered, totals), (totals_covered, totals)


STREAM_PAGES = 200
STREAM_PAIRS = 30


def _stream_events(tmp_path):
    """300 users a day on each of 200 pages for 7 days from 2026-10-29 (a window's start), one event each at noon
    with a value in 0 … 7 (within --bounds -8:8, on its grid: the sums' bounded truth is the raw one)."""
    days = ["2026-10-29", "2026-10-30", "2026-10-31", "2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
    n = 300 * STREAM_PAGES
    frames = [pl.DataFrame({"user": [f"u{day}-{i}" for i in range(n)], "page": [f"p{i % STREAM_PAGES:03d}" for i in
                                                                              range(n)],
                            "ts": [f"{days[day]}T12:00:00Z"] * n, "v": [float((i * 3 + day) % 8) for i in range(n)]})
              for day in range(7)]
    events = pl.concat(frames)
    src = tmp_path / "events.csv"
    events.write_csv(src)
    return src, events


def _stream_run(state, src, through, out, *extra):
    r = cli("--state-dir", state, "-q", "stream-replay", src, "--time", "ts", "--by", "page", "--privacy-unit",
            "user", "--window", "7d", "--trigger-every", "1d", "--max-contributions", "1", "--value", "v", "--bounds",
            "-8:8", "--epsilon", "4", "--delta", "1e-9", "--through", through, "-o", out, "--json", *extra)
    assert r.exit_code == 0, r.stderr
    return r.stdout


def test_a_streams_two_triggers_margins_are_calibrated(tmp_path):
    """30 streams under fresh keys, each released at trigger 4 and at trigger 7 of one window: half as two replays
    of one file (through 2026-11-02 and 2026-11-05), half as two runs of a --state stream (the first 4 days, then
    the rest). The two values of a page read one tree, and the margin comes from its shared nodes; the true
    difference is the page's events of days 5-7 (900 per page; their values' sum for sums).

    Each page's covered probability under the margin's model is q = 2Φ((m + ½)/√V) − 1 for counts (whole numbers:
    the continuity correction; at least 95%, more by the step to a whole margin) and 2Φ(m/√V) − 1 for sums, V the
    difference's exact variance with the roundings'. Over 6,000 pages per column the covered count must lie within
    4 standard deviations of Σq (about ±1.1%): a margin computed as two independent trees' (too wide: about 99%)
    or one 15% too narrow (about 92%) falls outside the band."""
    src, events = _stream_events(tmp_path)
    early = tmp_path / "early.csv"
    events.filter(pl.col("ts") < "2026-11-02").write_csv(early)
    late = tmp_path / "late.csv"
    events.filter(pl.col("ts") >= "2026-11-02").write_csv(late)
    truth = events.filter(pl.col("ts") >= "2026-11-02").group_by("page").agg(pl.len().alias("count_true"),
                                                                             pl.col("v").sum().alias("sum_v_true"))
    covered, wide, narrow = {"count": 0, "sum_v": 0}, {"count": 0, "sum_v": 0}, {"count": 0, "sum_v": 0}
    expected, variance = {"count": 0.0, "sum_v": 0.0}, {"count": 0.0, "sum_v": 0.0}
    normal = NormalDist()
    for p in range(STREAM_PAIRS):
        state = tmp_path / f"state-s{p}"
        assert cli("--state-dir", state, "budget", "init", "default", "--mode", "approx", "--epsilon", "10",
                   "--delta", "1e-6").exit_code == 0
        a, b = tmp_path / f"s{p}a.csv", tmp_path / f"s{p}b.csv"
        if p % 2:
            _stream_run(state, early, "2026-11-02", a, "--state", tmp_path / f"s{p}.stream")
            summary = json.loads(_stream_run(state, late, "2026-11-05", b, "--state", tmp_path / f"s{p}.stream"))
        else:
            _stream_run(state, src, "2026-11-02", a)
            summary = json.loads(_stream_run(state, src, "2026-11-05", b))
        r = cli("--state-dir", state, "diff", a, b, "--json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["summary"]["shared_trees"], doc["summary"]
        table = pl.DataFrame(doc["result"]).filter(pl.col("trigger_old") == 4).join(truth, on="page")
        assert table.height == STREAM_PAGES and set(table["trigger_new"]) == {7}
        noise = rep.stream_noise("s", summary)
        shared = d.shared_tree_variance(1.0, 4, 7)
        for c, s2, rounding, continuity in (("count", noise.count_sigma2, 1.0, 0.5),
                                            ("sum_v", noise.sum_sigma2 or 0.0, noise.sum_step or 0.0, 0.0)):
            err = (table[f"{c}_diff"] - table[f"{c}_true"]).abs()
            m = table[f"{c}_diff_moe95"].cast(pl.Float64)
            sd = math.sqrt(s2 * shared + d.ROUNDING_VARIANCE * rounding**2)
            q = (2 * m.map_elements(lambda x, sd=sd, cc=continuity: normal.cdf((x + cc) / sd),
                                    return_dtype=pl.Float64) - 1).to_numpy()
            covered[c] += int((err <= m).sum())
            expected[c] += float(q.sum())
            variance[c] += float((q * (1 - q)).sum())
            independent = 1.96 * math.sqrt(s2 * d.independent_trees_variance(1.0, 4, 1.0, 7))
            wide[c] += int((err <= independent).sum())
            narrow[c] += int((err <= 0.85 * m).sum())
    for c in covered:
        print(f"stream {c}: covered {covered[c]}, expected {expected[c]:.1f} ± {math.sqrt(variance[c]):.1f}, "
              f"independent trees' margin {wide[c]}, 0.85× {narrow[c]} of {STREAM_PAIRS * STREAM_PAGES}")
        assert expected[c] >= 0.95 * STREAM_PAIRS * STREAM_PAGES - 1e-6
        assert _band(covered[c], expected[c], variance[c]), (c, covered[c], expected[c])
        assert not _band(wide[c], expected[c], variance[c]), (c, wide[c], expected[c])  # the band's power
        assert not _band(narrow[c], expected[c], variance[c]), (c, narrow[c], expected[c])


SCHEDULES = 30
SCHEDULE_GROUPS = 100


def test_a_schedules_epochs_are_exact_within_one_and_calibrated_across(tmp_path):
    """30 bbscheduler schedules (γ 0.5) under fresh keys over three snapshots of 20,000, 21,000 and 37,000 units in
    100 listed groups: the second stays in epoch 0 (the same release: every difference exactly 0, "unchanged"), the
    third starts a new epoch with independent noise at its own ε. The diff of the first and third must cover the
    true growth of each group's count (170 units) as exactly as its noises say: within 4 standard deviations of
    the sum of each group's exact covered probability (1 − 2·P[A − B ≥ m + 1])."""
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n" + "".join(f"g{i:03d}\n" for i in range(SCHEDULE_GROUPS)))
    snaps = []
    for day, size in ((1, 20000), (2, 21000), (3, 37000)):
        path = tmp_path / f"day{day}.csv"
        pl.DataFrame({"user": [f"u{i}" for i in range(size)],
                      "g": [f"g{i % SCHEDULE_GROUPS:03d}" for i in range(size)]}).write_csv(path)
        snaps.append(path)
    covered = trials = 0
    expected = variance = 0.0
    for k in range(SCHEDULES):
        state = tmp_path / f"state-e{k}"
        assert cli("--state-dir", state, "budget", "init", "default", "--mode", "pure", "--epsilon", "2").exit_code == 0
        outs = []
        for day, path in enumerate(snaps, start=1):
            out = tmp_path / f"e{k}-{day}.csv"
            r = cli("--state-dir", state, "-q", "histogram", path, "--by", "g", "--privacy-unit", "user", "--keys",
                    keys, "--schedule", "daily", "--total-epsilon", "1", "--gamma", "0.5", "-o", out)
            assert r.exit_code == 0, r.stderr
            outs.append(out)
        same = json.loads(cli("--state-dir", state, "diff", outs[0], outs[1], "--json").stdout)
        assert same["summary"]["shared_noise"] and {x["changed"] for x in same["result"]} == {"unchanged"}
        grown = json.loads(cli("--state-dir", state, "diff", outs[0], outs[2], "--json").stdout)
        assert not grown["summary"]["shared_noise"]
        table = pl.DataFrame(grown["result"])
        truth = 170  # (37,000 − 20,000) / 100 more units in every group
        covered += int(((table["count_diff"] - truth).abs() <= table["count_diff_moe95"]).sum())
        trials += table.height
        na, nb = (_laplace(grown["summary"]["noise"]["count"][s]) for s in ("old", "new"))
        m = int(table["count_diff_moe95"][0])
        q = 1 - 2 * d.difference_tail(na, nb, m + 1)
        expected += table.height * q
        variance += table.height * q * (1 - q)
    print(f"schedule epochs: covered {covered}, expected {expected:.1f} ± {math.sqrt(variance):.1f} of {trials}")
    assert trials == SCHEDULES * SCHEDULE_GROUPS
    assert _band(covered, expected, variance), (covered, expected, trials)


def _laplace(described: dict) -> Noise:
    return Noise("laplace", Fraction(described["scale"]))
