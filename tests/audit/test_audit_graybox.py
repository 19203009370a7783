"""Gray-box replay: neighbouring inputs run with instrumented samplers, for every subcommand.

Each test draws random datasets (including a single row, extreme values and
units at their maximal contribution) and a neighbour (one unit removed, or a
heavy unit added), replaces the noise by zeros so that outputs are the
pre-noise aggregates, records every noise call, and checks: the same noise
calls on both sides (or, where the mechanism is adaptive or creates per-key
trees, calls that differ only as the privacy analysis allows), value changes
within the declared sensitivity, and that shuffling the rows changes nothing.
``make test`` replays 25 pairs per command (8 for tabulate, whose runs are slower); ``make audit``
1,000.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from dptest import table as _table  # one fingerprint for all: identical randomness
from tabulate_specs import block_frame, write_spec

from dpcli.core import mechanisms as mech
from dpcli.core import selection as sel
from dpcli.core.prf import KeyedStream
from dpcli.tasks import histogram as hist
from dpcli.tasks import stream as sr
from dpcli.tasks import tabulate as tab
from dpcli.tasks import topk
from dpcli.tasks.tabulate.query import load_spec

PAIRS = [pytest.param(25, id="fast"), pytest.param(1000, marks=pytest.mark.audit, id="full")]


def _shuffled(df: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    return df.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(0, 2**31)))


@pytest.fixture
def zero_noise(monkeypatch):
    """Noise.sample returns zeros and records (stream label, n, noise description)."""
    calls: list[tuple[str, int, str]] = []

    def zero(self, stream, n):
        calls.append((stream.label, n, str(self.describe())))
        return np.zeros(n, dtype=np.int64)

    monkeypatch.setattr(mech.Noise, "sample", zero)
    return calls


# ---- histogram ------------------------------------------------------------------------------------

KEYS = pl.DataFrame({"g": ["a", "b", "c", "d"]})


def _units_dataset(rng: np.random.Generator, groups: list[str], values: list[float]) -> pl.DataFrame:
    rows = [("base", groups[0], 1.0)]  # at least one row (an empty input is released too, but is not the case here)
    for u in range(int(rng.integers(0, 12))):
        for _ in range(int(rng.integers(1, 8))):
            rows.append((f"u{u}", str(rng.choice(groups)), float(rng.choice(values))))
    return pl.DataFrame(rows, schema={"user": pl.String, "g": pl.String, "x": pl.Float64}, orient="row")


def _units_neighbour(df: pl.DataFrame, rng: np.random.Generator, groups: list[str]) -> pl.DataFrame:
    """Drop one unit, or add a unit at its maximal contribution (many rows, extreme values, every group)."""
    units = df["user"].unique().to_list()
    units.remove("base")
    if units and rng.random() < 0.5:
        return df.filter(pl.col("user") != units[int(rng.integers(0, len(units)))])
    heavy = [("new", g, v) for g in groups for v in (1e9, -1e9, 7.5) for _ in range(5)]
    return pl.concat([df, pl.DataFrame(heavy, schema=df.schema, orient="row")])


@pytest.mark.parametrize("pairs", PAIRS)
def test_histogram(zero_noise, pairs):
    """Per measurement an L1 change within the declared bound: P·C rows, P units, P·C·max|bound| for sums."""
    calls = zero_noise
    P, C, lo, hi = 2, 3, -10.0, 10.0
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("count", "count-units", "sum"), value="x",
                            bounds=(lo, hi), max_partitions=P, max_contributions=C, epsilon=Fraction(1),
                            domain="keys")
    plan = hist.plan_histogram(q, "pure", {})
    rng = np.random.default_rng(2024)  # test data only

    def run(df):
        calls.clear()
        out = hist.run_histogram(_table(df), q, plan, KeyedStream(b"g" * 32, "histogram"), KEYS).table.sort("g")
        return out, list(calls)

    for _ in range(pairs):
        d = _units_dataset(rng, ["a", "b", "c", "d", "zz"], [-50.0, 0.0, 3.3, 9.99, 1e9])
        a, calls_a = run(d)
        b, calls_b = run(_units_neighbour(d, rng, ["a", "b", "c", "d"]))
        assert calls_a == calls_b and len(calls_a) == 3
        assert a["g"].to_list() == b["g"].to_list() == KEYS["g"].to_list()  # the undeclared "zz" never leaks
        assert (a["count"] - b["count"]).abs().sum() <= P * C
        assert (a["count_units"] - b["count_units"]).abs().sum() <= P
        assert (a["sum_x"] - b["sum_x"]).abs().sum() <= P * C * max(abs(lo), abs(hi)) + 1e-9
        shuffled, calls_s = run(_shuffled(d, rng))
        assert shuffled.equals(a) and calls_s == calls_a


# ---- topk -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pairs", PAIRS)
def test_topk(zero_noise, monkeypatch, pairs):
    """The counts fed to the selection move by at most τ each (ℓ∞; unrestricted ℓ0), for the known
    domain (aligned candidates) and the unknown one (the d̄ + 1 largest, sorted, zero-padded); the
    selections get the same parameters on both sides; released counts of groups picked on both
    sides move by ≤ τ, with the same Laplace(2τ/ε_per) noise call."""
    calls = zero_noise
    fed: list[tuple] = []

    def known(stream, counts, k, eps, tau):
        fed.append(("known", np.asarray(counts).copy(), k, eps, tau))
        return [int(i) for i in np.argsort(-np.asarray(counts), kind="stable")[:k]]

    def unknown(stream, h, k, dbar, eps, tau, delta):
        padded = np.zeros(dbar + 1, dtype=np.int64)
        got = np.asarray(h)[: dbar + 1]
        padded[: got.size] = got
        fed.append(("unknown", padded, k, dbar, eps, tau, delta))
        picks = [i for i in range(min(k, dbar)) if padded[i] > 0]
        return sel.UnknownTopK(picks, len(picks) < k, k, 0.0)

    monkeypatch.setattr(sel, "known_top_k", known)
    monkeypatch.setattr(sel, "unknown_top_k", unknown)
    rng = np.random.default_rng(7)  # test data only
    groups = ["a", "b", "c", "d", "e", "f"]
    domain = pl.DataFrame({"g": groups + ["never"]})
    for known_domain, count, tau in ((True, "units", 1), (False, "units", 1), (True, "rows", 2), (False, "rows", 3)):
        q = topk.TopKQuery(by=("g",), unit="user", k=2, count=count, max_contributions=tau, known_domain=known_domain,
                           dbar=4, epsilon_per=Fraction(1, 2), delta=Fraction(1, 10**6))
        plan = topk.plan_topk(q, "approx" if not known_domain else "pure", {})

        def run(df):
            calls.clear()
            fed.clear()
            out = topk.run_topk(_table(df), q, plan, KeyedStream(b"k" * 32, "topk"), domain if known_domain else None)
            return out.table, list(fed), list(calls)

        for _ in range(pairs // 4):
            d = _units_dataset(rng, groups, [1.0])
            a, fed_a, calls_a = run(d)
            b, fed_b, calls_b = run(_units_neighbour(d, rng, groups + ["new"]))
            (_, h_a, *params_a), (_, h_b, *params_b) = fed_a[0], fed_b[0]
            assert len(fed_a) == len(fed_b) == 1 and params_a == params_b and h_a.size == h_b.size
            assert np.abs(h_a - h_b).max() <= tau
            # One count-noise call per run, Laplace(2τ/ε_per), sized by what was released (always k when
            # the domain is known; the unknown domain may stop at ⊥, which its accounting charges for).
            laplace = str(mech.laplace(2 * tau, Fraction(1, 2)).describe())
            assert [(c[1], c[2]) for c in calls_a] == [(a.height, laplace)]
            assert [(c[1], c[2]) for c in calls_b] == [(b.height, laplace)]
            assert not known_domain or a.height == b.height == q.k
            assert not known_domain or set(a["g"]) | set(b["g"]) <= set(domain["g"])  # "new" is not a candidate
            both = a.join(b, on="g", suffix="_b")
            assert ((both["count"] - both["count_b"]).abs() <= tau).all()
            sa, fed_s, calls_s = run(_shuffled(d, rng))
            assert sa.equals(a) and np.array_equal(fed_s[0][1], h_a) and calls_s == calls_a


# ---- tabulate -------------------------------------------------------------------------------------

TAB_LEVELS = "\n".join(f'[[levels]]\ngeography = "{g}"\niterations = "reg"\nepsilon = 1\nstability = 3'
                       for g in ("nation", "state", "area"))


def _person(rng: np.random.Generator) -> tuple[str, str, str, str, int]:
    return (str(rng.choice(["01001", "01002", "02001"])), str(rng.choice(["1000", "2000", "1000;2000", "1500;1600"])),
            str(rng.choice(["1", "2"])), str(rng.choice(["1", "2"])), int(rng.integers(0, 100)))


@pytest.mark.parametrize("pairs", [pytest.param(8, id="fast"), pytest.param(1000, marks=pytest.mark.audit, id="full")])
def test_tabulate(zero_noise, tmp_path, pairs):
    """A person maps to at most s = 3 groups per level (W/WC/B and the TotalOnly H), so per level the
    step-1 totals move by ≤ 1 each and ≤ s in L1 (seen in a run whose thresholds send every group to
    branch 0, releasing the very totals step 1 uses). With the real thresholds and zero noise the
    step-1 noise calls are identical on both sides; when no group changes branch (the branch is
    post-processing of the noisy step-1 total), every call is identical and the released cells move
    by ≤ s in L1 per level."""
    calls = zero_noise
    spec = load_spec(str(write_spec(tmp_path, TAB_LEVELS, blocks="block,aiannh\n01001,A1\n01002,\n02001,A1\n")))
    totals_spec = dataclasses.replace(spec, thresholds=(10**9, 10**9 + 1, 10**9 + 2))
    rng = np.random.default_rng(11)  # test data only
    schema = {"block": pl.String, "race": pl.String, "eth": pl.String, "sex": pl.String, "age": pl.Int64}
    keys = ["level", "geo_id", "iteration", "sex", "age"]

    def run(df, s):
        calls.clear()
        out = tab.run_tabulate(_table(df), s, KeyedStream(b"t" * 32, "tab"), blocks=block_frame(s)).table
        return out, list(calls)

    def l1_by_level(a, b):
        both = a.join(b, on=keys, how="full", coalesce=True, nulls_equal=True, suffix="_b")
        assert both["count"].null_count() == both["count_b"].null_count() == 0  # same rows
        return both.group_by("level").agg((pl.col("count") - pl.col("count_b")).abs().sum().alias("l1"),
                                          (pl.col("count") - pl.col("count_b")).abs().max().alias("linf"))

    same_branches = 0
    for _ in range(pairs):
        people = [_person(rng) for _ in range(int(rng.integers(1, 160)))]
        d = pl.DataFrame(people, schema=schema, orient="row")
        if d.height > 1 and rng.random() < 0.5:  # one person removed, or one added
            d2 = d.filter(pl.int_range(pl.len()) != int(rng.integers(0, d.height)))
        else:
            d2 = pl.concat([d, pl.DataFrame([_person(rng)], schema=schema, orient="row")])
        t_a, _ = run(d, totals_spec)
        t_b, _ = run(d2, totals_spec)
        change = l1_by_level(t_a, t_b)
        assert (change["l1"] <= 3).all() and (change["linf"] <= 1).all()
        a, calls_a = run(d, spec)
        b, calls_b = run(d2, spec)
        step1 = lambda cs: [c for c in cs if c[0].endswith("/step1")]  # noqa: E731
        assert step1(calls_a) == step1(calls_b) and len(step1(calls_a)) == 3
        if a.select(keys).equals(b.select(keys)):
            same_branches += 1
            assert calls_a == calls_b
            assert (l1_by_level(a, b)["l1"] <= 3).all()
        shuffled, calls_s = run(_shuffled(d, rng), spec)
        assert shuffled.equals(a) and calls_s == calls_a
    assert same_branches >= pairs // 2  # the branch-equal case, where cells are compared, is the common one


# ---- stream-replay --------------------------------------------------------------------------------


@pytest.mark.parametrize("pairs", PAIRS)
def test_stream_replay(monkeypatch, pairs):
    """Zero tree noise and zero thresholds (μ = 0), so every key with a new unit is released at each
    trigger and the releases are the exact running totals. A unit's first C records are all that
    count: at every trigger the running counts of all keys together move by ≤ C and the sums by
    ≤ C·L. Trees are only created for keys present in the data (the unknown domain): per kind, the
    neighbour creates or removes at most C of them (others may start at another trigger), each with
    the same σ² and length per trigger."""
    made: list[tuple[str, Fraction, int, int]] = []

    def zero_prefixes(stream, sigma2, trees, n):
        made.append((stream.label, sigma2, trees, n))
        return np.zeros((trees, n))

    monkeypatch.setattr(sr.tree, "noise_prefixes", zero_prefixes)
    monkeypatch.setattr(sr.tree, "selection_thresholds", lambda sigma2, n, beta, horizon: np.zeros(n))
    C, L = 3, 5.0
    q = sr.StreamQuery(time="ts", keys=("key",), unit="user", window=40, triggers=4, max_records=C,
                       epsilon=Fraction(1), delta=Fraction(1, 10**6), value="v", clamp=L)
    rng = np.random.default_rng(5)  # test data only
    schema = {"ts": pl.Int64, "user": pl.String, "key": pl.String, "v": pl.Float64}
    plan = sr.plan_stream(q)  # made once: ρ calibration takes ~0.25 s

    def row(user: str) -> tuple[int, str, str, float]:
        return (int(rng.integers(0, 80)), user, str(rng.choice(["a", "b", "c", "d", "e"])),
                float(rng.choice([-50.0, 0.0, 3.3, 1e9])))

    def run(df):
        """The release table, the running totals of every key at every trigger, and the trees made per call."""
        made.clear()
        out = sr.run_stream(_table(df), q, plan, b"s" * 32).table
        cells = (pl.DataFrame({"window_start": out["window_start"].unique().sort()})
                 .join(pl.DataFrame({"trigger": [1, 2, 3, 4]}), how="cross")
                 .join(pl.DataFrame({"key": list("abcde")}), how="cross"))
        running = (cells.join(out, on=["window_start", "trigger", "key"], how="left")
                   .sort("window_start", "key", "trigger")
                   .with_columns(pl.col("count", "sum_v").forward_fill().over("window_start", "key").fill_null(0)))
        return out, running, {(label, s2, n): k for label, s2, k, n in made}

    for _ in range(pairs):
        rows = [row(f"u{u}") for u in range(int(rng.integers(1, 10))) for _ in range(int(rng.integers(1, 8)))]
        d = pl.DataFrame(rows, schema=schema, orient="row")
        units = d["user"].unique().to_list()
        if len(units) > 1 and rng.random() < 0.5:
            d2 = d.filter(pl.col("user") != units[int(rng.integers(0, len(units)))])
        else:  # a heavy unit: 12 records over random keys and times, of which the first C count
            d2 = pl.concat([d, pl.DataFrame([row("heavy") for _ in range(12)], schema=schema, orient="row")])
        out_a, fa, trees_a = run(d)
        _, fb, trees_b = run(d2)
        both = fa.join(fb, on=["window_start", "trigger", "key"], how="full", coalesce=True, suffix="_b").fill_null(0)
        per_trigger = both.group_by("window_start", "trigger").agg(
            (pl.col("count") - pl.col("count_b")).abs().sum().alias("dc"),
            (pl.col("sum_v") - pl.col("sum_v_b")).abs().sum().alias("ds"))
        assert (per_trigger["dc"] <= C).all() and (per_trigger["ds"] <= C * L + 1e-9).all()
        for kind in ("select", "pert-count", "pert-sum"):  # a tree may also start at another trigger
            made_a = sum(k for (label, _, _), k in trees_a.items() if f"/{kind}/" in label)
            made_b = sum(k for (label, _, _), k in trees_b.items() if f"/{kind}/" in label)
            assert abs(made_a - made_b) <= C
        calls = set(trees_a) | set(trees_b)
        assert len({label for label, _, _ in calls}) == len(calls)  # σ² and tree length fixed per call
        out_s, _, trees_s = run(_shuffled(d, rng))
        assert out_s.equals(out_a) and trees_s == trees_a
