"""``dpcli budget plan --json -- COMMAND ARGS`` with an ARGS that the command's parser refuses (an unknown option,
a missing required option) ends with click's own four-line usage block on stderr and *no* JSON error object on
stdout. The inner command is run with ``standalone_mode=True`` (``dpcli/cli/budget_plan.py`` ``_dry_run``), so
click prints the usage error itself and exits 2 before dpcli's one-line formatting
(:func:`dpcli.cli.app._run_with_json_errors`) can see it. The same error given to the command directly is one
line and, with ``--json``, a JSON error object (rule 7: one line on stderr; the documented ``--json`` ending).

Fix: run the inner command with ``standalone_mode=False`` and end a ``click.ClickException`` as the root does
(one line, its exit code, the JSON error object under ``--json``)."""

from __future__ import annotations

import json

from dptest import console, init_ledger


def test_an_inner_usage_error_is_one_line_and_a_json_error(tmp_path, state_dir):
    init_ledger("pure", "--epsilon", "1")
    data = tmp_path / "d.csv"
    data.write_text("user,g\nu1,a\n")
    direct = console("histogram", str(data), "--by", "g", "--bogus", "--json")
    assert direct.returncode == 2 and len(direct.stderr.strip().splitlines()) == 1
    assert json.loads(direct.stdout)["exit"] == 2
    planned = console("budget", "plan", "--json", "--", "histogram", str(data), "--by", "g", "--bogus")
    assert planned.returncode == 2
    assert len(planned.stderr.strip().splitlines()) == 1, planned.stderr  # BUG: click's usage block
    assert json.loads(planned.stdout)["exit"] == 2  # BUG: no JSON error object
