"""Differential report checks: run a dpcli command on D and D′ under one forced seed, compare what is public.

The threat model says nothing that leaves dpcli may depend on the data except
through noise. With the data fingerprint kept out of the seed, D and a
neighbour D′ get the *same* noise draws, so every part of the report that is
not a noisy released value must come out byte-identical: exit code, stderr,
the ``--json`` summary and the ledger entries. Any difference is an exact
statistic leaking (e.g. a count of groups seen, truncated records or a
threshold computed from a true count).

Usage::

    a, b, diff = differential(["histogram", path, "--json", ...], path, d_csv, d2_csv, tmp_path,
                              setup=[APPROX], noisy={"json.summary.k_bar"})
    assert diff == []

Each run gets its own state directory (with the same forced seed the second
run would otherwise be a free replay); the input path is the same in both
runs (it appears in summary lines), only its content differs.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import polars as pl
from dptest import ledger_argv, runner

from dpcli.cli.app import app
from dpcli.core.prf import canonical_json
from dpcli.errors import BudgetError
from dpcli.state import ledger

#: The set-up of a differential run: a pure or an approx ledger with room for any test's release.
PURE = ledger_argv("pure", "--epsilon", "100")
APPROX = ledger_argv("approx", "--epsilon", "100", "--delta", "1e-3")

#: Ledger entry fields that differ between any two runs (or state dirs) whatever the data.
VOLATILE_LEDGER_FIELDS = ("time", "hash", "prev", "seq")
#: Ledger entry fields that are functions of the released (noisy) values: the digest of the file written.
#: A stream's or schedule's run marked as begun carries a keyed digest of its input's bytes, which differ
#: between any two inputs (as a step's ``step.input`` does).
NOISY_LEDGER_FIELDS = ("ledger.*.output", "ledger.*.starts.input")
#: The bias report's released values (dpcli.tasks.bias_report): noisy shares and units, and the margin derived
#: from the noisy units. Its budget and noise are compared.
NOISY_BIAS_FIELDS = ("json.summary.bias.share_*", "json.summary.bias.units", "json.summary.bias.moe95")
#: Notes whose text is a function of released values only: the bias report's statement (compared with its
#: numbers masked) and the notes it leads to (whether one is shown depends on the noisy shares: dropped).
BIAS_STATEMENT = re.compile(r"^dpcli: note: bounds cut\b.*$", re.M)
BIAS_CONSEQUENCES = re.compile(r"^dpcli: note: (\S+: the caps cut about|\S+: about .* of the kept values were "
                               r"clamped to|about .* of the kept values were clamped to).*\n", re.M)


@dataclass
class Report:
    """Everything one CLI run makes public (stdout parsed when it is JSON)."""

    exit_code: int
    stdout: str
    json: Any | None
    stderr: str
    ledger: list[dict[str, Any]]


def _forced_derive_seed(key: bytes, material: dict[str, Any]) -> bytes:
    """A seed from the query alone: no key, no data fingerprints, so D and D′ draw the same noise."""
    return hashlib.sha256(b"report-diff\x00" + canonical_json(material.get("query", {}))).digest()


@contextlib.contextmanager
def forced_seed() -> Iterator[None]:
    """Patch the release seed so that it ignores the secret key and the data fingerprints."""
    with mock.patch("dpcli.release.seeds.derive_seed", _forced_derive_seed):
        yield


@contextlib.contextmanager
def counted_tokens() -> Iterator[None]:
    """``secrets.token_hex`` from a counter (restarted on entry): a stream's or schedule's random state ids
    and secrets come out the same for D and D′ (a schedule's size noise is keyed by its reservation id)."""
    drawn = iter(range(10**6))
    with mock.patch("secrets.token_hex", lambda n=32: hashlib.sha256(b"%d" % next(drawn)).hexdigest()[: 2 * n]):
        yield


def _ledger_entries(state_dir: Path, analyst: str) -> list[dict[str, Any]]:
    try:
        led = ledger.read_ledger(state_dir, analyst)
    except BudgetError:  # no ledger (none was set up)
        return []
    return [{k: v for k, v in e.items() if k not in VOLATILE_LEDGER_FIELDS} for e in led.entries]


def run_cli(args: Sequence[str], state_dir: Path, setup: Sequence[Sequence[str]] = (),
            analyst: str = "default", stdin: bytes | None = None) -> Report:
    """Run ``setup`` commands then ``args`` (all with state dir ``state_dir``) under the forced seed;
    ``stdin``: the bytes the command reads from standard input (for an input of ``-``)."""
    env = {"DPCLI_STATE_DIR": str(state_dir), "DPCLI_ANALYST": analyst}
    with forced_seed():
        for cmd in setup:
            r = runner.invoke(app, [str(a) for a in cmd], env=env)
            assert r.exit_code == 0, (cmd, r.stdout, r.stderr)
        r = runner.invoke(app, [str(a) for a in args], env=env, input=stdin)
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = None
    return Report(r.exit_code, r.stdout, doc, r.stderr, _ledger_entries(state_dir, analyst))


def _walk(a: Any, b: Any, path: str, noisy: Collection[str], out: list[str]) -> None:
    if any(fnmatch.fnmatchcase(path, pat) for pat in noisy):
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                if not any(fnmatch.fnmatchcase(sub, pat) for pat in noisy):
                    out.append(f"{sub}: only in {'D′' if k not in a else 'D'}")
                continue
            _walk(a[k], b[k], sub, noisy, out)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{path}.{i}", noisy, out)
        return
    if a != b:
        out.append(f"{path}: {a!r} != {b!r}")


def report_diff(a: Report, b: Report, noisy: Collection[str] = ()) -> list[str]:
    """Where two reports differ, as ``path: old != new`` lines (empty: indistinguishable).

    Compared: exit code, stderr, the parsed stdout (``--json``) and the ledger entries. The
    released rows (``json.result``) are noisy values and skipped; ``noisy`` adds fnmatch
    patterns of dotted paths that may differ too (noisy values or functions of them only),
    e.g. ``"json.summary.k_bar"`` or ``"json.summary.levels.*.branches"``.
    """
    out: list[str] = []
    if a.exit_code != b.exit_code:
        out.append(f"exit_code: {a.exit_code} != {b.exit_code}")
    stderr = [BIAS_STATEMENT.sub("dpcli: note: bounds cut (noisy)", BIAS_CONSEQUENCES.sub("", r.stderr))
              for r in (a, b)]
    if stderr[0] != stderr[1]:
        out.append(f"stderr: {a.stderr!r} != {b.stderr!r}")
    skip = {"json.result", *NOISY_LEDGER_FIELDS, *NOISY_BIAS_FIELDS, *noisy}
    # the entry of a file written with -o records the release's report (its --json summary without the receipt):
    # what may differ in the summary may differ there too
    skip |= {"ledger.*.report." + p.removeprefix("json.summary.") for p in skip if p.startswith("json.summary.")}
    if (a.json is None) != (b.json is None):
        out.append("json: only one run printed JSON")
    elif a.json is not None:
        _walk(a.json, b.json, "json", skip, out)
    _walk(a.ledger, b.ledger, "ledger", skip, out)
    return out


def differential(args: Sequence[Any], data: Path, d: bytes | str, d2: bytes | str, tmp: Path,
                 setup: Sequence[Sequence[Any]] = (), noisy: Collection[str] = (),
                 same_ids: bool = False) -> tuple[Report, Report, list[str]]:
    """Run ``args`` with ``data`` holding D, then with ``data`` holding D′, each in a fresh state dir.

    The file path is the same in both runs (it appears in summaries and ledger lines), only its
    content changes. ``same_ids``: state ids and secrets from :func:`counted_tokens`. Returns both
    reports and :func:`report_diff` of them.
    """
    reports = []
    for label, content in (("D", d), ("D-prime", d2)):
        data.write_bytes(content.encode() if isinstance(content, str) else content)
        with counted_tokens() if same_ids else contextlib.nullcontext():
            reports.append(run_cli([str(a) for a in args], tmp / f"state-{label}", setup))
    return reports[0], reports[1], report_diff(reports[0], reports[1], noisy)


def csv_text(df: pl.DataFrame) -> str:
    """A frame as CSV text (for building D and D′ = D plus rows)."""
    return df.write_csv()
