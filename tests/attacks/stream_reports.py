"""What ``dpcli stream-replay`` makes public, on D and on a neighbour D′ (issue 15, findings 3, 4 and 9).

Shared by rule 3's report test (one more unit), rule 4's bad-record tests and rule 7's extreme options:
D is three pages of 100 units a day over two days; :func:`_run` runs a command in a fresh state
directory on data written to one path and returns everything public (exit code, stderr, ledger
summaries, the ``--json`` summary).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from dptest import init_ledger, runner

from dpcli.cli.app import app

BASE = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "6h",
        "--max-contributions", "3", "--epsilon", "4", "--delta", "1e-9"]
THROUGH = "2026-11-10T00:00:00"


def _rows(extra: list[dict] | None = None, first: list[dict] | None = None, value: bool = False) -> pl.DataFrame:
    """D: three pages of 100 units a day over two days (released); ``extra`` rows appended, ``first`` prepended."""
    rows = [{"ts": f"2026-11-0{1 + i % 2}T{(i * 5) % 24:02d}:{i % 60:02d}:00", "user": f"u{i}", "page": f"p{i % 3}",
             "v": float(i % 7)} for i in range(600)]
    rows = (first or []) + rows + (extra or [])
    df = pl.DataFrame(rows, schema={"ts": pl.String, "user": pl.String, "page": pl.String, "v": pl.Float64})
    return df if value else df.drop("v")


def _write(tmp: Path, name: str, df: pl.DataFrame) -> Path:
    path = tmp / name
    df.write_csv(path)
    return path


def _run(monkeypatch, tmp: Path, tag: str, argv: list[str], state_file: Path | None = None,
         setup: list[list[str]] = (), data: pl.DataFrame | None = None) -> dict:
    """Run argv (after ``setup`` runs) in a fresh state dir, with ``data`` written to tmp/data.csv first
    (the same path for D and D′: it appears in messages); return everything public."""
    if data is not None:
        _write(tmp, "data.csv", data)
    monkeypatch.setenv("DPCLI_STATE_DIR", str(tmp / f"state-{tag}"))
    if state_file is not None and state_file.exists():
        state_file.unlink()
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    for cmd in setup:
        r = runner.invoke(app, cmd)
        assert r.exit_code == 0, r.stderr
    r = runner.invoke(app, argv)
    history = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
    out = {"exit": r.exit_code, "stderr": r.stderr, "ledger": [e.get("summary") for e in history]}
    if r.exit_code == 0 and "--json" in argv:
        doc = json.loads(r.stdout)
        out["summary"] = doc["summary"]
    return out


def _differs(a: dict, b: dict) -> list[tuple[str, object, object]]:
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


NEWCOMER = {"user": "newcomer", "page": "solo", "v": 1.0}
