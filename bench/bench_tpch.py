"""Issue 41 item 5: ``dpcli sql`` on TPC-H (``make bench-tpch``), against the plain query and the bounded pipeline.

Data from ``tpchgen-cli`` (the bench's own venv, ``.venv-tpch``: tpchgen-cli and duckdb are no dependencies of
dpcli) at each ``--scale`` (default 1 and 10), as Parquet in ``--data``/sf{N}, made once. The queries and their
bounds: :mod:`bench.tpch.queries` (the DuckDB privacy extension's DP set, Q1, Q5, Q6, Q14, Q19, the customer the
privacy unit). Four programs per query, each a fresh process, **interleaved** (DuckDB, polars, by hand, dpcli,
DuckDB, …), one warm-up round then ``--runs`` rounds, the median of each:

* **plain DuckDB**: the standard TPC-H text over the Parquet files (:mod:`bench.tpch.plain_duckdb`);
* **plain polars**: the same query in lazy, streaming polars (:mod:`bench.tpch.plain_polars`);
* **by hand**: the bounded per-customer pipeline in polars, every step dpcli's rules require, no noise
  (:mod:`bench.tpch.hand`; ``--check`` first holds its totals equal to dpcli's per-user stage at one salt);
* **dpcli sql**: a real release, charged to a ledger (a new ε each run: never a free replay).

Wall seconds, CPU seconds (user + system) and peak RSS from ``os.wait4``; the 1-minute load average before and
after the runs. Targets (issue 41 item 3): dpcli ≤ 1.3× by hand and ≤ 3× plain DuckDB on every query.

Usage: python bench/bench_tpch.py [--scale 1,10] [--runs 5] [--only Q1,Q5] [--data DIR] [--check]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "tpch"))
sys.path.insert(0, str(HERE))
from bench_sql import run_once  # noqa: E402  (wall, CPU and peak RSS of one child, as bench-sql measures)
from queries import QUERIES, dpcli_args  # noqa: E402

TPCH_PYTHON = ROOT / ".venv-tpch" / "bin" / "python"
PROGRAMS = ("duckdb", "polars", "hand", "dpcli")
HAND_TARGET, DUCKDB_TARGET = 1.3, 3.0

Run = tuple[float, float, float]  # wall s, CPU s, peak RSS MiB


def make_data(tpch_python: Path, directory: Path, scale: int) -> None:
    """The eight tables at ``scale`` as Parquet, unless they are there."""
    if (directory / "lineitem.parquet").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    cli = tpch_python.with_name("tpchgen-cli")
    subprocess.run([str(cli), "parquet", "-s", str(scale), "--output-dir", str(directory)], check=True)


def commands(query: str, data: Path, tpch_python: Path, eps: str, out: Path) -> dict[str, list[str]]:
    py, tpch = sys.executable, HERE / "tpch"
    dpcli = str(Path(sys.executable).with_name("dpcli"))
    return {"duckdb": [str(tpch_python), str(tpch / "plain_duckdb.py"), query, str(data)],
            "polars": [py, str(tpch / "plain_polars.py"), query, str(data)],
            "hand": [py, str(tpch / "hand.py"), query, str(data)],
            "dpcli": [dpcli, *dpcli_args(query, str(data), eps), "-o", str(out)]}


def measure(query: str, data: Path, tpch_python: Path, runs: int, env: dict[str, str], serial: list[int]
            ) -> dict[str, list[Run]]:
    times: dict[str, list[Run]] = {p: [] for p in PROGRAMS}
    for i in range(runs + 1):  # round 0 warms the page cache and the bytecode
        serial[0] += 1
        eps = f"1.{serial[0]:06d}"
        cmds = commands(query, data, tpch_python, eps, data / f"out-{query}.csv")
        for program in PROGRAMS:
            got = run_once(cmds[program], env)
            if i:
                times[program].append(got)
    return times


def _cell(m: list[float]) -> str:
    return f"{m[0]:.2f} s ({m[1]:.2f} CPU, {m[2]:.0f} MiB)"


def row(query: str, scale: int, times: dict[str, list[Run]], load: tuple[float, float]) -> str:
    med = {p: [statistics.median(r[i] for r in v) for i in range(3)] for p, v in times.items()}
    vs_hand, vs_duck = med["dpcli"][0] / med["hand"][0], med["dpcli"][0] / med["duckdb"][0]
    cpu_hand = med["dpcli"][1] / med["hand"][1]
    marks = [f"{vs_hand:.2f}× {'**met**' if vs_hand <= HAND_TARGET else 'not met'} (CPU {cpu_hand:.2f}×)",
             f"{vs_duck:.2f}× {'**met**' if vs_duck <= DUCKDB_TARGET else 'not met'}"]
    return (f"| {query} | SF{scale} | {' | '.join(_cell(med[p]) for p in PROGRAMS)} | {' | '.join(marks)} "
            f"| {load[0]:.1f} → {load[1]:.1f} |")


HEADER = ("| query | scale | plain DuckDB | plain polars | bounded by hand (polars) | dpcli sql "
          f"| dpcli / by hand (≤ {HAND_TARGET}×) | dpcli / DuckDB (≤ {DUCKDB_TARGET:.0f}×) | load |\n"
          "|---|---|---:|---:|---:|---:|---|---|---|")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="1,10")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default=",".join(QUERIES))
    ap.add_argument("--data", type=Path, default=ROOT / ".bench-tpch-data")
    ap.add_argument("--tpch-python", type=Path, default=TPCH_PYTHON)
    ap.add_argument("--check", action="store_true", help="first hold the hand pipelines' totals equal to dpcli's")
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="dpcli-bench-tpch-state-"))
    env = {**os.environ, "DPCLI_STATE_DIR": str(state), "DPCLI_ANALYST": "bench", "OPENBLAS_NUM_THREADS": "1"}
    # bytecode written as an installed dpcli has it (the warm-up round writes it): with PYTHONDONTWRITEBYTECODE
    # every dpcli run would compile its modules from source, ~0.15 s that no installed copy pays
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    dpcli = str(Path(sys.executable).with_name("dpcli"))
    subprocess.run([dpcli, "budget", "init", "bench", "--mode", "approx", "--epsilon", "1e6", "--delta", "0.5"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    queries, serial = args.only.split(","), [0]
    print(HEADER, flush=True)
    for scale in (int(s) for s in args.scale.split(",")):
        data = args.data / f"sf{scale}"
        make_data(args.tpch_python, data, scale)
        if args.check:
            subprocess.run([sys.executable, str(HERE / "tpch" / "check.py"), str(data), *queries], check=True)
        for query in queries:
            before = os.getloadavg()[0]
            times = measure(query, data, args.tpch_python, args.runs, env, serial)
            print(row(query, scale, times, (before, os.getloadavg()[0])), flush=True)


if __name__ == "__main__":
    main()
