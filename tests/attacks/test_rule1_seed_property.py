"""Rule 1 as a property (issue 37): one field changed at a time, either the seed changes or the noise lands alike.

For each command a base release is drawn (its query and how its inputs are read), then each of its fields is
changed in turn to another drawn value: grouping columns and their order, the list of groups and which of its
columns are read, aggregates and their order, value columns, bounds, caps, ε and δ, the input's format (CSV,
tab-separated text, Parquet, NDJSON) and delimiter, the output's format and path, ``--with-error``, ``--json``;
for ``sql`` also output aliases, SELECT order, WHERE, HAVING, ORDER BY and LIMIT; for ``tabulate`` every field of
its spec; for ``stream-replay`` the window, the triggers, ``--through`` and a ``--state`` file. Every pair of runs
is then compared: if the two got one seed, they must hold one noisy table before post-processing, (row,
measurement) → value, on the rows and measurements both release (a LIMIT or a HAVING may release fewer rows: then
its rows are a subset of the other's; of two ``--through`` moments the rows up to the earlier one are compared).
Which fields are free replays is not encoded here (:data:`dpcli.release.seeds.FREE_REPLAY` has its own tests):
the property fails only if one seed gives two noise placements.

The CLI is run in process (``typer``'s runner: argument parsing, the gate and the release path as a user meets
them), and the table is taken where the CLI renders it (:func:`dpcli.cli.render.write_release`): the noisy table
before it is rounded and written, so two output formats compare exactly. Hypothesis is derandomized and draws two
or three bases per command, and the state directory holds the golden tests' key, so the file runs in under ten
seconds of CPU and checks the same cases with the same noise every time.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dptest import init_ledger, runner, use_fixed_key
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from tabulate_specs import REG_ITERATIONS, spec_toml

from dpcli.cli import render
from dpcli.cli.app import app

#: Per command: two drawn bases (three for sql, which has the most fields), each with every field changed in turn
#: (1 + fields runs, every pair compared). Derandomized, never shrunk (a failure prints its example as drawn).
_COMMON: dict[str, Any] = {"derandomize": True, "deadline": None, "database": None, "phases": [Phase.generate],
                           "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
SETTINGS = settings(max_examples=2, **_COMMON)
SQL_SETTINGS = settings(max_examples=3, **_COMMON)

Table = dict[tuple[str, ...], dict[str, Any]]


@dataclass(frozen=True)
class Run:
    """One CLI release: its arguments, the output columns that name a row, canonical names for output columns
    (``sql`` aliases), and whether post-processing may release a subset of the rows (LIMIT, HAVING, ``--through``)."""

    argv: tuple[str, ...]
    keys: tuple[str, ...]
    rename: Mapping[str, str] = field(default_factory=dict)
    subset: bool = False
    until: datetime | None = None  # stream-replay: rows of the triggers up to --through (the key's third column)


# ---- inputs ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """300 units over one day in four formats; lists of groups; tabulation data in four formats."""
    root = tmp_path_factory.mktemp("property")
    rows = [{"user": f"u{i % 300}", "a": "PQR"[i % 3], "b": "XY"[i % 2], "v": i % 7, "w": (i * 5) % 9,
             "ts": f"2026-11-01T{(i * 7) % 24:02d}:{(i * 13) % 60:02d}:00"} for i in range(1200)]
    out: dict[str, Path] = {}
    _formats(pl.DataFrame(rows), root, "d", out)
    persons = pl.DataFrame({"block": ["01001", "02001", "01002"] * 100, "race": ["1000;2000", "1500", "2100"] * 100,
                            "eth": [1, 2, 1] * 100, "sex": ["1", "2"] * 150, "age": [30, 80, 12, 50, 70] * 60})
    _formats(persons, root, "p", out)
    # a list's columns: a and b name the groups; x and y let an sql alias pick another column of the same list
    lists = {"ab": {"a": ["P", "Q", "R"], "b": ["X", "Y", "Z"], "x": ["X", "Y", "Z"], "y": ["P", "Q", "S"]},
             "ba": {"b": ["Y", "X", "Z"], "a": ["R", "Q", "P"], "x": ["Z", "Y", "X"], "y": ["S", "Q", "P"]}}
    for name, columns in lists.items():
        out[f"list_{name}.parquet"] = root / f"list_{name}.parquet"
        pl.DataFrame(columns).write_parquet(out[f"list_{name}.parquet"])
        out[f"list_{name}.csv"] = root / f"list_{name}.csv"
        pl.DataFrame(columns).write_csv(out[f"list_{name}.csv"])
    out["root"] = root
    return out


def _formats(frame: pl.DataFrame, root: Path, stem: str, out: dict[str, Path]) -> None:
    """``frame`` as CSV, tab-separated text, NDJSON and Parquet (``out[stem + "." + format]``)."""
    for fmt in ("csv", "tsv", "ndjson", "parquet"):
        path = out[f"{stem}.{fmt}"] = root / f"{stem}.{fmt}"
        if fmt == "csv":
            frame.write_csv(path)
        elif fmt == "tsv":
            frame.write_csv(path, separator="\t")
        elif fmt == "ndjson":
            frame.write_ndjson(path)
        else:
            frame.write_parquet(path)


def _source(paths: Mapping[str, Path], stem: str, fmt: str) -> list[str]:
    """The data argument in ``fmt`` (tab-separated text with its delimiter; NDJSON named by ``--input-format``)."""
    if fmt == "tsv":
        return [str(paths[f"{stem}.tsv"]), "-d", "\t"]
    if fmt == "ndjson":
        return [str(paths[f"{stem}.ndjson"]), "--input-format", "ndjson"]
    return [str(paths[f"{stem}.{fmt}"])]


def _output(paths: Mapping[str, Path], choice: str) -> list[str]:
    """Where and how the release is written: stdout as CSV or JSON, a Parquet or CSV file, with ``--json``."""
    root = paths["root"]
    return {"stdout": [], "json": ["--format", "json"], "parquet": ["-o", str(root / "out.parquet")],
            "csv file": ["-o", str(root / "out.csv"), "--json"], "summary": ["--json"]}[choice]


OUTPUTS = ["stdout", "json", "parquet", "csv file", "summary"]
FORMATS = ["csv", "tsv", "ndjson", "parquet"]


# ---- running and comparing ------------------------------------------------------------------------------------


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[pl.DataFrame, str]]:
    """Each release the CLI renders, as (its noisy table before rounding, its seed id), in order."""
    seen: list[tuple[pl.DataFrame, str]] = []
    original = render.write_release

    def write_release(s: Any, release: Any, output: Any, as_json: bool) -> None:
        seen.append((release.table, release.report["seed_id"]))
        original(s, release, output, as_json)

    monkeypatch.setattr(render, "write_release", write_release)
    return seen


def _release(run: Run, seen: list[tuple[pl.DataFrame, str]], cache: dict[tuple[str, ...], Any]) -> Any:
    """(seed id, table) of one run, or None if it was refused as a usage error before anything was released."""
    if run.argv not in cache:
        before = len(seen)
        r = runner.invoke(app, list(run.argv))
        assert r.exit_code in (0, 2), (run.argv, r.stderr)
        if r.exit_code == 2:
            cache[run.argv] = None
        else:
            assert len(seen) == before + 1, run.argv
            table, seed = seen[-1]
            cache[run.argv] = (seed, _normal(table, run))
    return cache[run.argv]


def _normal(table: pl.DataFrame, run: Run) -> Table:
    """The table as (row key) → {canonical column: value} (the key columns by their canonical names)."""
    named = table.rename({c: run.rename.get(c, _moe(c, run.rename)) for c in table.columns})
    keys = [run.rename.get(k, k) for k in run.keys]
    return {tuple(str(row[k]) for k in keys): {c: v for c, v in row.items() if c not in keys}
            for row in named.iter_rows(named=True)}


def _moe(column: str, rename: Mapping[str, str]) -> str:
    """A margin column under its measurement's canonical name (``n_moe95`` → ``count(*)_moe95``)."""
    stem = column.removesuffix("_moe95")
    return f"{rename[stem]}_moe95" if stem != column and stem in rename else column


def _compare(a: tuple[Run, Any], b: tuple[Run, Any]) -> bool:
    """Assert that two runs with one seed have one noisy table; True if they had one seed."""
    (ra, da), (rb, db) = a, b
    if da is None or db is None or da[0] != db[0]:
        return False
    ta, tb = da[1], db[1]
    if ra.until is not None and rb.until is not None:  # a later --through adds later triggers' rows, no other
        cut = min(ra.until, rb.until)
        ta, tb = ({k: v for k, v in t.items() if datetime.fromisoformat(k[2]) <= cut} for t in (ta, tb))
    if ra.subset != rb.subset:  # the run that may drop rows releases no row the other does not
        small, large = (ta, tb) if ra.subset else (tb, ta)
        assert small.keys() <= large.keys(), f"one seed, rows the other lacks:\n{ra.argv}\n{rb.argv}"
    elif not ra.subset:
        assert ta.keys() == tb.keys(), f"one seed, other rows:\n{ra.argv}\n{rb.argv}"
    for key in ta.keys() & tb.keys():
        common = ta[key].keys() & tb[key].keys()
        assert common, (ra.argv, rb.argv, key)
        for column in common:
            assert ta[key][column] == tb[key][column], f"one seed, other noise on {key} {column}:\n{ra.argv}\n{rb.argv}"
    return True


@dataclass(frozen=True)
class Command:
    """A command's fields (each with the values it may take) and how a choice of them becomes a run."""

    fields: Mapping[str, Sequence[Any]]
    build: Callable[[Mapping[str, Any], Mapping[str, Path]], Run]


def _check(data: st.DataObject, command: Command, paths: Mapping[str, Path],
           seen: list[tuple[pl.DataFrame, str]], cache: dict[tuple[str, ...], Any]) -> None:
    """Draw a base, change each field in turn to another of its values, compare every pair of runs."""
    base = data.draw(st.fixed_dictionaries({k: st.sampled_from(v) for k, v in command.fields.items()}), label="base")
    choices = [base]
    for name, values in sorted(command.fields.items()):
        others = [v for v in values if v != base[name]]
        choices.append({**base, name: data.draw(st.sampled_from(others), label=name)})
    runs = [command.build(c, paths) for c in choices]
    done = [(run, _release(run, seen, cache)) for run in runs]
    assume(done[0][1] is not None)  # a base some option refuses (a variant may be refused: it releases nothing)
    shared = sum(_compare(a, b) for a, b in itertools.combinations(done, 2))
    assert shared, "no two runs had one seed: the property was not exercised"


def _ledger(state_dir: Path) -> None:
    if not state_dir.exists():  # the golden tests' key: the same noise, the same cases, on every run
        use_fixed_key(state_dir)
        init_ledger("approx", "--epsilon", "100000", "--delta", "0.5")


# ---- histogram ------------------------------------------------------------------------------------------------

GROUPINGS = ["a", "b", "a,b", "b,a"]
LISTS = [None, "ab.parquet", "ba.parquet", "ab.csv"]


def _histogram(f: Mapping[str, Any], paths: Mapping[str, Path]) -> Run:
    argv = ["histogram", *_source(paths, "d", f["format"]), "--by", f["by"], "--privacy-unit", "user",
            "--agg", f["agg"], "--max-contributions", str(f["cap"]), "--max-partitions", str(f["partitions"]),
            "--epsilon", f["epsilon"], "--delta", f["delta"]]
    if f["agg"] != "count":
        argv += ["--value", f["value"], "--bounds", f["bounds"]]
        argv += ["--granularity", f["granularity"]] if f["granularity"] else []
    argv += ["--noise", f["noise"]] if f["noise"] else []
    if f["keys"] is not None:
        argv += ["--keys", str(paths[f"list_{f['keys']}"])]
    argv += ["--with-error"] * f["with_error"] + _output(paths, f["output"])
    return Run(tuple(argv), tuple(sorted(f["by"].split(","))))


HISTOGRAM = Command({
    "by": GROUPINGS, "keys": LISTS, "format": FORMATS, "output": OUTPUTS, "with_error": [False, True],
    "agg": ["count", "count,sum", "sum,count", "count,mean", "mean,variance", "count-units,sum"],
    "value": ["v", "w"], "bounds": ["0:10", "0:20", "2:8"],
    "cap": [1, 2, 3, "auto"], "partitions": [1, 2, "auto"],
    "epsilon": ["1", "2"], "delta": ["1e-6", "1e-7"],
    "noise": [None, "laplace", "gaussian"], "granularity": [None, "0.5", "1"],
}, _histogram)


@SETTINGS
@given(data=st.data())
def test_histogram_property(data, paths, captured, state_dir):
    _ledger(state_dir)
    _check(data, HISTOGRAM, paths, captured, {})


# ---- topk -----------------------------------------------------------------------------------------------------


def _topk(f: Mapping[str, Any], paths: Mapping[str, Path]) -> Run:
    argv = ["topk", *_source(paths, "d", f["format"]), "--by", f["by"], "--privacy-unit", "user", "-k", str(f["k"]),
            "--epsilon", f["epsilon"], "--delta", f["delta"]]
    if f["cap"] is not None:
        argv += ["--count", "rows", "--max-contributions", str(f["cap"])]
    if f["keys"] is not None:
        argv += ["--keys", str(paths[f"list_{f['keys']}"])]
    else:
        argv += ["--max-groups", str(f["max_groups"])]
    argv += ["--no-counts"] * f["no_counts"] + ["--with-error"] * (f["with_error"] and not f["no_counts"])
    return Run(tuple(argv + _output(paths, f["output"])), tuple(sorted(f["by"].split(","))))


TOPK = Command({
    "by": GROUPINGS, "keys": LISTS, "format": FORMATS, "output": OUTPUTS, "with_error": [False, True],
    "k": [1, 2, 3], "cap": [None, 1, 2, 3, "auto"], "max_groups": [2, 4],
    "no_counts": [False, True], "epsilon": ["1", "2"], "delta": ["1e-6", "1e-7"],
}, _topk)


@SETTINGS
@given(data=st.data())
def test_topk_property(data, paths, captured, state_dir):
    _ledger(state_dir)
    _check(data, TOPK, paths, captured, {})


# ---- tabulate -------------------------------------------------------------------------------------------------

BLOCKS = {"three": "block,aiannh\n01001,A1\n01002,\n02001,\n",
          "four": "block,aiannh\n01001,A1\n01002,A1\n02001,\n03001,\n"}
ITERATIONS = {"reg": REG_ITERATIONS, "narrow": REG_ITERATIONS.replace('"B" = { race = ["2000-2999"] }',
                                                                       '"B" = { race = ["2000-2199"] }')}


def _spec(f: Mapping[str, Any], root: Path) -> Path:
    """The spec the fields describe, written once in a directory of its own next to its block list."""
    levels = (f'[[levels]]\ngeography = "{f["geography"]}"\niterations = "reg"\nepsilon = {f["epsilon"]}\n'
              f'stability = {f["stability"]}\n')
    text = spec_toml(levels, ITERATIONS[f["iterations"]], gamma=f["gamma"], thresholds=f["thresholds"],
                     extra="# a comment\n" if f["comment"] else "")
    directory = root / ("spec-" + hashlib.sha256((text + f["blocks"]).encode()).hexdigest()[:12])
    directory.mkdir(exist_ok=True)
    (directory / "blocks.csv").write_text(BLOCKS[f["blocks"]])
    (directory / "spec.toml").write_text(text)
    return directory / "spec.toml"


def _tabulate(f: Mapping[str, Any], paths: Mapping[str, Path]) -> Run:
    argv = ["tabulate", *_source(paths, "p", f["format"]), "--spec", str(_spec(f, paths["root"])),
            *["--with-error"] * f["with_error"], *_output(paths, f["output"])]
    return Run(tuple(argv), ("level", "geo_id", "iteration", "sex", "age"))


TABULATE = Command({
    "geography": ["state", "nation", "area"], "epsilon": ["0.5", "1"],
    "stability": [3, 4], "gamma": ["0.1", "0.2"],
    "thresholds": [(20, 100, 500), (10, 100, 500), (20, 50, 500)],
    "iterations": sorted(ITERATIONS), "blocks": sorted(BLOCKS),
    "comment": [False, True], "format": FORMATS, "output": OUTPUTS, "with_error": [False, True],
}, _tabulate)


@SETTINGS
@given(data=st.data())
def test_tabulate_property(data, paths, captured, state_dir):
    _ledger(state_dir)
    _check(data, TABULATE, paths, captured, {})


# ---- stream-replay --------------------------------------------------------------------------------------------


def _stream(f: Mapping[str, Any], paths: Mapping[str, Path]) -> Run:
    argv = ["stream-replay", *_source(paths, "d", f["format"]), "--time", "ts", "--by", f["by"],
            "--privacy-unit", "user", "--window", f["window"], "--trigger-every", f["trigger"],
            "--max-contributions", str(f["cap"]), "--epsilon", f["epsilon"], "--delta", f["delta"],
            "--through", f["through"], "--mu", str(f["mu"])]
    if f["value"] is not None:
        argv += ["--value", f["value"], f"--bounds={f['bounds']}"]
    if f["state"] is not None:
        argv += ["--state", str(paths["root"] / f["state"])]
    argv += ["--with-error"] * f["with_error"] + _output(paths, f["output"])
    keys = ("window_start", "trigger", "trigger_time", *sorted(f["by"].split(",")))
    return Run(tuple(argv), keys, until=datetime.fromisoformat(f["through"]))


STREAM = Command({
    "by": GROUPINGS, "format": FORMATS, "output": OUTPUTS, "with_error": [False, True],
    "window": ["1d", "12h"], "trigger": ["6h", "4h"],
    "cap": ["auto", 2, 3], "value": [None, "v", "w"],
    "bounds": ["-10:10", "-20:20"], "mu": [1, 5],
    "epsilon": ["2", "3"], "delta": ["1e-9", "1e-8"],
    "through": ["2026-11-01T13:00", "2026-11-02", "2026-11-01T17:00"],
    "state": [None, None, "s1.state", "s2.state"],
}, _stream)


@SETTINGS
@given(data=st.data())
def test_stream_replay_property(data, paths, captured, state_dir):
    _ledger(state_dir)
    for state in ("s1.state", "s2.state"):  # each example starts its streams afresh
        (paths["root"] / state).unlink(missing_ok=True)
    _check(data, STREAM, paths, captured, {})


# ---- sql ------------------------------------------------------------------------------------------------------

AGGREGATES = {"count": "ANON_COUNT(*, {cap})", "count uncapped": "ANON_COUNT(*)", "count v": "ANON_COUNT(v, {cap})",
              "units": "ANON_COUNT(DISTINCT user)", "sum v": "ANON_SUM(v, 0, 10)",
              "sum w": "ANON_SUM(w, 0, 10)", "avg v": "ANON_AVG(v, 0, 10)", "sum v wide": "ANON_SUM(v, 0, 20)"}


def _sql(f: Mapping[str, Any], paths: Mapping[str, Path]) -> Run:
    """The query the fields describe; its output columns renamed back to canonical names (``g:a``, ``m:count``)."""
    groups = list(f["groups"])
    group_alias = {g: f["group_alias"].get(g, g) for g in groups}
    measures = list(f["measures"])
    rename = {group_alias[g]: f"g:{g}" for g in groups}
    items = [f"{g} AS {group_alias[g]}" if group_alias[g] != g else g for g in groups]
    aggs = []
    for i, m in enumerate(measures):
        alias = f"{f['measure_prefix']}{i}" if not f["alias_by_name"] else m.replace(" ", "_")
        rename[alias] = f"m:{m}"
        aggs.append(f"{AGGREGATES[m].format(cap=f['cap'])} AS {alias}")
    select = [*aggs, *items] if f["measures_first"] else [*items, *aggs]
    table = f["table"]
    query = f"SELECT {', '.join(select)} FROM {table}"
    if f["where"]:
        query += f" WHERE {f['where']}"
    if groups:
        query += f" GROUP BY {', '.join(groups)}"
    first = next(iter(rename.keys() - {group_alias[g] for g in groups}))
    if f["having"] and groups:
        query += f" HAVING {first} > 5"
    if f["order"]:
        query += f" ORDER BY {first} {f['order']}"
    if f["limit"] is not None:
        query += f" LIMIT {f['limit']}"
    source = _source(paths, "d", f["format"])  # sql reads NDJSON by its extension (no --input-format)
    argv = ["sql", query, "--table", f"{table}={source[0]}", *(source[1:] if f["format"] == "tsv" else []),
            "--privacy-unit", f"{table}.user", "--epsilon", f["epsilon"],
            "--delta", f["delta"], "--max-partitions", str(f["partitions"])]
    if f["keys"] is not None and groups:
        argv += ["--keys", str(paths[f"list_{f['keys']}"])]
    if f["contributions"] is not None and (f["contributions"] != "auto" or "count uncapped" in measures):
        argv += ["--max-contributions", str(f["contributions"])]  # auto: the cap of a count without one
    argv += ["--noise", f["noise"]] if f["noise"] else []
    if f["row_cap"] is not None:
        argv += ["--max-rows-per-table", str(f["row_cap"])]
    argv += ["--with-error"] * f["with_error"] + _output(paths, f["output"])
    subset = (f["having"] and bool(groups)) or f["limit"] is not None
    return Run(tuple(argv), tuple(group_alias[g] for g in groups), rename, subset)


SQL = Command({
    "groups": [(), ("a",), ("b",), ("a", "b"), ("b", "a")],
    "group_alias": [{}, {"a": "x"}, {"a": "y"}, {"b": "x"}, {"a": "x", "b": "y"}],
    "measures": [("count",), ("count", "sum v"), ("sum v", "count"), ("units",), ("avg v", "count"),
                                 ("sum w",), ("sum v wide",), ("count uncapped",), ("count v", "count")],
    "contributions": [None, 2, 3, "auto"], "noise": [None, "laplace", "gaussian"],
    "measure_prefix": ["n", "m"], "alias_by_name": [False, True], "measures_first": [False, True],
    "cap": [1, 2, 3], "table": ["t", "u"],
    "where": [None, "v > 1", "w < 7"], "having": [False, True],
    "order": [None, "DESC", "ASC"], "limit": [None, 1, 2],
    "keys": LISTS, "partitions": [1, 2, "auto"], "row_cap": [None, 3, 5],
    "epsilon": ["1", "2"], "delta": ["1e-6", "1e-7"],
    "format": FORMATS, "output": OUTPUTS, "with_error": [False, True],
}, _sql)


@SQL_SETTINGS
@given(data=st.data())
def test_sql_property(data, paths, captured, state_dir):
    _ledger(state_dir)
    _check(data, SQL, paths, captured, {})
