"""Issue 31's smaller stumbles of a new user writing a cron job, each fixed and held here.

Global options after the command; a ``.tsv`` input and a device or pipe as ``-o`` without ``--format``;
``--value`` without ``--bounds`` named as such; a column typo answered with the closest name (never
to a service-mode analyst, to whom the names are private); a header that another ``--delimiter``
would split pointed out; a misspelt ``--state-dir`` refused (exit 78) instead of silently created.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
import typer
from dptest import PV_SMALL, SAMPLE, Service, cli, console

from dpcli.cli._aliases import ROOT_FLAGS, ROOT_VALUE_OPTIONS, hoist_root_options
from dpcli.cli.app import app
from dpcli.io.outputs import output_format_for
from dpcli.state.atomic import writes_in_place

HIST = ["histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--epsilon", "0.5", "--delta", "1e-7"]


@pytest.fixture
def ledger(state_dir: Path) -> Path:
    assert cli("budget", "init", "default", "--mode", "approx", "--epsilon", "10", "--delta", "1e-5").exit_code == 0
    return state_dir


def _env(state_dir: Path) -> dict[str, str | None]:
    return {**{k: None for k in os.environ if k.startswith("DPCLI_")}, "DPCLI_STATE_DIR": str(state_dir)}


# --- 1. global options after the command -----------------------------------------------------------


def test_global_options_after_the_command_are_the_global_options(ledger, tmp_path):
    other = tmp_path / "other"
    assert cli("--state-dir", other, "budget", "init", "default", "--epsilon", "1", "--mode", "approx",
               "--delta", "1e-6").exit_code == 0
    before = console("-q", "--state-dir", other, *HIST, env=_env(ledger))
    after = console(*HIST, "-q", "--state-dir", other, env=_env(ledger))
    assert before.returncode == after.returncode == 0, after.stderr
    assert after.stdout == before.stdout and after.stderr == before.stderr == ""  # -q: no notes; a free replay
    assert cli("--state-dir", other, "budget", "history").stdout.count("replay") == 1  # charged to `other`
    loud = console(*HIST, "--state-dir=" + str(other), "-v", env=_env(ledger))
    assert loud.returncode == 0 and "dpcli: note:" in loud.stderr
    shown = console("budget", "show", "--analyst", "default", "-q", "--state-dir", other, "--json", env=_env(ledger))
    assert shown.returncode == 0 and '"spent"' in shown.stdout


def test_a_value_that_spells_a_global_option_stays_the_commands():
    """Only tokens in an option's place move: ``--by -q`` is a column named ``-q``, and nothing after ``--``."""
    takes = {("histogram",): frozenset({"--by", "-o", "--output"})}.get
    hoist = lambda *a: hoist_root_options(list(a), lambda path: takes(path, frozenset()))  # noqa: E731
    assert hoist("histogram", "f", "--by", "-q", "-v") == ["-v", "histogram", "f", "--by", "-q"]
    assert hoist("--analyst", "a", "histogram", "f", "-o", "x", "--lock-timeout", "3", "-qq") == [
        "--lock-timeout", "3", "-qq", "--analyst", "a", "histogram", "f", "-o", "x"]
    assert hoist("histogram", "f", "--", "-q") == ["histogram", "f", "--", "-q"]
    assert hoist("budget", "show", "-q") == ["-q", "budget", "show"]
    asked = []
    assert hoist_root_options(["histogram", "f", "--by", "a"], lambda p: asked.append(p) or frozenset()) == [
        "histogram", "f", "--by", "a"]
    assert asked == []  # typer's command is built only when a global option may follow the command


def test_no_command_option_shares_a_name_with_a_global_option():
    root = typer.main.get_command(app)

    def commands(group):
        for c in getattr(group, "commands", {}).values():
            yield c
            yield from commands(c)

    names = {o for c in commands(root) for p in c.params for o in getattr(p, "opts", [])}
    assert not {n for n in names if ROOT_FLAGS.fullmatch(n) or n in ROOT_VALUE_OPTIONS}


# --- 2. .tsv inputs; devices and pipes as outputs -----------------------------------------------------


def test_a_tsv_input_is_split_on_tabs(ledger, tmp_path):
    tsv = tmp_path / "views.tsv"
    tsv.write_text((SAMPLE / "page_views.csv").read_text().replace(",", "\t"))
    plain, tab = cli(*HIST[:1], tsv, *HIST[2:]), cli(*HIST[:1], tsv, *HIST[2:], "-d", "tab")
    assert plain.exit_code == tab.exit_code == 0, plain.stderr
    assert plain.stdout == tab.stdout and plain.stdout.startswith("country,count\n")  # one reading: a replay
    comma = cli(*HIST[:1], tsv, *HIST[2:], "-d", ",")
    assert comma.exit_code == 65 and "--delimiter tab is probably needed" in comma.stderr, comma.stderr


def test_output_format_without_an_extension_is_csv_and_an_unknown_one_is_refused(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert output_format_for("/dev/null", None) == output_format_for(str(fifo), None) == "csv"
    assert output_format_for(str(tmp_path / "daily"), None) == "csv" and output_format_for("x.json", None) == "json"
    assert writes_in_place("/dev/null") and writes_in_place("/dev/stdout") and writes_in_place(fifo)
    assert not writes_in_place(tmp_path / "x.csv") and not writes_in_place(tmp_path)
    r = cli(*HIST, "-o", tmp_path / "x.txt")
    assert r.exit_code == 2 and "--format is needed" in r.stderr


def test_a_pipe_as_output_is_written_through_never_replaced(ledger, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))  # blocks until dpcli opens it
    reader.start()
    r = cli(*HIST, "-o", fifo)
    reader.join(timeout=60)
    assert r.exit_code == 0, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and not reader.is_alive()
    assert got == [cli(*HIST).stdout.encode()]  # what stdout gets (a free replay)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a device node needs root")
def test_a_device_as_output_stays_a_device(ledger, tmp_path):
    """Before: ``-o /dev/null`` (with ``--format csv``) renamed a regular file over /dev/null, as root."""
    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        null.write_bytes(b"x")  # a file system mounted nodev refuses to open it
    except OSError:
        pytest.skip("no device nodes here")
    r = cli(*HIST, "-o", null)
    assert r.exit_code == 0 and stat.S_ISCHR(os.stat(null).st_mode), r.stderr


# --- 3. --value and --bounds, each named when missing ------------------------------------------------


def test_a_value_without_bounds_names_bounds_where_they_cannot_be_chosen(ledger):
    """Bounds left out are chosen from the data (a note says so); where they cannot be (a grid spacing given
    without bounds, a margin target), the error names --bounds."""
    for agg in ("mean", "median"):
        r = cli(*HIST, "--agg", agg, "--value", "duration_s")
        assert r.exit_code == 0 and "--bounds " in r.stderr and "left out, so chosen from the data" in r.stderr, r.stderr
    r = cli(*HIST, "--agg", "median", "--value", "duration_s", "--granularity", "1")
    assert r.exit_code == 2 and r.stderr.startswith("dpcli: error: --bounds is needed by median: LO:HI"), r.stderr
    r = cli(*HIST, "--agg", "count,p50")
    assert r.exit_code == 2 and r.stderr.startswith("dpcli: error: --value is needed by p50"), r.stderr
    stream = ["stream-replay", PV_SMALL, "--time", "ts", "--by", "page", "--privacy-unit", "user_id", "--window", "7d",
              "--trigger-every", "1d", "--max-contributions", "2", "--epsilon", "1", "--delta", "1e-9"]
    r = cli(*stream, "--value", "duration_s")
    assert r.exit_code == 2 and r.stderr.startswith("dpcli: error: --bounds is needed by a sum"), r.stderr
    r = cli(*stream, "--bounds", "-9:9")
    assert r.exit_code == 2 and r.stderr.startswith("dpcli: error: --value is needed with bounds"), r.stderr


# --- 4 and 5. a column typo, a header another delimiter splits ----------------------------------------


def test_a_column_typo_gets_the_closest_name(ledger):
    r = cli(*[("contry" if a == "country" else a) for a in HIST])
    assert r.exit_code == 65 and "column 'contry' not found" in r.stderr and "did you mean 'country'?" in r.stderr
    assert r.stderr.count("\n") == 1
    r = cli(*[("nothing_like_it" if a == "country" else a) for a in HIST])
    assert r.exit_code == 65 and "did you mean" not in r.stderr and "(columns: " in r.stderr


def test_a_semicolon_file_read_with_commas_points_at_the_delimiter(ledger, tmp_path):
    semi = tmp_path / "views.csv"
    semi.write_text((SAMPLE / "page_views.csv").read_text().replace(",", ";"))
    r = cli(*HIST[:1], semi, *HIST[2:])
    assert r.exit_code == 65 and r.stderr == ("dpcli: error: --delimiter ';' is probably needed: column 'user_id' "
                                              f"not found in {semi}, whose header is one column that ';' splits "
                                              "into 5\n")
    ok = cli(*HIST[:1], semi, *HIST[2:], "--delimiter", ";")
    assert ok.exit_code == 0, ok.stderr


def test_a_service_mode_analyst_learns_no_column_name_from_a_typo(tmp_path, monkeypatch):
    """The operator's column names are private to an analyst (README, threat model): no suggestion, no
    list of columns, no delimiter hint (the catalog fixes the delimiter)."""
    svc = Service(tmp_path, monkeypatch)
    (svc.data / "semi.csv").write_text("user;page;secret\n" + "".join(f"u{i};/p/{i % 3};s{i}\n" for i in range(50)))
    svc.catalog_toml += f'[datasets.semi]\nlocation = "{svc.data / "semi.csv"}"\nprivacy_unit = "user"\n' \
                        'analysts = ["*"]\n'
    svc.setup()
    for dataset, by, missing in (("visits", "secre", "secre"), ("visits", "pag", "pag"), ("semi", "page", "user")):
        r = svc.run("alice", "histogram", dataset, "--by", by, "--epsilon", "1", "--delta", "1e-6")
        assert r.exit_code == 65, r.stderr
        assert r.stderr == f"dpcli: error: column {missing!r} not found in {dataset}\n"
    r = svc.owner("--analyst", "alice", "histogram", svc.data / "visits.csv", "--by", "pag", "--privacy-unit", "user",
                  "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 65 and "did you mean 'page'?" in r.stderr  # the operator, in personal mode: suggested


# --- 6. a misspelt state directory --------------------------------------------------------------------


def test_a_state_directory_that_does_not_exist_is_refused_and_not_created(ledger, tmp_path):
    """Issue 31's review added the dry runs of a schedule and of a stream, which created it (then exit 77)."""
    typo = tmp_path / "stat"
    schedule = ["histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id",
                "--keys", SAMPLE / "pages_public.csv",
                "--schedule", "daily", "--total-epsilon", "1", "--dry-run", "--units", "1000"]
    stream = ["stream-replay", PV_SMALL, "--time", "ts", "--by", "page", "--privacy-unit", "user_id", "--window", "7d",
              "--trigger-every", "1d", "--max-contributions", "2", "--epsilon", "1", "--delta", "1e-9", "--dry-run"]
    for args in (HIST, [*HIST, "--dry-run"], ["budget", "show"], ["budget", "history"], ["budget", "verify"],
                 schedule, stream, [*stream, "--state", tmp_path / "s.stream"]):
        r = console("--state-dir", typo, *args)
        assert r.returncode == 78 and r.stdout == "", (args, r.stderr)
        assert r.stderr == (f"dpcli: error: state directory {typo} does not exist (is its name right?); "
                            "'dpcli budget init NAME' creates it with a ledger\n")
        assert not typo.exists()
    r = console(*HIST, "--state-dir", typo, env=_env(ledger))  # after the command too
    assert r.returncode == 78 and not typo.exists()
    assert cli("--state-dir", typo, "budget", "init", "me", "--epsilon", "1").exit_code == 0 and typo.is_dir()
    r = cli("--state-dir", typo, *HIST)
    assert r.exit_code == 77 and "no budget ledger" in r.stderr  # the directory exists: 'default' has no ledger
