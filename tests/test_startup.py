"""Start-up of the dpcli process (issue 30): what main() does to the process it runs in.

In a process of its own (the console script: ``main()`` without arguments) numpy's OpenBLAS is
told to start no threads unless the user said otherwise, and the start-up objects are frozen out
of the garbage collector; an in-process caller of ``main(argv)`` gets neither. The timings are in
bench/ (``make bench-small``), never here.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from dpcli.cli.app import main

REPORT = ("import atexit, gc, os, sys\n"
          "atexit.register(lambda: print(os.environ.get('OPENBLAS_NUM_THREADS'), gc.get_freeze_count() > 0,"
          " file=sys.stderr))\n"
          "sys.argv = ['dpcli', '--help']\n"
          "from dpcli.cli.app import main\n"
          "main()\n")


@pytest.mark.parametrize(("given", "seen"), [(None, "1"), ("2", "2")])
def test_the_console_script_starts_numpy_without_blas_threads_and_freezes_its_start_up(given, seen):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given  # a user's setting wins
    r = subprocess.run([sys.executable, "-c", REPORT], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"{seen} True"


def test_an_in_process_caller_keeps_its_environment_and_its_garbage_collector(monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    frozen = gc.get_freeze_count()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert gc.get_freeze_count() == frozen
    assert "OPENBLAS_NUM_THREADS" not in os.environ
