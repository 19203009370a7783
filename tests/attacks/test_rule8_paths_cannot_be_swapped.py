"""Rule 8: catalog locations and output directories cannot be swapped (issue 37, class 2).

A path is only as safe as whoever can rename its ancestors. ``catalog set`` resolves every location
once and refuses one with a component others could rename or write; at use the stored path is opened
without following any symlink, the opened file checked again, and an output directory must be the
one pinned (device, inode) when the catalog was sealed. (The in-process service runs as the test's
user, so "others" are simulated by symlinks and by modes: a group-writable or sticky world-writable
directory.)
"""

from __future__ import annotations

import os
import shutil

from dptest import Service

HISTOGRAM = ("histogram", "-", "--by", "page", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6")
STDIN = "user,page\nu1,/p/0\n"




def test_attack_a_public_list_swapped_for_a_symlink_to_a_private_file_is_refused(svc):
    private = svc.data / "visits.csv"
    listed = svc.data / "pages.csv"
    listed.unlink()
    listed.symlink_to(private)  # (as if the list lay where the analyst could rename it)
    r = svc.run("alice", *HISTOGRAM, "--keys", "pages", input=STDIN)
    assert r.exit_code == 2, r.stderr
    assert "no longer safe from renames" in r.stderr and "secret" not in r.stdout and "s1" not in r.stdout
    assert str(svc.data) not in r.stderr  # (the location is private)


def test_attack_a_public_list_whose_directory_is_swapped_for_a_symlink_is_refused(tmp_path, monkeypatch):
    svc = Service(tmp_path, monkeypatch)
    shared = svc.root / "shared"
    shared.mkdir()
    (shared / "pages.csv").write_text("page\n/p/0\n")
    svc.catalog_toml += f'[public.shared]\nlocation = "{shared / "pages.csv"}"\nanalysts = ["*"]\n'
    svc.setup()
    assert svc.run("alice", *HISTOGRAM, "--keys", "shared", input=STDIN).exit_code == 0
    shutil.rmtree(shared)
    fake = svc.root / "fake"
    fake.mkdir()
    os.symlink(svc.data / "visits.csv", fake / "pages.csv")
    shared.symlink_to(fake)  # the ancestor renamed and replaced by a symlink to a directory of hers
    r = svc.run("alice", *HISTOGRAM, "--keys", "shared", input=STDIN)
    assert r.exit_code == 2, r.stderr
    assert "s1" not in r.stdout and "secret" not in r.stdout


def test_attack_an_output_directory_renamed_and_replaced_by_a_symlink_into_the_data(svc):
    before = (svc.data / "visits.csv").read_bytes()
    out = svc.out / "alice"
    out.rename(svc.root / "alice-old")
    out.symlink_to(svc.data)
    r = svc.run("alice", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6",
                "-o", out / "visits.csv")
    assert r.exit_code == 2, r.stderr
    assert "no longer the one the catalog was sealed with" in r.stderr
    assert (svc.data / "visits.csv").read_bytes() == before


def test_attack_an_output_directory_replaced_by_another_real_directory_fails_its_pin(svc):
    out = svc.out / "alice"
    out.rename(svc.root / "alice-old")
    out.mkdir()
    r = svc.run("alice", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6",
                "-o", out / "x.csv")
    assert r.exit_code == 2 and "sealed with" in r.stderr
    assert not (out / "x.csv").exists()


def test_a_group_writable_ancestor_is_refused_at_catalog_set(tmp_path, monkeypatch):
    svc = Service(tmp_path, monkeypatch)
    svc.data.chmod(0o775)
    cat = svc.home / "catalog.toml"
    cat.write_text(svc.catalog_toml)
    r = svc.owner("catalog", "set", cat)
    assert r.exit_code == 2
    assert f"{svc.data} is writable by its group" in r.stderr and "catalog set again" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_sticky_world_writable_ancestor_is_refused_at_catalog_set(tmp_path, monkeypatch):
    svc = Service(tmp_path, monkeypatch)
    (svc.out / "alice").chmod(0o1777)  # /tmp-like
    cat = svc.home / "catalog.toml"
    cat.write_text(svc.catalog_toml)
    r = svc.owner("catalog", "set", cat)
    assert r.exit_code == 2
    assert "writable by others" in r.stderr and "sticky" in r.stderr and "outputs[0].directory" in r.stderr


def test_a_location_under_tmp_is_refused_at_catalog_set(tmp_path, monkeypatch):
    svc = Service(tmp_path, monkeypatch)
    (tmp_path / "pages.csv").write_text("page\n/p/0\n")
    svc.catalog_toml += f'[public.tmp]\nlocation = "{tmp_path / "pages.csv"}"\nanalysts = ["*"]\n'
    cat = svc.home / "catalog.toml"
    cat.write_text(svc.catalog_toml)
    r = svc.owner("catalog", "set", cat)
    assert r.exit_code == 2 and "public.tmp.location" in r.stderr


def test_the_catalog_stores_resolved_paths_and_pins_output_directories(svc):
    import json

    body = json.loads((svc.state / "catalog.json").read_text())["body"]
    assert body["public"]["pages"]["resolved"] == os.path.realpath(svc.data / "pages.csv")
    st = os.stat(svc.out / "alice")
    assert body["outputs"][0]["pin"] == [st.st_dev, st.st_ino]


def test_a_catalog_sealed_before_still_opens_and_is_checked_at_each_use(svc):
    from dpcli.access.catalog import read_toml, write_catalog

    write_catalog(svc.state, read_toml(svc.catalog_toml.encode()))  # no resolved paths, no pins
    run = ("histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6", "--keys", "pages")
    assert svc.run("alice", *run, "-o", svc.out / "alice" / "a.csv").exit_code == 0
    svc.data.chmod(0o775)  # now others could rename the list: refused at use, naming no path
    r = svc.run("alice", *run)
    assert r.exit_code == 2 and "ask the operator" in r.stderr and str(svc.data) not in r.stderr
    svc.data.chmod(0o755)
    (svc.out / "alice").chmod(0o777)
    r = svc.run("alice", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6",
                "-o", svc.out / "alice" / "b.csv")
    assert r.exit_code == 2 and not (svc.out / "alice" / "b.csv").exists()
