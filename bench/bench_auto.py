"""Issue 33: ``histogram`` with every bound ``auto`` against the best fixed bounds (a non-private oracle).

Three synthetic shapes (numpy's seeded generator makes the *data* only; every release is dpcli's):

* ``light``: most units have 1–3 rows in 1–2 groups, log-normal values (median 20);
* ``heavy``: groups per unit Zipf(2) (at most 50), rows per (unit, group) Zipf(2) (at most 10^4),
  Pareto(1.3) values (infinite variance);
* ``giant``: ``light`` plus one unit with ``GIANT_ROWS`` rows spread over every group, each value 10^6.

Every shape has 50 groups, given to dpcli as a public ``--keys`` list (``--discover``: found from the
data instead, with thresholding at δ = 1e-6), and a value column ``v``. The release is
``dpcli histogram --agg count,sum,mean --value v`` (one release, ε split equally by dpcli).

**Error metric**: the mean absolute error, over the groups the release contains, of each released
statistic against the TRUE statistic of the data with no bound at all (every row of every unit,
unclamped values), averaged over R repetitions. Each repetition has a fresh state directory (its own
``dpcli budget init`` and so its own secret key, hence its own seeds). For ``giant`` the true
statistics are dominated by the giant unit, which no DP release can (or should) reproduce, so the
table also shows the error against the truth of every OTHER unit (``giant, others``).

* ``auto``: ``--max-partitions auto --max-contributions auto --bounds auto`` at total ε (the default
  ``--auto-share`` 0.1 chooses the bounds, the release gets the rest).
* ``oracle``: the best fixed ``--max-partitions K --max-contributions C --bounds LO:HI`` for each
  statistic, at the SAME total ε, all of it spent on the release. Found with the true data in two steps:
  (1) an exhaustive screen of the grid ``K_GRID`` × ``C_GRID`` × (LO, HI) over true quantiles of ``v``
  (``LO_LEVELS`` × ``HI_LEVELS``, quantiles of the rows and of the units: about 50 pairs) by expected error: the bias of each bound computed exactly from the data
  (bounded here with a random keep-first order, as dpcli bounds with its keyed one) plus Laplace noise
  of dpcli's scales (means: 32 noise draws per group); (2) the ``FINALISTS`` best grid points of each
  statistic (and metric) are released by dpcli in every repetition, and the oracle is the one with the
  smallest measured error (a slight advantage to the oracle: the least of a few noisy means).

``--emulate`` (for a build whose ``histogram`` does not take ``auto`` yet): auto's bounds from the library's
``choose_bounds`` at the default share, then a fixed release at the rest of ε.

Calls dpcli in-process (typer's CliRunner on ``dpcli.cli.app``): no 0.4 s start-up per release.
Usage: python bench/bench_auto.py [--units 50000] [--reps 8] [--epsilons 1,0.25] [--discover] [--emulate]
       [--shapes light,heavy,giant] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

GROUPS = 50
GIANT_ROWS = 50_000
GIANT_VALUE = 1e6
STATS = ("count", "sum", "mean")
COLUMNS = {"count": "count", "sum": "sum_v", "mean": "mean_v"}
K_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 50)
C_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)
LO_LEVELS = (0.0, 0.01, 0.05)  # 0.0: LO = 0 (every value is positive), else the true quantile
HI_LEVELS = (0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0)
FINALISTS = 3
MC_DRAWS = 32
TARGET = 1.5


# --- data -----------------------------------------------------------------------------------------

def _pick_groups(rng: np.random.Generator, per_unit: np.ndarray, skew: float) -> tuple[np.ndarray, np.ndarray]:
    """Distinct groups for each unit (``per_unit[i]`` of them, popularity ∝ rank^-skew): weighted
    sampling without replacement by exponential keys (Efraimidis–Spirakis), vectorised over units."""
    weights = 1.0 / np.arange(1, GROUPS + 1) ** skew
    keys = rng.exponential(size=(per_unit.size, GROUPS)) / weights
    order = np.argsort(keys, axis=1)
    take = np.arange(GROUPS)[None, :] < per_unit[:, None]
    units = np.repeat(np.arange(per_unit.size, dtype=np.int64), per_unit)
    return units, order[take]


def light(rng: np.random.Generator, units: int) -> pl.DataFrame:
    per_unit = rng.choice([1, 2], size=units, p=[0.7, 0.3])
    u, g = _pick_groups(rng, per_unit, 0.5)
    rows = rng.choice([1, 2, 3], size=u.size, p=[0.6, 0.3, 0.1])
    u, g = np.repeat(u, rows), np.repeat(g, rows)
    return _frame(u, g, rng.lognormal(3.0, 0.5, size=u.size))


def heavy(rng: np.random.Generator, units: int) -> pl.DataFrame:
    per_unit = np.minimum(rng.zipf(2.0, size=units), GROUPS)
    u, g = _pick_groups(rng, per_unit, 0.5)
    rows = np.minimum(rng.zipf(2.0, size=u.size), 10_000)
    u, g = np.repeat(u, rows), np.repeat(g, rows)
    return _frame(u, g, 10.0 * (rng.pareto(1.3, size=u.size) + 1.0))


def giant(rng: np.random.Generator, units: int) -> pl.DataFrame:
    base = light(rng, units - 1)
    g = np.arange(GIANT_ROWS) % GROUPS
    extra = _frame(np.full(GIANT_ROWS, units - 1, dtype=np.int64), g, np.full(GIANT_ROWS, GIANT_VALUE))
    return pl.concat([base, extra]).sample(fraction=1.0, shuffle=True, seed=3)


def _frame(u: np.ndarray, g: np.ndarray, v: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame({"u": u.astype(np.int64), "g": pl.Series(g.astype(np.int64)).map_elements(
        lambda x: f"g{x:02d}", return_dtype=pl.String), "v": np.round(v, 3)})


SHAPES = {"light": light, "heavy": heavy, "giant": giant}


def make_data(directory: Path, units: int) -> dict[str, pl.DataFrame]:
    """Each shape as ``<shape>.parquet`` (seed 33 + its index) and the public ``keys.csv``."""
    out = {}
    for i, (name, make) in enumerate(SHAPES.items()):
        path = directory / f"{name}.parquet"
        if not path.exists():
            make(np.random.default_rng(33 + i), units).write_parquet(path)
        out[name] = pl.read_parquet(path)
    pl.DataFrame({"g": [f"g{x:02d}" for x in range(GROUPS)]}).write_csv(directory / "keys.csv")
    return out


def describe(df: pl.DataFrame) -> str:
    pairs = df.group_by("u", "g").len()
    per_unit = pairs.group_by("u").agg(pl.len().alias("d"), pl.col("len").sum().alias("n"))
    q = df["v"].quantile
    return (f"{df.height:,} rows, {per_unit.height:,} units; groups per unit p50/p90/p99/max "
            f"{_qs(per_unit['d'])}; rows per (unit, group) {_qs(pairs['len'])}; v p1/p50/p99/max "
            f"{q(0.01):.3g}/{q(0.5):.3g}/{q(0.99):.3g}/{df['v'].max():.3g}")


def _qs(s: pl.Series) -> str:
    return "/".join(f"{s.quantile(p, 'nearest'):.0f}" for p in (0.5, 0.9, 0.99)) + f"/{s.max()}"


# --- truth and the oracle's screen ----------------------------------------------------------------

def truth(df: pl.DataFrame) -> dict[str, np.ndarray]:
    """The unbounded count, sum and mean of ``v`` per group, in group order g00…g49."""
    gi = df["g"].str.slice(1).cast(pl.Int64).to_numpy()
    v = df["v"].to_numpy()
    n = np.bincount(gi, minlength=GROUPS).astype(float)
    s = np.bincount(gi, weights=v, minlength=GROUPS)
    return {"count": n, "sum": s, "mean": s / np.maximum(n, 1)}


@dataclass(frozen=True)
class Fixed:
    """One grid point: fixed K, C and LO:HI (with the quantile levels they came from)."""

    k: int
    c: int
    lo: float
    hi: float
    levels: tuple[str, str]  # the quantiles LO and HI are (q: of rows, u: of units)

    def args(self) -> list[str]:
        return ["--max-partitions", str(self.k), "--max-contributions", str(self.c),
                "--bounds", f"{self.lo!r}:{self.hi!r}"]

    def text(self) -> str:
        return f"K={self.k} C={self.c} {_num(self.lo)}:{_num(self.hi)}"


AUTO_ARGS = ["--max-partitions", "auto", "--max-contributions", "auto", "--bounds", "auto"]


def _num(x: float) -> str:
    return f"{x:.4g}"


def _ranks(df: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    """The rows sorted by (group, value), with a random keep-first order: each row's rank in its
    (unit, group) (``__row``) and each pair's rank in its unit (``__pair``), from 0."""
    r = df.with_columns(pl.Series("__r", rng.random(df.height)))
    r = r.with_columns((pl.col("__r").rank("ordinal").over("u", "g") - 1).alias("__row"))
    pair = r.group_by("u", "g").agg(pl.col("__r").min().alias("__p"))
    pair = pair.with_columns((pl.col("__p").rank("ordinal").over("u") - 1).alias("__pair"))
    r = r.join(pair.select("u", "g", "__pair"), on=["u", "g"], how="left")
    return r.with_columns(pl.col("g").str.slice(1).cast(pl.Int64).alias("__g")).sort("__g", "v")


def _expected_abs(bias: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """E|b + L| for Laplace noise of ``scale``, averaged over groups (axis 0): |b| + s·exp(−|b|/s)."""
    b = np.abs(bias)
    out: np.ndarray = np.mean(b + scale * np.exp(-b / scale), axis=0)
    return out


def _clamped_sums(x: np.ndarray, starts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per group (rows ``starts[j]:starts[j+1]`` of ``x``, sorted within each group) and per bound pair,
    the sum of the values clamped to [lo, hi]: a (groups, pairs) matrix from prefix sums."""
    cs = np.concatenate([[0.0], np.cumsum(x)])
    out = np.empty((starts.size - 1, lo.size))
    for j in range(starts.size - 1):
        a, b = starts[j], starts[j + 1]
        il = a + np.searchsorted(x[a:b], lo, side="left")
        ih = a + np.searchsorted(x[a:b], hi, side="right")
        out[j] = lo * (il - a) + (cs[ih] - cs[il]) + hi * (b - ih)
    return out


def screen(df: pl.DataFrame, truths: dict[str, dict[str, np.ndarray]], epsilon: float, parts: int,
           rng: np.random.Generator) -> dict[tuple[str, str], list[tuple[float, Fixed]]]:
    """Expected error of every grid point, per (metric, statistic), best first. ``parts``: the number of
    measurements dpcli splits ε among (count, sum, centred sum; + unit counts when discovering)."""
    ranked = _ranks(df, rng)
    row_rank, pair_rank = ranked["__row"].to_numpy(), ranked["__pair"].to_numpy()
    gi, v = ranked["__g"].to_numpy(), ranked["v"].to_numpy()
    bounds = _bound_candidates(df)
    lo, hi = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
    mid, half, top = (lo + hi) / 2, (hi - lo) / 2, np.maximum(np.abs(lo), np.abs(hi))
    out: dict[tuple[str, str], list[tuple[float, Fixed]]] = {(m, s): [] for m in truths for s in STATS}
    noise = rng.laplace(size=(2, MC_DRAWS, GROUPS, 1))
    for k in K_GRID:
        for c in C_GRID:
            keep = (row_rank < c) & (pair_rank < k)
            g, x = gi[keep], v[keep]
            starts = np.searchsorted(g, np.arange(GROUPS + 1))
            n = np.diff(starts).astype(float)[:, None]  # (groups, 1)
            sums = _clamped_sums(x, starts, lo, hi)  # (groups, pairs)
            unit = k * c * parts / epsilon
            nn = np.maximum(n + noise[0] * unit, 1)
            means = np.clip(mid + (sums - n * mid + noise[1] * unit * half) / nn, lo, hi)  # (draws, groups, pairs)
            points = [Fixed(k, c, b[0], b[1], (b[2], b[3])) for b in bounds]
            for metric, t in truths.items():
                count = float(_expected_abs(n - t["count"][:, None], unit)[0])
                sum_err = _expected_abs(sums - t["sum"][:, None], unit * top)
                mean_err = np.mean(np.abs(means - t["mean"][None, :, None]), axis=(0, 1))
                for i, point in enumerate(points):
                    out[(metric, "count")].append((count, point))
                    out[(metric, "sum")].append((float(sum_err[i]), point))
                    out[(metric, "mean")].append((float(mean_err[i]), point))
    return {key: sorted(val, key=lambda p: p[0]) for key, val in out.items()}


def _bound_candidates(df: pl.DataFrame) -> list[tuple[float, float, str, str]]:
    """(LO, HI, their names) over true quantiles of ``v``: of the rows (``q``) and of the units (``u``: each
    unit's rows weigh 1/its rows, so a unit with many rows counts once, as in auto's one entry per unit).
    Level 0 is LO = 0 (every value is positive); level 1 is the maximum."""
    v = df["v"].to_numpy()
    per_row = 1.0 / df.select(pl.len().over("u")).to_series().to_numpy()
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(per_row[order])
    cum /= cum[-1]

    def at(level: float, by_unit: bool) -> float:
        if level == 0.0:
            return 0.0
        if not by_unit:
            return float(f"{np.quantile(v, level):.4g}")
        return float(f"{v[order][min(np.searchsorted(cum, level), v.size - 1)]:.4g}")

    out = set()
    for src in ("q", "u"):
        for lo in LO_LEVELS:
            for hi in HI_LEVELS:
                a, b = at(lo, src == "u"), at(hi, src == "u")
                if a < b:
                    out.add((a, b, "0" if lo == 0 else f"{src}{lo:g}", "max" if hi == 1 else f"{src}{hi:g}"))
    return sorted(out)


# --- dpcli, in-process ----------------------------------------------------------------------------

class Dpcli:
    """dpcli's CLI in this process: one state directory (and secret key) per repetition."""

    def __init__(self, reps: int) -> None:
        from typer.testing import CliRunner

        from dpcli.cli.app import app

        self.app, self.runner = app, CliRunner()
        self.states = [Path(tempfile.mkdtemp(prefix=f"dpcli-bench-auto-{r}-")) for r in range(reps)]
        self.out = Path(tempfile.mkdtemp(prefix="dpcli-bench-auto-out-")) / "out.csv"  # never in a state directory
        for state in self.states:
            self._invoke(state, ["budget", "init", "bench", "--mode", "approx", "--epsilon", "1e6", "--delta", "0.5"])

    def _invoke(self, state: Path, args: list[str]) -> Any:
        res = self.runner.invoke(self.app, ["--state-dir", str(state), "--analyst", "bench", *args])
        return res

    def histogram(self, rep: int, data: Path, bounds: list[str], epsilon: float,
                  discover: bool) -> tuple[pl.DataFrame, dict[str, Any]] | str:
        """The released table and the ``--json`` summary, or the error line when dpcli refuses."""
        out = self.out
        domain = ["--delta", "1e-6"] if discover else ["--keys", str(data.parent / "keys.csv")]
        res = self._invoke(self.states[rep], [
            "histogram", str(data), "--by", "g", "--privacy-unit", "u", "--agg", "count,sum,mean", "--value", "v",
            *bounds, "--epsilon", repr(epsilon), *domain, "-o", str(out), "--json"])
        if res.exit_code != 0:
            return (res.stderr or res.stdout).strip().splitlines()[-1] if (res.stderr or res.stdout) else "failed"
        return pl.read_csv(out), json.loads(res.stdout)


def errors(table: pl.DataFrame, truths: dict[str, dict[str, np.ndarray]]) -> dict[tuple[str, str], float]:
    """MAE over the released groups of each statistic, against each metric's truth."""
    gi = table["g"].str.slice(1).cast(pl.Int64).to_numpy()
    out = {}
    for metric, t in truths.items():
        for stat in STATS:
            released = table[COLUMNS[stat]].to_numpy().astype(float)
            out[(metric, stat)] = float(np.mean(np.abs(released - t[stat][gi]))) if gi.size else math.nan
    return out


@dataclass
class Measured:
    """Errors of one configuration over the repetitions (and what auto chose, per repetition)."""

    errors: list[dict[tuple[str, str], float]] = field(default_factory=list)
    chosen: list[dict[str, Any]] = field(default_factory=list)
    refused: str | None = None

    def mae(self, key: tuple[str, str]) -> float:
        return statistics.fmean(e[key] for e in self.errors) if self.errors else math.nan


def measure(dp: Dpcli, data: Path, bounds: list[str], epsilon: float, discover: bool,
            truths: dict[str, dict[str, np.ndarray]]) -> Measured:
    got = Measured()
    for rep in range(len(dp.states)):
        res = dp.histogram(rep, data, bounds, epsilon, discover)
        if isinstance(res, str):
            got.refused = res
            return got
        table, summary = res
        got.errors.append(errors(table, truths))
        got.chosen.append(summary.get("auto", {}))
    return got


def measure_emulated(dp: Dpcli, data: Path, epsilon: float, discover: bool,
                     truths: dict[str, dict[str, np.ndarray]]) -> Measured:
    """``auto`` before the histogram command takes it (``--emulate``): the library's
    :func:`dpcli.tasks.auto_bounds.choose_bounds` at the default share (ε·share/4 per quantile, on a keyed
    stream of the repetition's own), then a fixed-bound release at the rest of ε, through the CLI."""
    import hashlib
    from fractions import Fraction

    from dpcli.core.prf import KeyedStream
    from dpcli.tasks import auto_bounds as ab

    request = ab.AutoBounds(partitions=True, contributions=True, values=True)
    eps = Fraction(repr(epsilon))
    per_quantile = ab.pure_epsilon(eps, None, request.share, request.choices)
    got = Measured()
    for rep in range(len(dp.states)):
        seed = hashlib.sha256(f"bench-auto/{rep}/{data.name}/{epsilon!r}".encode()).digest()
        chosen = ab.choose_bounds(pl.scan_parquet(data), ab.DataShape("u", ("g",), "v"), request,
                                  ab.ChosenBounds(None, 1, None), per_quantile, KeyedStream(seed, "auto"),
                                  int.from_bytes(seed[:16], "little"))
        assert chosen.max_partitions is not None and chosen.bounds is not None
        fixed = Fixed(chosen.max_partitions, chosen.max_contributions, *chosen.bounds, ("auto", "auto"))
        res = dp.histogram(rep, data, fixed.args(), float(eps * (1 - request.share)), discover)
        if isinstance(res, str):
            got.refused = res
            return got
        got.errors.append(errors(res[0], truths))
        got.chosen.append(chosen.to_json())
    return got


def chosen_text(chosen: list[dict[str, Any]]) -> str:
    """Auto's choices over the repetitions: the median K, C, LO and HI (and their ranges)."""
    if not chosen or "max_partitions" not in chosen[0]:
        return "–"
    def med(xs: list[float]) -> str:
        span = f" ({_num(min(xs))}–{_num(max(xs))})" if min(xs) != max(xs) else ""
        return _num(statistics.median(xs)) + span

    k, c = [x["max_partitions"] for x in chosen], [x["max_contributions"] for x in chosen]
    lo, hi = [x["bounds"][0] for x in chosen], [x["bounds"][1] for x in chosen]
    return f"K={med(k)} C={med(c)} {med(lo)}:{med(hi)}"


# --- the benchmark --------------------------------------------------------------------------------

def run_shape(dp: Dpcli, name: str, df: pl.DataFrame, data: Path, epsilon: float, discover: bool,
              rng: np.random.Generator, emulate: bool) -> list[str]:
    """The table rows of one shape at one ε."""
    truths = {name: truth(df)}
    if name == "giant":
        truths["giant, others"] = truth(df.filter(pl.col("u") != df["u"].max()))
    parts = 4 if discover else 3
    screened = screen(df, truths, epsilon, parts, rng)
    finalists = {p for ranked in screened.values() for _, p in ranked[:FINALISTS]}
    fixed = {p: measure(dp, data, p.args(), epsilon, discover, truths) for p in sorted(finalists, key=Fixed.text)}
    if emulate:
        auto = measure_emulated(dp, data, epsilon, discover, truths)
    else:
        auto = measure(dp, data, AUTO_ARGS, epsilon, discover, truths)
    rows = []
    for metric in truths:
        for stat in STATS:
            key = (metric, stat)
            best = min(fixed, key=lambda p: fixed[p].mae(key))
            o, a = fixed[best].mae(key), auto.mae(key)
            if auto.refused:
                cell, ratio = f"not run: {auto.refused[:80]}", "–"
            else:
                ratio_v = a / o if o > 0 else math.inf
                cell, ratio = f"{a:.4g}", f"{ratio_v:.2f}× {'**met**' if ratio_v <= TARGET else 'not met'}"
            rows.append(f"| {metric} | {epsilon:g} | {stat} | {cell} | {o:.4g} | {ratio} | {chosen_text(auto.chosen)} "
                        f"| {best.text()} ({best.levels[0]}:{best.levels[1]}) |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--epsilons", default="1,0.25")
    ap.add_argument("--discover", action="store_true", help="no --keys: groups found from the data (δ = 1e-6)")
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--emulate", action="store_true",
                    help="auto through the library's choose_bounds and a fixed release (before histogram takes auto)")
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="dpcli-bench-auto-"))
    data.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    frames = make_data(data, args.units)
    dp = Dpcli(args.reps)
    rng = np.random.default_rng(0)  # the oracle's screen only (bounding order, noise draws of its model)
    print(f"{args.reps} repetitions, groups {'discovered (δ = 1e-6)' if args.discover else 'from --keys'}")
    for name in args.shapes.split(","):
        print(f"* {name}: {describe(frames[name])}")
    print("\n| shape (truth) | ε | statistic | auto MAE | oracle MAE | auto / oracle (target ≤ 1.5×) "
          "| auto chose (median over reps, range) | oracle's bounds (true quantiles) |")
    print("|---|---:|---|---:|---:|---|---|---|")
    for name in args.shapes.split(","):
        for eps in (float(e) for e in args.epsilons.split(",")):
            for row in run_shape(dp, name, frames[name], data / f"{name}.parquet", eps, args.discover, rng,
                                 args.emulate):
                print(row, flush=True)
    print(f"\n({time.perf_counter() - start:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
