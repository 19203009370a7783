"""Schedule state: which epochs/runs of a scheduled query happened, and the cached release.

Layout: ``schedules/ANALYST/KEY.json`` (the state, a checked document of
:mod:`dpcli.state.documents`) and ``KEY.run-N.parquet`` (the release of run
N), where KEY hashes the schedule name and the canonical query without its
input file, so the same daily job finds its schedule. The state is written
(atomically, under ``KEY.json.lock``) *before* a release is output, so a crash
can never lead to two different releases for one epoch.

Each run records its input's fingerprint (and ``through``, the ``--through`` moment, when given); calls
answered with an earlier run's release are listed in ``answers`` (fingerprint, ``through``, the run), so a
retry gets the same release (issue 31; states written before have no ``answers``: an empty list).

States written before issue 29 also hold exact row counts (``n0``, each run's ``size``); dpcli
never shows or uses them (docs/commands/schedules.md, "Schedules made before noisy sizes").

The state is bound to the analyst's ledger: it records the ``analyst``, the
``ledger_id``, a random ``reservation`` id (its entry in the ledger) and a random
``secret`` keying the input digests recorded with each run (see
:mod:`dpcli.state.ledger`, reservations and steps). It is first saved, with no
runs, just before the reservation is debited; after that each run is recorded
in the ledger first, then saved here, then output.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # polars only where a cached release is read (`budget show` stays fast)
    import polars as pl

from dpcli.core.prf import canonical_json
from dpcli.errors import StateError
from dpcli.state import documents
from dpcli.state.atomic import atomic_write_bytes
from dpcli.state.paths import validate_analyst

KIND = "dpcli-schedule"


def schedule_key(name: str, query: dict[str, Any]) -> str:
    """The id of a schedule: its name plus the canonical query (input file excluded)."""
    return hashlib.sha256(canonical_json({"schedule": name, "query": query})).hexdigest()[:24]


def _dir(root: Path, analyst: str) -> Path:
    d = root / "schedules" / validate_analyst(analyst)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


@contextmanager
def locked(root: Path, analyst: str, key: str, timeout: float) -> Iterator[Path]:
    """Hold the schedule's lock; yields its directory."""
    d = _dir(root, analyst)
    with documents.locked(d / f"{key}.json", timeout):
        yield d


def load(directory: Path, key: str) -> dict[str, Any] | None:
    """The schedule state, or None if the schedule has never run (a damaged file: StateError, never reset)."""
    return documents.read(directory / f"{key}.json", KIND)


def peek(root: Path, analyst: str, key: str) -> dict[str, Any] | None:
    """The schedule state, read without its lock and without creating anything (a dry run's look), or None."""
    return documents.read(root / "schedules" / validate_analyst(analyst) / f"{key}.json", KIND)


def save(directory: Path, key: str, state: dict[str, Any], release: pl.DataFrame | None = None) -> None:
    """Write the cached release of the newest run (if given), then the state, both atomically."""
    if release is not None:
        buf = io.BytesIO()
        release.write_parquet(buf)
        atomic_write_bytes(directory / f"{key}.run-{len(state['runs'])}.parquet", buf.getvalue())
    documents.write(directory / f"{key}.json", KIND, state)


def cached_release(directory: Path, key: str, run: int) -> pl.DataFrame:
    import polars as pl

    path = directory / f"{key}.run-{run}.parquet"
    try:
        return pl.read_parquet(path.read_bytes())  # bytes, not the path: polars would expand globs in it
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise StateError(f"cached release {path} is missing or corrupt ({type(exc).__name__})") from None


def all_schedules(root: Path, analyst: str) -> list[dict[str, Any]]:
    """Every schedule of an analyst (for ``budget show``)."""
    d = root / "schedules" / analyst
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json")):
        data = load(d, p.stem)
        if data is not None:
            out.append(data)
    return out


def summaries(root: Path, analyst: str) -> list[dict[str, Any]]:
    """What ``budget show`` lists for each schedule: runs, epochs, ε spent and reserved."""
    from fractions import Fraction

    from dpcli.core.exact import fraction_text

    out = []
    for st in all_schedules(root, analyst):
        spec = st["spec"]
        runs = st["runs"]
        out.append(
            {
                "name": spec["name"],
                "scheduler": spec["scheduler"],
                "command": st["command"],
                "runs": len(runs),
                # calls answered with an earlier release (a new input or moment given one, free: "not yet",
                # a backfill, the same input again), each counted once
                "answered": len(st.get("answers", [])),
                "epochs": [r["epoch"] for r in runs] if spec["scheduler"] == "bbscheduler" else None,
                # releases and the noisy size estimates (bbscheduler) together; no size is listed
                "epsilon_spent": fraction_text(sum((Fraction(r["epsilon"]) + Fraction(r.get("size_epsilon", 0))
                                                    for r in runs), Fraction(0))),
                "epsilon_reserved": spec["total_epsilon"],
                "delta_reserved": spec["total_delta"],
            }
        )
    return out
