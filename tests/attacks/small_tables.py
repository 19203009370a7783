"""Small CSV inputs of the review of issue 15: ``uid,g,v`` rows (units ``0…n-1`` in groups 0, 1, 2).
"""

from __future__ import annotations

from pathlib import Path


def csv_rows(n: int) -> list[str]:
    return ["uid,g,v"] + [f"{i},{i % 3},{i % 7}" for i in range(n)]


def write(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n")
    return path
