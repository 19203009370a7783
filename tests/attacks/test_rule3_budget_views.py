"""Rule 3 for the ledger's public views: ``budget show`` and ``budget history`` after a release.

Attack (issue 15, finding 3), fifth command. The ledger's entries and summary lines are public. After
each releasing command runs on D or on D′ = D plus one unit alone in a new group (same forced seed),
every field ``budget show`` and ``budget history`` print, as JSON and as text, must be identical except
the entries' times. Before the fix, stream-replay's ledger line said "over N key(s)" (the true number
of keys seen).
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from report_diff import APPROX, PURE, csv_text, report_diff, run_cli
from tabulate_specs import write_spec

_TIME = re.compile(r"\d{4}-\d\d-\d\dT[0-9:.]+Z?")

# Counts far from every threshold, so the noisy outcome (which groups are released) is the same on
# D and D′ and only exact statistics could tell them apart.
BASE = pl.DataFrame({"user": [f"u{i}" for i in range(300)], "g": ["a"] * 200 + ["b"] * 100,
                     "t": ["2026-01-01T10:00:00"] * 300})
NEW = pl.DataFrame({"user": ["newcomer"], "g": ["zzz"], "t": ["2026-01-01T11:00:00"]})
PERSONS = "block,race,eth,sex,age\n" + "01001,1000,1,1,30\n" * 40
NEW_PERSON = "02001,1000;2000,1,1,40\n"


def _release(command: str, data: Path, tmp: Path) -> tuple[list[str], list[str]]:
    """(setup ledger, release command) for ``command`` reading ``data``."""
    unit = ["--privacy-unit", "user"]
    if command == "histogram":
        return APPROX, ["histogram", str(data), "--by", "g", *unit, "--epsilon", "1", "--delta", "1e-6"]
    if command == "topk":
        return APPROX, ["topk", str(data), "--by", "g", "-k", "1", *unit, "--epsilon-per", "0.5",
                        "--delta", "1e-6"]
    if command == "tabulate":
        level = '[[levels]]\ngeography = "state"\niterations = "reg"\nepsilon = 2\nstability = 1\n'
        return PURE, ["tabulate", str(data), "--spec", str(write_spec(tmp, level))]
    return APPROX, ["stream-replay", str(data), "--time", "t", "--by", "g", *unit, "--window", "1d",
                    "--triggers", "4", "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6",
                    "--through", "2026-01-02T00:00:00"]


@pytest.mark.parametrize("command", ["histogram", "topk", "tabulate", "stream-replay"])
def test_budget_show_and_history_reveal_nothing(tmp_path, command):
    data = tmp_path / ("persons.csv" if command == "tabulate" else "events.csv")
    contents = ((PERSONS, PERSONS + NEW_PERSON) if command == "tabulate"
                else (csv_text(BASE), csv_text(pl.concat([BASE, NEW]))))
    outputs = []
    for label, content in zip(("D", "D-prime"), contents):
        data.write_text(content)
        state = tmp_path / f"state-{label}"
        setup, release = _release(command, data, tmp_path)
        reports = [run_cli(["budget", "history", "--json"], state, setup=[setup, release + ["-o", str(tmp_path / "o.csv")]])]
        for args in (["budget", "show", "--json"], ["budget", "history"], ["budget", "show"]):
            reports.append(run_cli(args, state))
        for r in reports:  # entry times differ between any two runs
            assert r.exit_code == 0, r.stderr
            r.stdout, r.stderr = _TIME.sub("TIME", r.stdout), _TIME.sub("TIME", r.stderr)
            if isinstance(r.json, list):
                r.json = [{k: v for k, v in e.items() if k != "time"} for e in r.json]
        outputs.append(reports)
    for a, b in zip(*outputs):
        diff = report_diff(a, b)
        if a.json is None:
            diff += [] if a.stdout == b.stdout else [f"stdout: {a.stdout!r} != {b.stdout!r}"]
        assert diff == [], f"{command}: budget output tells D from D′:\n" + "\n".join(diff)
