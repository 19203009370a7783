"""Rule 8 for writes and ``plot``: only into the analyst's output directories, only releases dpcli wrote, also under races.

Issue 29's attacks 1 and 3: ``-o`` outside the analyst's output directories (elsewhere, another
analyst's, the state, a list), and ``plot PATH``, which printed any file with a release-like column
(every other column became a label). The service-mode review of issue 29 added the races, staged with
hooks that run the attacker's move between the gate's check and dpcli's open or write: a directory of a
group-writable output directory swapped for a symlink to the data (``-o``, ``budget show --plot``), a
release swapped for a symlink between ``plot``'s check and its open; and planted symlinks.
"""

from __future__ import annotations

import pytest
from dptest import Service
from service_checks import QUERY, SECRET_VALUES, _nothing_private, _one_line


def test_outputs_only_into_the_analysts_directories(svc, tmp_path):
    query = ["histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6"]
    for target in (tmp_path / "anywhere.csv", svc.out / "bob" / "x.csv", svc.state / "x.csv", svc.data / "pages.csv"):
        r = svc.run("alice", *query, "-o", target)
        assert r.exit_code in (2, 73), (target, r.stderr)
        assert not target.exists() or target == svc.data / "pages.csv"
    r = svc.run("alice", *query, "-o", svc.out / "alice" / "pages.csv")
    assert r.exit_code == 0, r.stderr


def test_attack_3_plot_draws_only_releases_dpcli_wrote(svc):
    """plot PATH printed any file with a release-like column; every other column became a label."""
    r = svc.run("alice", "plot", svc.data / "visits.csv")
    assert r.exit_code == 2, r.stderr
    _nothing_private(r, "u17")
    forged = svc.out / "alice" / "forged.csv"  # a file the analyst planted in their own output directory
    forged.write_text("page,count\n" + "".join(f"{s},1\n" for s in SECRET_VALUES))
    r = svc.run("alice", "plot", forged)
    assert r.exit_code == 2 and "not a release dpcli wrote for you" in r.stderr, r.stderr
    _nothing_private(r)
    real = svc.out / "alice" / "release.csv"
    assert svc.run("alice", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6",
                   "-o", real).exit_code == 0
    r = svc.run("alice", "plot", real)
    assert r.exit_code == 0, r.stderr
    bobs = svc.out / "bob" / "release.csv"  # bob's release is not alice's to draw
    assert svc.run("bob", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6",
                   "-o", bobs).exit_code == 0
    assert svc.run("alice", "plot", bobs).exit_code == 2


# --- writing and plotting: only in the analyst's directories, also under races ------------------------


def _group_writable_subdir(svc: Service) -> tuple:
    """A directory the analyst made in their (group-writable) output directory, and the private one
    they will swap it for."""
    sub = svc.out / "alice" / "sub"
    sub.mkdir()
    return sub, svc.data


def _swap_after_check(monkeypatch, sub, target, after_calls: int) -> None:
    """After the gate's ``after_calls``-th write check, ``sub`` becomes a symlink to ``target``."""
    from dpcli import access

    original = access.Gate.check_write
    calls = []

    def check_then_swap(self, path, what="output"):
        original(self, path, what)
        calls.append(path)
        if len(calls) == after_calls and not sub.is_symlink():
            sub.rename(sub.with_name("sub.old"))
            sub.symlink_to(target, target_is_directory=True)

    monkeypatch.setattr(access.Gate, "check_write", check_then_swap)


@pytest.mark.parametrize("command", [
    [*QUERY, "-o", "{S}/x.csv"],
    ["budget", "show", "--plot", "{S}/x.svg"],
])
def test_attack_a_directory_swapped_for_a_symlink_after_the_check_cannot_redirect_a_write(svc, monkeypatch,
                                                                                        command):
    """With a group-writable output directory, the analyst swapped a subdirectory for a symlink to the
    private data directory between the gate's check and the write: the release landed there (it could
    overwrite the data, or any file the service account may write)."""
    sub, private = _group_writable_subdir(svc)
    before = sorted(p.name for p in private.iterdir())
    _swap_after_check(monkeypatch, sub, private, after_calls=2)
    r = svc.run("alice", *[a.replace("{S}", str(sub)) for a in command])
    assert sorted(p.name for p in private.iterdir()) == before, r.stderr
    assert r.exit_code == 2 and "output directories" in _one_line(r), r.stderr


def test_attack_plot_opens_no_file_swapped_in_after_the_check(svc, monkeypatch):
    """plot checked the path, then opened it: a release swapped for a symlink in between had the
    service account open any file, and its answer told which exist (66) from which do not (2)."""
    from dpcli import access

    release = svc.out / "alice" / "r.csv"
    assert svc.run("alice", *QUERY, "-o", release).exit_code == 0
    lines = set()
    for target in (svc.data / "visits.csv", svc.data / "diagnosis=HIV", svc.data):
        release.unlink(missing_ok=True)
        release.write_text("page,count\n")
        original = access.Gate.allow_read

        def allow_then_swap(self, path, target=target, original=original):
            original(self, path)
            release.unlink()
            release.symlink_to(target)

        monkeypatch.setattr(access.Gate, "allow_read", allow_then_swap)
        r = svc.run("alice", "plot", release)
        monkeypatch.setattr(access.Gate, "allow_read", original)
        assert r.exit_code == 2, r.stderr
        lines.add(_one_line(r))
    assert len(lines) == 1, lines


def test_resists_planted_symlinks_in_the_output_directory(svc):
    link_dir = svc.out / "alice" / "data"
    link_dir.symlink_to(svc.data, target_is_directory=True)
    r = svc.run("alice", *QUERY, "-o", link_dir / "pages.csv")
    assert r.exit_code == 2 and (svc.data / "pages.csv").read_text().startswith("page\n/p/0")
    link = svc.out / "alice" / "v.csv"
    link.symlink_to(svc.data / "visits.csv")
    r = svc.run("alice", "plot", link)
    assert r.exit_code == 2 and "s17" not in r.stdout + r.stderr
    r = svc.run("alice", "plot", svc.out / "alice" / ".." / "bob" / "x.csv")
    assert r.exit_code == 2


def test_attack_an_output_path_outside_is_not_looked_at_before_the_refusal(svc, tmp_path):
    """Issue 31's review: a device or a pipe as ``-o`` is written as CSV, and dpcli looked at the path the
    analyst typed (as the service account) before the gate refused it: ``-o PRIVATE/x.fifo`` was refused as
    outside their directories when a pipe lay there, else for its unknown extension; which of the two
    messages came told whether a pipe, socket or device exists where the analyst cannot look."""
    import os

    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    os.mkfifo(hidden / "there.fifo")
    query = ["histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6"]
    there = svc.run("alice", *query, "-o", hidden / "there.fifo")
    absent = svc.run("alice", *query, "-o", hidden / "absent.fifo")
    assert there.exit_code == absent.exit_code == 2, (there.stderr, absent.stderr)
    assert there.stderr.replace("there", "absent") == absent.stderr
