"""Rule: dpcli never reads for the analyst what the analyst could not read (issue 29, attacks 1, 3, 6).

In service mode analysts run dpcli through sudo as the service account, which can read the data,
the key and the state; they cannot. Each attack below reproduced on 554e946 (where dpcli opened any
path it was given, with its own rights, and let anyone pick any ledger): every one must now fail
with one line, before anything is read, and without printing what it aimed at.
"""

from __future__ import annotations

import json

import pytest
from dptest import Service

SECRET_VALUES = ("s17", "s42", "s299")  # values of the private column: none may ever be printed


@pytest.fixture
def svc(tmp_path, monkeypatch):
    service = Service(tmp_path, monkeypatch)
    service.setup()
    return service


def _nothing_private(result, *extra: str) -> None:
    text = result.stdout + result.stderr
    for secret in (*SECRET_VALUES, *extra):
        assert secret not in text, text


def test_an_analyst_queries_a_dataset_by_name(svc):
    r = svc.run("alice", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 0, r.stderr
    assert "/p/" in r.stdout
    r = svc.run("alice", "histogram", "visits", "--by", "page", "--epsilon", "1", "--keys", "pages")
    assert r.exit_code == 0, r.stderr


def test_attack_1_a_private_file_named_as_a_public_list(svc):
    """--keys naming the private data would print every distinct (user, secret) pair verbatim."""
    private = svc.data / "visits.csv"
    r = svc.run("alice", "histogram", "visits", "--by", "page", "--keys", private, "--epsilon", "1e-9")
    assert r.exit_code == 2, r.stderr
    assert "not a public list of the catalog" in r.stderr
    _nothing_private(r, "u17")
    r = svc.run("alice", "topk", "visits", "--by", "page", "-k", "1", "--keys", private, "--epsilon", "1")
    assert r.exit_code == 2, r.stderr


def test_attack_1_data_state_and_specs_by_path_are_refused(svc):
    private = str(svc.data / "visits.csv")
    cases = [
        ["histogram", private, "--by", "page", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6"],
        ["topk", private, "--by", "page", "-k", "1", "--privacy-unit", "user", "--epsilon", "1"],
        ["tabulate", "visits", "--spec", private],
        ["stream-replay", "visits", "--time", "secret", "--by", "page", "--window", "1d", "--triggers", "1",
         "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6", "--state", str(svc.state / "x.stream")],
    ]
    for args in cases:
        r = svc.run("alice", *args)
        assert r.exit_code == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        _nothing_private(r, "u17")


def test_attack_1_a_dataset_the_analyst_may_not_use_is_no_name(svc, tmp_path):
    svc.catalog_toml = svc.catalog_toml.replace('analysts = ["*"]\n[public', 'analysts = ["bob"]\n[public', 1)
    svc.setup(ledgers=False)
    r = svc.run("alice", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 2 and "not a dataset of the catalog you may use" in r.stderr
    assert svc.run("bob", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6").exit_code == 0


def test_the_privacy_unit_is_the_operators(svc):
    """Naming a unit column would tell whether a guess is the private unit column: refused outright."""
    for unit in ("user", "guess"):
        r = svc.run("alice", "histogram", "visits", "--by", "page", "--privacy-unit", unit, "--epsilon", "1",
                    "--delta", "1e-6")
        assert r.exit_code == 2 and "operator declared" in r.stderr, r.stderr


def test_outputs_only_into_the_analysts_directories(svc, tmp_path):
    query = ["histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6"]
    for target in (tmp_path / "anywhere.csv", svc.out / "bob" / "x.csv", svc.state / "x.csv", svc.data / "pages.csv"):
        r = svc.run("alice", *query, "-o", target)
        assert r.exit_code in (2, 73), (target, r.stderr)
        assert not target.exists() or target == svc.data / "pages.csv"
    r = svc.run("alice", *query, "-o", svc.out / "alice" / "pages.csv")
    assert r.exit_code == 0, r.stderr


def test_attack_3_plot_draws_only_releases_dpcli_wrote(svc):
    """plot PATH printed any file with a release-like column; every other column became a label."""
    r = svc.run("alice", "plot", svc.data / "visits.csv")
    assert r.exit_code == 2, r.stderr
    _nothing_private(r, "u17")
    forged = svc.out / "alice" / "forged.csv"  # a file the analyst planted in their own output directory
    forged.write_text("page,count\n" + "".join(f"{s},1\n" for s in SECRET_VALUES))
    r = svc.run("alice", "plot", forged)
    assert r.exit_code == 2 and "not a release dpcli wrote for you" in r.stderr, r.stderr
    _nothing_private(r)
    real = svc.out / "alice" / "release.csv"
    assert svc.run("alice", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6",
                   "-o", real).exit_code == 0
    r = svc.run("alice", "plot", real)
    assert r.exit_code == 0, r.stderr
    bobs = svc.out / "bob" / "release.csv"  # bob's release is not alice's to draw
    assert svc.run("bob", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6",
                   "-o", bobs).exit_code == 0
    assert svc.run("alice", "plot", bobs).exit_code == 2


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


def test_a_catalog_edited_by_hand_fails_its_seal(svc):
    path = svc.state / "catalog.json"
    doc = json.loads(path.read_text())
    doc["body"]["datasets"]["visits"]["analysts"] = ["mallory"]
    path.write_text(json.dumps(doc))
    r = svc.run("alice", "budget", "show")
    assert r.exit_code == 78 and "seal" in r.stderr


def test_personal_mode_never_reads_the_state_as_input(tmp_path, monkeypatch):
    """Attack 2 in personal mode: a symlink named x.csv to the key file printed the secret key."""
    from dptest import cli, init_pure_ledger

    init_pure_ledger()
    state = tmp_path / "state"
    key_hex = (state / "secret.key").read_text().split("\n")[1]
    link = tmp_path / "x.csv"
    link.symlink_to(state / "secret.key")
    copy = tmp_path / "k.csv"
    copy.write_bytes((state / "secret.key").read_bytes())
    data = tmp_path / "d.csv"
    data.write_text("user,g\n" + "".join(f"u{i},a\n" for i in range(50)))
    ledger_link = tmp_path / "l.csv"
    ledger_link.symlink_to(state / "ledgers" / "default.json")
    for keys in (link, copy, ledger_link):
        r = cli("histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--epsilon", "1")
        assert r.exit_code == 66, r.stderr
        assert key_hex not in r.stdout + r.stderr


def test_two_catalog_names_for_one_file_are_two_releases(svc):
    """The seed binds the catalog entry: another name (or an edited entry) is never a free replay."""
    svc.catalog_toml = svc.catalog_toml.replace(
        "[public.pages]", f'[datasets.visits2]\nlocation = "{svc.data / "visits.csv"}"\nprivacy_unit = "user"\n'
        'analysts = ["*"]\n[public.pages]')
    svc.setup(ledgers=False)
    query = ["--by", "page", "--epsilon", "1", "--delta", "1e-6", "--json"]
    first = json.loads(svc.run("alice", "histogram", "visits", *query).stdout)["summary"]
    again = json.loads(svc.run("alice", "histogram", "visits", *query).stdout)["summary"]
    other = json.loads(svc.run("alice", "histogram", "visits2", *query).stdout)["summary"]
    assert first["charged"] and not again["charged"] and other["charged"]
    assert other["seed_id"] != first["seed_id"]
