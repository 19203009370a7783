"""Review session 48, item 2 (a run builds only the command it names): ``dpcli --help histogram`` (root options
before the command, ``--help`` among them) is routed by ``app_for`` to the one-command app, so the root help lists
one command instead of all eight; ``build_app``'s docstring says ``--help`` gets every command, and the full app
(``dpcli.cli.app.app``, the CLI runner's and the man pages') prints them all."""

from __future__ import annotations

import pytest
from dptest import console, runner

from dpcli.cli.app import app


@pytest.mark.parametrize("argv", [["--help", "histogram"], ["-q", "--help", "budget", "show"], ["--help", "sql"]])
def test_root_help_before_a_command_is_the_whole_apps(argv):
    ran = console(*argv)
    whole = runner.invoke(app, argv, prog_name="dpcli")
    assert (ran.returncode, ran.stdout) == (whole.exit_code, whole.stdout)
    assert "stream-replay" in ran.stdout and "catalog" in ran.stdout
