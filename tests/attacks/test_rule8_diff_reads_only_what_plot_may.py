"""Rule 8 for ``dpcli diff`` in service mode (issue 42): it reads exactly the releases ``dpcli plot`` may read.

diff was refused in service mode (it needed the releases' --json summaries, which service mode does not read for
an analyst). It now works on files in the analyst's output directories whose digest their own ledger recorded
when dpcli wrote them, with the calibration the ledger entry keeps; it goes through plot's own check
(:func:`dpcli.plot.recorded.service_acceptor`), so a file plot refuses, diff refuses with the same message and
exit code, and no summary path (a file the analyst typed) is ever opened. Another analyst's ledger is never read.
"""

from __future__ import annotations

import json

from service_checks import QUERY, _nothing_private, _one_line


def _release(svc, analyst: str, name: str, epsilon: str = "1"):
    out = svc.out / analyst / name
    r = svc.run(analyst, *QUERY[:-4], "--keys", "pages", "--epsilon", epsilon, "--delta", "1e-6", "--with-error",
                "-o", out)
    assert r.exit_code == 0, r.stderr
    return out


def test_diff_works_in_service_mode_on_releases_the_analysts_ledger_recorded(svc):
    old, new = _release(svc, "alice", "mon.csv"), _release(svc, "alice", "tue.csv", epsilon="2")
    r = svc.run("alice", "diff", old, new, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["columns"] == ["count"] and {x["page"] for x in doc["result"]} == {"/p/0", "/p/1", "/p/2"}
    assert all(isinstance(x["count_diff_moe95"], int) and x["count_diff_moe95"] > 0 for x in doc["result"])
    out = svc.out / "alice" / "d.csv"
    assert svc.run("alice", "diff", old, new, "-o", out).exit_code == 0 and out.read_text().startswith("page,")


def _answers(svc, analyst: str, path) -> tuple[tuple[int, str], tuple[int, str]]:
    """plot's and diff's exit code and line for ``path`` (diff given a real release as the other file)."""
    real = svc.out / analyst / "real.csv"
    if not real.exists():
        _release(svc, analyst, "real.csv")
    p = svc.run(analyst, "plot", path)
    d = svc.run(analyst, "diff", real, path)
    return (p.exit_code, _one_line(p).replace("plot: ", "").replace("draws", "reads")), \
           (d.exit_code, _one_line(d).replace("diff: ", ""))


def test_attack_diff_refuses_what_plot_refuses_with_the_same_answer(svc):
    """Private data, a planted file in the analyst's own directory, another analyst's release, a path climbing
    out of the output directory, a symlink to the data: each is refused by diff as plot refuses it (exit 2), and
    nothing private is printed."""
    forged = svc.out / "alice" / "forged.csv"
    forged.write_text("page,count\n/p/0,17\n/p/1,42\n")
    bobs = _release(svc, "bob", "bob.csv")
    link = svc.out / "alice" / "v.csv"
    link.symlink_to(svc.data / "visits.csv")
    for path in (svc.data / "visits.csv", forged, bobs, svc.out / "alice" / ".." / "bob" / "bob.csv", link):
        plot, diff = _answers(svc, "alice", path)
        assert plot == diff and diff[0] == 2, (path, plot, diff)
        r = svc.run("alice", "diff", path, path)
        _nothing_private(r, "u17")


def test_attack_no_summary_path_is_opened_for_the_analyst(svc):
    """--old-summary/--new-summary name files the analyst typed: refused before anything is read (as plot's
    --summary), even one that lies in their output directory."""
    old, new = _release(svc, "alice", "a.csv"), _release(svc, "alice", "b.csv")
    for summary in (svc.data / "visits.csv", svc.state / "ledgers" / "alice.json", old):
        for flag in ("--old-summary", "--new-summary"):
            r = svc.run("alice", "diff", old, new, flag, summary)
            assert r.exit_code == 2 and "service mode" in _one_line(r), r.stderr
            _nothing_private(r, "u17")


def test_attack_another_analysts_ledger_is_never_read(svc, monkeypatch):
    """Alice diffs her releases and bob's: only her own ledger is read (bob's release is refused by its digest,
    which her ledger never recorded)."""
    from dpcli.state import ledger

    old, new = _release(svc, "alice", "a.csv"), _release(svc, "alice", "b.csv")
    bobs = _release(svc, "bob", "b.csv")
    read = []
    original = ledger.read_ledger

    def spy(root, analyst, *args, **kwargs):
        read.append(analyst)
        return original(root, analyst, *args, **kwargs)

    monkeypatch.setattr(ledger, "read_ledger", spy)
    assert svc.run("alice", "diff", old, new).exit_code == 0
    assert svc.run("alice", "diff", old, bobs).exit_code == 2
    assert set(read) == {"alice"}, read


def test_an_operator_diffs_any_file_as_in_personal_mode(svc):
    old, new = _release(svc, "alice", "a.csv"), _release(svc, "alice", "b.csv", epsilon="2")
    r = svc.owner("diff", old, new)  # the operator (the service account): personal mode, any file
    assert r.exit_code == 65 and "has no summary" in r.stderr  # its own ledger did not write them
