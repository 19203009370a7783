"""Issue 38's accuracy bench: dpcli (default, auto, careful) and OpenDP, Tumult Analytics, PipelineDP.

    python -m bench.accuracy.run [--dpcli .venv/bin/dpcli] [--draws 10] [--only dpcli|peers|TOOL,...]
                                 [--venvs /work/venvs] [--data /work/data] [--reuse]

dpcli runs as a subprocess of the given binary (rerun it against another install with --dpcli); each
peer runs in its own venv (VENVS/opendp, VENVS/tumult, VENVS/pipelinedp: `make bench-accuracy`
creates them from bench/peers/requirements-*.txt); Tumult runs a second time on the means and medians
with its own `get_bounds` (shown in its cell, as the issue did). The raw releases of each tool go to
bench/accuracy/raw/TOOL.json; --reuse takes a tool's raw file when it holds at least --draws draws.
Tools not run keep their cells from the previous bench/accuracy/results.json, so `--only dpcli`
refreshes dpcli's columns only. Writes results.json and section 17 of bench/results.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from bench.accuracy import dpcli_runner, report, truth
from bench.accuracy.spec import QUERIES, input_path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# column -> (venv, script, extra arguments, raw file name)
PEER_SCRIPTS: dict[str, tuple[str, str, list[str], str]] = {
    "OpenDP": ("opendp", "peer_opendp.py", [], "opendp"),
    "Tumult Analytics": ("tumult", "peer_tumult.py", [], "tumult"),
    # Tumult's own value bounds for means and medians (shown beside its careful figure, as in the issue)
    "Tumult Analytics (get_bounds)": ("tumult", "peer_tumult.py",
                                      ["--get-bounds", "--only", "carrier_mean_delay,carrier_median_delay,acs_median_income"],
                                      "tumult_getbounds"),
    "PipelineDP": ("pipelinedp", "peer_pipelinedp.py", [], "pipelinedp"),
}


def _dpcli_version(exe: list[str]) -> str:
    p = subprocess.run([*exe, "--version"], capture_output=True, text=True, check=False, cwd=ROOT)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    said = (p.stdout or p.stderr).strip().splitlines()
    return f"{said[0] if said else '?'} (`{shlex.join(exe)}`, run from a checkout at git {head})"


def run_dpcli(exe: list[str], draws: int, work: Path, only: set[str] | None) -> dict[str, list[dict[str, Any]]]:
    """Raw releases of the three configurations: {column: [draw, ...]}."""
    out: dict[str, list[dict[str, Any]]] = {}
    for config in dpcli_runner.CONFIGS:
        out[f"dpcli {config}"] = []
        for d in range(draws):
            out[f"dpcli {config}"].append(dpcli_runner.run_draw(exe, config, work, only))
            print(f"dpcli {config}: draw {d + 1}/{draws}", file=sys.stderr, flush=True)
    return out


def run_peer(column: str, venvs: Path, draws: int, work: Path, raw: Path, reuse: bool) -> dict[str, Any] | None:
    """A peer's raw document (its own venv's python runs bench/accuracy/peer_*.py)."""
    venv, script, extra, name = PEER_SCRIPTS[column]
    target = raw / f"{name}.json"
    if reuse and target.exists():  # a variant's raw file may hold fewer draws (the get_bounds one: 5)
        doc: dict[str, Any] = json.loads(target.read_text())
        if len(doc["draws"]) >= draws or extra:
            return doc
    python = venvs / venv / "bin" / "python"
    if not python.exists():
        print(f"{column}: no {python} (make bench-accuracy creates it): skipped", file=sys.stderr)
        return None
    subprocess.run([str(python), str(HERE / script), str(work), "--draws", str(draws), "--out", str(target), *extra],
                   cwd=ROOT, check=True)
    return json.loads(target.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dpcli", default=str(ROOT / ".venv" / "bin" / "dpcli"),
                    help="the dpcli command: a binary, or e.g. '/path/python -m dpcli' (run from the repo root)")
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--only", default="", help="dpcli, peers, or tools (dpcli,opendp,tumult,pipelinedp)")
    ap.add_argument("--queries", default="", help="comma-separated query names (quick runs)")
    ap.add_argument("--venvs", type=Path, default=Path("/work/venvs"))
    ap.add_argument("--data", type=Path, default=truth.DATA)
    ap.add_argument("--raw", type=Path, default=HERE / "raw")
    ap.add_argument("--reuse", action="store_true", help="take a peer's raw file if it has enough draws")
    ap.add_argument("--json", type=Path, default=HERE / "results.json")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results.md")
    a = ap.parse_args()
    wanted = {s.strip().lower() for s in a.only.split(",") if s.strip()} or {"dpcli", "peers"}
    if "peers" in wanted:
        wanted |= {"opendp", "tumult", "pipelinedp"}
    queries = {s for s in a.queries.split(",") if s} or None
    a.raw.mkdir(parents=True, exist_ok=True)
    previous: dict[str, Any] = json.loads(a.json.read_text()) if a.json.exists() else {}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    doc: dict[str, Any] = {"date": now,
                           "cells": dict(previous.get("cells", {})), "versions": dict(previous.get("versions", {})),
                           "notes": dict(previous.get("notes", {})), "draws": dict(previous.get("draws", {}))}
    with tempfile.TemporaryDirectory(prefix="bench-accuracy-") as tmp:
        work = Path(tmp)
        truth.prepare(a.data, work)
        truths = {q.name: truth.truth(q, work) for q in QUERIES}
        doc["rows"] = {d: pl.scan_parquet(input_path(work, d)).select(pl.len()).collect().item()
                       for d in ("flights", "acs")}
        raws: dict[str, list[dict[str, Any]]] = {}
        if "dpcli" in wanted:
            exe = shlex.split(a.dpcli)
            raws.update(run_dpcli(exe, a.draws, work, queries))
            (a.raw / "dpcli.json").write_text(json.dumps(raws))
            for c in dpcli_runner.CONFIGS:
                doc["versions"][f"dpcli {c}"] = f"{_dpcli_version(exe)}, {a.draws} draws, run {now}"
        for column, (venv, *_) in PEER_SCRIPTS.items():
            if venv not in wanted:
                continue
            peer = run_peer(column, a.venvs, a.draws, work, a.raw, a.reuse)
            if peer is None:
                continue
            raws[column] = peer["draws"][: a.draws]
            ran = datetime.datetime.fromtimestamp((a.raw / f"{PEER_SCRIPTS[column][3]}.json").stat().st_mtime,
                                                  datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")  # reused: its file's
            doc["versions"][column] = f"{peer['tool']} {peer['version']}, {len(raws[column])} draws, run {ran}"
            doc["notes"][column] = peer["notes"]
    for column, draws in raws.items():
        cells = doc["cells"].setdefault(column, {})
        for q in QUERIES:
            if any(q.name in d for d in draws):
                cells[q.name] = report.evaluate(q, draws, truths[q.name])
        doc["draws"][column] = len(draws)
    a.json.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    section = report.markdown(doc)
    report.write_section(a.results, section)
    print(section)


if __name__ == "__main__":
    main()
