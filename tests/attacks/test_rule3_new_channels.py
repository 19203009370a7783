"""Rule 3 on the channels issue 39 added: a JSON error object on stdout, the line an interrupted run
prints, and the job a note names in a log. D and D′ = D plus one privacy unit alone in a new group
(report_diff.differential, one forced seed): each channel must come out the same for both.
"""

from __future__ import annotations

import polars as pl
from report_diff import APPROX, csv_text, differential

BASE = pl.DataFrame({"user": [f"u{i}" for i in range(400)], "g": ["a", "b", "c", "d"] * 100,
                     "x": [float(i % 37) for i in range(400)]})
D = csv_text(BASE)
D2 = csv_text(pl.concat([BASE, pl.DataFrame({"user": ["newcomer"], "g": ["zzz"], "x": [1e9]})]))


def _hist(data, *extra):
    return ["histogram", data, "--by", "g", "--privacy-unit", "user", "--delta", "1e-6", *extra]


def test_json_errors_are_the_same_for_neighbours(tmp_path):
    """A refusal under --json (the budget, a missing column, a bad option) prints one object on stdout
    naming its stderr line and code, and the object is the same for D and D′."""
    data = tmp_path / "d.csv"
    for extra, code in ((["--epsilon", "500", "--json"], 77), (["--epsilon", "1", "--value", "nope", "--agg", "sum",
                                                                "--bounds", "0:10", "--json"], 65)):
        a, b, diff = differential(_hist(data, *extra), data, D, D2, tmp_path / str(code), setup=[APPROX])
        assert diff == [] and a.exit_code == code, (diff, a.stderr)
        assert a.json == {"error": a.stderr.strip().splitlines()[-1], "exit": code}
        assert a.ledger == [] or all(not e.get("events") for e in a.ledger)  # nothing charged


def test_an_interrupted_run_says_the_same_for_neighbours(tmp_path, monkeypatch):
    """SIGTERM (here raised where the run first collects records, as the handler would) ends with 143 and a
    line on what the run charged and wrote: the same for D and D′ (it depends on where the run stopped,
    never on a record)."""
    from dpcli.cli._common import Terminated

    def stop(self, *args, **kwargs):
        raise Terminated

    monkeypatch.setattr(pl.LazyFrame, "collect", stop)
    data = tmp_path / "d.csv"
    a, b, diff = differential(_hist(data, "--epsilon", "1", "--json", "-o", tmp_path / "o.csv"), data, D, D2,
                              tmp_path, setup=[APPROX])
    assert diff == [] and a.exit_code == 143, diff
    said = ("dpcli: interrupted by SIGTERM: this run charged ledger 'default' (it had begun reading its data; its "
            "rerun on the same input is free: see dpcli budget history) and wrote nothing")
    assert a.stderr.strip() == said and a.json == {"error": said, "exit": 143}
    assert not (tmp_path / "o.csv").exists()


def test_notes_name_their_job_alike_for_neighbours(tmp_path):
    """Outside a terminal every note ends with the job it belongs to ([histogram -o FILE]), for D and D′."""
    data, out = tmp_path / "d.csv", tmp_path / "o.csv"
    a, b, diff = differential(_hist(data, "--epsilon", "1", "-o", out), data, D, D2, tmp_path, setup=[APPROX])
    notes = [ln for ln in a.stderr.splitlines() if ln.startswith("dpcli: note:")]
    assert diff == [] and a.exit_code == 0 and notes, (diff, a.stderr)
    assert all(ln.endswith(f" [histogram -o {out}]") for ln in notes), notes
