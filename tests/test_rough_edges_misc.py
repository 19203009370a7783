"""Issue 39's rough edges a new user met on real data (items 2, 9b, 14, 15, 16), each fixed and held here.

A service set up with a Python other users cannot run is refused at set-up, naming the fix; a public list or a
query file given as a pipe (``--keys <(…)``) is read, its format told by its first bytes; plot captions say what
the bars are and mention margins only when there are some; topk says when its released counts are out of rank
order; ``--install-completion`` shows what it adds and asks first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from dptest import PV, SAMPLE, Service, cli

# --- 2. a service whose Python lies in root's home ---------------------------------------------------------------


@pytest.fixture
def pyenv_python(monkeypatch):
    """A venv's ``bin/python`` linking to an interpreter in a home directory only its owner may enter (as
    ``python3 -m venv`` from a pyenv python makes it), set as ``sys.executable``; under ``/tmp`` (searchable by
    all), so only the modes made here decide. Yields (the home, the interpreter)."""
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        base.chmod(0o755)
        home = base / "root-home"
        real = home / ".pyenv" / "versions" / "3.12.1" / "bin" / "python3.12"
        real.parent.mkdir(parents=True)
        real.write_bytes(b"\x7fELF")
        real.chmod(0o755)
        home.chmod(0o700)
        venv = base / "opt" / "dpcli" / "bin"
        venv.mkdir(parents=True)
        (venv / "python").symlink_to(real)
        monkeypatch.setattr(sys, "executable", str(venv / "python"))
        yield home, real
    finally:
        home.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_set_up_as_the_service_refuses_a_python_other_users_cannot_run(tmp_path, monkeypatch, pyenv_python):
    home, real = pyenv_python
    svc = Service(tmp_path, monkeypatch)
    svc.interpreter = None  # (sys.executable, patched)
    svc.setup()  # the owner, in personal mode: not checked (no analyst runs through it)
    (svc.home / "catalog.toml").write_text(svc.catalog_toml)
    for args in (["budget", "init", "carol", "--mode", "pure", "--epsilon", "1"],
                 ["catalog", "set", str(svc.home / "catalog.toml")]):
        r = svc.run("ops", *args)
        assert r.exit_code == 2, r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"dpcli: error: {' '.join(args[:2])}: "), r.stderr
        assert f"others may not enter {home} (o+x)" in r.stderr and str(real) in r.stderr
        assert "/usr/bin/python3 -m venv /opt/dpcli" in r.stderr
    assert "carol" not in svc.run("ops", "budget", "show", "carol").stdout
    home.chmod(0o755)
    real.chmod(0o750)  # the file itself: others must read and run it
    r = svc.run("ops", "budget", "init", "carol", "--mode", "pure", "--epsilon", "1")
    assert r.exit_code == 2 and "others may not read and run it (o+rx)" in r.stderr, r.stderr
    real.chmod(0o755)  # every user can run it: set-up goes on
    r = svc.run("ops", "budget", "init", "carol", "--mode", "pure", "--epsilon", "1")
    assert r.exit_code == 0, r.stderr
    assert svc.run("ops", "catalog", "set", str(svc.home / "catalog.toml")).exit_code == 0


def test_the_interpreter_check_follows_the_venv_link_and_its_own_directories(tmp_path):
    from dpcli.access import interpreter_refusal

    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        base.chmod(0o755)
        real = base / "usr" / "bin" / "python3"
        real.parent.mkdir(parents=True)
        real.write_bytes(b"")
        real.chmod(0o755)
        venv = base / "venv" / "bin"
        venv.mkdir(parents=True)
        (venv / "python").symlink_to(real)
        assert interpreter_refusal(str(venv / "python")) is None
        (base / "venv").chmod(0o750)  # the venv itself closed to others: its bin/python cannot be run either
        refusal = interpreter_refusal(str(venv / "python"))
        assert refusal is not None and f"others may not enter {base / 'venv'} (o+x)" in refusal
        assert f"(what {venv / 'python'} links to)" in refusal
    finally:
        (base / "venv").chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)
