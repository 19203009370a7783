"""h-attack (review of issue 37), rule 8: what lies *below* a catalog dataset directory is never checked.

FIXED (h-walk): see the fix at the end of this docstring.

``catalog set`` checks every component of a dataset directory's path from ``/`` down to the directory,
and at use the directory is opened without following symlinks and its owner and mode checked
(:meth:`dpcli.access.Gate._open_location`). But the files of a dataset are then listed with
``Path.rglob`` and ``is_file()`` (which follows symlinks) and opened by path by polars
(:func:`dpcli.io.inputs.open_dataset`): nothing below the directory is checked. A partition
sub-directory that someone else can write (an ETL account's ``year=2026/``, group-writable for a team:
common for partitioned data, and nothing in the seal or in README's set-up forbids it) lets them plant
``x.parquet -> /any/file/the/service/account/reads.parquet``: the service account then reads another
dataset (one this analyst may not use) as part of this one, for this analyst. The release is noisy,
but rule 8 ("never reads for the analyst what the analyst could not read") is broken, and with
``--by`` over the planted file's columns the analyst gets DP statistics of a dataset the catalog
withholds from them.

Suggested fix: list the dataset from the directory descriptor opened at use (``os.fwalk`` with
``follow_symlinks=False`` from that fd, or ``openat`` with ``O_NOFOLLOW`` per name), refuse a symlink
anywhere below, check each sub-directory and file with :func:`dpcli.io.beneath.unsafe_stat` (owner root
or the service account, not group- or other-writable), and hand polars the opened descriptors (or
``/proc/self/fd/N`` of them), not the paths.
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
