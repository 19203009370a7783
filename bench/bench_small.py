"""Issue 30, item 5: dpcli's fixed cost per run, where it shows (start-up, small and medium inputs).

Three workloads, each a dpcli command against the plain pipeline that computes the same
non-private answer, in fresh processes, **interleaved** (plain, dpcli, plain, dpcli, …: a change
in the machine's speed hits both alike), median of ``--runs`` runs after one warm-up of each:

1. ``histogram``, 3M rows (``bench/synthetic.py`` with seed 0, the harness's generator): ``dpcli
   histogram --by key --privacy-unit user_id --max-partitions 32`` (the harness's workload 1)
   against the harness's plain polars pipeline (``PLAIN_HIST``: the same dedupe, cap and group-by,
   no noise). Target ≤ 1.3×.
2. ``histogram``, 2,000 rows (the same generator): the same command against ``python -c "import
   polars, numpy"``, the least any process that reads the file with polars and draws noise with
   numpy can cost. Target ≤ 1.5×.
3. ``topk -k 100 --max-groups 1000``, 10M rows of the third generator (``synthetic.py --pages``:
   about 0.94M pages with Zipf–Mandelbrot popularity, log-normal user activity) against the
   harness's ``PLAIN_TOPK`` (distinct users per page, top 1000). Target ≤ 1.3×.

4. ``histogram``, the issue 41 item 4 figure: ``dpcli histogram tiny.csv --by country --privacy-unit user_id
   --epsilon 0.001 --delta 1e-9 -o out.csv`` on 2,000 rows (500 users, 7 countries, :func:`tiny_csv`), default
   caps (so ``auto`` and the bias report run too), against ``python -c "import polars, numpy"``. Target ≤ 1.5×.

5. ``topk`` as in 3, on 10M rows of the fourth generator (``synthetic.py --heavy``, issue 41 item 6: users'
   record counts P(n) ∝ (n + 1.656)^-2.2 on [1, 10^5], one user per ten rows, keys P(r) ∝ (r + 1000)^-1.4 over
   as many keys as users, ids permuted, rows shuffled) against the same ``PLAIN_TOPK``. Target ≤ 1.3×.

Every dpcli run is a real release charged to a ledger (a fresh ε each time). Wall time and CPU
time (user + system, from ``wait4``) of each process; the CPU time is the steadier figure on a
shared machine, but the targets are on wall time. ``--before DPCLI`` interleaves another install's
console script as a third command (e.g. the previous commit's, in its own venv), so before and
after are measured in the same run. Bytecode caching is on (as after an install).

Usage: python bench/bench_small.py [--runs 9] [--before PATH/TO/dpcli] [--data DIR] [--only 3m,2k,tiny,topk,heavy]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import PLAIN_HIST, PLAIN_TOPK  # noqa: E402

IMPORTS = "import polars, numpy"
TARGETS = {"3m": 1.3, "2k": 1.5, "tiny": 1.5, "topk": 1.3, "heavy": 1.3}


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one child process; fails loudly."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


class Dpcli:
    """One dpcli install (its console script) with its own state directory and ledger."""

    def __init__(self, script: str, state: Path, env: dict[str, str]) -> None:
        self.script, self.eps = script, 0
        self.env = {**env, "DPCLI_STATE_DIR": str(state), "DPCLI_ANALYST": "bench"}
        python = Path(script).with_name("python")
        package = subprocess.run([str(python), "-c", "import dpcli, os; print(os.path.dirname(dpcli.__file__))"],
                                 capture_output=True, text=True, check=True, env=self.env).stdout.strip()
        subprocess.run([str(python), "-m", "compileall", "-q", package], check=True, env=self.env,
                       stdout=subprocess.DEVNULL)
        subprocess.run([script, "budget", "init", "bench", "--mode", "approx", "--epsilon", "1e6", "--delta", "0.5"],
                       check=True, env=self.env, stdout=subprocess.DEVNULL)

    def fresh_eps(self) -> str:
        self.eps += 1
        return f"1.{self.eps:05d}"  # a new ε per run: every run is a real, charged release

    def histogram(self, path: Path) -> list[str]:
        return [self.script, "histogram", str(path), "--by", "key", "--privacy-unit", "user_id",
                "--max-partitions", "32", "--epsilon", self.fresh_eps(), "--delta", "1e-9"]

    def tiny(self, path: Path, out: Path) -> list[str]:
        eps = f"0.001{self.fresh_eps()[2:]}"  # 0.001 and a fresh tail: a new release every run
        return [self.script, "histogram", str(path), "--by", "country", "--privacy-unit", "user_id",
                "--epsilon", eps, "--delta", "1e-9", "-o", str(out)]

    def topk(self, path: Path) -> list[str]:
        return [self.script, "topk", str(path), "--by", "key", "-k", "100", "--max-groups", "1000",
                "--privacy-unit", "user_id", "--epsilon-per", self.fresh_eps(), "--delta", "1e-9"]


#: A command to run: a function giving its argv and environment (a fresh ε each time for dpcli).
Command = Callable[[], tuple[list[str], dict[str, str]]]


def interleave(cmds: dict[str, Command], runs: int) -> dict[str, list[tuple[float, float]]]:
    """Each command once as a warm-up, then ``runs`` rounds of all of them in turn."""
    for make in cmds.values():
        run_once(*make())
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
    for _ in range(runs):
        for label, make in cmds.items():
            out[label].append(run_once(*make()))
    return out


def tiny_csv(directory: Path) -> Path:
    """2,000 rows of (user_id, country): 500 users, 7 countries, uniform, seed 0 (issue 41 item 4)."""
    path = directory / "tiny.csv"
    if not path.exists():
        import numpy as np
        import polars as pl

        rng = np.random.default_rng(0)
        countries = np.array(["BR", "DE", "FR", "GB", "IN", "JP", "US"])
        pl.DataFrame({"user_id": rng.integers(0, 500, 2000),
                      "country": countries[rng.integers(0, 7, 2000)]}).write_csv(path)
    return path


def data(directory: Path, name: str, args: list[str]) -> Path:
    path = directory / name
    if not path.exists():
        subprocess.run([sys.executable, str(HERE / "synthetic.py"), str(path), *args], check=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--before", default=None, help="another dpcli console script, measured interleaved as 'before'")
    ap.add_argument("--data", default=None, help="directory for the data files (kept between runs)")
    ap.add_argument("--only", default="3m,2k,tiny,topk")
    a = ap.parse_args()
    unset = ("PYTHONDONTWRITEBYTECODE", "DPCLI_STATE_DIR", "DPCLI_ANALYST")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    python = sys.executable
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        directory = Path(a.data) if a.data else Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        after = Dpcli(str(Path(python).with_name("dpcli")), Path(tmp) / "state-after", env)
        before = Dpcli(a.before, Path(tmp) / "state-before", env) if a.before else None
        workloads: dict[str, tuple[str, list[str], Callable[[Dpcli], list[str]]]] = {}
        only = a.only.split(",")
        if "3m" in only:
            p3 = data(directory, "events_3000000.parquet", ["3000000", "--seed", "0"])
            workloads["3m"] = ("histogram, 3M rows", [python, "-c", PLAIN_HIST, str(p3)], lambda d: d.histogram(p3))
        if "2k" in only:
            p2 = data(directory, "events_2000.parquet", ["2000", "--seed", "0"])
            workloads["2k"] = ("histogram, 2,000 rows", [python, "-c", IMPORTS], lambda d: d.histogram(p2))
        if "tiny" in only:
            pc, out = tiny_csv(directory), Path(tmp) / "out.csv"
            workloads["tiny"] = ("histogram tiny.csv, 2,000 rows, ε 0.001, -o", [python, "-c", IMPORTS],
                                 lambda d: d.tiny(pc, out))
        if "topk" in only:
            pt = data(directory, "pages_10000000.parquet", ["10000000", "--pages"])
            workloads["topk"] = ("topk, 10M rows, ~0.94M pages", [python, "-c", PLAIN_TOPK, str(pt)],
                                 lambda d: d.topk(pt))
        if "heavy" in only:
            ph = data(directory, "heavy_10000000.parquet", ["10000000", "--heavy"])
            workloads["heavy"] = ("topk, 10M rows, heavy-tailed users, ~0.58M keys",
                                  [python, "-c", PLAIN_TOPK, str(ph)], lambda d: d.topk(ph))
        rows = []
        for key, (label, reference, command) in workloads.items():
            print(f"{label} …", file=sys.stderr)
            cmds: dict[str, Command] = {"reference": lambda r=reference: (r, env)}
            for name, install in (("before", before), ("after", after)):
                if install is not None:
                    cmds[name] = lambda c=command, d=install: (c(d), d.env)
            res = interleave(cmds, a.runs)
            ref_wall = statistics.median(w for w, _ in res["reference"])
            ref_cpu = statistics.median(c for _, c in res["reference"])
            for name, values in res.items():
                wall = statistics.median(w for w, _ in values)
                cpu = statistics.median(c for _, c in values)
                verdict = ""
                if name != "reference":
                    verdict = "met" if wall / ref_wall <= TARGETS[key] else "missed"
                target = f"≤ {TARGETS[key]:.1f}× {verdict}" if name != "reference" else ""
                rows.append(f"| {label} | {name} | {wall:.3f} | {wall / ref_wall:.2f}× | {cpu:.3f} | "
                            f"{cpu / ref_cpu:.2f}× | {target} |")
        print(f"\n{a.runs} interleaved runs, medians; load average at the end: "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
        print("| workload | command | wall s | wall ratio | CPU s | CPU ratio | target |")
        print("|---|---|---:|---:|---:|---:|---|")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
