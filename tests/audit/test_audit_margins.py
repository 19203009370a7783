"""Audit of ``--with-error``: every released margin covers its bounded statistic at least 95% of the
time, conditional on the group being released.

Each test builds data whose bounded statistics are known exactly (every unit within the caps, values
on the grid and within the bounds, so bounding keeps everything), releases it through the library
functions the commands call, many groups at a time (groups are independent: each has its own
noise), over several fixed seeds, and counts the released values within ± their margin of the truth.

The test, for each statistic (and each class of group where the guarantee is per class): the one-sided
exact binomial test of H0 "coverage ≥ 95%" at the 1% level (:func:`auditstats.coverage_rejected`)
must not reject. A margin that covers exactly 95% passes such a test 99% of the time at a random
seed; the seeds are fixed, so a pass is deterministic. Where a wrong margin is easy to build (the
unconditional noise margin for a thresholded count, a 90% margin for a count) the same test must
reject it, which shows the trial counts have the power to see a shortfall.
"""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from auditstats import coverage_rejected
from tabulate_specs import block_frame, spec_toml

from dpcli.core import intervals
from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.tasks import histogram as hist
from dpcli.tasks import tabulate as tab
from dpcli.tasks import topk
from dpcli.tasks.tabulate.query import load_spec

pytestmark = pytest.mark.audit


def _stream(label: str, name: str) -> KeyedStream:
    return KeyedStream(hashlib.sha256(label.encode()).digest(), name)


def _check(name: str, covered: np.ndarray) -> None:
    """The binomial test on one statistic's coverage indicators (printed for the record)."""
    hits, trials = int(covered.sum()), int(covered.size)
    print(f"{name}: coverage {hits / max(trials, 1):.4f} over {trials} released values")
    assert trials >= 500, f"{name}: too few trials ({trials}) for the test to mean anything"
    assert not coverage_rejected(hits, trials), f"{name}: coverage {hits}/{trials} is significantly below 95%"


def _within(released: np.ndarray, truth: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """|released − truth| ≤ margin, with a relative float slack of 1e-9 (margins are computed in floats)."""
    released, truth, margin = (np.asarray(a, dtype=np.float64) for a in (released, truth, margin))
    return np.abs(released - truth) <= margin * (1 + 1e-9) + 1e-9 * np.maximum(np.abs(truth), 1.0)


# --- histogram over public groups: counts, sums, means, variances, quantile ranks ----------------

C, HI = 3, 1024.0  # rows per unit and group; bounds 0:1024 at granularity 1 (quantile candidates = 0 … 1024)


def _groups(groups: int, seed: int) -> pl.DataFrame:
    """Rows of ``groups`` public groups, of four kinds (values spread over the range, piled at the top,
    a single value, piled at the bottom), 1 to 120 units each, 1 to C rows per unit."""
    rng = np.random.default_rng(seed)
    units = rng.integers(1, 121, groups)
    unit_group = np.repeat(np.arange(groups), units)
    rows_per_unit = rng.integers(1, C + 1, unit_group.size)
    g = np.repeat(unit_group, rows_per_unit)
    user = np.repeat(np.arange(unit_group.size), rows_per_unit)
    kind = g % 4
    spread = rng.integers(0, 1024, g.size)
    top = rng.integers(1000, 1024, g.size)
    bottom = rng.integers(0, 8, g.size)
    x = np.select([kind == 0, kind == 1, kind == 2], [spread, top, np.full(g.size, 300)], bottom)
    return pl.DataFrame({"user": user, "g": g, "x": x.astype(np.float64)})


def _truth(df: pl.DataFrame) -> pl.DataFrame:
    return df.group_by("g").agg(
        pl.len().alias("t_rows"), pl.col("user").n_unique().alias("t_units"), pl.col("x").sum().alias("t_sum"),
        pl.col("x").mean().alias("t_mean"), pl.col("x").var(ddof=0).alias("t_var"),
    ).sort("g")


def _release(df: pl.DataFrame, aggs: tuple[str, ...], label: str, **options) -> pl.DataFrame:
    groups = int(df["g"].max()) + 1
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=aggs, value="x", bounds=(0.0, HI),
                            granularity=Fraction(1), max_partitions=1, max_contributions=C, domain="keys",
                            with_error=True, **options)
    plan = hist.plan_histogram(q, "zcdp" if q.noise == "gaussian" else "pure", {})
    out = hist.run_histogram(df.lazy(), q, plan, _stream(label, "histogram"), pl.DataFrame({"g": np.arange(groups)}))
    return out.table.sort("g")


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_histogram_counts_sums_means_variances_cover(noise):
    """20,000 public groups per seed, five seeds (10⁵ released values per statistic); ε = 2 (or
    ρ = 0.5) split five ways. Mean and variance margins are conservative (a union bound), so their
    coverage is well above 95%; the count and sum margins are the exact noise intervals."""
    options = {"epsilon": Fraction(2)} if noise == "laplace" else {"rho": Fraction(1, 2), "noise": "gaussian"}
    columns = {"count": "t_rows", "count_units": "t_units", "sum_x": "t_sum", "mean_x": "t_mean", "variance_x": "t_var"}
    covered: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    for seed in range(5):
        df = _groups(20_000, seed)
        out = _release(df, ("count", "count-units", "sum", "mean", "variance"), f"{noise}/{seed}", **options)
        out = out.join(_truth(df), on="g")
        for column, truth in columns.items():
            margin = out[f"{column}_moe95"].to_numpy()
            assert np.isfinite(margin).all() and (margin > 0).all()
            covered[column].append(_within(out[column].to_numpy(), out[truth].to_numpy(), margin))
    for column, parts in covered.items():
        _check(f"{noise} {column}", np.concatenate(parts))


def test_histogram_quantile_rank_margin_holds():
    """The rank margin E of a quantile: the released grid point's distance from q·n in rank (0 when q·n lies
    between the rows below it and the rows at most it) is at most the best point's + E. Checked over 2,000
    groups × five seeds, at a small ε (0.5 over two quantiles) so the bound is not trivially met."""
    covered = {"median": [], "p90": []}
    for seed in range(5):
        df = _groups(2_000, 100 + seed)
        q_aggs = ("median", "p90")
        out = _release(df, q_aggs, f"quantiles/{seed}", epsilon=Fraction(1, 2))
        query = hist.HistogramQuery(by=("g",), unit="user", aggregations=q_aggs, value="x", bounds=(0.0, HI),
                                    granularity=Fraction(1), max_contributions=C, epsilon=Fraction(1, 2),
                                    domain="keys", with_error=True)  # as _release: half of each share
        plan, plan_grid = hist.plan_histogram(query, "pure", {}), query.grid
        counts = np.zeros((out.height, 1025), dtype=np.int64)
        np.add.at(counts, (df["g"].to_numpy(), df["x"].to_numpy().astype(np.int64)), 1)
        at_most = np.cumsum(counts, axis=1)  # r_≤(x) for the grid points x = 0 … 1024
        below = at_most - counts  # r_<(x)
        n = at_most[:, -1]
        for agg in q_aggs:
            p = hist.parse_quantile(agg)
            assert p is not None
            chosen = np.rint(out[f"{agg}_x"].to_numpy()).astype(np.int64)  # candidates are the integers 0 … 1024
            # the utility's distance (docs/histogram.md): 0 where q·n lies in [r_<, r_≤], else den·(rank distance)
            gap = np.maximum(0, np.maximum(p.denominator * below - p.numerator * n[:, None],
                                           p.numerator * n[:, None] - p.denominator * at_most))
            best = gap.min(axis=1)
            got = gap[np.arange(out.height), chosen]
            margin = hist.quantile_rank_margin(plan.measurements[hist.quantile_measurement(agg)], plan_grid)
            covered[agg].append(got <= best + margin * p.denominator)
    for agg, parts in covered.items():
        _check(f"{agg} rank", np.concatenate(parts))


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_histogram_quantile_value_interval_covers_the_bounded_sample_quantile(noise):
    """The value interval of a quantile (``<q>_x_moe95``, docs/histogram.md: two exponential mechanisms at ranks
    shifted by a noisy count's margin and their own): the released value ± its margin holds the bounded sample
    quantile x* (the smallest value with at least q·n rows at most it) for ≥ 95% of 2,000 groups × five seeds per
    quantile, one-sided exact binomial test at 1% (:func:`auditstats.coverage_rejected`). The groups include a
    single repeated value and values piled at either end; ε = 1 (or ρ = 1/4) over median and p90."""
    options = {"epsilon": Fraction(1)} if noise == "laplace" else {"rho": Fraction(1, 4), "noise": "gaussian"}
    covered: dict[str, list[np.ndarray]] = {"median": [], "p90": []}
    for seed in range(5):
        df = _groups(2_000, 300 + seed)
        out = _release(df, ("median", "p90"), f"quantile-interval/{noise}/{seed}", **options)
        for agg in covered:
            p = hist.parse_quantile(agg)
            assert p is not None
            truth = df.group_by("g").agg(pl.col("x").sort().alias("xs")).sort("g")
            star = [xs[max(int(np.ceil(float(p) * len(xs))) - 1, 0)] for xs in truth["xs"].to_list()]
            got = out.join(truth.with_columns(pl.Series("star", star)), on="g")
            margin = got[f"{agg}_x_moe95"].to_numpy()
            assert np.isfinite(margin).all()
            covered[agg].append(_within(got[f"{agg}_x"].to_numpy(), got["star"].to_numpy(), margin))
    for agg, parts in covered.items():
        _check(f"{noise} {agg} value interval", np.concatenate(parts))


def test_a_quantile_interval_without_the_mechanisms_slack_is_rejected(monkeypatch):
    """The control: ends aimed at q·n̂ ∓ the count's margin alone (no slack for the ends' own rank error) must fail
    the same test on the same kind of data, so the audit has the power to see a short interval."""
    from dpcli.tasks import quantile_interval

    monkeypatch.setattr(quantile_interval, "end_slack", lambda rate, candidates: 0.0)
    monkeypatch.setattr(quantile_interval, "COUNT_ALPHA", 0.9)
    hits = trials = 0
    for seed in range(2):
        df = _groups(2_000, 300 + seed)
        out = _release(df, ("median",), f"quantile-interval/control/{seed}", epsilon=Fraction(1, 4))
        truth = df.group_by("g").agg(pl.col("x").sort().alias("xs")).sort("g")
        star = [xs[max(int(np.ceil(len(xs) / 2)) - 1, 0)] for xs in truth["xs"].to_list()]
        got = out.join(truth.with_columns(pl.Series("star", star)), on="g")
        ok = _within(got["median_x"].to_numpy(), got["star"].to_numpy(), got["median_x_moe95"].to_numpy())
        hits, trials = hits + int(ok.sum()), trials + ok.size
    print(f"control: coverage {hits / trials:.4f} over {trials}")
    assert coverage_rejected(hits, trials)


# --- thresholding and UnkLap: a count conditional on its own selection ---------------------------


def _noise_draws(noise: mech.Noise, true: int, n: int, label: str) -> np.ndarray:
    return true + noise.sample(_stream(label, "draws"), n)


@pytest.mark.parametrize("noise", [mech.laplace(1, Fraction(1, 2)), mech.laplace(1, Fraction(1, 40)),
                                   mech.gaussian(1, Fraction(1, 8)), mech.gaussian(1, Fraction(1, 10**12))],
                         ids=["laplace-b2", "laplace-b40", "gauss-s2", "gauss-s7e5"])
def test_selected_interval_covers_conditional_on_selection(noise):
    """:func:`selected_interval` with the exact samplers: true counts from 1.5 margins below the
    threshold to 3 above, 5·10⁵ draws each, only those passing kept (at 1.5 margins below, about
    one draw in 600 to 3,000). Each class on its own must pass; the unconditional noise margin must
    fail a margin or more below the threshold (a group released from below has noise at least its distance to τ).
    The last noise has σ above the exact-tail limit, so the normal-tail path is audited too."""
    tau = mech.selection_threshold(noise, 1, 1e-7)
    m = noise.margin95()
    for offset in (-1.5, -1.0, -0.5, 0.0, 1.0, 3.0):
        true = max(tau + round(offset * m), 0)
        u = _noise_draws(noise, true, 500_000, f"{noise}/{offset}")
        u = u[u >= tau]
        lo, hi = intervals.selected_interval(noise, u, tau)
        margin = intervals.cover_margin(u, lo, hi)
        _check(f"{noise.describe()} c = τ {offset:+.1f}·m", _within(u, true, margin))
        if offset <= -1:
            plain = _within(u, true, np.full(u.size, m))
            assert coverage_rejected(int(plain.sum()), plain.size), "the unconditional margin should fail here"


def _threshold_groups(tau: int, m: int, per_class: int) -> tuple[pl.DataFrame, np.ndarray]:
    """Groups whose true unit counts sit from m below τ to 3m above (one row per unit)."""
    offsets = np.array([-m, -m // 2, 0, m, 3 * m])
    true = np.repeat(np.maximum(tau + offsets, 1), per_class)
    g = np.repeat(np.arange(true.size), true)
    return pl.DataFrame({"user": np.arange(g.size), "g": g, "x": 1.0}), true


def test_thresholded_histogram_counts_cover_given_release():
    """End to end: ``--selection threshold`` (ε = 1 for count and count-units, δ = 10⁻⁷) over groups
    near τ; count_units is the selecting measurement, count is independent of it. Per class of true
    size, coverage among the released groups; 12 seeds, so the rarest class (one margin below τ,
    released about 3% of the time) has over 2,000 releases."""
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("count", "count-units"), max_partitions=1,
                            max_contributions=1, epsilon=Fraction(1), delta=Fraction(1, 10**7), with_error=True)
    plan = hist.plan_histogram(q, "approx", {})
    units = plan.measurements["units"].noise
    assert units is not None and plan.threshold is not None
    df, true = _threshold_groups(plan.threshold, units.margin95(), 6_000)
    per_class = {t: [] for t in np.unique(true)}
    counts = []
    for seed in range(12):
        out = hist.run_histogram(df.lazy(), q, plan, _stream(f"threshold/{seed}", "histogram")).table
        t = true[out["g"].to_numpy()]
        cu = _within(out["count_units"].to_numpy(), t, out["count_units_moe95"].to_numpy())
        counts.append(_within(out["count"].to_numpy(), t, out["count_moe95"].to_numpy()))
        for c in per_class:
            per_class[c].append(cu[t == c])
    for c, parts in per_class.items():
        _check(f"count_units, true {c} (τ = {plan.threshold})", np.concatenate(parts))
    _check("count (independent of the selection)", np.concatenate(counts))


def test_unklap_counts_cover_given_release():
    """``--selection unklap``: the top D groups are released when their noisy count beats the noisy ⊥
    (released, drawn independently of each group's noise), so each count is conditioned on
    u ≥ ⊥ + 1. 3,000 groups sit just around ⊥'s typical value, below them many groups of one unit."""
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("count",), max_partitions=1, max_contributions=1,
                            epsilon=Fraction(1), delta=Fraction(1, 10**7), domain="unklap", max_groups=3000,
                            with_error=True)
    plan = hist.plan_histogram(q, "approx", {})
    assert plan.unklap_offset is not None
    base = 1 + plan.unklap_offset
    true = np.concatenate([base + np.arange(-6, 14).repeat(150), np.ones(4000, dtype=np.int64)])
    g = np.repeat(np.arange(true.size), true)
    df = pl.DataFrame({"user": np.arange(g.size), "g": g, "x": 1.0})
    covered = []
    for seed in range(30):
        out = hist.run_histogram(df.lazy(), q, plan, _stream(f"unklap/{seed}", "histogram")).table
        covered.append(_within(out["count"].to_numpy(), true[out["g"].to_numpy()], out["count_moe95"].to_numpy()))
    _check("unklap count", np.concatenate(covered))


# --- topk and tabulate: counts with independent noise after the selection -------------------------


def _topk_frame(counts: np.ndarray) -> pl.DataFrame:
    g = np.repeat(np.arange(counts.size), counts)
    return pl.DataFrame({"user": np.arange(g.size), "g": g})


def test_topk_counts_cover():
    """The released counts get fresh Laplace(2τ/ε_per) noise after the selection, so their exact
    noise margin covers conditional on being chosen. Known domain (3,000 candidates, k = 1,000,
    20 seeds) and unknown domain (300 large groups above 1,700 small ones, k = 300, 10 seeds: UnkGumb's
    ⊥ sits above the small ones); a 90% margin must be caught."""
    rng = np.random.default_rng(7)
    spread = rng.integers(1, 300, 3000)
    gap = np.concatenate([rng.integers(1000, 1300, 300), rng.integers(1, 50, 1700)])
    for known, counts, k, seeds in ((True, spread, 1000, 20), (False, gap, 300, 10)):
        df = _topk_frame(counts)
        q = topk.TopKQuery(by=("g",), unit="user", k=k, known_domain=known, epsilon_per=Fraction(1, 10),
                           delta=Fraction(0) if known else Fraction(1, 10**6), with_error=True)
        plan = topk.plan_topk(q, "approx", {})
        covered, narrow = [], []
        assert plan.count_noise is not None
        m90 = plan.count_noise.margin(0.10)
        for seed in range(seeds):
            out = topk.run_topk(df.lazy(), q, plan, _stream(f"topk/{known}/{seed}", "topk"),
                                pl.DataFrame({"g": np.arange(counts.size)}) if known else None).table
            t = counts[out["g"].to_numpy()]
            covered.append(_within(out["count"].to_numpy(), t, out["count_moe95"].to_numpy()))
            narrow.append(_within(out["count"].to_numpy(), t, np.full(out.height, m90)))
        _check(f"topk count ({'known' if known else 'unknown'} domain)", np.concatenate(covered))
        narrow_all = np.concatenate(narrow)
        assert coverage_rejected(int(narrow_all.sum()), narrow_all.size), "a 90% margin should be caught"


def _age_range(label: str) -> tuple[int, int]:
    if label.endswith("+"):
        return int(label[:-1]), 10**6
    lo, _, hi = label.partition("-")
    return int(lo), int(hi or lo)


def test_tabulate_cells_cover(tmp_path):
    """SafeTab-style cells: step 1's noise (which picks the branch) is independent of step 2's, so each
    released cell's noise margin covers conditional on its branch. 6,000 blocks, each one population
    group of 0 to 59 persons (all sex 1, age 30), thresholds 10/25/40 so every branch occurs; five
    seeds. Totals and marginal cells are checked apart."""
    blocks = 6000
    ids = [f"{i:07d}" for i in range(blocks)]
    pl.DataFrame({"block": ids}).write_csv(tmp_path / "blocks.csv")
    (tmp_path / "spec.toml").write_text(spec_toml(
        '[[levels]]\ngeography = "block"\niterations = "all"\nepsilon = 1\nstability = 1',
        iterations='[iterations.all]\n"T" = { race = ["1000-9999"] }', geography="levels.block = { prefix = 7 }",
        gamma="0.2", thresholds=(10, 25, 40)))
    spec = load_spec(str(tmp_path / "spec.toml"))
    persons_per_block = np.arange(blocks) % 60
    persons = pl.DataFrame({"block": np.repeat(ids, persons_per_block), "race": "1000", "eth": "1", "sex": "1",
                            "age": 30}).lazy()
    truth = dict(zip(ids, persons_per_block.tolist(), strict=True))
    totals, cells = [], []
    for seed in range(5):
        out = tab.run_tabulate(persons, spec, _stream(f"tabulate/{seed}", "tab"), True, blocks=block_frame(spec)).table
        for row in out.iter_rows(named=True):
            n = truth[row["geo_id"]]
            if row["age"] == "total":
                totals.append(abs(row["count"] - n) <= row["moe95"])
                continue
            lo, hi = _age_range(row["age"])
            cells.append(abs(row["count"] - (n if row["sex"] == "1" and lo <= 30 <= hi else 0)) <= row["moe95"])
    _check("tabulate totals", np.array(totals))
    _check("tabulate cells", np.array(cells))


def test_the_binomial_test_rejects_what_it_should():
    """The decision rule itself: at 1,000 trials 93.2% is rejected (P[X ≤ 932] = 0.0074 under 95%) and
    93.3% is not (0.0106); at 10⁵ trials 94.83% is rejected (0.0072) and 94.85% is not (0.0153)."""
    assert coverage_rejected(932, 1000) and not coverage_rejected(933, 1000)
    assert coverage_rejected(94_830, 100_000) and not coverage_rejected(94_850, 100_000)
    assert not any(coverage_rejected(k, 1000) for k in range(950, 1001))


# --- sql: ANON_AVG, ANON_VAR and ANON_STDDEV (per-person estimands), discovered distinct counts -------


def _sql_groups(groups: int, seed: int) -> pl.DataFrame:
    """Rows of public groups, 1 to 60 persons each with 1 to 3 rows: values spread, piled at the top, or one value."""
    rng = np.random.default_rng(1000 + seed)
    persons = rng.integers(1, 61, groups)
    person_group = np.repeat(np.arange(groups), persons)
    rows = rng.integers(1, 4, person_group.size)
    g = np.repeat(person_group, rows)
    uid = np.repeat(np.arange(person_group.size), rows)
    kind = g % 3
    x = np.select([kind == 0, kind == 1], [rng.integers(0, 1024, g.size), rng.integers(1000, 1024, g.size)], 300)
    return pl.DataFrame({"uid": uid, "g": g, "x": x.astype(np.float64)})


def _fixed_keys(monkeypatch) -> None:
    """Seeds fixed by the release's material alone (the ledger's key is random per test run)."""
    from dpcli.core.prf import canonical_json

    monkeypatch.setattr("dpcli.release.seeds.derive_seed",
                        lambda key, material: hashlib.sha256(b"audit" + canonical_json(material)).digest())


def test_sql_avg_var_stddev_margins_cover_the_per_person_statistics(tmp_path, monkeypatch):
    """ANON_AVG is the mean over persons of each person's mean, ANON_VAR the variance of the mixture that
    weighs each person's rows by 1/rows (mean of per-person mean squares minus the squared mean),
    ANON_STDDEV its root: every value lies in [0, 1024] on the grid, so bounding keeps them all. 10,000
    public groups per seed, three seeds (3·10⁴ values per statistic), ε = 3 split four ways. The margins
    are union bounds (conservative): the one-sided binomial test at the 1% level must not reject 95%."""
    from dptest import cli, init_ledger

    _fixed_keys(monkeypatch)
    init_ledger("pure", "--epsilon", "1000")
    covered: dict[str, list[np.ndarray]] = {"a": [], "v": [], "sd": []}
    for seed in range(3):
        df = _sql_groups(10_000, seed)
        data, keys = tmp_path / f"rows{seed}.parquet", tmp_path / f"keys{seed}.csv"
        df.write_parquet(data)
        pl.DataFrame({"g": np.arange(10_000)}).write_csv(keys)
        r = cli("sql", "SELECT g, ANON_AVG(x, 0, 1024) a, ANON_VAR(x, 0, 1024) v, ANON_STDDEV(x, 0, 1024) sd "
                "FROM t GROUP BY g", "--table", f"t={data}", "--privacy-unit", "uid", "--keys", keys,
                "--max-partitions", "1", "--epsilon", "3", "--with-error", "-o", tmp_path / f"out{seed}.parquet")
        assert r.exit_code == 0, r.stderr
        out = pl.read_parquet(tmp_path / f"out{seed}.parquet").sort("g")
        person = df.group_by("g", "uid").agg(pl.col("x").mean().alias("m"), ((pl.col("x") - 512) ** 2).mean()
                                             .alias("q"))
        truth = person.group_by("g").agg(pl.col("m").mean().alias("t_a"),
                                         (pl.col("q").mean() - (pl.col("m").mean() - 512) ** 2).alias("t_v")).sort("g")
        truth = truth.with_columns(pl.col("t_v").sqrt().alias("t_sd"))
        out = out.join(truth, on="g")
        for column in covered:
            margin = out[f"{column}_moe95"].to_numpy()
            assert np.isfinite(margin).all()
            covered[column].append(_within(out[column].to_numpy(), out[f"t_{column}"].to_numpy(), margin))
    for column, parts in covered.items():
        _check(f"sql {column}", np.concatenate(parts))


def test_sql_discovered_distinct_counts_cover_given_release(tmp_path, monkeypatch):
    """ANON_COUNT(DISTINCT uid) without a public list: the count that passed the threshold is the one released,
    so its margin is the conditional interval; groups of true sizes around the threshold (the unconditional
    margin covered 94.6% of them here, which the test rejects), one row per person."""
    from dptest import cli, init_ledger

    _fixed_keys(monkeypatch)
    init_ledger("approx", "--epsilon", "1000", "--delta", "0.5")
    pl.DataFrame({"uid": [0], "g": [0]}).write_parquet(tmp_path / "probe.parquet")
    probe = cli("sql", "SELECT g, ANON_COUNT(DISTINCT uid) u FROM t GROUP BY g", "--table", f"t={tmp_path}/probe.parquet",
                "--privacy-unit", "uid", "--max-partitions", "1", "--epsilon", "0.5", "--delta", "1e-5", "--dry-run",
                "--json")
    tau = int(json.loads(probe.stdout)["threshold"])
    covered = []
    for seed in range(4):  # true sizes τ − 8 … τ + 3: released ones are mostly those whose noise pushed them over
        sizes = np.random.default_rng(2000 + seed).integers(tau - 8, tau + 4, 40_000)
        g = np.repeat(np.arange(sizes.size), sizes)
        data = tmp_path / f"d{seed}.parquet"
        pl.DataFrame({"uid": np.arange(g.size), "g": g}).write_parquet(data)
        r = cli("sql", "SELECT g, ANON_COUNT(DISTINCT uid) u FROM t GROUP BY g", "--table", f"t={data}",
                "--privacy-unit", "uid", "--max-partitions", "1", "--epsilon", "0.5", "--delta", "1e-5", "--with-error",
                "-o", tmp_path / f"o{seed}.parquet")
        assert r.exit_code == 0, r.stderr
        out = pl.read_parquet(tmp_path / f"o{seed}.parquet")
        truth = pl.DataFrame({"g": np.arange(sizes.size), "t": sizes})
        out = out.join(truth, on="g")
        covered.append(_within(out["u"].to_numpy(), out["t"].to_numpy(), out["u_moe95"].to_numpy()))
    _check("sql discovered distinct count", np.concatenate(covered))
