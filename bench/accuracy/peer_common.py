"""What the peer scripts share (standard library only): arguments, the output document, errors per query."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: bench.accuracy.spec

from bench.accuracy.spec import QUERIES, Query


def main(tool: str, version: str, notes: list[str], run_query: Callable[[Query, Path], dict[str, Any]]) -> None:
    """Run every query (or --only ones) --draws times; write {tool, version, notes, draws: [...]}."""
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path, help="directory with the prepared inputs (bench/accuracy/truth.py)")
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated query names")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    only = {s for s in a.only.split(",") if s}
    draws = []
    for d in range(a.draws):
        res: dict[str, Any] = {}
        for q in QUERIES:
            if only and q.name not in only:
                continue
            try:
                res[q.name] = run_query(q, a.work)
            except Exception as e:  # noqa: BLE001  a peer's failure is a result of the table, not a crash of the harness
                traceback.print_exc()
                res[q.name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
        draws.append(res)
        print(f"{tool}: draw {d + 1}/{a.draws}", file=sys.stderr, flush=True)
    a.out.write_text(json.dumps({"tool": tool, "version": version, "notes": notes, "draws": draws}))


def group_map(rows: list[tuple[Any, ...]]) -> dict[str, float | None]:
    """{group key: value} from rows (by values..., value)."""
    from bench.accuracy.spec import group_key

    return {group_key(list(r[:-1])): (None if r[-1] is None else float(r[-1])) for r in rows}
