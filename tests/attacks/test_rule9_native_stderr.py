"""Rule 9 (no foreign text on any channel): what native code writes to stderr, and a native panic.

h-textcap, after h-attack's value amplification: polars' Rust writes to file descriptor 2 directly, past
every ``except`` (a panic's "thread … panicked at …", an allocation failure's message before the
process aborts), and a polars panic reaches Python as pyo3's ``PanicException``, a ``BaseException``
that ``except Exception`` lets through with its message. A process of its own now sends descriptor 2
to the null device and keeps its own messages on a duplicate (:func:`dpcli.errors.quiet_native_stderr`),
and the command wrapper maps a panic to an internal error that quotes nothing.
"""

from __future__ import annotations

import subprocess
import sys

import polars as pl
import pytest
import typer

from dpcli.cli._common import handles_errors

_SCRIPT = """
import os, subprocess, sys
from dpcli.errors import quiet_native_stderr
quiet_native_stderr()
os.write(2, b"native text\\n")
subprocess.run(["sh", "-c", "echo child text >&2"], check=True)
print("dpcli: error: own line", file=sys.stderr)
"""


def test_native_writes_to_stderr_are_dropped_and_own_lines_kept():
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "dpcli: error: own line\n"


def test_the_console_entry_point_still_reports_on_stderr(tmp_path):
    env = {"DPCLI_STATE_DIR": str(tmp_path / "none"), "DPCLI_ANALYST": "me", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "dpcli", "budget", "show"], capture_output=True, text=True,
                       timeout=60, check=False, env=env)
    assert r.returncode == 78 and r.stderr.startswith("dpcli: error: state directory"), (r.returncode, r.stderr)


def test_a_native_panic_is_an_internal_error_without_its_message(capsys):
    @handles_errors
    def command() -> None:
        raise pl.exceptions.PanicException("value of record 17")

    with pytest.raises(typer.Exit) as info:
        command()
    assert info.value.exit_code == 1
    err = capsys.readouterr().err
    assert err.startswith("dpcli: internal error (please report): PanicException at ") and "record" not in err
