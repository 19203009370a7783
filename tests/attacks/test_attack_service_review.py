"""Review of service mode (issue 29): attacks by an analyst (and a careless operator) on the gate.

Each ``test_attack_*`` reproduced on 8f4342e; each ``test_resists_*`` is an attack the code already
withstood, kept so that it stays withstood. The deployment is simulated as in
:class:`dptest.Service` (sudo is a replaced identity source); races are staged with hooks that run
the attacker's move between the gate's check and dpcli's open or write.
"""

from __future__ import annotations

import json
import os

import polars as pl
import pytest
from dptest import Service, runner

QUERY = ["histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6"]


@pytest.fixture
def svc(tmp_path, monkeypatch):
    """The deployment with a catalog and one ledger: alice's (the attacker's)."""
    service = Service(tmp_path, monkeypatch, analysts=("alice",))
    service.setup(ledgers=False)
    r = service.owner("budget", "init", "alice", "--mode", "approx", "--epsilon", "10", "--delta", "1e-4")
    assert r.exit_code == 0, r.stderr
    return service


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _add(svc: Service, section: str, name: str, location: object, unit: str | None = "user") -> None:
    """The operator adds ``[section.name]`` at ``location`` (every analyst may use it) and reinstalls."""
    svc.catalog_toml += (f'[{section}.{name}]\nlocation = "{location}"\n'
                         + (f'privacy_unit = "{unit}"\n' if section == "datasets" else "") + 'analysts = ["*"]\n')
    svc.setup(ledgers=False)


# --- identity: who runs dpcli ----------------------------------------------------------------------


def test_attack_sudo_without_the_service_state_directory_is_no_personal_mode(tmp_path, monkeypatch):
    """Before the operator set up the state directory (or while it is moved away for a restore), dpcli
    run through sudo by an analyst fell back to personal mode *as the service account*: any
    --state-dir, any ledger with any budget, any path opened with the account's rights."""
    svc = Service(tmp_path, monkeypatch)
    mine = tmp_path / "alices-state"
    private = svc.data / "visits.csv"
    attempts = [
        ["--state-dir", mine, "budget", "init", "default", "--mode", "pure", "--epsilon", "1000"],
        ["budget", "init", "alice", "--mode", "pure", "--epsilon", "1000"],
        ["--state-dir", mine, "histogram", svc.data / "pages.csv", "--by", "page", "--privacy-unit", "page",
         "--keys", private, "--epsilon", "1"],
    ]
    for args in attempts:
        r = svc.run("alice", *args)
        assert r.exit_code == 2, (args, r.stderr)
        assert "ask the operator" in _one_line(r) and "u17" not in r.stdout + r.stderr
    assert not mine.exists() and not svc.state.exists()


def test_root_through_sudo_still_sets_the_service_up(tmp_path, monkeypatch):
    """README step 4: root runs ``sudo -H -u dpcli dpcli catalog set``; there is no state directory yet."""
    from dpcli import access
    from dpcli.cli.app import app

    svc = Service(tmp_path, monkeypatch)
    (svc.home / "c.toml").write_text(svc.catalog_toml)
    euid, home = svc.euid, svc.home
    monkeypatch.setattr(access, "SOURCE", access.IdentitySource(
        uid=lambda: euid, euid=lambda: euid, environ=lambda: {"SUDO_UID": "0", "SUDO_USER": "root"},
        user_name=lambda uid: "root" if uid == 0 else "svc", user_home=lambda uid: home))
    monkeypatch.setenv("DPCLI_STATE_DIR", str(svc.state))  # sudo -H: the account's home, so this directory
    r = runner.invoke(app, ["catalog", "set", str(svc.home / "c.toml")])
    assert r.exit_code == 0, r.stderr
    assert (svc.state / "catalog.json").exists()


def test_resists_a_sudo_user_without_a_sudo_uid(svc):
    from dpcli import access

    svc.owner("--version")
    src = access.SOURCE
    for env in ({"SUDO_USER": "alice"}, {"SUDO_UID": "not-a-number", "SUDO_USER": "alice"}):
        caller = access.whoami(access.IdentitySource(uid=src.uid, euid=src.euid, environ=lambda env=env: env,
                                                     user_name=src.user_name, user_home=src.user_home))
        assert not caller.service and caller.name != "alice"  # not sudo: the owner's own run


def test_resists_sudo_to_oneself_and_unnamed_or_invalid_users(svc, monkeypatch):
    from dpcli import access
    from dpcli.cli.app import app
    from dpcli.errors import UsageError

    euid, home = svc.euid, svc.home

    def source(env, uid=euid, names=None):
        return access.IdentitySource(uid=lambda: uid, euid=lambda: euid, environ=lambda: env,
                                     user_name=lambda u: (names or {}).get(u), user_home=lambda u: home)

    assert not access.whoami(source({"SUDO_UID": str(euid), "SUDO_USER": "alice"})).service  # the account itself
    with pytest.raises(UsageError):  # set-user-id by a uid without a name in the user database
        access.whoami(source({}, uid=euid + 4242))
    svc.run("alice", "--version")
    monkeypatch.setattr(access, "SOURCE", source({"SUDO_UID": "40000", "SUDO_USER": "alice$"}))
    r = runner.invoke(app, ["budget", "show"])  # a user name that is no valid ledger name
    assert r.exit_code == 2 and "invalid analyst name" in _one_line(r)


def test_resists_home_and_xdg_pointing_elsewhere(svc, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    r = svc.run("alice", "budget", "show", "--json", env={"HOME": str(elsewhere), "XDG_DATA_HOME": str(elsewhere)})
    assert r.exit_code == 0 and json.loads(r.stdout)["analyst"] == "alice"
    assert not elsewhere.exists()


# --- reading: only what the catalog names, as named --------------------------------------------------


def test_attack_a_typed_path_equal_to_a_resolved_location_is_not_opened(svc):
    """--spec was opened whenever its text equalled a location the run had resolved: naming the dataset
    and then its (guessed) location as the spec confirmed the guess and quoted the data's TOML error
    position ("not valid TOML (at line 1, column 5)": the length of the first column name)."""
    location = str(svc.data / "visits.csv")
    r = svc.run("alice", "tabulate", "visits", "--spec", location)
    assert r.exit_code == 2, r.stderr
    line = _one_line(r)
    assert "TOML" not in line and "line 1" not in line and "opens no path" in line
    guess = svc.run("alice", "tabulate", "visits", "--spec", str(svc.data / "guess.csv"))
    assert _one_line(guess).replace(str(svc.data / "guess.csv"), "P") == line.replace(location, "P")


def test_attack_files_below_a_dataset_directory_are_not_opened_by_typed_paths(svc):
    """Any path below a catalog dataset directory passed the gate: a spec aimed at an operator's notes
    file there printed its keys ("password: unknown key"), and at a missing name told hive
    partitions (data values) from absent ones."""
    ds = svc.data / "ds"
    ds.mkdir()
    pl.DataFrame({"user": ["a", "b"], "page": ["x", "y"]}).write_parquet(ds / "p0.parquet")
    (ds / "_notes.toml").write_text('password = "hunter2"\n')
    (ds / "diagnosis=HIV").mkdir()
    _add(svc, "datasets", "ds", ds)
    lines = set()
    for target in (ds / "_notes.toml", ds / "p0.parquet", ds / "diagnosis=HIV", ds / "diagnosis=flu"):
        r = svc.run("alice", "tabulate", "ds", "--spec", target)
        assert r.exit_code == 2, r.stderr
        assert "password" not in r.stderr and "hunter2" not in r.stderr
        lines.add(_one_line(r).replace(str(target), "P"))
    assert len(lines) == 1, lines  # one refusal, whatever lies there


def test_attack_a_missing_or_broken_dataset_does_not_name_its_location(svc):
    """In service mode the data's locations are private, yet open errors quoted them."""
    data = svc.data / "visits.csv"
    data.rename(svc.data / "moved.csv")
    r = svc.run("alice", *QUERY)
    assert r.exit_code == 66 and "'visits'" in r.stderr, r.stderr
    assert str(svc.data) not in r.stderr
    empty = svc.data / "empty-ds"
    empty.mkdir()
    odd = svc.data / "odd-ds"
    odd.mkdir()
    (odd / "notes.txt").write_text("x")
    _add(svc, "datasets", "empty", empty)
    _add(svc, "datasets", "odd", odd)
    for name in ("empty", "odd"):
        r = svc.run("alice", "histogram", name, "--by", "page", "--epsilon", "1", "--delta", "1e-6")
        assert r.exit_code in (2, 66), r.stderr
        assert str(svc.data) not in r.stderr and f"'{name}'" in _one_line(r)
    (svc.data / "pages.csv").unlink()
    r = svc.run("alice", *QUERY, "--keys", "pages")
    assert r.exit_code == 66 and str(svc.data) not in _one_line(r)


def test_attack_a_column_type_names_no_category_and_no_field(svc):
    """A polars type's text is foreign: an Enum's lists its categories (data values, even unseen ones),
    a Struct's its fields (private column names). Errors printed it as the column's type."""
    data = svc.data / "typed.parquet"
    enum = pl.Enum(["flu", "CANARY-CATEGORY"])
    pl.DataFrame({"user": ["a", "b"], "page": ["x", "y"], "diag": pl.Series(["flu", "flu"], dtype=enum),
                  "nest": [{"CANARY_FIELD": 1}, {"CANARY_FIELD": 2}]}).write_parquet(data)
    _add(svc, "datasets", "typed", data)
    runs = [["histogram", "{D}", "--by", "page", "--agg", "sum", "--value", "diag", "--bounds", "0:1"],
            ["histogram", "{D}", "--by", "nest", "--keys", "-"],
            ["stream-replay", "{D}", "--time", "diag", "--by", "page", "--window", "1d", "--triggers", "1",
             "--max-contributions", "1"]]
    for service in (True, False):
        for args in runs:
            args = [a.replace("{D}", "typed" if service else str(data)) for a in args]
            args += ["--epsilon", "1", "--delta", "1e-6"] + ([] if service else ["--privacy-unit", "user"])
            r = svc.run("alice", *args, input="nest\n1\n") if service else svc.owner("--analyst", "alice", *args)
            assert r.exit_code in (2, 65), (args, r.stderr)
            assert "CANARY" not in r.stderr, r.stderr


def test_attack_a_stream_whose_column_types_changed_names_no_category(svc):
    """A stream state records its key columns' types; when the operator replaced the data with other
    types, the refusal printed both types in full: an Enum's categories (here of the group column)."""
    data = svc.data / "events.parquet"

    def write(categories: list[str]) -> None:
        pl.DataFrame({"user": ["a", "b"], "page": pl.Series(["x", "x"], dtype=pl.Enum(categories)),
                      "t": ["2026-11-01T10:00:00Z"] * 2}).write_parquet(data)

    write(["x", "CANARY-THEN"])
    _add(svc, "datasets", "events", data)
    stream = ["stream-replay", "events", "--time", "t", "--by", "page", "--window", "1d", "--triggers", "1",
              "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6", "--state", "s"]
    assert svc.run("alice", *stream, "--through", "2026-11-02").exit_code == 0
    write(["x", "CANARY-NOW"])
    r = svc.run("alice", *stream, "--through", "2026-11-03")
    assert r.exit_code == 65 and "schema changed" in _one_line(r), r.stderr
    assert "CANARY" not in r.stderr


def test_resists_a_spec_on_stdin_whose_block_list_is_a_path(svc, tmp_path):
    from tabulate_specs import spec_toml

    levels = '[[levels]]\ngeography = "nation"\niterations = "reg"\nepsilon = 1\nstability = 4\n'
    spec = spec_toml(levels).replace('blocks = "blocks.csv"',
                                                               f'blocks = "{svc.data / "visits.csv"}"')
    r = svc.run("alice", "tabulate", "visits", "--spec", "-", input=spec)
    assert r.exit_code == 2 and "geography.blocks the path given is not a public list" in _one_line(r), r.stderr
    assert str(svc.data) not in r.stderr


def test_resists_stream_state_names_that_are_paths(svc):
    for name in ("../x", ".hidden", "a/b", "/tmp/x", "x\n"):
        r = svc.run("alice", "stream-replay", "visits", "--time", "secret", "--by", "page", "--window", "1d",
                    "--triggers", "1", "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6", "--state", name)
        assert r.exit_code == 2 and "--state" in _one_line(r), (name, r.stderr)
    assert not (svc.state / "streams" / "x.stream").exists()


def test_resists_uris_device_files_and_spark_endpoints_given_by_the_analyst(svc):
    private = f"file://{svc.data / 'visits.csv'}"
    for args in (["histogram", private, "--by", "page", "--epsilon", "1", "--delta", "1e-6"],
                 [*QUERY, "--keys", private],
                 [*QUERY, "--keys", "/dev/stdin"],
                 ["tabulate", "visits", "--spec", "/dev/stdin"],
                 [*QUERY, "--engine", "spark", "--remote", "sc://attacker:15002"],
                 [*QUERY, "--engine", "spark", "--master", "local[2]", "--spark-conf", "spark.jars=/tmp/x.jar"],
                 ["plot", "-", "--summary", svc.data / "visits.csv"]):
        r = svc.run("alice", *args, input="page\n/p/0\n")
        assert r.exit_code == 2, (args, r.stderr)
        assert "s17" not in r.stdout + r.stderr


def test_resists_stdin_as_a_public_list(svc):
    r = svc.run("alice", *QUERY, "--keys", "-", input="page\n/p/0\n")
    assert r.exit_code == 0, r.stderr


# --- writing and plotting: only in the analyst's directories, also under races ------------------------


def _group_writable_subdir(svc: Service) -> tuple:
    """A directory the analyst made in their (group-writable) output directory, and the private one
    they will swap it for."""
    sub = svc.out / "alice" / "sub"
    sub.mkdir()
    return sub, svc.data


def _swap_after_check(monkeypatch, sub, target, after_calls: int) -> None:
    """After the gate's ``after_calls``-th write check, ``sub`` becomes a symlink to ``target``."""
    from dpcli import access

    original = access.Gate.check_write
    calls = []

    def check_then_swap(self, path, what="output"):
        original(self, path, what)
        calls.append(path)
        if len(calls) == after_calls and not sub.is_symlink():
            sub.rename(sub.with_name("sub.old"))
            sub.symlink_to(target, target_is_directory=True)

    monkeypatch.setattr(access.Gate, "check_write", check_then_swap)


@pytest.mark.parametrize("command", [
    [*QUERY, "-o", "{S}/x.csv"],
    ["budget", "show", "--plot", "{S}/x.svg"],
])
def test_attack_a_directory_swapped_for_a_symlink_after_the_check_cannot_redirect_a_write(svc, monkeypatch,
                                                                                        command):
    """With a group-writable output directory, the analyst swapped a subdirectory for a symlink to the
    private data directory between the gate's check and the write: the release landed there (it could
    overwrite the data, or any file the service account may write)."""
    sub, private = _group_writable_subdir(svc)
    before = sorted(p.name for p in private.iterdir())
    _swap_after_check(monkeypatch, sub, private, after_calls=2)
    r = svc.run("alice", *[a.replace("{S}", str(sub)) for a in command])
    assert sorted(p.name for p in private.iterdir()) == before, r.stderr
    assert r.exit_code == 2 and "output directories" in _one_line(r), r.stderr


def test_attack_plot_opens_no_file_swapped_in_after_the_check(svc, monkeypatch):
    """plot checked the path, then opened it: a release swapped for a symlink in between had the
    service account open any file, and its answer told which exist (66) from which do not (2)."""
    from dpcli import access

    release = svc.out / "alice" / "r.csv"
    assert svc.run("alice", *QUERY, "-o", release).exit_code == 0
    lines = set()
    for target in (svc.data / "visits.csv", svc.data / "diagnosis=HIV", svc.data):
        release.unlink(missing_ok=True)
        release.write_text("page,count\n")
        original = access.Gate.allow_read

        def allow_then_swap(self, path, target=target, original=original):
            original(self, path)
            release.unlink()
            release.symlink_to(target)

        monkeypatch.setattr(access.Gate, "allow_read", allow_then_swap)
        r = svc.run("alice", "plot", release)
        monkeypatch.setattr(access.Gate, "allow_read", original)
        assert r.exit_code == 2, r.stderr
        lines.add(_one_line(r))
    assert len(lines) == 1, lines


def test_resists_planted_symlinks_in_the_output_directory(svc):
    link_dir = svc.out / "alice" / "data"
    link_dir.symlink_to(svc.data, target_is_directory=True)
    r = svc.run("alice", *QUERY, "-o", link_dir / "pages.csv")
    assert r.exit_code == 2 and (svc.data / "pages.csv").read_text().startswith("page\n/p/0")
    link = svc.out / "alice" / "v.csv"
    link.symlink_to(svc.data / "visits.csv")
    r = svc.run("alice", "plot", link)
    assert r.exit_code == 2 and "s17" not in r.stdout + r.stderr
    r = svc.run("alice", "plot", svc.out / "alice" / ".." / "bob" / "x.csv")
    assert r.exit_code == 2


def test_attack_a_write_that_fails_is_one_line_not_an_internal_error(svc):
    """plot -o / budget show --plot into a directory that cannot be written ended in an internal error
    (exit 1, the OS error's type) instead of exit 73."""
    locked = svc.out / "alice" / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root: the permission does not hold; a missing directory then
            locked.chmod(0o700)
            locked.rmdir()
        r = svc.run("alice", "budget", "show", "--plot", locked / "b.svg")
        assert r.exit_code == 73, r.stderr
        assert "internal error" not in r.stderr
    finally:
        if locked.exists():
            locked.chmod(0o700)


# --- budget and messages ---------------------------------------------------------------------------


def test_attack_a_tampered_catalog_tells_the_analyst_no_operator_verb(svc):
    """The seal error said "(edited without dpcli catalog set?)" to everyone."""
    path = svc.state / "catalog.json"
    doc = json.loads(path.read_text())
    doc["body"]["operators"] = ["alice"]
    path.write_text(json.dumps(doc))
    r = svc.run("alice", "budget", "show")
    assert r.exit_code == 78 and "catalog set" not in r.stderr and "ask the operator" in _one_line(r), r.stderr
    r = svc.owner("budget", "show", "alice")
    assert r.exit_code == 78 and "dpcli catalog set" in r.stderr


def test_resists_free_replays_across_catalog_names_and_entry_edits(svc):
    svc.catalog_toml += (f'[datasets.visits2]\nlocation = "{svc.data / "visits.csv"}"\nprivacy_unit = "user"\n'
                         'analysts = ["*"]\n')
    svc.setup(ledgers=False)
    first = svc.run("alice", *QUERY)
    assert svc.run("alice", *QUERY).stdout == first.stdout  # the same name: a free replay
    other = svc.run("alice", "histogram", "visits2", *QUERY[2:])
    svc.catalog_toml = svc.catalog_toml.replace('privacy_unit = "user"', 'privacy_unit = "secret"', 1)
    svc.setup(ledgers=False)
    edited = svc.run("alice", *QUERY)
    assert other.exit_code == edited.exit_code == 0
    history = json.loads(svc.run("alice", "budget", "history", "--json").stdout)
    assert [bool(e["replay_of"]) for e in history] == [False, True, False, False]


def test_resists_learning_locations_from_budget_and_catalog_views(svc):
    assert svc.run("alice", *QUERY).exit_code == 0
    for args in (["budget", "history", "--json"], ["budget", "show", "--json"], ["catalog", "show"],
                 ["catalog", "show", "--json"], ["budget", "key"]):
        r = svc.run("alice", *args)
        assert r.exit_code == 0 and str(svc.data) not in r.stdout + r.stderr and "secret.key" not in r.stdout


def test_attack_an_output_directory_over_the_data_is_refused_at_catalog_set(tmp_path, monkeypatch):
    """A careless operator gave an output directory that holds the data (or the state): every catalog
    file not read by the run itself could be overwritten by ``-o`` (here the public list)."""
    svc = Service(tmp_path, monkeypatch, analysts=("alice",))
    for broad in (tmp_path, svc.data, svc.home):
        svc.catalog_toml = svc.catalog_toml.replace(f'directory = "{svc.out / "alice"}"', f'directory = "{broad}"')
        cat = svc.home / "catalog.toml"
        cat.write_text(svc.catalog_toml)
        r = svc.owner("catalog", "set", cat)
        assert r.exit_code == 2 and "outputs[0].directory" in _one_line(r), (broad, r.stderr)
        svc.catalog_toml = svc.catalog_toml.replace(f'directory = "{broad}"', f'directory = "{svc.out / "alice"}"')
    svc.setup(ledgers=False)  # the catalog as it should be is accepted


def test_attack_notes_do_not_name_the_operators_unit_column(svc):
    """The caps notes named the privacy unit column on every run ("counts are per user-group pair"):
    the column the catalog keeps from analysts (``catalog show`` hides it, ``--privacy-unit`` is refused)."""
    data = svc.data / "units.csv"
    data.write_text("CANARY_UNIT,page\n" + "".join(f"u{i},/p/{i % 2}\n" for i in range(40)))
    _add(svc, "datasets", "units", data, unit="CANARY_UNIT")
    for args in (["histogram", "units", "--by", "page", "--epsilon", "1", "--delta", "1e-6"],
                 ["topk", "units", "--by", "page", "-k", "1", "--count", "rows", "--epsilon", "1", "--delta", "1e-6"]):
        r = svc.run("alice", *args)
        assert r.exit_code == 0 and "per unit-group pair" in r.stderr, r.stderr
        assert "CANARY_UNIT" not in r.stdout + r.stderr
    r = svc.owner("--analyst", "alice", "histogram", data, "--by", "page", "--privacy-unit", "CANARY_UNIT",
                  "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 0 and "per CANARY_UNIT-group pair" in r.stderr  # personal mode: the column, as before
