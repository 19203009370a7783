"""dpcli's three configurations, each query a `dpcli` subprocess (any install: --dpcli PATH).

* ``default``: no caps or bounds (histogram chooses what is left out, as ``auto``, where it can);
* ``auto``: every bound ``auto`` (caps and value bounds);
* ``careful``: the caps of bench/accuracy/spec.py.
The command is an argument list: a binary (``.venv/bin/dpcli``) or ``python -m dpcli`` (run from the
repo root, so it imports this checkout's dpcli).
Every draw gets a fresh DPCLI_STATE_DIR (a fresh key, hence fresh noise) and its own ledger.
Results are read from ``-o FILE.csv`` and the ``--json`` summary (the caps the release used).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from bench.accuracy.spec import DELTA_TOPK, EPSILON, QUERIES, TOP_K, UNIT, Query, group_key, input_path

CONFIGS = ("default", "auto", "careful")
ROOT = Path(__file__).resolve().parents[2]  # the cwd of every dpcli call (`python -m dpcli` imports this tree)
AGG = {"count": "count", "sum": "sum", "mean": "mean", "median": "median"}


def _bounds(q: Query) -> str:
    assert q.bounds is not None
    return f"{q.bounds[0]:g}:{q.bounds[1]:g}"


def histogram_args(q: Query, config: str, work: Path) -> list[str]:
    """The `dpcli histogram` command line of one query and configuration (keys public)."""
    args = ["histogram", str(input_path(work, q.dataset)), "--by", ",".join(q.by), "--privacy-unit", UNIT[q.dataset],
            "--agg", AGG[q.stat], "--keys", str(work / str(q.keys)), "--epsilon", f"{EPSILON:g}"]
    if q.stat != "median":  # margins for the coverage figures; a quantile's interval would take half its share
        args.append("--with-error")
    if q.value:
        args += ["--value", q.value]
        if config != "default":
            args += ["--bounds", "auto" if config == "auto" else _bounds(q)]
    if config == "auto":
        args += ["--max-partitions", "auto", "--max-contributions", "auto"]
    elif config == "careful":
        args += ["--max-partitions", str(q.max_partitions), "--max-contributions", str(q.max_contributions)]
    return args


def topk_args(q: Query, config: str, work: Path, *, listed: bool) -> list[str]:
    """`dpcli topk`: default counts units (τ = 1); auto and careful count rows under τ."""
    args = ["topk", str(input_path(work, q.dataset)), "--by", ",".join(q.by), "-k", str(TOP_K),
            "--privacy-unit", UNIT[q.dataset], "--epsilon", f"{EPSILON:g}"]
    args += ["--keys", str(work / str(q.keys))] if listed else ["--delta", f"{DELTA_TOPK:g}"]
    if config == "auto":
        args += ["--count", "rows", "--max-contributions", "auto"]
    elif config == "careful":
        args += ["--count", "rows", "--max-contributions", str(q.max_contributions)]
    return args


class Dpcli:
    """Runs dpcli commands in one fresh state directory (one draw)."""

    def __init__(self, exe: list[str], state: Path, outdir: Path) -> None:
        self.exe, self.state, self.outdir = exe, state, outdir  # outputs may not lie inside the state
        self.env = {**os.environ, "DPCLI_STATE_DIR": str(state), "DPCLI_ANALYST": "bench", "OPENBLAS_NUM_THREADS": "1"}
        self._run(["budget", "init", "bench", "--mode", "approx", "--epsilon", "1000", "--delta", "0.01"])

    def _run(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.exe, *args], env=self.env, capture_output=True, text=True, check=False,
                              cwd=ROOT)

    def release(self, args: list[str], by: tuple[str, ...]) -> dict[str, Any]:
        """Run one release to a CSV; {'rows': frame or None, 'summary': --json dict, 'error': str | None}."""
        with tempfile.TemporaryDirectory(dir=self.outdir) as tmp:
            out = Path(tmp) / "out.csv"
            p = self._run([*args, "-o", str(out), "--json"])
            if p.returncode != 0 or not out.exists():
                err = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
                return {"rows": None, "summary": {}, "error": err[:200]}
            frame = pl.read_csv(out, schema_overrides=dict.fromkeys(by, pl.String))
            try:
                summary = json.loads(p.stdout)
            except json.JSONDecodeError:
                summary = {}
            return {"rows": frame, "summary": summary, "error": None}


def _values(frame: pl.DataFrame, by: tuple[str, ...]) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """(group -> released value, group -> 95% margin) from a histogram CSV."""
    value_col = next(c for c in frame.columns if c not in by and not c.endswith("_moe95"))
    moe_col = next((c for c in frame.columns if c.endswith("_moe95")), None)
    keys = [group_key(list(r)) for r in frame.select(by).iter_rows()]
    vals = dict(zip(keys, frame[value_col].cast(pl.Float64).to_list(), strict=True))
    moes = dict(zip(keys, frame[moe_col].cast(pl.Float64).to_list(), strict=True)) if moe_col else {}
    return vals, moes


def run_draw(exe: list[str], config: str, work: Path, only: set[str] | None = None) -> dict[str, Any]:
    """One draw of every query in one configuration: query name -> released values (JSON-ready)."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dpcli-acc-") as tmp:
        (Path(tmp) / "state").mkdir()
        (Path(tmp) / "out").mkdir()
        d = Dpcli(exe, Path(tmp) / "state", Path(tmp) / "out")
        for q in QUERIES:
            if only and q.name not in only:
                continue
            if q.stat == "topk":
                res = {}
                for listed in (False, True):
                    r = d.release(topk_args(q, config, work, listed=listed), q.by)
                    tag = "listed" if listed else "unlisted"
                    res[tag] = None if r["rows"] is None else [group_key(list(x)) for x in r["rows"].select(q.by).iter_rows()]
                    res[f"{tag}_error"] = r["error"]
                out[q.name] = res
                continue
            r = d.release(histogram_args(q, config, work), q.by)
            if r["rows"] is None:
                out[q.name] = {"error": r["error"]}
                continue
            vals, moes = _values(r["rows"], q.by)
            s = r["summary"]
            out[q.name] = {"values": vals, "moe": moes, "max_partitions": s.get("max_partitions"),
                           "max_contributions": s.get("max_contributions"), "bounds": s.get("bounds")}
    return out
