"""Issue 38: ``histogram`` ``auto`` on heavy-tailed data at a small ε, against the best fixed bounds.

Data (numpy's seeded generator makes the data only): 5,000 units, groups per unit Zipf(2) (at most 20, the public
``--keys`` list), rows per (unit, group) Zipf(2) (at most 100), values 10·(Pareto(1.3) + 1) rounded to 0.001 and at
most 1.2e4. Query: ``--agg count,sum --value v`` at ε 0.25.

* ``auto``: every bound ``auto`` (default share), one release per fresh state directory (its own key).
* ``best fixed``: a small screen of fixed K × C × HI (HI at true quantiles of the values, LO = 0) released by
  dpcli in a few draws each, the least median error kept per statistic (an oracle: it reads the data).

Reported: the median over releases of each statistic's median relative error over groups (raw truth, no bound),
the worst release's ratio to the best fixed, how many releases exceed 5× it, and how many chose value limits
disjoint from the data's range [min, max].

``--exact``: also the exact probability (the walk's pmf, tests/audit/abovethreshold_exact.py) that the HI walk
stops below the smallest value, the only way the limits can miss the data here (LO starts at 0, below every value),
at a few K, C and the allowance the error model gives them.

Usage: PYTHONPATH=. python bench/bench_auto_heavy.py [--releases 200] [--epsilon 0.25] [--exact]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

UNITS, GROUPS = 5_000, 20


def data(directory: Path) -> pl.DataFrame:
    rng = np.random.default_rng(38)
    per_unit = np.minimum(rng.zipf(2.0, size=UNITS), GROUPS)
    keys = rng.exponential(size=(UNITS, GROUPS)) / (1.0 / np.arange(1, GROUPS + 1) ** 0.5)
    order = np.argsort(keys, axis=1)
    take = np.arange(GROUPS)[None, :] < per_unit[:, None]
    u, g = np.repeat(np.arange(UNITS), per_unit), order[take]
    rows = np.minimum(rng.zipf(2.0, size=u.size), 100)
    u, g = np.repeat(u, rows), np.repeat(g, rows)
    v = np.round(np.minimum(10.0 * (rng.pareto(1.3, size=u.size) + 1.0), 12_000.0), 3)
    df = pl.DataFrame({"u": u.astype(np.int64), "g": [f"g{x:02d}" for x in g], "v": v})
    df.write_parquet(directory / "heavy.parquet")
    pl.DataFrame({"g": [f"g{x:02d}" for x in range(GROUPS)]}).write_csv(directory / "keys.csv")
    return df


class Dpcli:
    def __init__(self) -> None:
        from typer.testing import CliRunner

        from dpcli.cli.app import app

        self.app, self.runner = app, CliRunner()
        self.out = Path(tempfile.mkdtemp(prefix="dpcli-bench-heavy-out-")) / "out.csv"

    def release(self, args: list[str]) -> tuple[pl.DataFrame, dict[str, Any]]:
        state = tempfile.mkdtemp(prefix="dpcli-bench-heavy-")
        base = ["--state-dir", state, "--analyst", "bench"]
        self.runner.invoke(self.app, [*base, "budget", "init", "bench", "--mode", "pure", "--epsilon", "1e6"])
        res = self.runner.invoke(self.app, [*base, *args, "-o", str(self.out), "--json"])
        if res.exit_code != 0:
            raise SystemExit(f"dpcli failed: {args}\n{res.stdout}{res.stderr}")
        return pl.read_csv(self.out), json.loads(res.stdout)


def errors(table: pl.DataFrame, truth: pl.DataFrame) -> dict[str, float]:
    j = truth.join(table, on="g", how="left").fill_null(0)
    return {s: float(np.median(np.abs(j[c].to_numpy() - j[f"t_{s}"].to_numpy()) / j[f"t_{s}"].to_numpy()))
            for s, c in (("count", "count"), ("sum", "sum_v"))}


def exact_disjoint(df: pl.DataFrame, epsilon: float) -> None:
    import sys
    from fractions import Fraction

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "audit"))
    from abovethreshold_exact import first_within_pmf

    from dpcli.tasks import auto_bounds as ab
    from dpcli.tasks.auto_bounds import choose

    shape = ab.DataShape("u", ("g",), "v")
    parts = ab.model_parts(ab.AutoBounds(True, True, True), True)
    walk = Fraction(epsilon).limit_denominator(10**6) * ab.AUTO_SHARE / parts * ab.VALUE_WEIGHT
    noise = 2 / (epsilon * (1 - float(ab.AUTO_SHARE)))  # count and sum at half the release's ε each
    smallest = float(df["v"].min())  # type: ignore[arg-type]
    for k, c in ((1, 4), (2, 8), (4, 32)):
        rows = choose._kept_values(df.lazy(), shape, ab.ChosenBounds(k, c, None), 7)
        at_most, _ = choose._value_counts(choose._value_entries(rows, shape, 7), "heavy")
        held = rows.select(pl.len()).collect().item() / UNITS
        allowed = min(ab.ErrorModel(GROUPS, noise).allowed(k * c, held), UNITS // 8)
        p = first_within_pmf(at_most[-1] - at_most[ab.ZERO:-1], allowed, 1, walk, ab.VALUE_SLACK)
        cands = np.array(ab.VALUE_CANDIDATES[ab.ZERO:ab.ZERO + p.size])
        print(f"exact, K {k} C {c} (allowed {allowed}): P[HI below the smallest value] = {p[cands < smallest].sum():.2e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--releases", type=int, default=200)
    ap.add_argument("--epsilon", type=float, default=0.25)
    ap.add_argument("--fixed-draws", type=int, default=3)
    ap.add_argument("--exact", action="store_true")
    args = ap.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="dpcli-bench-heavy-data-"))
    df = data(directory)
    if args.exact:
        exact_disjoint(df, args.epsilon)
    lo_v, hi_v = float(df["v"].min()), float(df["v"].max())  # type: ignore[arg-type]
    truth = df.group_by("g").agg(pl.len().cast(pl.Float64).alias("t_count"), pl.col("v").sum().alias("t_sum"))
    print(f"data: {df.height} rows, {UNITS} units, values {lo_v:g}…{hi_v:g}")
    dp = Dpcli()
    base = ["histogram", str(directory / "heavy.parquet"), "--by", "g", "--privacy-unit", "u", "--agg", "count,sum",
            "--value", "v", "--keys", str(directory / "keys.csv"), "--epsilon", repr(args.epsilon)]
    best = {"count": float("inf"), "sum": float("inf")}
    his = [float(df["v"].quantile(q)) for q in (0.9, 0.99)] + [hi_v]  # type: ignore[arg-type]
    for k, c, hi in itertools.product((1, 2, 4), (2, 8, 32), his):
        fixed = ["--max-partitions", str(k), "--max-contributions", str(c), "--bounds", f"0:{hi:.6g}"]
        errs = [errors(dp.release([*base, *fixed])[0], truth) for _ in range(args.fixed_draws)]
        for s in best:
            best[s] = min(best[s], statistics.median(e[s] for e in errs))
    print(f"best fixed: count {best['count']:.2%}, sum {best['sum']:.2%}")
    auto = ["--max-partitions", "auto", "--max-contributions", "auto", "--bounds", "auto"]
    got: list[dict[str, float]] = []
    chosen: list[Any] = []
    disjoint = 0
    for _ in range(args.releases):
        table, summary = dp.release([*base, *auto])
        got.append(errors(table, truth))
        chosen.append(summary["auto"])
        lo, hi = summary["auto"]["bounds"]
        disjoint += int(hi < lo_v or lo > hi_v)
    if not got:
        return
    for s in best:
        ratios = [g[s] / best[s] for g in got]
        print(f"auto {s}: median error {statistics.median(g[s] for g in got):.2%}, worst release "
              f"{max(ratios):.2f}× best fixed, releases above 5×: {sum(r > 5 for r in ratios)} of {len(got)}"
              + "".join(f"; {chosen[i]}" for i, r in enumerate(ratios) if r > 5))
    print(f"limits disjoint from [{lo_v:g}, {hi_v:g}]: {disjoint} of {len(got)}")


if __name__ == "__main__":
    main()
