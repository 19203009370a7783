"""Review of ``dpcli diff`` in service mode: a path an analyst types is never resolved through a directory they
cannot read.

``diff OLD NEW -o OUT`` checked that OUT is not an input before checking OLD and NEW, by asking the file system about
OLD as the service account: ``OLD = /state/ledgers/../../out/alice`` was refused as "the input dataset" holding OUT
(exit 73) when ``/state/ledgers`` exists, and read (refused by its extension, exit 2) when it does not, so an
analyst learnt which names exist in the state directory, the data's directories, another analyst's stream folders.
``-o DIR/../../out/alice/x.csv`` told the same for every command ("output directory … does not exist", exit 73, or
a release written). In service mode a typed path is now made absolute and its ``..`` taken off by its text before
anything is asked of the file system; the answer is the same whether the directory climbed out of exists or not.
"""

from __future__ import annotations

import os

from service_checks import QUERY


def _release(svc, analyst: str, name: str):
    out = svc.out / analyst / name
    r = svc.run(analyst, *QUERY[:-4], "--keys", "pages", "--epsilon", "1", "--delta", "1e-6", "-o", out)
    assert r.exit_code == 0, r.stderr
    return out


def _through(svc, private) -> str:
    """A path to alice's output directory that climbs out of ``private`` (a directory alice cannot read)."""
    return f"{private}/../{os.path.relpath(svc.out / 'alice', private.parent)}"


def _answer(result, probe: str) -> tuple[int, str]:
    return result.exit_code, (result.stdout + result.stderr).replace(probe, "PROBE")


def _pairs(svc):
    """(an existing private directory, a missing one beside it): the state directory's, the data's."""
    return ((svc.state / "ledgers", svc.state / "no-such"), (svc.data, svc.root / "no-such-data"))


def test_attack_diff_old_through_a_private_directory_answers_the_same_whether_it_exists(svc):
    real = _release(svc, "alice", "real.csv")
    for there, missing in _pairs(svc):
        answers = []
        for private in (there, missing):
            probe = _through(svc, private)
            answers.append(_answer(svc.run("alice", "diff", probe, real, "-o", svc.out / "alice" / "d.csv"), probe))
        assert answers[0] == answers[1], answers


def test_attack_output_through_a_private_directory_answers_the_same_whether_it_exists(svc):
    real = _release(svc, "alice", "real.csv")
    for there, missing in _pairs(svc):
        for argv in (("diff", real, real), (*QUERY[:-4], "--keys", "pages", "--epsilon", "1", "--delta", "1e-6")):
            answers = []
            for private in (there, missing):
                probe = _through(svc, private)
                answers.append(_answer(svc.run("alice", *argv, "-o", f"{probe}/x.csv"), probe)[0])
            assert answers[0] == answers[1] == 0, (argv, answers)
