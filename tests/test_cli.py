"""The command line's conventions: entry points, exit codes, one vocabulary (old spellings rewritten with a
note), output formats and rounding, shell completion, a fast start, and the release's metadata.

Most came from issue 17, "the first hour": one regression test per problem a newcomer hit, and the
conventions that fixed them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import polars as pl
import pytest
from dptest import PAGES, PV_SMALL, ROOT, cli, console, init_ledger

import dpcli
from dpcli.cli._aliases import expand_aliases
from dpcli.cli.app import app
from dpcli.io.outputs import rounded


def test_version_and_module_entry_points():
    out = subprocess.run([sys.executable, "-m", "dpcli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("dpcli ")
    exe = os.path.join(os.path.dirname(sys.executable), "dpcli")
    out = subprocess.run([exe, "budget", "compose", "--mode", "pure", "--epsilon", "0.1", "--count", "10", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout)["epsilon"] == "1"


def test_usage_error_exit_2():
    assert cli("budget", "init").exit_code == 2
    assert cli("nosuchcommand").exit_code == 2


def test_verbose_prints_the_traceback_and_the_error_line(state_dir):
    state_dir.mkdir()  # no ledger in it: exit 77
    r = cli("-v", "histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--epsilon", "1")
    assert r.exit_code == 77
    assert "Traceback (most recent call last)" in r.stderr and r.stderr.rstrip().splitlines()[-1].startswith("dpcli: error:")
    plain = cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--epsilon", "1")
    assert plain.exit_code == 77 and "Traceback" not in plain.stderr and plain.stderr.count("\n") == 1


# --- one vocabulary ------------------------------------------------------------------------------


@pytest.mark.parametrize("old, new", [
    (["topk", "x.csv", "--domain", "d.csv", "--dbar=5"], ["topk", "x.csv", "--keys", "d.csv", "--max-groups=5"]),
    (["-q", "stream-replay", "e.csv", "--key", "page", "--max-records", "3", "--clamp", "10"],
     ["-q", "stream-replay", "e.csv", "--by", "page", "--max-contributions", "3", "--bounds", "-10:10"]),
    (["--analyst", "tabulate", "tabulate", "plan", "--spec", "s.toml"],
     ["--analyst", "tabulate", "tabulate", "--dry-run", "--spec", "s.toml"]),
    (["budget", "compose", "--mode", "rdp-geometric", "--calls", "3"], ["budget", "compose", "--mode", "rdp", "--call-budget", "3"]),
    (["histogram", "x.csv", "--by", "--key"], ["histogram", "x.csv", "--by", "--key"]),  # not histogram's alias
    (["stream-replay", "x.csv", "--", "--key"], ["stream-replay", "x.csv", "--", "--key"]),  # after --: data
])
def test_old_spellings_are_rewritten_with_one_note_each(old, new):
    got, said = expand_aliases(old)
    assert got == new
    assert len(said) == len({t.partition("=")[0] for t in old} & {"--domain", "--dbar", "--key", "--max-records",
                                                                   "--clamp", "plan", "--calls", "rdp-geometric"}) \
        - (old[0] == "histogram") - ("--" in old)


def test_an_old_spelling_gives_the_same_release_and_a_deprecation_note(tmp_path):
    env = {**{k: None for k in os.environ if k.startswith("DPCLI_")}, "DPCLI_STATE_DIR": str(tmp_path / "state")}
    run = lambda *a: console(*a, env=env)  # noqa: E731 (as the console script runs it, in this process)
    assert run("budget", "init", "default", "--epsilon", "5").returncode == 0
    common = ["topk", PV_SMALL, "--by", "page", "-k", "3", "--privacy-unit", "user_id", "--epsilon-per", "0.1"]
    new, old = run(*common, "--keys", PAGES), run(*common, "--domain", PAGES)
    assert new.returncode == old.returncode == 0, old.stderr
    assert old.stdout == new.stdout  # same query, same release: a free replay
    assert "dpcli: note: --domain is deprecated (removed in 0.3); use --keys" in old.stderr
    assert "deprecated" not in new.stderr


def test_the_vocabulary_table_names_every_command_option():
    """docs/vocabulary.md lists each concept once; every option it names exists where it says."""
    text = (ROOT / "docs" / "vocabulary.md").read_text()
    import typer

    root = typer.main.get_command(app)
    for command, flags in {"histogram": ["--by", "--keys", "--max-contributions", "--max-partitions", "--bounds",
                                         "--max-groups", "--with-error", "--dry-run", "--delimiter"],
                           "topk": ["--by", "--keys", "--max-contributions", "--max-groups", "--epsilon", "--with-error",
                                    "--dry-run", "--max-partitions", "--selection", "--selection-share"],
                           "stream-replay": ["--by", "--max-contributions", "--bounds", "--with-error", "--dry-run"],
                           "tabulate": ["--with-error", "--dry-run"]}.items():
        opts = {o for p in root.commands[command].params for o in getattr(p, "opts", [])}
        for flag in flags:
            assert flag in opts, (command, flag)
            assert f"`{flag}" in text, flag
    hidden = {o for c in root.commands.values() for p in getattr(c, "params", []) for o in getattr(p, "opts", [])}
    assert not hidden & {"--domain", "--dbar", "--key", "--max-records", "--clamp"}


# --- output conventions ----------------------------------------------------------------------------


def test_floats_are_rounded_to_their_margin_and_grid_and_margins_upwards():
    df = pl.DataFrame({"sum_x": [337602.625, 12.5], "sum_x_moe95": [62910.375, 62910.375], "mean_x": [33.216, 1.0],
                       "count": [10, 11]})
    out = rounded(df, step=0.125)
    assert out["sum_x"].to_list() == [337603.0, 12.0] or out["sum_x"].to_list() == [337603.0, 13.0]
    assert out["sum_x_moe95"].to_list() == [62911.0, 62911.0]  # never narrower than the margin
    assert out["mean_x"].to_list() == [33.22, 1.0] and out["count"].to_list() == [10, 11]
    assert rounded(df)["mean_x"].to_list() == [33.216, 1.0]  # no grid, no margin: as computed


def test_table_format_is_readable_and_only_for_terminals(tmp_path):
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-5")
    args = ["histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "1"]
    r = cli(*args, "--format", "table")
    assert r.exit_code == 0 and "┃" in r.stdout and "/p/000" in r.stdout
    r = cli(*args, "--format", "table", "-o", tmp_path / "t.txt")
    assert r.exit_code == 2 and "--format table" in r.stderr


# --- set-up and release metadata --------------------------------------------------------------------


def test_setup_ends_with_a_working_command_and_release_metadata_exists():
    make = (ROOT / "Makefile").read_text()
    demo = make.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert ". .venv/bin/activate" in demo.splitlines()[-1] and "make install" in demo.splitlines()[-1]
    assert "\ninstall:" in make and "pipx install" in make and "\ninstall-man:" in make
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert f"## {dpcli.__version__} " in (ROOT / "CHANGELOG.md").read_text()
    page = (ROOT / "man" / "dpcli-histogram.1").read_text()
    assert f"dpcli {dpcli.__version__}" in page and ".SH EXAMPLES" in page
    assert cli("--version").stdout.strip() == f"dpcli {dpcli.__version__}"


def _completion(env: dict[str, str]) -> str:
    """What ``dpcli`` prints with ``env`` (as the console script runs it, in this process)."""
    r = console(env={**{k: None for k in os.environ if "COMPLETE" in k}, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("shell, needle", [("bash", "complete -o default -F"), ("zsh", "#compdef dpcli"),
                                           ("fish", "complete --command dpcli")])
def test_shell_completion_scripts_for_bash_zsh_and_fish(shell, needle):
    """typer's completion (`dpcli --install-completion` picks the running shell; the script for any
    shell comes from `_DPCLI_COMPLETE=source_<shell> dpcli`, which needs no shell detection)."""
    assert needle in _completion({"_DPCLI_COMPLETE": f"source_{shell}"})


def test_completion_completes_commands_and_the_one_vocabulary():
    words = lambda line, cword: _completion({"_DPCLI_COMPLETE": "complete_bash", "COMP_WORDS": line,  # noqa: E731
                                             "COMP_CWORD": str(cword)}).split()
    assert words("dpcli hist", 1) == ["histogram"]
    assert words("dpcli topk x.csv --max-g", 3) == ["--max-groups"]
    assert words("dpcli topk x.csv --dba", 3) == []  # deprecated spellings are not offered


def test_help_and_budget_show_load_neither_polars_nor_numpy(tmp_path):
    """Fast start (≤ 0.15 s for --help, measured in bench/bench_startup.py): the data libraries are
    imported by the commands that read data, not to print help or a ledger."""
    env = {**os.environ, "DPCLI_STATE_DIR": str(tmp_path / "s")}
    code = ("import sys; from dpcli.cli.app import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('polars', 'numpy') if m in sys.modules), file=sys.stderr)")
    subprocess.run([sys.executable, "-c", code, "budget", "init", "default", "--epsilon", "1"], env=env, check=True,
                   capture_output=True)
    for argv in (["--help"], ["budget", "show"], ["histogram", "--help"]):
        r = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True)
        assert r.stderr.strip().splitlines()[-1] == "[]", (argv, r.stderr)


def test_a_closed_pipe_is_a_normal_end_with_one_code_and_no_message(tmp_path):
    """`dpcli budget history | head -3` (issue 39): the reader closes standard output before dpcli writes
    (here: at once), and dpcli ends with exit 141 and nothing on stderr, never a traceback or an internal
    error."""
    import subprocess
    import sys

    env = {**os.environ, "DPCLI_STATE_DIR": str(tmp_path / "state")}
    subprocess.run([sys.executable, "-m", "dpcli", "budget", "init", "default", "--mode", "pure", "--epsilon", "1"],
                   env=env, check=True, capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "dpcli", "budget", "history", "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before dpcli has started (it takes ~0.3 s to write anything)
    err = proc.stderr.read()
    assert proc.wait(60) == 141 and err == b"", err


def test_budget_compose_refuses_an_option_its_mode_does_not_use(tmp_path):
    """Issue 39, item 5: `budget compose --mode approx --epsilon 0.5 --count 14 --delta 1e-7` printed
    "delta = 0" (there --delta was zcdp's and rdp's target δ, silently ignored). One meaning per option: the
    mode's unused options are refused, naming the one it takes; --delta-per composes to 14 × 1e-7."""
    from dptest import cli

    r = cli("budget", "compose", "--mode", "approx", "--epsilon", "0.5", "--count", "14", "--delta", "1e-7")
    assert r.exit_code == 2 and "does not use --delta (each mechanism's δ is --delta-per here)" in r.stderr
    ok = cli("budget", "compose", "--mode", "approx", "--epsilon", "0.5", "--count", "14", "--delta-per", "1e-7",
             "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["delta"] == pytest.approx(1.4e-6)
    assert cli("budget", "compose", "--mode", "pure", "--epsilon", "1", "--rho", "0.1").exit_code == 2


@pytest.mark.parametrize(("command", "usage"), [
    (["histogram"], "[OPTIONS] {INPUT}"), (["sql"], "[OPTIONS] [QUERY]"), (["tabulate"], "[OPTIONS] [PERSONS]"),
    (["budget", "show"], "[OPTIONS] [ANALYST]"), (["budget", "init"], "[OPTIONS] {ANALYST}"),
    (["plot"], "[OPTIONS] {RELEASE}"), (["catalog", "set"], "[OPTIONS] {FILE}")])
def test_usage_lines_name_arguments_as_their_help_does(command, usage):
    """Issue 39 item 11: the usage line read '{input}'; arguments are named in capitals, as in the Arguments
    section, braces (required) and brackets (optional) as README's Commands section explains."""
    first = cli(*command, "--help").stdout.splitlines()[0]
    assert first == f"Usage: dpcli {' '.join(command)} {usage}", first
    assert "a required argument is\nin braces" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("argv", [
    ["histogram", "--help"], ["topk", "--help"], ["sql", "--help"], ["tabulate", "--help"], ["plot", "--help"],
    ["stream-replay", "--help"], ["budget", "--help"], ["budget", "show", "--help"], ["catalog", "set", "--help"],
    ["histogram", "--bogus"], ["histogram"], ["budget", "shw"], ["histogram", PV_SMALL, "--by", "page", "--epsilon",
                                                                 "x"],
    ["histogram", PV_SMALL, "--json", "--by"]])
def test_a_run_of_one_command_parses_prints_and_refuses_as_the_whole_app(argv):
    """Issue 41 item 4: a run builds only the command it names (dpcli.cli.app.build_app); its help, usage errors
    and exit codes must be those of the app with every command (the CLI runner's, the man pages')."""
    from typer.testing import CliRunner

    from dpcli.cli.app import app, app_for, build_app

    assert app_for(list(argv)) is build_app(argv[0]) and app_for(["--help"]) is app
    one, whole = (CliRunner().invoke(a, argv, prog_name="dpcli") for a in (build_app(argv[0]), app))
    assert (one.exit_code, one.stdout, one.stderr) == (whole.exit_code, whole.stdout, whole.stderr)
    assert list(typer_commands(build_app(argv[0]))) == [argv[0]]


def typer_commands(app):
    import typer.main

    return typer.main.get_command(app).commands


def test_engine_spark_without_pyspark_is_one_line_before_any_charge(monkeypatch):
    """--engine spark where pyspark is not installed was an internal error (a ModuleNotFoundError, exit 1) from
    where the release first imported it; now the engine check refuses it with the install line (exit 2)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a))
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    for extra, install in (((), "dpcli[spark]"), (("--remote", "sc://localhost:15002"), "dpcli[spark-connect]")):
        r = cli("histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--max-partitions", "1",
                "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6", "--engine", "spark", *extra)
        assert r.exit_code == 2 and r.stderr == f"dpcli: error: --engine spark needs pyspark: pip install '{install}'\n"
    from dptest import history

    assert history() == []


def test_the_engine_options_are_declared_once_and_reach_the_command_as_one_value():
    """Issue 40, item 5 (the engine group): --engine, --master, --remote and --spark-conf are declared once
    (cli/_options.engine_options) and each command gets their EngineRequest; help lists them where they were."""
    from dpcli.cli._groups import engine_options

    seen = []

    @engine_options
    def command(a: int, engine: object = None, b: int = 0) -> None:
        seen.append((a, engine, b))

    import inspect

    assert list(inspect.signature(command).parameters) == ["a", "engine", "master", "remote", "spark_conf", "b"]
    command(1, engine="spark", master="local[2]", remote=None, spark_conf=["k=v"], b=2)
    (a, request, b), = seen
    assert (a, b) == (1, 2) and (request.engine, request.master, request.remote, request.conf) == (
        "spark", "local[2]", None, ("k=v",))
    help_text = cli("topk", "--help").stdout
    assert help_text.index("--delimiter") < help_text.index("--engine") < help_text.index("--spark-conf")
