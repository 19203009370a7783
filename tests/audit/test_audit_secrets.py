"""Audit: no insecure randomness anywhere, integer releases, the key never leaks, canonical seeds.

Every subcommand runs end to end (in-process CLI) with Python's ``random``
module functions and numpy's global/legacy generators made to raise, so any
use of them on a release path fails the test.
"""

from __future__ import annotations

import base64
import json
import random
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dptest import init_ledger, runner

from dpcli.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_data"


def _events(path: Path) -> Path:
    """3,000 events of 600 users over 4 pages and one day, with a duration."""
    n = 3000
    pl.DataFrame({
        "ts": [f"2026-11-01T{(i * 7) % 24:02d}:{(i * 13) % 60:02d}:00" for i in range(n)],
        "user": [f"u{i % 600}" for i in range(n)],
        "page": [f"p{i % 4}" for i in range(n)],
        "secs": [float(i % 50) for i in range(n)],
    }).write_csv(path)
    return path


def _commands(tmp: Path) -> list[list[str]]:
    ev = _events(tmp / "events.csv")
    keys = tmp / "pages.csv"
    keys.write_text("page\np0\np1\np2\np3\np9\n")
    shutil.copy(SAMPLE / "blocks.csv", tmp)
    shutil.copy(SAMPLE / "safetab_spec.toml", tmp)
    stream = ["stream-replay", str(ev), "--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d",
              "--trigger-every", "6h", "--max-contributions", "5", "--epsilon", "1", "--delta", "1e-9"]
    return [
        ["histogram", str(ev), "--by", "page", "--privacy-unit", "user", "--agg", "count,count-units,sum,median",
         "--value", "secs", "--bounds", "0:60", "--epsilon", "0.5", "--delta", "1e-6"],
        ["histogram", str(ev), "--by", "page", "--privacy-unit", "user", "--keys", str(keys), "--epsilon", "0.5"],
        ["topk", str(ev), "--by", "page", "-k", "2", "--privacy-unit", "user", "--epsilon-per", "0.5",
         "--delta", "1e-9"],
        ["topk", str(ev), "--by", "page", "-k", "2", "--privacy-unit", "user", "--keys", str(keys),
         "--epsilon-per", "0.5"],
        ["tabulate", str(SAMPLE / "persons.parquet"), "--spec", str(tmp / "safetab_spec.toml")],
        stream,
        [*stream, "--state", str(tmp / "s.state")],
        ["budget", "show"],
        ["budget", "history"],
    ]


@pytest.fixture
def no_insecure_randomness(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("insecure randomness used")

    for name in ("random", "randint", "randrange", "getrandbits", "choice", "choices", "shuffle", "sample",
                 "uniform", "gauss", "normalvariate", "expovariate", "seed"):
        monkeypatch.setattr(random, name, boom)
    for name in ("random", "rand", "randn", "randint", "choice", "shuffle", "permutation", "normal", "laplace",
                 "exponential", "gumbel", "uniform", "seed", "default_rng", "RandomState", "Generator"):
        monkeypatch.setattr(np.random, name, boom)


def test_every_subcommand_runs_without_insecure_randomness_and_releases_integers(tmp_path, no_insecure_randomness):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    for cmd in _commands(tmp_path):
        out = tmp_path / "out.csv"
        args = [*cmd, "-o", str(out)] if cmd[0] != "budget" else cmd
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (cmd[:2], r.stderr, r.exception)
        if cmd[0] == "budget":
            continue
        df = pl.read_csv(out)
        counts = [c for c in df.columns if c in ("count", "count_units", "rows", "units") or c.startswith("count")]
        assert counts, (cmd[:2], df.columns)
        for c in counts:  # released counts are integers (exact discrete samplers), never floats
            assert df[c].dtype.is_integer() or df[c].null_count() == df.height, (cmd[:2], c, df[c].dtype)


def test_the_secret_key_never_appears_in_outputs_logs_ledgers_or_tracebacks(tmp_path, state_dir):
    """A canary: after running every command (and failing ones under -v), the key's hex, base64 and raw
    bytes occur in no stdout, stderr, output file or state file other than the key file itself."""
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    seen = []
    for cmd in _commands(tmp_path):
        r = runner.invoke(app, ["-v", *cmd])  # -v: a failing command also prints its traceback
        seen += [r.stdout.encode(), r.stderr.encode()]
    bad = tmp_path / "bad.csv"
    bad.write_text("page,user\np1,\n")
    for cmd in (["-v", "histogram", str(bad), "--by", "page", "--privacy-unit", "user", "--epsilon", "1",
                 "--delta", "1e-6"], ["-v", "budget", "key"], ["budget", "show", "--json"]):
        r = runner.invoke(app, cmd)
        seen += [r.stdout.encode(), r.stderr.encode(), repr(r.exception).encode()]
    key_file = state_dir / "secret.key"
    key_hex = key_file.read_text().split()[-1]
    raw = bytes.fromhex(key_hex)
    needles = [key_hex.encode(), key_hex.upper().encode(), base64.b64encode(raw), raw]
    files = [p for p in [*state_dir.rglob("*"), *tmp_path.rglob("*")] if p.is_file() and p != key_file]
    assert len(files) > 5
    seen += [p.read_bytes() for p in files]
    for blob in seen:
        for needle in needles:
            assert needle not in blob


def test_spelling_does_not_change_the_seed_and_a_respelled_query_is_a_free_replay(tmp_path):
    """Option order and whitespace in column lists give the same seed: same numbers, charged once."""
    ev = _events(tmp_path / "events.csv")
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-3")
    a = runner.invoke(app, ["histogram", str(ev), "--by", "page", "--privacy-unit", "user", "--epsilon", "1",
                            "--delta", "1e-6", "--max-partitions", "3", "--agg", "count,sum", "--value", "secs",
                            "--bounds", "0:60"])
    b = runner.invoke(app, ["histogram", str(ev), "--max-partitions", "3", "--bounds", "0.0:60", "--delta",
                            "0.000001", "--epsilon", "1.0", "--value", "secs", "--agg", " count , sum ",
                            "--privacy-unit", "user", "--by", " page "])
    assert a.exit_code == 0 and b.exit_code == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout
    h = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
    assert len(h) == 2 and h[1]["replay_of"] == 1 and h[0]["seed_id"] == h[1]["seed_id"]
