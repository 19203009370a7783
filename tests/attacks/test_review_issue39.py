"""Adversarial review of issue 39's new channels (07707e0: --json error objects, SIGTERM, notes' job; e2fc742:
public lists and query files as pipes).

One flaw found, of the --json contract rather than of privacy: a run that ends before its command starts (the
root callback: a service-mode refusal of --state-dir or DPCLI_*, a missing catalog, a tampered one) or is
interrupted outside the command's own handler wrote its line on stderr and *nothing* on stdout under --json,
although "a wrapper that parses stdout gets an object for every ending, never nothing" (fail). The object is
the stderr line, so it says nothing the line does not.

Resisted (no test of its own beyond those in test_rule3_new_channels.py and test_endings_and_logs.py): the error
object, the interrupted line and the note suffix are the same for D and D′ (the line says which ledgers this run
charged and which outputs it wrote: debits precede the first private read, writes follow the release); SIGTERM
in a pipe read, at the first private read, after the output, and during interpreter exit never gave an output
without a charge; usage errors under --json in service mode quote only what the analyst typed; in service mode
-f/--keys paths (pipes or not) are refused with one message whatever lies there; a data input given as a pipe
(a FIFO, /dev/stdin, a symlink to one) is refused; a pipe is read once per run and its bytes reused for the header
check and the release.
"""

from __future__ import annotations

import json

import pytest

from dpcli.cli import app as app_module
from dpcli.cli._common import Terminated
from dpcli.cli.app import main


def _main(*args: object) -> int:
    with pytest.raises(SystemExit) as end:
        main([str(a) for a in args])
    return int(end.value.code)


def test_a_service_refusal_before_the_command_is_an_object_under_json(svc, capsys):
    """--state-dir refused in service mode (the root callback's handler): stderr had its line, stdout nothing."""
    svc._identity("alice")
    code = _main("--state-dir", "/tmp/elsewhere", "budget", "show", "--json")
    out = capsys.readouterr()
    line = out.err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("dpcli: error: --state-dir")
    assert json.loads(out.out) == {"error": line, "exit": 2}


def test_a_sigterm_outside_the_command_is_an_object_under_json(state_dir, capsys, monkeypatch):
    """SIGTERM before the command's handler runs (here: while the root callback sets up): 143 and the
    interrupted line, and under --json its object too."""
    def terminated(*args, **kwargs):
        raise Terminated

    monkeypatch.setattr(app_module, "start", terminated)
    monkeypatch.setattr(app_module, "_TERMINATED", [15])
    code = _main("budget", "show", "--json")
    out = capsys.readouterr()
    line = out.err.strip().splitlines()[-1]
    assert code == 143 and line.startswith("dpcli: interrupted by SIGTERM: this run charged nothing")
    assert json.loads(out.out) == {"error": line, "exit": 143}
