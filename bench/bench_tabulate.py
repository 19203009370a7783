"""Issue 41, item 1: `dpcli tabulate` against a plain polars pipeline computing the same exact counts.

The spec is ``sample_data/safetab_spec.toml`` (7 levels, 49 iterations, stability 9); the persons come
from ``scripts/make_sample_data.py``'s generator (the sample data's logic, any size: 1M, 10M, 30M),
kept in ``--data DIR`` between runs.

The **reference** (``plain_counts``) is the non-private pipeline someone would write with polars: read
the persons, split the race codes, join the public block list, match every iteration (codes exploded
per person, one flag per iteration, regrouped per person), keep each person's first s iterations of
a level, and count every level by geography, iteration, sex and *single year of age* (from which
every total and every Sex × Age marginal of every branch follows), all levels in one query,
written to Parquet. Before timing, its counts, binned, are checked equal to dpcli's own bounded counts
(:func:`dpcli.tasks.tabulate.level_counts`) at each size up to ``--check-up-to`` persons.

Both run as fresh processes, **interleaved** (reference, dpcli, reference, …: a change in the machine's
speed hits both alike), median of ``--runs`` runs after one warm-up of each: wall time, CPU time
(user + system) and peak RSS of the process, from ``wait4``. Every dpcli run is a real release
charged to a ledger (the spec with a new comment line each run: a new seed, a new charge).
``--collects`` counts polars queries in one in-process run (``LazyFrame.collect``, which eager
operations also call, and ``collect_all``). Target: ≤ 1.5× the reference at 1M and 10M persons;
30M persons at ≤ 16 GB peak RSS.

Usage: python bench/bench_tabulate.py [--persons 1000000,10000000] [--runs 5] [--data DIR] [--collects]
                                      [--before 'env PYTHONPATH=OLD/TREE python -m dpcli']
       python bench/bench_tabulate.py --reference PERSONS SPEC OUT   (one reference run, as timed)
The last line printed is the harness's (``bench/harness.py`` section 5).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "sample_data" / "safetab_spec.toml"
TARGET = 1.5


# ---- the reference ------------------------------------------------------------------------------


def _ranges(values: list[Any]) -> list[tuple[int, int]]:
    out = []
    for v in values:
        lo, _, hi = str(v).partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


def plain_counts(persons: str, spec_path: str) -> Any:
    """Every level's exact counts by (geo_id, iteration, sex, age): the reference. Two queries: the
    persons with their iterations (collected once: polars would otherwise recompute them for each
    level), then every level's counts."""
    import polars as pl

    spec = tomllib.loads(Path(spec_path).read_text())
    col, geo = spec["columns"], spec["geography"]["levels"]
    areas = sorted({g["column"] for g in geo.values() if "column" in g})
    blocks = pl.read_csv(Path(spec_path).parent / spec["geography"]["blocks"], infer_schema=False).select("block", *areas)
    iterations = {name: dict(sorted(its.items())) for name, its in spec["iterations"].items()}

    def in_ranges(expr: pl.Expr, values: list[Any]) -> pl.Expr:
        return pl.any_horizontal([expr.is_between(lo, hi) for lo, hi in _ranges(values)])

    race_its = [(code, it) for its in iterations.values() for code, it in its.items() if "race" in it]
    people = (pl.scan_parquet(persons)
              .select(pl.col(col["block"]).cast(pl.String).alias("block"), pl.col(col["race"]).str.split(";").alias("race"),
                      pl.col(col["ethnicity"]).cast(pl.Int64).alias("eth"), pl.col(col["sex"]).cast(pl.String).alias("sex"),
                      pl.col(col["age"]).cast(pl.Int64).alias("age"))
              .with_row_index("pid")  # before the join: its output order is not the file's
              .join(blocks.lazy(), on="block"))
    # One row per (person, race code), a flag per race iteration, regrouped per person: all() for
    # "alone", any() for "alone or in combination".
    codes = people.select("pid", "race").explode("race").with_columns(pl.col("race").cast(pl.Int64)).with_columns(
        in_ranges(pl.col("race"), it["race"]).alias(f"f_{code}") for code, it in race_its)
    flags = codes.group_by("pid").agg(
        (pl.col(f"f_{code}").all() if it.get("alone") else pl.col(f"f_{code}").any()) for code, it in race_its)
    matched = people.drop("race").join(flags, on="pid").with_columns(
        in_ranges(pl.col("eth"), it["ethnicity"]).alias(f"f_{code}")
        for its in iterations.values() for code, it in its.items() if "ethnicity" in it
    ).collect().lazy()  # once, not once per level
    parts = []
    for lv in spec["levels"]:
        g = geo[lv["geography"]]
        geo_id = (pl.lit("ALL") if g.get("prefix") == 0 else pl.col("block").str.slice(0, g["prefix"]) if "prefix" in g
                  else pl.when(pl.col(g["column"]) != "").then(pl.col(g["column"])))
        codes_of = list(iterations[lv["iterations"]])
        # Stability: a person keeps their first s iterations of the level (in code order), counted in `kept`.
        rows = matched.select(geo_id.alias("geo_id"), "sex", "age", *[f"f_{code}" for code in codes_of],
                              pl.lit(0, dtype=pl.Int32).alias("kept")).filter(pl.col("geo_id").is_not_null())
        for code in codes_of:
            rows = rows.with_columns((pl.col(f"f_{code}") & (pl.col("kept") < lv["stability"])).alias(code)).with_columns(
                pl.col("kept") + pl.col(code))
        parts.append(rows
                     .group_by("geo_id", "sex", "age").agg(pl.col(code).sum() for code in codes_of)
                     .unpivot(codes_of, index=["geo_id", "sex", "age"], variable_name="iteration", value_name="n")
                     .filter(pl.col("n") > 0).select(pl.lit(f"{lv['geography']}/{lv['iterations']}").alias("level"),
                                                     "geo_id", "iteration", "sex", "age", pl.col("n").cast(pl.UInt32)))
    return pl.concat(parts).collect()


def check_reference(persons: Path, spec_path: Path) -> None:
    """The reference's counts, binned to the spec's age bins, equal dpcli's bounded counts, level by level."""
    import polars as pl

    from dpcli.io.inputs import open_input
    from dpcli.tasks import tabulate as tab
    from dpcli.tasks.tabulate.query import load_spec

    spec = load_spec(str(spec_path))
    blocks = tab.read_blocks(spec, open_input(str(spec.blocks_file), text_columns=tuple(tab.block_columns(spec))).frame)
    counts = tab.level_counts(pl.scan_parquet(persons), spec, blocks, "persons")
    plain = plain_counts(str(persons), str(spec_path)).rename({"sex": "__sex", "age": "__age"})
    keys = ["geo_id", "iteration", "__sex", "__a0", "__a1", "__a2"]
    for level in spec.levels:
        want = (plain.filter(pl.col("level") == f"{level.geography}/{level.iterations}")
                .with_columns(tab._age_bin(edges).alias(f"__a{i}") for i, edges in enumerate(spec.age_bins))
                .group_by(keys).agg(pl.col("n").sum().cast(pl.Int64)).sort(keys))
        got = counts(level).sort(keys)
        if not got.equals(want):
            raise SystemExit(f"the reference's counts differ from dpcli's at level {level.index} ({persons})")


# ---- data and timing ----------------------------------------------------------------------------


def persons_file(data: Path, n: int) -> Path:
    """``persons.parquet`` (and ``blocks.csv``) of ``n`` persons in ``data/n``, generated once (zstd level 3
    above 1M persons: the rows are the same at any level)."""
    d = data / str(n)
    if not (d / "persons.parquet").exists():
        d.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        code = (f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); from pathlib import Path; "
                f"from make_sample_data import persons; persons(Path({str(d)!r}), {n}, {19 if n <= 1_000_000 else 3})")
        subprocess.run([sys.executable, "-c", code], check=True)  # in a child, as the check (below)
        print(f"generated {n:,} persons in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    shutil.copy(SPEC, d / "safetab_spec.toml")
    return d / "persons.parquet"


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Wall and CPU (user + system) seconds and peak RSS (MiB) of one child process; fails loudly."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def count_collects(persons: Path, env: dict[str, str], out: Path) -> str:
    """Polars queries in one in-process `dpcli tabulate` run (a child interpreter, patched polars): lazy
    queries collected, and eager operations (each a small query of its own, ``LazyFrame._collect_eager``)."""
    code = f"""
import sys, polars as pl
n = {{"collect": 0, "collect_all": 0, "eager": 0}}
c, ca, ce = pl.LazyFrame.collect, pl.collect_all, pl.LazyFrame._collect_eager
def collect(self, *a, **k):
    n["collect"] += 1; return c(self, *a, **k)
def collect_all(*a, **k):
    n["collect_all"] += 1; return ca(*a, **k)
def eager(self, *a, **k):
    n["eager"] += 1; return ce(self, *a, **k)
pl.LazyFrame.collect, pl.collect_all, pl.LazyFrame._collect_eager = collect, collect_all, eager
from dpcli.cli.app import main
sys.argv = ["dpcli", "tabulate", {str(persons)!r}, "--spec", {str(persons.with_name("safetab_spec.toml"))!r}, "-o", {str(out)!r}]
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
print(n["collect"], n["collect_all"], n["eager"], file=sys.stderr)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    one, many, eager = r.stderr.strip().splitlines()[-1].split()
    return f"{one} `LazyFrame.collect` + {many} `collect_all`, and {eager} eager DataFrame operations"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--persons", default="1000000", help="comma-separated sizes, e.g. 1000000,10000000,30000000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--data", default=None, help="directory for the generated persons (kept between runs)")
    ap.add_argument("--check-up-to", type=int, default=10_000_000, help="check the reference against dpcli up to this size")
    ap.add_argument("--collects", action="store_true", help="count dpcli's polars queries (one extra run per size)")
    ap.add_argument("--before", default=None,
                    help="another dpcli, as a command line (e.g. 'env PYTHONPATH=/old/tree python -m dpcli'), interleaved as 'before'")
    ap.add_argument("--check", nargs=2, metavar=("PERSONS", "SPEC"), help="check the reference against dpcli's counts")
    ap.add_argument("--reference", nargs=3, metavar=("PERSONS", "SPEC", "OUT"), help="one reference run (what is timed)")
    args = ap.parse_args()
    if args.reference:
        plain_counts(args.reference[0], args.reference[1]).write_parquet(args.reference[2])
        return
    if args.check:
        check_reference(Path(args.check[0]), Path(args.check[1]))
        return

    dpcli = str(Path(sys.executable).with_name("dpcli"))
    sizes = [int(s) for s in args.persons.split(",")]
    lines = ["| persons | reference (plain polars) | dpcli tabulate | ratio (wall) | ratio (CPU) | target |",
             "|---:|---|---|---:|---:|---|"]
    last = ""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = Path(args.data) if args.data else work / "data"
        env = {**os.environ, "DPCLI_STATE_DIR": str(work / "state"), "DPCLI_ANALYST": "bench"}
        subprocess.run([dpcli, "budget", "init", "bench", "--mode", "pure", "--epsilon", "1000000"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        runs = itertools.count()
        for n in sizes:
            persons = persons_file(data, n)
            if n <= args.check_up_to:  # in a child: this process stays small (a child's peak RSS counts its parent's at fork)
                subprocess.run([sys.executable, __file__, "--check", str(persons), str(persons.with_name("safetab_spec.toml"))],
                               check=True, env=env)

            def release(prefix: list[str], persons: Path = persons) -> list[str]:
                spec = work / f"spec_{next(runs)}.toml"  # a new spec's bytes, a new seed: a real release each run
                spec.write_text(SPEC.read_text().replace("blocks.csv", str(persons.with_name("blocks.csv"))) + f"# {spec.name}\n")
                return [*prefix, "tabulate", str(persons), "--spec", str(spec), "-o", str(work / "cells.parquet")]

            def reference_cmd(persons: Path = persons) -> list[str]:
                return [sys.executable, __file__, "--reference", str(persons), str(persons.with_name("safetab_spec.toml")),
                        str(work / "plain.parquet")]

            cmds: dict[str, Callable[[], list[str]]] = {"reference": reference_cmd, "dpcli": lambda: release([dpcli])}
            if args.before:
                cmds["before"] = lambda: release(shlex.split(args.before))
            for make in cmds.values():  # warm-up
                run_once(make(), env)
            got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cmds}
            load = os.getloadavg()[0]
            for _ in range(args.runs):
                for label, make in cmds.items():
                    got[label].append(run_once(make(), env))
            med = {k: tuple(statistics.median(r[i] for r in v) for i in range(3)) for k, v in got.items()}
            (rw, rc, rm), (dw, dc, dm) = med["reference"], med["dpcli"]
            ratio = dw / rw
            met = ratio <= TARGET if n <= 10_000_000 else dm <= 16 * 1024
            target = f"≤ {TARGET}×" if n <= 10_000_000 else "≤ 16 GB peak RSS"
            if args.before:
                bw, bc, bm = med["before"]
                lines.append(f"| {n:,} | (before) | {bw:.2f} s (CPU {bc:.2f} s, {bm:,.0f} MiB) | {bw / rw:.2f}× | {bc / rc:.2f}× | |")
            lines.append(f"| {n:,} | {rw:.2f} s (CPU {rc:.2f} s, {rm:,.0f} MiB) | {dw:.2f} s (CPU {dc:.2f} s, {dm:,.0f} MiB) "
                         f"| **{ratio:.2f}×** | {dc / rc:.2f}× | {target} **{'met' if met else 'missed'}** |")
            print(lines[-1] + f" (load {load:.1f} → {os.getloadavg()[0]:.1f})", file=sys.stderr)
            if args.collects:
                lines.append(f"|  | dpcli's polars queries: {count_collects(persons, env, work / 'cells.parquet')} | | | | |")
            if not last:
                last = (f"tabulate: {n:,} persons × 7 levels: {dw:.1f} s, peak RSS {dm:.0f} MiB "
                        f"({ratio:.2f}× the plain polars reference, {rw:.1f} s)")
    print("\n".join(lines))
    print()
    print(last)


if __name__ == "__main__":
    main()
