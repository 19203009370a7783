"""Rule 1, the seed binds what a release reads of every input: its columns, in order, for every format (issue 37).

``dpcli sql … GROUP BY g --keys LIST`` reads the list's columns named by the GROUP BY keys' *output
names*. Seed material v2 bound the canonical plan (which drops output names) and, for CSV and NDJSON,
the columns read as text; for a Parquet list nothing recorded which columns became the partitions. So
``SELECT g AS x … --keys k.parquet`` and ``SELECT g AS y … --keys k.parquet`` over a two-column list
were one seed: the second run was a free replay putting the same noise, position by position, on
other partitions, and subtracting gave every group's exact count with the ledger already exhausted.
It worked in service mode with a catalog Parquet list too.

Material v3 binds the task's Needs whole (which columns of each input are read, in what order: the
i-th list column is the i-th group) and a digest of each list of groups as the release uses it. Each
attack on one list (personal and service mode) failed before the fix; runs that read alike stay free
replays.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dptest import PERSONS_SMALL, SAMPLE, init_ledger, runner

from dpcli.cli.app import app


def _data(tmp_path: Path) -> Path:
    """Units in groups A, B (column g); the list's column y holds other groups' names (C, D)."""
    path = tmp_path / "d.csv"
    path.write_text("user,g\n" + "".join(f"u{i},{'AB'[i % 2]}\n" for i in range(200)))
    return path


def _list(tmp_path: Path) -> Path:
    """A two-column Parquet list of groups: ``x`` lists the data's groups, ``y`` others."""
    path = tmp_path / "k.parquet"
    pl.DataFrame({"x": ["A", "B"], "y": ["C", "D"]}).write_parquet(path)
    return path


def _sql(alias: str, data: Path, keys: str | Path, *extra: str, runner_fn: Any = None) -> dict[str, Any]:
    query = f"SELECT g AS {alias}, ANON_COUNT(*) AS n FROM t GROUP BY g"
    args = ["sql", query, "--table", f"t={data}", "--privacy-unit", "t.user", "--keys", str(keys),
            "--epsilon", "0.5", *extra, "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, (args, r.stdout, r.stderr)
    return json.loads(r.stdout)["summary"]


def test_two_columns_of_one_parquet_list_are_two_releases(tmp_path):
    init_ledger()
    data, keys = _data(tmp_path), _list(tmp_path)
    first = _sql("x", data, keys)
    again = _sql("x", data, keys)
    assert again["seed_id"] == first["seed_id"] and again["charged"] is False  # a true replay stays free
    other = _sql("y", data, keys)
    assert other["seed_id"] != first["seed_id"], "the list's other column got the same noise"
    assert other["charged"] is True


def test_the_same_column_under_another_list_is_another_release(tmp_path):
    """Same alias, same bytes of data, a list whose ``x`` holds other groups: another partition table."""
    init_ledger()
    data, keys = _data(tmp_path), _list(tmp_path)
    other = tmp_path / "k2.parquet"
    pl.DataFrame({"x": ["C", "D"], "y": ["A", "B"]}).write_parquet(other)
    assert _sql("x", data, keys)["seed_id"] != _sql("x", data, other)["seed_id"]


def test_a_catalog_parquet_list_in_service_mode(svc):
    """An analyst, through sudo, names the catalog's two-column Parquet list: each column its own seed."""
    pl.DataFrame({"x": ["/p/0", "/p/1", "/p/2"], "y": ["/q/0", "/q/1", "/q/2"]}).write_parquet(
        svc.data / "pages2.parquet")
    svc.catalog_toml += f'[public.pages2]\nlocation = "{svc.data / "pages2.parquet"}"\nanalysts = ["*"]\n'
    (svc.home / "catalog.toml").write_text(svc.catalog_toml)
    assert svc.owner("catalog", "set", svc.home / "catalog.toml").exit_code == 0

    def run(alias: str) -> dict[str, Any]:
        r = svc.run("alice", "sql", f"SELECT page AS {alias}, ANON_COUNT(*) FROM visits GROUP BY page",
                    "--keys", "pages2", "--epsilon", "1", "--json")
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)["summary"]

    first = run("x")
    assert run("x")["charged"] is False
    other = run("y")
    assert other["seed_id"] != first["seed_id"] and other["charged"] is True


# ---- what stays a free replay (dpcli.tasks.FREE_REPLAY), one test per listed field ----------------------

SQL = "SELECT g, ANON_COUNT(*) AS n, ANON_SUM(v, 0, 10) AS s FROM t GROUP BY g"
#: Each FREE_REPLAY field → a change of it (sql arguments before ``--json``), against :data:`SQL`.
CHANGES: dict[str, tuple[str, list[str]]] = {
    "output path (-o)": (SQL, ["-o", "{tmp}/out.csv"]),
    "output format (--format)": (SQL, ["-o", "{tmp}/out.x", "--format", "parquet"]),
    "--json": (SQL, []),
    "--with-error": (SQL, ["--with-error"]),
    "sql output aliases": ("SELECT g AS grp, ANON_COUNT(*) AS c, ANON_SUM(v, 0, 10) AS t FROM t GROUP BY g", []),
    "sql SELECT order": ("SELECT ANON_SUM(v, 0, 10) AS s, g, ANON_COUNT(*) AS n FROM t GROUP BY g", []),
    "sql HAVING": (SQL + " HAVING ANON_COUNT(*) > 5", []),
    "sql ORDER BY": (SQL + " ORDER BY n DESC", []),
    "sql LIMIT": (SQL + " LIMIT 1", []),
    # the caps spelt out as what leaving them out means (auto): only the notes (which say they were left out) change
    "notes' wording": (SQL, ["--max-contributions", "auto", "--max-partitions", "auto"]),
}


def test_every_free_replay_field_has_a_test():
    from dpcli.tasks import FREE_REPLAY

    # "stream-replay --through" has its own test below, margin targets theirs in tests/test_targets.py
    # (test_a_target_release_is_the_release_at_its_epsilon_and_replays_free)
    assert {*CHANGES, "stream-replay --through", "margin targets (the ε they resolve to is bound)"} == set(FREE_REPLAY)


def test_the_free_replay_marker_refuses_a_field_not_listed():
    from dpcli.tasks import free_replay

    with pytest.raises(ValueError, match="not listed"):
        free_replay("--threshold", default=None)


def test_stream_through_is_a_free_replay_whose_rows_are_a_prefix(tmp_path):
    """``--through`` only chooses how many of the stream's triggers are shown: every trigger is paid by the
    one charge (the stream's ε covers all of them), so a later ``--through`` is a free replay and its rows
    extend the earlier ones, the same noise on every trigger both show."""
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-3")
    data = tmp_path / "ev.csv"
    n = 2880  # 600 users, two events a minute over one day, in three groups
    pl.DataFrame({"ts": [f"2026-11-01T{i // 120:02d}:{(i // 2) % 60:02d}:00" for i in range(n)],
                  "user": [f"u{i % 600}" for i in range(n)], "g": [f"p{i % 3}" for i in range(n)]}).write_csv(data)
    args = ["stream-replay", str(data), "--time", "ts", "--by", "g", "--privacy-unit", "user", "--window", "6h",
            "--trigger-every", "6h", "--max-contributions", "5", "--epsilon", "2", "--delta", "1e-6"]
    early = runner.invoke(app, [*args, "--through", "2026-11-01T12:00:00"])
    late = runner.invoke(app, [*args, "--through", "2026-11-02"])
    assert early.exit_code == late.exit_code == 0, (early.stderr, late.stderr)
    history = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
    assert [bool(e["events"]) for e in history] == [True, False] and history[1]["replay_of"] == 1
    first, second = early.stdout.splitlines(), late.stdout.splitlines()
    assert 1 < len(first) < len(second) and second[: len(first)] == first


def _free_data(tmp_path: Path) -> Path:
    path = tmp_path / "v.csv"
    path.write_text("user,g,v\n" + "".join(f"u{i},{'AB'[i % 2]},{i % 7}\n" for i in range(300)))
    return path


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_a_change_that_acts_after_the_noise_is_a_free_replay(tmp_path, field):
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-3")
    data = _free_data(tmp_path)
    base = ["sql", "--table", f"t={data}", "--privacy-unit", "t.user", "--epsilon", "1", "--delta", "1e-6"]

    def run(query: str, extra: list[str]) -> dict[str, Any]:
        """The release's ledger entry: its seed id, and whether it was charged (not a replay)."""
        args = [base[0], query, *base[1:], *(e.format(tmp=tmp_path) for e in extra)]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (args, r.stdout, r.stderr)
        last = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)[-1]
        return {"seed_id": last["seed_id"], "charged": last["replay_of"] is None}

    first = run(SQL, ["--json"])
    query, extra = CHANGES[field]
    again = run(query, extra)
    assert again["seed_id"] == first["seed_id"] and again["charged"] is False, field


@pytest.mark.parametrize("command", ["histogram", "topk"])
def test_with_error_is_a_free_replay_of_every_command(tmp_path, command):
    """``--with-error`` adds margins after the noise for every command that offers it."""
    init_ledger("approx", "--epsilon", "20", "--delta", "1e-3")
    data = _free_data(tmp_path)
    argv = [command, str(data), "--by", "g", "--privacy-unit", "user", "--epsilon" if command == "histogram"
            else "--epsilon-per", "0.5", *(["-k", "1", "--delta", "1e-6"] if command == "topk" else
                                           ["--delta", "1e-6"]), "--json"]
    r1 = runner.invoke(app, argv)
    r2 = runner.invoke(app, [*argv, "--with-error"])
    assert r1.exit_code == 0 and r2.exit_code == 0, (r1.stderr, r2.stderr)
    s1, s2 = json.loads(r1.stdout)["summary"], json.loads(r2.stdout)["summary"]
    assert s1["seed_id"] == s2["seed_id"] and s2["charged"] is False


def test_a_tabulation_spec_moved_with_its_block_list_is_a_free_replay(tmp_path):
    """The seed binds the spec's bytes and the block list's content, not where they lie: the same spec and
    list in another directory (another checkout, a CI clone) is the same release. A changed block list is
    not (its digest is in the material)."""
    import shutil

    init_ledger("pure", "--epsilon", "100")
    runs = []
    for where in ("a", "b"):
        d = tmp_path / where
        d.mkdir()
        for name in ("safetab_spec.toml", "blocks.csv"):
            shutil.copy(SAMPLE / name, d / name)
        r = runner.invoke(app, ["tabulate", PERSONS_SMALL, "--spec", str(d / "safetab_spec.toml")])
        assert r.exit_code == 0, r.stderr
        runs.append(r.stdout)
    history = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
    assert runs[0] == runs[1] and [bool(e["events"]) for e in history] == [True, False]
    blocks = tmp_path / "b" / "blocks.csv"
    lines = blocks.read_text().splitlines()
    blocks.write_text("\n".join(lines[:-1]) + "\n")  # one block fewer
    r = runner.invoke(app, ["tabulate", PERSONS_SMALL, "--spec", str(tmp_path / "b" / "safetab_spec.toml")])
    assert r.exit_code == 0, r.stderr
    history = json.loads(runner.invoke(app, ["budget", "history", "--json"]).stdout)
    assert [bool(e["events"]) for e in history] == [True, False, True]
