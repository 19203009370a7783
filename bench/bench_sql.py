"""Issue 32: ``dpcli sql`` on a join-and-aggregate query at 10M rows, against the same plain polars query.

Data (made once in ``--data``, deterministic): ``events`` (``bench/synthetic.py``'s generator, seed 0:
user_id, key, value over 10^6 keys), a public table ``keys`` (key → one of 40 categories) and a
private table ``users`` (user_id → one of 12 segments). Two queries, each timed in fresh processes,
**interleaved** (plain, dpcli, plain, dpcli, …), median of ``--runs`` after one warm-up of each:

* ``public``: events joined with the public ``keys`` on ``key``, per category: ANON_COUNT(*, 8) and
  ANON_SUM(value, 0, 100), at most 4 categories per user; plain: the same join and group-by.
* ``private``: events joined with the private ``users`` ``USING (user_id)``, per segment:
  ANON_COUNT(*, 8) and ANON_AVG(value, 0, 100); plain: the same join and group-by.

The plain query is what an engineer writes in polars for the same (non-private) answer; dpcli adds
the per-user stage (a group-by of every row by user and partition), the K-partition sample,
thresholding and noise. Every dpcli run is a real release, charged (a fresh ε each time). With
``--peer PYTHON`` the ``public`` query also runs in SmartNoise SQL (a venv with ``smartnoise-sql``;
its pandas reader at ``--peer-rows`` rows, its documented metadata form).

Usage: python bench/bench_sql.py [--rows 10000000] [--runs 5] [--data DIR] [--peer PYTHON] [--peer-rows 1000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

QUERIES = {
    "public": ("SELECT k.category, ANON_COUNT(*, 8) AS n, ANON_SUM(value, 0, 100) AS total FROM events e "
               "JOIN keys k ON e.key = k.key GROUP BY k.category"),
    "private": ("SELECT u.segment, ANON_COUNT(*, 8) AS n, ANON_AVG(value, 0, 100) AS mean FROM events e "
                "JOIN users u USING (user_id) GROUP BY u.segment"),
}
PLAIN = {
    "public": ("import polars as pl; e = pl.scan_parquet('{d}/events.parquet'); k = pl.scan_parquet('{d}/keys.parquet');"
               "print(e.join(k, on='key').group_by('category').agg(pl.len(), pl.col('value').sum())"
               ".collect(engine='streaming'))"),
    "private": ("import polars as pl; e = pl.scan_parquet('{d}/events.parquet'); u = pl.scan_parquet('{d}/users.parquet');"
                "print(e.join(u, on='user_id').group_by('segment').agg(pl.len(), pl.col('value').mean())"
                ".collect(engine='streaming'))"),
}
#: The same per-user stage and bound written by hand in polars (no resolver, no noise): what dpcli's own
#: overhead is measured against (the convention of the histogram benchmarks: "plain polars, bounded").
BOUNDED = (
    "import polars as pl; from dpcli.bounding.keyed_order import keep_first;"
    "e = pl.scan_parquet('{d}/events.parquet'); t = pl.scan_parquet('{d}/{table}.parquet');"
    "p = e.join(t, on='{on}').group_by('user_id', '{by}').agg(pl.len().clip(upper_bound=8).alias('n'), {partial});"
    "s = p.collect_schema();"
    "p = keep_first(p, ['user_id'], [('user_id', s['user_id']), ('{by}', s['{by}'])], 12345, 'groups', 4);"
    "print(p.group_by('{by}').agg(pl.len(), pl.col('n').sum(), pl.col('v').sum()).collect(engine='streaming'))"
)
BOUNDED_ARGS = {
    "public": {"table": "keys", "on": "key", "by": "category",
               "partial": "(pl.col('value').sum() / 2**-5).round().clip(0, 3200).alias('v')"},
    "private": {"table": "users", "on": "user_id", "by": "segment",
                "partial": "(pl.col('value').mean() / 2**-5).round().clip(0, 3200).alias('v')"},
}
TARGET = 1.3


def make_data(directory: Path, rows: int) -> None:
    """events (10M rows by default), keys (public) and users (private), as Parquet."""
    import numpy as np
    import polars as pl
    from synthetic import events_with_rows

    if (directory / "events.parquet").exists():
        return
    events = events_with_rows(rows, seed=0).select("user_id", "key", "value")
    events.write_parquet(directory / "events.parquet", row_group_size=1_000_000)
    keys = np.arange(10**6, dtype=np.int64)
    pl.DataFrame({"key": keys, "category": [f"c{k % 40:02d}" for k in keys]}).write_parquet(directory / "keys.parquet")
    users = events["user_id"].unique().sort()
    pl.DataFrame({"user_id": users, "segment": (users % 12).cast(pl.Int64)}).write_parquet(directory / "users.parquet")


def _made_apart(directory: Path, rows: int) -> None:
    """:func:`make_data` in a process of its own: a child forked from a parent holding the generated data
    would start with its memory, and report it as its own peak."""
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import bench_sql, pathlib; " \
           f"bench_sql.make_data(pathlib.Path({str(directory)!r}), {rows})"
    subprocess.run([sys.executable, "-c", code], check=True)


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def dpcli_command(name: str, data: Path, eps: int) -> list[str]:
    dpcli = str(Path(sys.executable).with_name("dpcli"))
    tables = ["--table", f"events={data / 'events.parquet'}", "--privacy-unit", "events.user_id"]
    if name == "public":
        tables += ["--public-table", f"keys={data / 'keys.parquet'}"]
    else:
        tables += ["--table", f"users={data / 'users.parquet'}", "--privacy-unit", "users.user_id"]
    return [dpcli, "sql", QUERIES[name], *tables, "--max-partitions", "4", "--epsilon", f"1.{eps:05d}",
            "--delta", "1e-9", "-o", str(data / f"out-{name}.csv")]


def measure(name: str, data: Path, runs: int, env: dict[str, str]) -> dict[str, list[tuple[float, float, float]]]:
    commands = {"plain": [sys.executable, "-c", PLAIN[name].format(d=data)],
                "bounded": [sys.executable, "-c", BOUNDED.format(d=data, **BOUNDED_ARGS[name])]}
    times: dict[str, list[tuple[float, float, float]]] = {"plain": [], "bounded": [], "dpcli": []}
    for i in range(runs + 1):  # run 0 warms the page cache and the bytecode; then interleaved
        got = {k: run_once(c, env) for k, c in commands.items()}
        got["dpcli"] = run_once(dpcli_command(name, data, i + 1 + (100 if name == "private" else 0)), env)
        if i:
            for k, v in got.items():
                times[k].append(v)
    return times


PEER = r'''
import sys, time, pandas as pd, snsql
mode, d = sys.argv[1], sys.argv[2]
e = pd.read_parquet(d + "/events.parquet")
k = pd.read_parquet(d + "/keys.parquet")
meta = {"Collection": {"bench": {"events": {"row_privacy": False, "max_ids": 4, "user_id": {"name": "user_id",
        "type": "int", "private_id": True}, "key": {"type": "int"}, "value": {"type": "int", "lower": 0, "upper": 100}},
        "keys": {"key": {"type": "int"}, "category": {"type": "string"}}}}}
reader = snsql.from_df({"bench.events": e, "bench.keys": k}, privacy=snsql.Privacy(epsilon=1.0, delta=1e-9),
                       metadata=meta)
queries = {"join": "SELECT k.category, COUNT(*) AS n, SUM(e.value) AS total FROM bench.events AS e "
                   "JOIN bench.keys AS k ON e.key = k.key GROUP BY k.category",
           "total": "SELECT COUNT(*) AS n, SUM(value) AS total FROM bench.events"}
try:
    print(reader.execute(queries[mode]))
except Exception as exc:  # the peer's own limitation, reported as such
    print("peer refused:", type(exc).__name__, str(exc)[:300]); sys.exit(3)
'''
TOTAL = "SELECT ANON_COUNT(*, 8) AS n, ANON_SUM(value, 0, 100) AS total FROM events"
PLAIN_TOTAL = ("import polars as pl; print(pl.scan_parquet('{d}/events.parquet').select(pl.len(), pl.col('value').sum())"
               ".collect(engine='streaming'))")


def peer_lines(python: str, data: Path, env: dict[str, str]) -> list[str]:
    """SmartNoise SQL at ``data``'s rows: the join query (or why not), and the query without the join
    against dpcli's and plain polars' (one run each, after a warm-up)."""
    lines = []
    for mode in ("join", "total"):
        proc = subprocess.run([python, "-c", PEER, mode, str(data)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            lines.append(f"* SmartNoise SQL, {mode} query: did not run: "
                         f"{(proc.stdout + proc.stderr).strip().splitlines()[-1][:200]}")
    dpcli = str(Path(sys.executable).with_name("dpcli"))
    commands = {
        "SmartNoise SQL (pandas reader)": [python, "-c", PEER, "total", str(data)],
        "dpcli sql": [dpcli, "sql", TOTAL, "--table", f"events={data / 'events.parquet'}", "--privacy-unit",
                      "events.user_id", "--epsilon", "1.5", "-o", str(data / "out-total.csv")],
        "plain polars": [sys.executable, "-c", PLAIN_TOTAL.format(d=data)],
    }
    for name, cmd in commands.items():
        try:
            run_once(cmd, env)
            wall, cpu, rss = run_once(cmd, env)
        except SystemExit:
            lines.append(f"* {name}, the query without the join: failed")
            continue
        lines.append(f"* {name}, the query without the join: {wall:.2f} s wall ({cpu:.2f} s CPU), {rss:.0f} MiB")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--peer", default=None)
    ap.add_argument("--peer-rows", type=int, default=1_000_000)
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="dpcli-bench-sql-"))
    data.mkdir(parents=True, exist_ok=True)
    _made_apart(data, args.rows)
    state = Path(tempfile.mkdtemp(prefix="dpcli-bench-sql-state-"))
    env = {**os.environ, "DPCLI_STATE_DIR": str(state), "DPCLI_ANALYST": "bench", "OPENBLAS_NUM_THREADS": "1"}
    dpcli = str(Path(sys.executable).with_name("dpcli"))
    subprocess.run([dpcli, "budget", "init", "bench", "--mode", "approx", "--epsilon", "1e6", "--delta", "0.5"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    print("| query | rows | plain polars query | the same, with the per-user stage and bound by hand | dpcli sql "
          f"| dpcli vs plain | dpcli vs bounded by hand (target ≤ {TARGET}×) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in QUERIES:
        t = measure(name, data, args.runs, env)
        med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in t.items()}
        cells = [f"{m[0]:.2f} s ({m[1]:.2f} CPU, {m[2]:.0f} MiB)" for m in med.values()]
        vs_plain, vs_bounded = med["dpcli"][0] / med["plain"][0], med["dpcli"][0] / med["bounded"][0]
        print(f"| {name} | {args.rows:,} | {' | '.join(cells)} | {vs_plain:.2f}× | {vs_bounded:.2f}× "
              f"{'**met**' if vs_bounded <= TARGET else 'not met'} |")
    if args.peer:
        small = data / f"peer-{args.peer_rows}"
        small.mkdir(exist_ok=True)
        _made_apart(small, args.peer_rows)
        print(f"\nAt {args.peer_rows:,} rows:")
        print("\n".join(peer_lines(args.peer, small, env)))


if __name__ == "__main__":
    main()
