"""Golden releases: every command, with a fixed secret key, gives byte-identical output.

Recorded before the issue-16 refactor ("one shape for every command") and kept
afterwards: a restructuring of the code must not change a single released
value, summary field or ledger line for the same key, query and data.
Re-recorded for seed material v2 (issue 29: the seed binds each input's reading
and the calibration), which changed every seed, so every noisy value and seed
id, and nothing else; and for v3 (issue 37: the seed binds what each release
reads of its inputs), likewise, and for v4 (issue 38: the versions of the rules
that choose bounds and report what they cut): ``seed-v2.json`` keeps the digest of each v2
file, and :func:`test_golden_release_under_its_v2_seed` shows the v2 bytes come
back when the v2 seed is forced. The
recorded documents live in ``tests/golden/``; after a deliberate change of
semantics (which must also change the seed material, e.g. ``bounding.SEMANTICS``)
re-record them with ``DPCLI_GOLDEN_RECORD=1 pytest tests/test_golden.py`` and
say why in the commit.

Volatile fields are normalised: ledger entry times, the reservation id of
stream/schedule state files, and the test's temporary directory. The random
tokens of new state files come from a counter (``secrets.token_hex`` is
patched), so a refactor must keep calling it through the module, in order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dptest import runner

from dpcli.cli.app import app
from dpcli.release import seeds

GOLDEN = Path(__file__).parent / "golden"
SAMPLE = Path(__file__).parent.parent / "sample_data"
RECORD = os.environ.get("DPCLI_GOLDEN_RECORD") == "1"
#: A fixed key (never used outside tests): the only source of randomness of a release.
FIXED_KEY = b"dpcli-secret-key-v1\n" + bytes(range(32)).hex().encode() + b"\n"



def _snapshots(tmp: Path) -> list[Path]:
    """Three growing daily snapshots of the sample page views (for the schedules)."""
    views = pl.read_parquet(SAMPLE / "page_views.parquet")
    out = []
    for i, n in enumerate((4000, 6000, 9000)):
        p = tmp / f"snap{i}.parquet"
        views.head(n).write_parquet(p)
        out.append(p)
    return out


def _stream_days(tmp: Path) -> list[Path]:
    days = []
    for d in range(3):
        ts = [f"2026-11-{1 + d:02d}T{h:02d}:{m:02d}:00" for h in range(24) for m in range(60)]
        f = tmp / f"ev{d}.csv"
        pl.DataFrame({"ts": ts, "user": [f"u{(i * 7 + d) % 1000}" for i in range(len(ts))],
                      "page": [f"p{i % 4}" for i in range(len(ts))],
                      "v": [float(i % 9) for i in range(len(ts))]}).write_csv(f)
        days.append(f)
    return days


def _cases(tmp: Path) -> dict[str, list[list[str]]]:
    pv, pvc = str(SAMPLE / "page_views.parquet"), str(SAMPLE / "page_views.csv")
    pages, persons, spec = str(SAMPLE / "pages_public.csv"), str(SAMPLE / "persons.parquet"), str(SAMPLE / "safetab_spec.toml")
    snaps = [str(p) for p in _snapshots(tmp)]
    days = [str(p) for p in _stream_days(tmp)]
    st = str(tmp / "stream.state")
    approx = ["budget", "init", "default", "--mode", "approx", "--epsilon", "50", "--delta", "1e-5"]
    hist = ["histogram", pv, "--privacy-unit", "user_id", "--json"]
    stream = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "6h",
              "--max-contributions", "5", "--epsilon", "3", "--delta", "1e-9", "--json"]
    sched = ["histogram", "--by", "page", "--privacy-unit", "user_id", "--agg", "count-units", "--keys", pages,
             "--schedule", "daily", "--total-epsilon", "1", "--json"]
    return {
        "histogram": [
            approx,
            [*hist, "--by", "country", "--agg", "count,count-units,sum,mean,variance,median,p90", "--value",
             "duration_s", "--bounds", "0:600", "--max-contributions", "5", "--epsilon", "1", "--delta", "1e-7",
             "--with-error"],
            [*hist, "--by", "page", "--agg", "count-units", "--keys", pages, "--max-partitions", "8", "--epsilon", "0.5"],
            [*hist, "--by", "page", "--agg", "count", "--selection", "unklap", "--max-groups", "50",
             "--max-partitions", "3", "--epsilon", "0.5", "--delta", "1e-8"],
            ["histogram", pvc, "--privacy-unit", "user_id", "--by", "country,page", "--agg", "sum", "--value",
             "duration_s", "--bounds", "0:100", "--granularity", "0.5", "--max-partitions", "2",
             "--max-contributions", "2", "--epsilon", "0.7", "--delta", "1e-7", "--json"],
            [*hist, "--by", "country", "--agg", "count", "--epsilon", "0.5", "--delta", "1e-7", "--dry-run"],
            ["budget", "history", "--json"],
            ["budget", "show", "--json"],
        ],
        "histogram-zcdp": [
            ["budget", "init", "default", "--mode", "zcdp", "--rho", "2"],
            [*hist, "--by", "page", "--agg", "count,count-units,mean", "--value", "duration_s", "--bounds", "0:600",
             "--keys", pages, "--rho", "0.2", "--with-error"],
            [*hist, "--by", "page", "--agg", "count", "--keys", pages, "--max-partitions", "4", "--rho", "0.1"],
        ],
        "topk": [
            approx,
            ["topk", pv, "--by", "page", "-k", "10", "--privacy-unit", "user_id", "--epsilon-per", "0.1",
             "--delta", "1e-8", "--with-error", "--json"],
            ["topk", pv, "--by", "page", "-k", "5", "--privacy-unit", "user_id", "--count", "rows",
             "--max-contributions", "3", "--epsilon-per", "0.1", "--delta", "1e-8", "--json"],
            ["topk", pv, "--by", "page", "-k", "5", "--privacy-unit", "user_id", "--keys", pages,
             "--epsilon-per", "0.2", "--json"],
            ["topk", pv, "--by", "country", "-k", "3", "--privacy-unit", "user_id", "--no-counts",
             "--epsilon-per", "0.2", "--delta", "1e-8", "--json"],
            ["topk", pv, "--by", "page", "-k", "4", "--privacy-unit", "user_id", "--epsilon-per", "0.1",
             "--delta", "1e-8", "--dry-run", "--json"],
            ["budget", "history", "--json"],
        ],
        "topk-br": [
            ["budget", "init", "default", "--mode", "br", "--epsilon-per", "0.1", "--delta", "1e-10",
             "--info-budget", "3000", "--call-budget", "30", "--delta-prime", "1e-9"],
            ["topk", pv, "--by", "page", "-k", "10", "--privacy-unit", "user_id", "--with-error", "--json"],
            ["budget", "show", "--json"],
        ],
        "tabulate": [
            ["budget", "init", "default", "--mode", "pure", "--epsilon", "16"],
            ["tabulate", "--dry-run", "--spec", spec],
            ["tabulate", persons, "--spec", spec, "--with-error", "--json"],
            ["budget", "history", "--json"],
        ],
        "stream-replay": [
            approx,
            ["stream-replay", days[0], *stream, "--through", "2026-11-02"],
            ["stream-replay", days[1], *stream, "--value", "v", "--bounds", "-4:4", "--mu", "2", "--through", "2026-11-03"],
            ["stream-replay", days[0], *stream, "--state", st, "--through", "2026-11-02"],
            ["stream-replay", days[1], *stream, "--state", st, "--through", "2026-11-03"],
            ["stream-replay", days[2], *stream, "--state", st, "--through", "2026-11-04"],
            ["budget", "history", "--json"],
        ],
        "schedules": [
            approx,
            [sched[0], snaps[0], *sched[1:]],
            [sched[0], snaps[1], *sched[1:]],
            [sched[0], snaps[2], *sched[1:]],
            ["topk", snaps[0], "--by", "page", "-k", "3", "--privacy-unit", "user_id", "--keys", pages,
             "--schedule", "weekly", "--scheduler", "fixed", "--epsilon", "0.3", "--total-epsilon", "1", "--json"],
            ["topk", snaps[2], "--by", "page", "-k", "3", "--privacy-unit", "user_id", "--keys", pages,
             "--schedule", "weekly", "--scheduler", "fixed", "--epsilon", "0.3", "--total-epsilon", "1", "--json"],
            ["budget", "show", "--json"],
            ["budget", "history", "--json"],
        ],
        "budget": [
            ["budget", "compose", "--mode", "br", "--epsilon-per", "0.15", "--count", "3000", "--call-budget", "30",
             "--delta-per", "1e-10", "--delta-prime", "1e-9"],
        ],
    }


#: Results longer than this many rows are recorded by row count and SHA-256 (tabulate's are megabytes).
MAX_ROWS_VERBATIM = 300


def _shorten(stdout: str) -> str:
    try:
        doc = json.loads(stdout)
    except ValueError:
        return stdout
    if isinstance(doc, dict) and isinstance(doc.get("result"), list) and len(doc["result"]) > MAX_ROWS_VERBATIM:
        rows = json.dumps(doc["result"], sort_keys=True).encode()
        doc["result"] = {"rows": len(doc["result"]), "sha256": hashlib.sha256(rows).hexdigest()}
        return json.dumps(doc, indent=2) + "\n"
    return stdout


def _normalise(text: str, tmp: Path) -> str:
    """Replace what differs between two runs of the same releases (times, random state ids, paths)."""
    text = text.replace(str(tmp), "<tmp>").replace(str(SAMPLE), "<sample>")
    text = re.sub(r'"time": "[^"]*"', '"time": "<time>"', text)
    # Stream and schedule state files carry a random reservation id; step digests are keyed by it.
    text = re.sub(r'"(id|input)": "[0-9a-f]{24,32}"', r'"\1": "<id>"', text)
    text = re.sub(r'"(schedule:|stream:)[0-9a-f]{24}"', r'"\1<id>"', text)
    return re.sub(r'"[0-9a-f]{24}/([^"]*)"', r'"<id>/\1"', text)


CASES = ["histogram", "histogram-zcdp", "topk", "topk-br", "tabulate", "stream-replay", "schedules", "budget"]


def _release_text(case: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every command of ``case`` run with the fixed key, its outputs normalised into one text."""
    # A new stream or schedule state file draws a random reservation id and secret: its noise is
    # fresh by design (a new reservation, charged anew). Here they come from a counter instead.
    drawn = iter(range(10**6))
    monkeypatch.setattr(secrets, "token_hex", lambda n=32: hashlib.sha256(b"%d" % next(drawn)).hexdigest()[: 2 * n])
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = state_dir / "secret.key"
    key.write_bytes(FIXED_KEY)
    key.chmod(0o600)
    got = []
    for argv in _cases(tmp_path)[case]:
        r = runner.invoke(app, argv)
        assert r.exit_code == 0, (argv, r.stderr)
        got.append(f"$ dpcli {' '.join(argv)}\n{_shorten(r.stdout)}")
    return _normalise("\n".join(got), tmp_path)


@pytest.mark.parametrize("case", CASES)
def test_golden_release(case, tmp_path, state_dir, monkeypatch):
    text = _release_text(case, tmp_path, state_dir, monkeypatch)
    path = GOLDEN / f"{case}.txt"
    if RECORD:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: record with DPCLI_GOLDEN_RECORD=1"
    assert text == path.read_text(), f"{case}: release differs from {path} (a refactor changed released bytes)"


def seed_material_v2(query: dict[str, Any], inputs: Mapping[str, seeds.SeedInput], calibration: seeds.Calibration,
                     engine: Any = None, reads: seeds.Reads | None = None) -> dict[str, Any]:
    """The seed material as version 2 built it (issue 29), for :func:`test_golden_release_under_its_v2_seed`
    only: v3 added ``reads`` (what the release reads of its inputs) and nothing else."""
    return {
        "material": 2,
        "query": query,
        "inputs": {role: source.seed_material() for role, source in inputs.items()},
        "calibration": calibration.seed_material(),
        "engine": seeds.engine_versions(engine),
    }


#: The SHA-256 of each golden file as seed material v2 recorded it (before issue 37's v3).
V2_GOLDEN = json.loads((GOLDEN / "seed-v2.json").read_text())


@pytest.mark.parametrize("case", CASES)
def test_golden_release_under_its_v2_seed(case, tmp_path, state_dir, monkeypatch):
    """Seed material v3 changed the seed and nothing else: forced to compute each release's v2 seed, every
    command prints the v2 golden bytes again (every released value, seed id, summary and ledger line).
    After a merge that changes released bytes on purpose, re-record with ``DPCLI_GOLDEN_RECORD=1`` (the v3
    files) and ``DPCLI_GOLDEN_RECORD_V2=1`` (this digest file) together, and say why in the commit."""
    monkeypatch.setattr(seeds, "seed_material", seed_material_v2)
    digest = hashlib.sha256(_release_text(case, tmp_path, state_dir, monkeypatch).encode()).hexdigest()
    if os.environ.get("DPCLI_GOLDEN_RECORD_V2") == "1":
        V2_GOLDEN[case] = digest
        (GOLDEN / "seed-v2.json").write_text(json.dumps(V2_GOLDEN, indent=2, sort_keys=True) + "\n")
    assert digest == V2_GOLDEN[case], f"{case}: under its v2 seed the release differs from the v2 golden"
