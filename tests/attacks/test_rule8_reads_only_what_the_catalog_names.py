"""Rule 8, dpcli never reads for the analyst what the analyst could not read: only what the catalog names, as named.

In service mode analysts run dpcli through sudo as the service account, which can read the data, the
key and the state; they cannot. Issue 29's attacks 1 and 2 (a private file named as a public list, as
the data, as a spec or as a ``--state`` file; in personal mode the key named as ``--keys``) reproduced
on 554e946, where dpcli opened any path it was given with its own rights: every one must now fail with
one line, before anything is read, and without printing what it aimed at.

The service-mode review of issue 29 (on 8f4342e; ``test_attack_*`` reproduced there, ``test_resists_*``
were withstood and are kept so) added: a typed path whose text equals a resolved location, files below
a dataset directory (an operator's notes, hive partitions), a missing or broken dataset named by its
location, a spec on stdin whose block list is a path, ``--state`` names that are paths, URIs, device
files and Spark endpoints given by the analyst.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from dptest import cli, init_ledger
from service_checks import QUERY, _add, _nothing_private, _one_line


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


def test_personal_mode_never_reads_the_state_as_input(tmp_path, monkeypatch):
    """Attack 2 in personal mode: a symlink named x.csv to the key file printed the secret key."""
    init_ledger()
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



def test_attack_a_stream_dry_run_reads_no_private_file_as_its_state(tmp_path, monkeypatch):
    """Issue 31's review: ``stream-replay --dry-run --state`` read the key or a ledger as a stream state
    (the run refuses such a path before reading it; the dry run said "corrupt, restore it from a backup")."""
    from dpcli.state import documents

    init_ledger()
    state = tmp_path / "state"
    data = tmp_path / "d.csv"
    data.write_text("t,user,g\n" + "".join(f"2026-11-01T0{i % 9}:00:00,u{i},a\n" for i in range(20)))
    read: list[Path] = []
    real = documents.read
    monkeypatch.setattr(documents, "read", lambda path, kind: read.append(Path(path)) or real(path, kind))
    stream = ["stream-replay", data, "--time", "t", "--by", "g", "--privacy-unit", "user", "--window", "1d",
              "--triggers", "1", "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6"]
    for private in (state / "secret.key", state / "ledgers" / "default.json", data):
        for dry in (["--dry-run"], []):
            r = cli(*stream, "--state", private, *dry)
            assert r.exit_code == 73 and r.stderr.count("\n") == 1, (private, dry, r.stderr)
    assert read == []
    assert cli(*stream, "--state", tmp_path / "s.stream", "--dry-run").exit_code == 0  # a state of its own: read

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


def test_attack_which_refusal_a_missing_column_gets_says_nothing_of_the_header(tmp_path, monkeypatch):
    """Issue 31's review: a header that another delimiter splits into text got "column not found" where
    any other header that is not text got "does not look like csv" (the delimiter hint was worked out
    before the service-mode check): which refusal came told an analyst how the private header is split."""
    from dptest import Service

    svc = Service(tmp_path, monkeypatch)
    for name, sep in (("tabbed", "\t"), ("binary", "\x01")):
        rows = "".join(f"u{i}{sep}/p/{i % 3}{sep}s{i}\n" for i in range(50))
        (svc.data / f"{name}.csv").write_text(f"user{sep}page{sep}secret\n{rows}")
        svc.catalog_toml += (f'[datasets.{name}]\nlocation = "{svc.data / name}.csv"\nprivacy_unit = "user"\n'
                             'format = "csv"\nanalysts = ["*"]\n')
    svc.setup()
    answers = [svc.run("alice", "histogram", name, "--by", "page", "--epsilon", "1", "--delta", "1e-6")
               for name in ("tabbed", "binary")]
    assert [r.exit_code for r in answers] == [65, 65], [r.stderr for r in answers]
    assert answers[0].stderr.replace("tabbed", "binary") == answers[1].stderr
