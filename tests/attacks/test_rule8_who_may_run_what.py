"""Rule 8 and the threat model's "who may run what": the analyst, the operator and what each may do.

Issue 29's attack 6 (on 554e946): ``--analyst``/``DPCLI_ANALYST`` picked any ledger, ``budget init`` made
new budget, ``--reseal`` handed it back; messages told analysts to run operator commands. The
service-mode review of issue 29 (on 8f4342e) added: sudo while the service account owns no state
directory fell back to personal mode as the service account; a tampered catalog's message named
``catalog set``; the caps notes named the operator's unit column; an output directory over the data
accepted by ``catalog set``. Resisted: ``SUDO_USER`` without ``SUDO_UID``, sudo to oneself, a user
without a name or with an invalid one, ``HOME``/``XDG_DATA_HOME`` pointing elsewhere, locations in
``budget`` and ``catalog`` views.
"""

from __future__ import annotations

import json

import pytest
from dptest import Service, runner
from service_checks import QUERY, _add, _one_line


@pytest.mark.parametrize("args", [
    ["--analyst", "bob", "budget", "show"],
    ["--state-dir", "/tmp/elsewhere", "budget", "show"],
    ["budget", "show", "bob"],
    ["budget", "history", "bob"],
    ["budget", "init", "alice2", "--mode", "pure", "--epsilon", "100"],
    ["budget", "verify", "--reseal"],
    ["budget", "key", "--rotate"],
    ["catalog", "set", "-"],
])
def test_attack_6_budget_is_not_anyones(svc, args):
    """--analyst/DPCLI_ANALYST picked any ledger, budget init made new budget, --reseal handed it back."""
    r = svc.run("alice", *args)
    assert r.exit_code == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("variable", ["DPCLI_ANALYST", "DPCLI_STATE_DIR", "_DPCLI_COMPLETE"])
def test_attack_6_the_environment_is_not_the_analysts_to_set(svc, variable):
    r = svc.run("alice", "budget", "show", env={variable: "bob"})
    assert r.exit_code == 2 and variable in r.stderr, r.stderr


def test_attack_6_a_restore_message_hands_the_analyst_no_operator_verb(svc):
    """After a restore the error line itself said "accept it with: dpcli budget verify NAME --reseal"."""
    ledger_file = svc.state / "ledgers" / "alice.json"
    ledger_file.write_bytes(ledger_file.read_bytes())  # replaced by a copy of itself: the reseal case
    r = svc.run("alice", "budget", "show")
    assert r.exit_code == 78, r.stderr
    assert "--reseal" not in r.stderr and "budget init" not in r.stderr and "ask the operator" in r.stderr
    r = svc.run("ops", "budget", "show", "alice")  # the operator is told how
    assert r.exit_code == 78 and "budget verify alice --reseal" in r.stderr
    assert svc.run("bob", "budget", "show").exit_code == 0  # other ledgers are untouched


def test_attack_6_no_ledger_tells_the_analyst_to_ask(svc):
    (svc.state / "ledgers" / "bob.json").unlink()
    (svc.state / "ledgers" / "bob.hwm").unlink()
    r = svc.run("bob", "budget", "show")
    assert r.exit_code == 77 and "budget init" not in r.stderr and "ask the operator" in r.stderr, r.stderr


def test_the_operator_may_do_what_analysts_may_not(svc):
    assert svc.run("ops", "budget", "init", "carol", "--mode", "pure", "--epsilon", "1").exit_code == 0
    assert svc.run("ops", "budget", "show", "alice").exit_code == 0
    r = svc.run("ops", "catalog", "show", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["datasets"]["visits"]["location"].endswith("visits.csv")


def test_an_analyst_sees_names_only(svc):
    r = svc.run("alice", "catalog", "show", "--json")
    doc = json.loads(r.stdout)
    assert list(doc["datasets"]) == ["visits"] and doc["datasets"]["visits"] == {}
    assert str(svc.data) not in r.stdout and "user" not in r.stdout.replace("users", "")


def test_service_mode_without_a_catalog_is_a_refusal(tmp_path, monkeypatch):
    svc = Service(tmp_path, monkeypatch)
    svc.state.mkdir(parents=True, mode=0o700)
    r = svc.run("alice", "histogram", str(svc.data / "visits.csv"), "--by", "page", "--privacy-unit", "user",
                "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2 and "no catalog" in r.stderr, r.stderr


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
    from dpcli.access import identity
    from dpcli.cli.app import app

    svc = Service(tmp_path, monkeypatch)
    (svc.home / "c.toml").write_text(svc.catalog_toml)
    euid, home = svc.euid, svc.home
    monkeypatch.setattr(identity, "SOURCE", access.IdentitySource(
        uid=lambda: euid, euid=lambda: euid, environ=lambda: {"SUDO_UID": "0", "SUDO_USER": "root"},
        user_name=lambda uid: "root" if uid == 0 else "svc", user_home=lambda uid: home))
    monkeypatch.setenv("DPCLI_STATE_DIR", str(svc.state))  # sudo -H: the account's home, so this directory
    r = runner.invoke(app, ["catalog", "set", str(svc.home / "c.toml")])
    assert r.exit_code == 0, r.stderr
    assert (svc.state / "catalog.json").exists()


def test_resists_a_sudo_user_without_a_sudo_uid(svc):
    from dpcli import access
    from dpcli.access import identity

    svc.owner("--version")
    src = identity.SOURCE
    for env in ({"SUDO_USER": "alice"}, {"SUDO_UID": "not-a-number", "SUDO_USER": "alice"}):
        caller = access.whoami(access.IdentitySource(uid=src.uid, euid=src.euid, environ=lambda env=env: env,
                                                     user_name=src.user_name, user_home=src.user_home))
        assert not caller.service and caller.name != "alice"  # not sudo: the owner's own run


def test_resists_sudo_to_oneself_and_unnamed_or_invalid_users(svc, monkeypatch):
    from dpcli import access
    from dpcli.access import identity
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
    monkeypatch.setattr(identity, "SOURCE", source({"SUDO_UID": "40000", "SUDO_USER": "alice$"}))
    r = runner.invoke(app, ["budget", "show"])  # a user name that is no valid ledger name
    assert r.exit_code == 2 and "invalid analyst name" in _one_line(r)


def test_resists_home_and_xdg_pointing_elsewhere(svc, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    r = svc.run("alice", "budget", "show", "--json", env={"HOME": str(elsewhere), "XDG_DATA_HOME": str(elsewhere)})
    assert r.exit_code == 0 and json.loads(r.stdout)["analyst"] == "alice"
    assert not elsewhere.exists()


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
    for args, said in ((["histogram", "units", "--by", "page", "--epsilon", "1", "--delta", "1e-6"],
                        "left out, so chosen from the data"),
                       (["histogram", "units", "--by", "page", "--epsilon", "1", "--delta", "1e-6", "--selection",
                         "unklap"], "per unit-group pair"),
                       (["topk", "units", "--by", "page", "-k", "1", "--count", "rows", "--epsilon", "1", "--delta",
                         "1e-6"], "per unit-group pair")):
        r = svc.run("alice", *args)
        assert r.exit_code == 0 and said in r.stderr, r.stderr
        assert "CANARY_UNIT" not in r.stdout + r.stderr
    r = svc.owner("--analyst", "alice", "histogram", data, "--by", "page", "--privacy-unit", "CANARY_UNIT",
                  "--epsilon", "1", "--delta", "1e-6", "--selection", "unklap")
    assert r.exit_code == 0 and "per CANARY_UNIT-group pair" in r.stderr  # personal mode: the column, as before
