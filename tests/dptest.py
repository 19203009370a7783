"""Helpers shared by the test files (importable as ``dptest``: ``tests/`` is on pytest's pythonpath).

One builder per idea: an in-memory input table, a keyed stream from any label, the CLI runner and
the analyst's ledger history as the CLI prints it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import polars as pl
from typer.testing import CliRunner

from dpcli.cli.app import app
from dpcli.core.prf import KeyedStream

runner = CliRunner()


def table(df: pl.DataFrame) -> pl.LazyFrame:
    """An in-memory input as the tasks take it: a lazy frame."""
    return df.lazy()


def stream(i: Any, label: str = "t") -> KeyedStream:
    """A keyed stream whose seed is the SHA-256 of ``repr(i)`` (tests only; releases derive theirs from the key)."""
    return KeyedStream(hashlib.sha256(repr(i).encode()).digest(), label)


def cli(*args: Any) -> Any:
    """Run ``dpcli ARGS`` in process; the typer result (exit_code, stdout, stderr)."""
    return runner.invoke(app, [str(a) for a in args])


def history(analyst: str = "default") -> list[dict[str, Any]]:
    """The analyst's ledger entries, from ``dpcli budget history --json``."""
    return json.loads(cli("budget", "history", analyst, "--json").stdout)


#: Units in :func:`one_group_csv`'s files (the input attacks): each has one row in the file's group.
N_UNITS = 200


def one_group_csv(group: str, extra: int = 0) -> str:
    """A CSV of ``N_UNITS + extra`` units (``user``), one row each, all in group ``g`` = ``group``."""
    return "user,g\n" + "".join(f"u{i},{group}\n" for i in range(N_UNITS + extra))


def init_pure_ledger(epsilon: str = "50") -> None:
    """``dpcli budget init default --mode pure --epsilon EPSILON`` (asserted to succeed)."""
    r = cli("budget", "init", "default", "--mode", "pure", "--epsilon", epsilon)
    assert r.exit_code == 0, r.stderr


#: Notes computed from a release's noisy output (post-processing, see dpcli.advice): they may differ
#: between two releases exactly as the released values do.
OUTPUT_NOTES = ("is mostly noise", "groups released: no group")


def without_output_notes(stderr: str) -> str:
    """``stderr`` without the notes computed from the released values (all other lines kept)."""
    return "".join(ln for ln in stderr.splitlines(keepends=True) if not any(n in ln for n in OUTPUT_NOTES))


def dataset(tmp_path: Path, name: str) -> Path:
    """The sample page views as a dataset directory ``tmp_path/big``: three Parquet files named
    ``name.format(i=…)``, one in a hive-style subdirectory, and a ``_SUCCESS`` marker."""
    big = tmp_path / "big"
    (big / "day=2").mkdir(parents=True)
    views = Path(__file__).resolve().parent.parent / "sample_data" / "page_views.parquet"
    for i, part in enumerate(pl.read_parquet(views).iter_slices(100_000)):
        part.write_parquet(big / ("day=2" if i % 2 else "") / name.format(i=i))
    (big / "_SUCCESS").write_text("")
    return big
