"""h-attack (review of issue 37), rule 8: what lies *below* a catalog dataset directory is never checked.

FIXED (h-walk): see the fix at the end of this docstring.

``catalog set`` checks every component of a dataset directory's path from ``/`` down to the directory,
and at use the directory is opened without following symlinks and its owner and mode checked
(:meth:`dpcli.access.Gate._open_location`). But the files of a dataset are then listed with
``Path.rglob`` and ``is_file()`` (which follows symlinks) and opened by path by polars
(:func:`dpcli.io.datasets.open_dataset`): nothing below the directory is checked. A partition
sub-directory that someone else can write (an ETL account's ``year=2026/``, group-writable for a team:
common for partitioned data, and nothing in the seal or in README's set-up forbids it) lets them plant
``x.parquet -> /any/file/the/service/account/reads.parquet``: the service account then reads another
dataset (one this analyst may not use) as part of this one, for this analyst. The release is noisy,
but rule 8 ("never reads for the analyst what the analyst could not read") is broken, and with
``--by`` over the planted file's columns the analyst gets DP statistics of a dataset the catalog
withholds from them.

Fixed (h-walk): the dataset directory opened at use is walked from its descriptor, one name at a time
without following symlinks (:func:`dpcli.access.walk.files_below`); a symlink anywhere below is refused
(in personal mode too), in service mode so is every sub-directory or file :func:`dpcli.access.walk.unsafe_stat`
refuses, and polars is given the files opened in the walk, never their paths
(:class:`dpcli.io.datasets.DatasetListing`). ``catalog set`` walks each dataset directory the same way.
"""

from __future__ import annotations

import os

import polars as pl
import pytest


def test_a_symlink_planted_below_a_dataset_directory_is_refused(svc):
    withheld = svc.data / "withheld"  # a dataset only bob may use: its rows have page /w/…
    withheld.mkdir()
    pl.DataFrame({"user": [f"w{i}" for i in range(400)], "page": ["/w/0"] * 400}).write_parquet(
        withheld / "part-0.parquet")
    ds = svc.data / "events"
    (ds / "year=2026").mkdir(parents=True)
    pl.DataFrame({"user": [f"u{i}" for i in range(100)], "page": ["/p/0"] * 100}).write_parquet(
        ds / "year=2026" / "part-0.parquet")
    svc.catalog_toml += (f'[datasets.events]\nlocation = "{ds}"\nprivacy_unit = "user"\nanalysts = ["alice"]\n'
                         f'[datasets.withheld]\nlocation = "{withheld}"\nprivacy_unit = "user"\n'
                         'analysts = ["bob"]\n')
    (svc.home / "catalog.toml").write_text(svc.catalog_toml)
    assert svc.owner("catalog", "set", svc.home / "catalog.toml").exit_code == 0
    # later, the partition directory is made writable for the team that loads it (no catalog set follows)
    os.chmod(ds / "year=2026", 0o777)
    # someone who can write there (not the operator) plants a link to the withheld dataset's file
    os.symlink(withheld / "part-0.parquet", ds / "year=2026" / "part-1.parquet")
    refused = svc.run("alice", "histogram", "withheld", "--by", "page", "--epsilon", "1", "--delta", "1e-6")
    assert refused.exit_code == 2  # alice may not name it …
    r = svc.run("alice", "histogram", "events", "--by", "page", "--epsilon", "1", "--delta", "1e-6")
    # … but today she gets it through `events`: /w/0 is released with a noisy count near 400
    assert r.exit_code == 2 and "/w/0" not in r.stdout, (r.exit_code, r.stdout, r.stderr)


def _events(svc, analysts='["alice"]'):
    """A catalog dataset ``events`` with one partition directory; its directory and the partition."""
    ds = svc.data / "events"
    (ds / "year=2026").mkdir(parents=True)
    pl.DataFrame({"user": [f"u{i}" for i in range(100)], "page": ["/p/0"] * 100}).write_parquet(
        ds / "year=2026" / "part-0.parquet")
    svc.catalog_toml += f'[datasets.events]\nlocation = "{ds}"\nprivacy_unit = "user"\nanalysts = {analysts}\n'
    (svc.home / "catalog.toml").write_text(svc.catalog_toml)
    assert svc.owner("catalog", "set", svc.home / "catalog.toml").exit_code == 0
    return ds, ds / "year=2026"


HIST = ("histogram", "events", "--by", "page", "--epsilon", "1", "--delta", "1e-6")


def test_a_partition_others_can_write_is_refused_before_anything_is_read(svc):
    """No symlink yet, but a partition directory anyone (or a group) can write: a link or a hard link could
    be planted at any time, so the dataset is refused, to the analyst without its location or its names
    below, to the operator with the directory and a `find` that lists what is refused (names below a
    dataset can be data: never quoted)."""
    ds, part = _events(svc)
    assert svc.run("alice", *HIST).exit_code == 0
    for mode in (0o777, 0o775, 0o1777):
        os.chmod(part, mode)
        r = svc.run("alice", *HIST)
        assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1, (mode, r.stderr)
        assert "ask the operator" in r.stderr and str(svc.data) not in r.stderr and "year" not in r.stderr
        op = svc.run("ops", *HIST)
        assert op.exit_code == 2 and op.stderr.count("\n") == 1 and f"below {ds} is writable" in op.stderr
        assert f"find {ds} " in op.stderr and "year" not in op.stderr and "part-0" not in op.stderr
    os.chmod(part, 0o755)
    os.chmod(part / "part-0.parquet", 0o666)  # a file others can rewrite in place: refused as well
    assert svc.run("alice", *HIST).exit_code == 2
    os.chmod(part / "part-0.parquet", 0o644)
    assert svc.run("alice", *HIST).exit_code == 0


def test_a_symlink_below_is_refused_even_to_a_trusted_target(svc):
    """A link below a dataset directory is refused wherever it points (to another dataset, within the
    dataset itself, dangling), and in a hidden entry it is never looked at (not read)."""
    ds, part = _events(svc)
    os.symlink(part / "part-0.parquet", ds / "part-9.parquet")  # within the dataset itself
    r = svc.run("alice", *HIST)
    assert r.exit_code == 2 and "symlink" in r.stderr and str(ds) not in r.stderr
    os.unlink(ds / "part-9.parquet")
    os.symlink(part, ds / "year=2027")  # a directory link
    assert svc.run("alice", *HIST).exit_code == 2
    os.unlink(ds / "year=2027")
    os.symlink("/nonexistent", ds / "_temporary")  # hidden (Hadoop's rule): no data, not looked at
    assert svc.run("alice", *HIST).exit_code == 0


def test_a_dataset_is_read_through_the_descriptors_of_its_walk(tmp_path):
    """Personal mode: the files read are those opened in the walk; one renamed over after it is not read
    (the open file is), and the change is refused before the charge. A symlink below is refused here too."""
    from dpcli.access import Source
    from dpcli.errors import InputMissingError, UsageError
    from dpcli.io import datasets

    ds = tmp_path / "ds"
    (ds / "d=1").mkdir(parents=True)
    pl.DataFrame({"u": ["a", "b"]}).write_parquet(ds / "d=1" / "p.parquet")
    table = datasets.open_dataset(str(ds))
    pl.DataFrame({"u": ["x", "y", "z"]}).write_parquet(tmp_path / "new.parquet")
    os.replace(tmp_path / "new.parquet", ds / "d=1" / "p.parquet")
    assert table.frame.collect()["u"].to_list() == ["a", "b"]
    with pytest.raises(InputMissingError, match="changed while it was read"):
        table.verify_unchanged()
    os.symlink(ds / "d=1" / "p.parquet", ds / "q.parquet")
    with pytest.raises(UsageError, match="a symlink lies below") as err:
        datasets.open_dataset(Source("ds", str(ds)))
    assert f"find {ds} -type l" in str(err.value) and "q.parquet" not in str(err.value)


def test_an_sql_table_that_is_a_dataset_directory_is_walked_too(svc):
    """`dpcli sql` reads the columns of a dataset table through the same walk."""
    ds, part = _events(svc)
    q = ("sql", "SELECT page, ANON_COUNT(*) AS n FROM events GROUP BY page", "--epsilon", "1", "--delta", "1e-6")
    assert svc.run("alice", *q).exit_code == 0, svc.run("alice", *q).stderr
    os.chmod(part, 0o777)
    r = svc.run("alice", *q)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "ask the operator" in r.stderr, r.stderr


def test_catalog_set_checks_below_a_dataset_directory(svc):
    """The operator hears of it at `catalog set` already, with the directory and a `find` (no name below)."""
    ds = svc.data / "events"
    (ds / "year=2026").mkdir(parents=True)
    pl.DataFrame({"user": ["u0"], "page": ["/p/0"]}).write_parquet(ds / "year=2026" / "part-0.parquet")
    os.chmod(ds / "year=2026", 0o775)
    svc.catalog_toml += f'[datasets.events]\nlocation = "{ds}"\nprivacy_unit = "user"\nanalysts = ["alice"]\n'
    (svc.home / "catalog.toml").write_text(svc.catalog_toml)
    r = svc.owner("catalog", "set", svc.home / "catalog.toml")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and f"below {ds} is writable by its group" in r.stderr
    assert "year" not in r.stderr and f"find {ds} " in r.stderr
    os.chmod(ds / "year=2026", 0o755)
    assert svc.owner("catalog", "set", svc.home / "catalog.toml").exit_code == 0
