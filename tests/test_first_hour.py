"""Issue 17, "the first hour": one regression test per problem a newcomer hit, and the conventions
that fixed them (one vocabulary, notes in pipes, dry-run margins, rounding, tables, set-up)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import polars as pl
import pytest
from dptest import history
from typer.testing import CliRunner

import dpcli
from dpcli.cli._aliases import expand_aliases
from dpcli.cli.app import app
from dpcli.io.outputs import rounded

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"
PV, PAGES = str(SAMPLE / "page_views.parquet"), str(SAMPLE / "pages_public.csv")
runner = CliRunner()


def cli(*args: str, **kw) -> object:
    return runner.invoke(app, [str(a) for a in args], **kw)


def init(*args: str) -> None:
    r = cli("budget", "init", "default", *(args or ("--mode", "approx", "--epsilon", "20", "--delta", "1e-5")))
    assert r.exit_code == 0, r.stderr


def notes(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("dpcli: note:")]


# --- the bugs of the report -------------------------------------------------------------------


@pytest.mark.parametrize("mode, extra", [
    (("--mode", "zcdp", "--rho", "5"), ("--keys", PAGES)),
    (("--mode", "approx", "--epsilon", "20", "--delta", "1e-5"), ("--keys", PAGES, "--delta", "1e-8")),
    (("--mode", "zcdp", "--rho", "5", "--delta", "1e-6"), ("--delta", "1e-9")),  # groups discovered
])
def test_quantiles_with_rho_release(mode, extra):
    """The README's quantile example with --rho (reported as `need num ≥ 0 without a scale`)."""
    init(*mode)
    r = cli("histogram", SAMPLE / "page_views.csv", "--by", "page", "--privacy-unit", "user_id", "--agg",
            "median,p90", "--value", "duration_s", "--bounds", "0:600", "--noise", "gaussian", "--rho", "0.1", *extra)
    assert r.exit_code == 0, r.stderr
    out = pl.read_csv(r.stdout.encode())
    assert out.height > 0 and out["median_duration_s"].is_between(0, 600).all()
    assert (out["p90_duration_s"] >= 0).all()


def test_verbose_prints_the_traceback_and_the_error_line():
    r = cli("-v", "histogram", PV, "--by", "page", "--privacy-unit", "user_id", "--epsilon", "1")
    assert r.exit_code == 77
    assert "Traceback (most recent call last)" in r.stderr and r.stderr.rstrip().splitlines()[-1].startswith("dpcli: error:")
    plain = cli("histogram", PV, "--by", "page", "--privacy-unit", "user_id", "--epsilon", "1")
    assert plain.exit_code == 77 and "Traceback" not in plain.stderr and plain.stderr.count("\n") == 1


def test_output_onto_the_input_by_a_relative_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    init()
    (tmp_path / "copy.csv").write_bytes((SAMPLE / "page_views.csv").read_bytes())
    before = (tmp_path / "copy.csv").read_bytes()
    r = cli("histogram", "copy.csv", "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "1",
            "-o", "copy.csv")
    assert r.exit_code == 73 and "is the input" in r.stderr
    assert (tmp_path / "copy.csv").read_bytes() == before and history() == []


def test_default_caps_say_so_in_plain_words_even_in_a_pipe():
    """CliRunner's stderr is not a terminal: the notes must appear anyway, and -q silences them."""
    init()
    args = ("histogram", PV, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "1")
    said = notes(cli(*args).stderr)
    assert ("dpcli: note: counts are per user_id-group pair, at most 1 row per user_id: raise --max-contributions "
            "to count more rows") in said
    assert any("--max-partitions" in n for n in said)
    assert notes(cli("-q", *args).stderr) == []
    explicit = cli(*args, "--max-contributions", "1", "--max-partitions", "1")
    assert not any("--max-" in n for n in notes(explicit.stderr))
    units_only = cli(*args, "--agg", "count-units", "--max-partitions", "2")  # distinct units: no row cap to raise
    assert not any("--max-contributions" in n for n in notes(units_only.stderr))


def test_mostly_noise_is_said_and_follows_the_released_values():
    init("--mode", "pure", "--epsilon", "10")
    r = cli("histogram", PV, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "0.001",
            "--max-contributions", "1", "--max-partitions", "1")
    assert r.exit_code == 0
    assert any("count is mostly noise" in n for n in notes(r.stderr)), r.stderr
    big = cli("histogram", PV, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "5",
              "--max-contributions", "1", "--max-partitions", "1")
    assert not any("mostly noise" in n for n in notes(big.stderr)), big.stderr


def test_advice_mostly_noise_uses_the_median_released_value():
    from dpcli.advice import mostly_noise

    assert mostly_noise("count", [1, -3, 2], 10) is not None
    assert mostly_noise("count", [100, 300, 200], 10) is None
    assert mostly_noise("count", [], 10) is None


def test_bottom_and_empty_releases_are_noted_in_a_pipe():
    init()
    r = cli("topk", PV, "--by", "page", "-k", "60", "--privacy-unit", "user_id", "--epsilon-per", "0.05",
            "--delta", "1e-9", "--max-groups", "100")
    assert r.exit_code == 0, r.stderr
    assert any("(⊥)" in n for n in notes(r.stderr)), r.stderr
    r = cli("histogram", PV, "--by", "ts", "--privacy-unit", "user_id", "--epsilon", "0.1", "--delta", "1e-9",
            "--max-contributions", "1", "--max-partitions", "1")
    assert r.exit_code == 0 and r.stdout.strip() == "ts,count", r.stderr
    assert any("0 groups released" in n for n in notes(r.stderr)), r.stderr


def test_a_schedule_run_with_a_tiny_share_of_its_epsilon_says_so(tmp_path):
    init()
    snap = tmp_path / "snap.parquet"
    pl.read_parquet(PV).head(20000).write_parquet(snap)  # about 9,000 units: epoch 0 gets ε ≈ 0.005
    r = cli("histogram", snap, "--by", "page", "--privacy-unit", "user_id", "--agg", "count-units", "--keys", PAGES,
            "--schedule", "daily", "--total-epsilon", "1", "--max-partitions", "1")
    assert r.exit_code == 0, r.stderr
    assert any("this run of the schedule used ε =" in n for n in notes(r.stderr)), r.stderr


def test_spec_errors_are_usage_errors_not_damaged_state(tmp_path):
    bad = tmp_path / "spec.toml"
    bad.write_text((SAMPLE / "safetab_spec.toml").read_text() + "\ncolour = 1\n")
    r = cli("tabulate", "--dry-run", "--spec", bad)
    assert r.exit_code == 2 and "colour: unknown key" in r.stderr


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCLI_")}
    env["DPCLI_STATE_DIR"] = str(tmp_path / "state")
    dpcli_bin = str(Path(sys.executable).with_name("dpcli"))
    run = lambda *a: subprocess.run([dpcli_bin, *a], env=env, capture_output=True, text=True)  # noqa: E731
    assert run("budget", "init", "default", "--epsilon", "5").returncode == 0
    common = ["topk", PV, "--by", "page", "-k", "3", "--privacy-unit", "user_id", "--epsilon-per", "0.1"]
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
                                    "--dry-run"],
                           "stream-replay": ["--by", "--max-contributions", "--bounds", "--with-error", "--dry-run"],
                           "tabulate": ["--with-error", "--dry-run"]}.items():
        opts = {o for p in root.commands[command].params for o in getattr(p, "opts", [])}
        for flag in flags:
            assert flag in opts, (command, flag)
            assert f"`{flag}" in text, flag
    hidden = {o for c in root.commands.values() for p in getattr(c, "params", []) for o in getattr(p, "opts", [])}
    assert not hidden & {"--domain", "--dbar", "--key", "--max-records", "--clamp"}


# --- dry runs, topk --epsilon, stream margins --------------------------------------------------


def test_dry_run_shows_margins_in_output_units_and_whether_the_ledger_accepts():
    init("--mode", "pure", "--epsilon", "1")
    args = ["histogram", PV, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--agg", "count,sum",
            "--value", "duration_s", "--bounds", "0:600", "--granularity", "0.5", "--epsilon", "0.5", "--dry-run"]
    doc = json.loads(cli(*args, "--json").stdout)
    assert doc["ledger"] == {"analyst": "default", "accepts": True, "refusal": None}
    rows, s = doc["calibration"]["rows"], doc["calibration"]["sum"]
    assert rows["moe95"] >= 1 and s["moe95"] == pytest.approx(
        dpcli_noise_margin(s) * 0.5)  # grid units × granularity
    text = cli(*args).stdout
    assert "95% margin ±" in text and "would accept" in text
    too_much = json.loads(cli(*args[:-3], "--epsilon", "2", "--dry-run", "--json").stdout)
    assert too_much["ledger"]["accepts"] is False and "ε left is 1" in too_much["ledger"]["refusal"]
    assert history() == []  # a dry run charges nothing


def dpcli_noise_margin(description: dict) -> int:
    from fractions import Fraction

    from dpcli.core.mechanisms import Noise

    return Noise("laplace", Fraction(description["scale"])).margin95()


@pytest.mark.parametrize("known, counts", [(True, True), (True, False), (False, True), (False, False)])
def test_topk_epsilon_is_what_a_pure_ledger_is_charged(known, counts):
    init("--mode", "approx", "--epsilon", "5", "--delta", "1e-5")
    domain = ["--keys", PAGES] if known else ["--delta", "1e-9"]
    r = cli("topk", PV, "--by", "page", "-k", "4", "--privacy-unit", "user_id", "--epsilon", "0.6", *domain,
            *([] if counts else ["--no-counts"]), "--json")
    assert r.exit_code == 0, r.stderr
    cost = json.loads(r.stdout)["summary"]["cost"]
    assert sum(float(e.get("epsilon", 0)) for e in cost) == pytest.approx(0.6)


def test_stream_replay_with_error_adds_the_worst_trigger_margin(tmp_path):
    from dpcli.core import tree

    init()
    ev = tmp_path / "ev.csv"
    pl.DataFrame({"ts": [f"2026-11-01T{h:02d}:00:00" for h in range(24)] * 5,
                  "u": [f"u{i}" for i in range(120)], "page": ["a", "b", "c"] * 40}).write_csv(ev)
    args = ["stream-replay", ev, "--time", "ts", "--by", "page", "--privacy-unit", "u", "--window", "1d",
            "--triggers", "8", "--max-contributions", "1", "--epsilon", "5", "--delta", "1e-6", "--through", "2026-11-02"]
    plan = json.loads(cli(*args, "--dry-run", "--json").stdout)
    sigma = plan["perturbation"]["sigma_count"]
    expected = 1.96 * math.sqrt(tree.prefix_variances(sigma**2, 8).max())
    assert plan["moe95"]["count"] == pytest.approx(expected, rel=1e-9)
    r = cli(*args, "--with-error", "--format", "json")
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)
    # Shown rounded up to two significant digits: never below the margin, at most 10% above it.
    assert rows and all(expected <= row["count_moe95"] <= expected * 1.1 for row in rows)


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
    init()
    args = ["histogram", PV, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "1"]
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
    dpcli_bin = str(Path(sys.executable).with_name("dpcli"))
    clean = {k: v for k, v in os.environ.items() if "COMPLETE" not in k}
    r = subprocess.run([dpcli_bin], capture_output=True, text=True, env={**clean, **env})
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


def test_a_ledger_that_can_never_pay_refuses_before_reading_the_data(tmp_path):
    """The tour's first histogram on a pure ledger: refused at once (exit 77), with what to do,
    without reading the data (here: a file that is not even there)."""
    init("--mode", "pure", "--epsilon", "1")
    r = cli("histogram", tmp_path / "missing.csv", "--by", "country", "--privacy-unit", "user_id", "--epsilon", "0.5",
            "--delta", "1e-7")
    assert r.exit_code == 77 and "has a δ, which a pure ε-DP ledger cannot pay" in r.stderr
    assert "public list of groups" in r.stderr and history() == []
