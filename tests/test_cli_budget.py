"""The budget command, global options and exit codes (stdout and stderr checked apart)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from dpcli.cli.app import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_init_show_history_json():
    r = run("budget", "init", "alice", "--mode", "zcdp", "--rho", "0.5", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["mode"] == "zcdp"
    r = run("budget", "show", "alice", "--json")
    data = json.loads(r.stdout)
    assert data["remaining"]["rho"] == "0.5" and data["spent"]["rho"] == "0"
    assert run("budget", "history", "alice", "--json").stdout.strip() == "[]"
    assert run("budget", "verify", "alice").exit_code == 0


def test_compose_br_matches_paper_and_zcdp_keys():
    r = run("budget", "compose", "--mode", "br", "--epsilon-per", "0.15", "--count", "3000", "--call-budget", "30",
            "--delta-per", "1e-10", "--delta-prime", "1e-9", "--json")
    d = json.loads(r.stdout)
    assert round(d["epsilon"], 1) == 34.9 and abs(d["delta"] - 7e-9) < 1e-20
    d = json.loads(run("budget", "compose", "--mode", "zcdp", "--rho", "1.41", "--delta", "1e-10", "--json").stdout)
    assert round(d["epsilon"], 1) == 12.2 and round(d["epsilon_analytic"], 1) == 12.8


def test_bad_values_give_one_line_and_exit_2():
    for args in (["--mode", "pure", "--epsilon", "0"], ["--mode", "pure", "--epsilon", "-1"],
                 ["--mode", "approx", "--epsilon", "1", "--delta", "1"], ["--mode", "pure"],
                 ["--mode", "nope", "--epsilon", "1"], ["--mode", "pure", "--epsilon", "abc"]):
        r = run("budget", "init", "x", *args)
        assert r.exit_code == 2, (args, r.stderr)
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert run("budget", "init", "../evil", "--epsilon", "1").exit_code == 2


def test_missing_ledger_is_budget_refusal():
    r = run("budget", "show", "ghost")
    assert r.exit_code == 77 and "budget init ghost" in r.stderr


def test_corrupt_ledger_exit_78(state_dir):
    assert run("budget", "init", "c", "--epsilon", "1").exit_code == 0
    (state_dir / "ledgers" / "c.json").write_text("garbage")
    r = run("budget", "show", "c")
    assert r.exit_code == 78 and "corrupt" in r.stderr and "Traceback" not in r.stderr


def test_key_is_private_and_never_printed(state_dir):
    r = run("budget", "key", "--json")
    assert r.exit_code == 0
    key_file = state_dir / "secret.key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert oct(state_dir.stat().st_mode & 0o777) == "0o700"
    secret_hex = key_file.read_text().splitlines()[1]
    assert secret_hex not in r.stdout + r.stderr
    os.chmod(key_file, 0o644)
    r = run("budget", "key")
    assert r.exit_code == 78 and "chmod 600" in r.stderr
    os.chmod(key_file, 0o600)
    r = run("budget", "key", "--rotate", "--json")
    d = json.loads(r.stdout)
    assert d["fingerprint"] != d["old_fingerprint"]
    assert secret_hex not in r.stdout


def test_version_and_module_entry_points():
    out = subprocess.run([sys.executable, "-m", "dpcli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("dpcli ")
    exe = os.path.join(os.path.dirname(sys.executable), "dpcli")
    out = subprocess.run([exe, "budget", "compose", "--mode", "pure", "--epsilon", "0.1", "--count", "10", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout)["epsilon"] == "1"


def test_usage_error_exit_2():
    assert run("budget", "init").exit_code == 2
    assert run("nosuchcommand").exit_code == 2
