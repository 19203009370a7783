"""A value column's type is schema where the format declares it (issue 39, item 1).

A Parquet column's type is public: a value no release can aggregate from it (text, booleans, dates, times,
durations, binary, categorical, nested) is the documented exit 65 before any charge, in every command that
aggregates a value (``histogram --value``, ``stream-replay --value``, ``sql``'s ANON_ arguments) and in their
dry runs, which read the schema (a Parquet footer, a CSV header) and no record. It used to be charged: a
text column released nothing (or, with ``--keys``, pure noise), a boolean or a date failed after the debit.
CSV and NDJSON declare no types: every column a query reads is text, parsed per record, and a value that does
not parse is dropped inside the bounded transformation (never an error, never reported by count).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import polars as pl
import pytest
from dptest import Service, cli, history, init_ledger

import dpcli
from dpcli.errors import DataError
from dpcli.io.schemas import SchemaOf, check_schema

ROWS = 60


def _frame() -> pl.DataFrame:
    """Units ``u`` in groups ``g``, a numeric value ``x``, and a column of each type no value is read from."""
    i = pl.int_range(ROWS, eager=True)
    return pl.DataFrame({
        "u": [f"u{k}" for k in range(ROWS)], "g": [f"g{k % 3}" for k in range(ROWS)], "x": (i % 7).cast(pl.Float64),
        "n": i % 5, "d": (i % 7).cast(pl.Decimal(10, 2)),
        "text": [str(k % 7) for k in range(ROWS)],  # numbers, as text: still text in Parquet
        "flag": i % 2 == 0, "day": [dt.date(2026, 11, 1 + k % 3) for k in range(ROWS)],
        "ts": [dt.datetime(2026, 11, 1, k % 24) for k in range(ROWS)],
        "wait": [dt.timedelta(seconds=k) for k in range(ROWS)], "clock": [dt.time(k % 24) for k in range(ROWS)],
        "blob": [b"7"] * ROWS, "cat": pl.Series(["7"] * ROWS, dtype=pl.Categorical),
        "nums": [[1.0]] * ROWS, "rec": [{"a": 1.0}] * ROWS,
    })


REFUSED = ["text", "flag", "day", "ts", "wait", "clock", "blob", "cat", "nums", "rec"]
ACCEPTED = ["x", "n", "d"]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    df = _frame()
    df.write_parquet(tmp_path / "v.parquet")
    df.select("u", "g", "x", "text").write_csv(tmp_path / "v.csv")
    return {"parquet": str(tmp_path / "v.parquet"), "csv": str(tmp_path / "v.csv"), "out": str(tmp_path / "o.csv"),
            "state": str(tmp_path / "s.state")}


def _histogram(f: dict[str, str], value: str, agg: str = "mean", data: str = "parquet") -> list[str]:
    return ["histogram", f[data], "--by", "g", "--privacy-unit", "u", "--agg", agg, "--value", value, "--bounds",
            "0:10", "--max-contributions", "1", "--max-partitions", "1", "--epsilon", "1", "--delta", "1e-6"]


def _stream(f: dict[str, str], value: str, data: str = "parquet") -> list[str]:
    return ["stream-replay", f[data], "--time", "ts", "--by", "g", "--privacy-unit", "u", "--window", "1d",
            "--triggers", "2", "--max-contributions", "2", "--value", value, "--bounds", "-10:10", "--epsilon", "1",
            "--delta", "1e-6", "--through", "2026-11-03"]


def _sql(f: dict[str, str], call: str, data: str = "parquet") -> list[str]:
    return ["sql", f"SELECT g, {call} AS y FROM V GROUP BY g", "--table", f"V={f[data]}", "--privacy-unit", "V.u",
            "--max-contributions", "1", "--max-partitions", "1", "--epsilon", "1", "--delta", "1e-6"]


def _refused(args: list[str], f: dict[str, str]) -> str:
    """Run ``args`` (with ``-o``): exit 65, one line on stderr, nothing charged, no output file; the line."""
    before = history()
    r = cli(*args, "-o", f["out"])
    assert r.exit_code == 65, (args, r.exit_code, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dpcli: error: "), r.stderr
    assert "charged" not in lines[0], lines[0]  # refused before the debit: nothing to say about a charge
    assert history() == before, "a refusal from the schema was debited"
    assert not Path(f["out"]).exists() and not Path(f["state"]).exists()
    return lines[0]


@pytest.mark.parametrize("column", REFUSED)
def test_histogram_refuses_a_parquet_value_of_a_type_it_cannot_aggregate(files, column):
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    for agg in ("sum", "mean", "variance", "median"):
        line = _refused(_histogram(files, column, agg), files)
        assert f"column {column!r} must be numeric but is" in line, line
    _refused([*_histogram(files, column), "--dry-run"], files)
    chosen = [a if a != "0:10" else "auto" for a in _histogram(files, column, "sum")]  # bounds chosen from data
    _refused(chosen, files)


@pytest.mark.parametrize("column", REFUSED)
def test_stream_replay_refuses_it_with_and_without_state_and_in_its_dry_run(files, column):
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    _refused(_stream(files, column), files)
    _refused([*_stream(files, column), "--state", files["state"]], files)
    _refused([*_stream(files, column), "--dry-run"], files)


@pytest.mark.parametrize("call", ["ANON_SUM({c}, 0, 10)", "ANON_AVG({c}, 0, 10)", "ANON_VAR({c}, 0, 10)",
                                  "ANON_STDDEV({c}, 0, 10)", "ANON_NTILE({c}, 0.25, 0, 10)",
                                  "ANON_MEDIAN({c}, 0, 10)"])
def test_sql_refuses_an_anon_argument_declared_as_text_or_a_type_no_number_is_read_from(files, call):
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    for column in ("text", "day", "wait", "blob", "cat", "nums"):
        _refused(_sql(files, call.format(c=column)), files)
        _refused([*_sql(files, call.format(c=column)), "--dry-run"], files)
    # through a sub-query's column and a sub-query's MAX: the same declared text
    _refused(["sql", f"SELECT g, {call.format(c='t')} AS y FROM (SELECT u, g, text AS t FROM V) s GROUP BY g",
              "--table", f"V={files['parquet']}", "--privacy-unit", "V.u", "--epsilon", "1", "--delta", "1e-6"], files)


def test_what_is_accepted_a_number_a_cast_and_sqls_booleans(files):
    """The controls: numeric Parquet types are values everywhere; sql reads a boolean as 0 or 1 (as its
    arithmetic does) and reads declared text as numbers when the query says so (CAST, arithmetic)."""
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    for column in ACCEPTED:
        for args in (_histogram(files, column), _stream(files, column)):
            r = cli(*args, "--json")
            assert r.exit_code == 0, (column, r.stderr)
        r = cli(*_sql(files, f"ANON_SUM({column}, 0, 10)"), "--json")
        assert r.exit_code == 0, (column, r.stderr)
    for call in ("ANON_SUM(flag, 0, 1)", "ANON_AVG(CAST(text AS DOUBLE), 0, 10)", "ANON_SUM(text + 0, 0, 10)"):
        r = cli(*_sql(files, call), "--json")
        assert r.exit_code == 0, (call, r.stderr)


def test_csv_text_is_parsed_per_record_and_never_refused_by_type(files):
    """A CSV declares no types: the same text column is a value (each record parsed; one that does not parse,
    such as the group's own text, is dropped inside the bound: the release is made, and charged)."""
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    for args in (_histogram(files, "text", data="csv"), _histogram(files, "g", data="csv"),
                 _sql(files, "ANON_SUM(text, 0, 10)", data="csv"), _sql(files, "ANON_AVG(g, 0, 10)", data="csv")):
        before = len(history())
        r = cli(*args, "--json")
        assert r.exit_code == 0, (args, r.stderr)
        assert json.loads(r.stdout)["summary"]["charged"] and len(history()) > before


def test_a_service_mode_analyst_is_told_neither_the_type_nor_another_column(tmp_path, monkeypatch):
    svc = Service(tmp_path, monkeypatch)
    _frame().write_parquet(svc.data / "typed.parquet")
    svc.catalog_toml += (f'[datasets.typed]\nlocation = "{svc.data / "typed.parquet"}"\nprivacy_unit = "u"\n'
                         'analysts = ["*"]\n')
    svc.setup()
    query = "SELECT g, ANON_SUM({c}, 0, 10) AS y FROM typed GROUP BY g"
    runs = {
        "histogram": ["histogram", "typed", "--by", "g", "--agg", "sum", "--value", "{c}", "--bounds", "0:10",
                      "--epsilon", "1", "--delta", "1e-6"],
        "sql": ["sql", query, "--epsilon", "1", "--delta", "1e-6", "--max-contributions", "1", "--max-partitions",
                "1"],
    }
    for name, template in runs.items():
        for column in ("text", "day", "rec", *(["flag"] if name == "histogram" else [])):  # (sql sums booleans)
            for dry in ([], ["--dry-run"]):
                r = svc.run("alice", *[a.format(c=column) for a in template], *dry)
                assert r.exit_code == 65, (name, column, r.stderr)
                said = r.stderr.lower()
                for word in ("string", "text", "bool", "date", "struct", "type " + column, "numeric", "but is"):
                    assert word not in said.replace(f"'{column}'", ""), (name, column, r.stderr)
                assert not any(f"'{other}'" in r.stderr for other in ("u", "x", "n", "ts", "blob")), r.stderr
    led = svc.owner("budget", "history", "alice", "--json")
    assert led.exit_code == 0 and not [e for e in json.loads(led.stdout) if e.get("events")], led.stdout


def test_the_library_refuses_what_the_cli_refuses(files, tmp_path):
    """``dpcli.release_histogram`` (and so ``dpcli.release.run``) refuses the same column the same way, debits
    nothing; a numeric column is released."""
    from fractions import Fraction

    state = tmp_path / "lib-state"
    dpcli.init_ledger(state, "me", dpcli.Limits("approx", {"epsilon": Fraction(5), "delta": Fraction(1, 10**5)}))
    for column in ("text", "flag", "day"):
        query = dpcli.HistogramQuery(by=("g",), unit="u", aggregations=("sum",), value=column, bounds=(0.0, 10.0),
                                     epsilon=Fraction(1), delta=Fraction(1, 10**6))
        with pytest.raises(DataError, match=f"column {column!r} must be numeric") as refused:
            dpcli.release_histogram(files["parquet"], query, state_dir=state, analyst="me")
        assert refused.value.exit_code == 65
    from dpcli.access import Source
    from dpcli.release import LedgerRef, Sources, run
    from dpcli.tasks.sql import Budget, SqlOptions, SqlTask
    from dpcli.tasks.sql.scope import TableDecl

    decl = {"V": TableDecl("V", "u", tuple(_frame().columns))}
    options = SqlOptions(Budget(epsilon=Fraction(1), delta=Fraction(1, 10**6)))
    for call in ("ANON_SUM(text, 0, 10)", "ANON_AVG(day, 0, 10)"):
        task = SqlTask.from_text(f"SELECT g, {call} AS y FROM V GROUP BY g", decl, options)
        with pytest.raises(DataError) as refused:
            run(task, Sources(Source("V", files["parquet"], privacy_unit="u")), LedgerRef(state, "me"))
        assert refused.value.exit_code == 65
    assert dpcli.read_ledger(state, "me").entries == ()
    query = dpcli.HistogramQuery(by=("g",), unit="u", aggregations=("sum",), value="x", bounds=(0.0, 10.0),
                                 epsilon=Fraction(1), delta=Fraction(1, 10**6))
    assert dpcli.release_histogram(files["parquet"], query, state_dir=state, analyst="me").report["charged"]


def test_one_rule_for_every_format_spark_csv_is_text_and_spark_parquet_is_typed():
    """The rule by format: Parquet (a file, a dataset, Parquet files Spark reads) declares types; CSV and NDJSON
    (and CSV Spark reads, whose columns it reads as text) do not. Checked on the schema alone."""
    schema = pl.Schema({"v": pl.String()})
    for fmt in ("csv", "ndjson", "spark-csv"):
        check_schema(schema, {"v": "value"}, SchemaOf("t", fmt))
    for fmt in ("parquet", "spark-parquet"):
        with pytest.raises(DataError, match="'v' must be numeric but is String in t"):
            check_schema(schema, {"v": "value"}, SchemaOf("t", fmt))
    with pytest.raises(DataError, match="'v' must be numeric"):  # a boolean is no value in any format
        check_schema(pl.Schema({"v": pl.Boolean()}), {"v": "value"}, SchemaOf("t", "csv"))


def test_a_dry_run_checks_the_schema_only_of_data_that_is_there(files, tmp_path):
    """The plan reads the schema, never a record: a column missing from the header is refused as the run would
    refuse it; data not there yet (a plan made before the data), or a pipe, is planned without it."""
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    missing = cli("histogram", files["csv"], "--by", "nope", "--privacy-unit", "u", "--epsilon", "1", "--delta",
                  "1e-6", "--dry-run")
    assert missing.exit_code == 65 and "column 'nope' not found" in missing.stderr, missing.stderr
    later = cli("histogram", str(tmp_path / "tomorrow.parquet"), "--by", "g", "--privacy-unit", "u", "--agg", "sum",
                "--value", "x", "--bounds", "0:10", "--epsilon", "1", "--delta", "1e-6", "--dry-run")
    assert later.exit_code == 0, later.stderr
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # a pipe's first bytes are not the plan's to consume (nor would opening it return)
    piped = cli("histogram", fifo, "--input-format", "csv", "--by", "g", "--privacy-unit", "u", "--epsilon", "1",
                "--delta", "1e-6", "--dry-run")
    assert piped.exit_code == 0, piped.stderr


def test_csv_a_column_of_words_as_value_gets_a_note_from_the_released_counts(tmp_path, state_dir):
    """CSV: nothing refuses a column of words given to --value (its type is not schema); the release, debited,
    holds noise, and a note says so from what it released: the count of rows with a number is mostly noise
    (its median |count| below the count's 95% margin). Pure noise over 9 groups passes that margin in at least
    5 of them with probability C(9,5)·0.05^5 < 1e-4; the key is fixed besides, so the run is deterministic.
    A column of numbers (200 units per group, far above the margin) gets no such note."""
    from dptest import use_fixed_key

    use_fixed_key(state_dir)
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    n = 1800
    (tmp_path / "w.csv").write_text("u,g,x,w\n" + "".join(f"u{k},g{k % 9},{k % 7},word{k % 5}\n" for k in range(n)))
    (tmp_path / "keys.csv").write_text("g\n" + "".join(f"g{k}\n" for k in range(9)))
    notes = {}
    for column in ("w", "x"):
        r = cli("histogram", tmp_path / "w.csv", "--by", "g", "--privacy-unit", "u", "--agg", "count,mean", "--value",
                column, "--bounds", "0:10", "--keys", tmp_path / "keys.csv", "--max-contributions", "1",
                "--max-partitions", "1", "--epsilon", "1", "--delta", "1e-6", "-o", tmp_path / f"out-{column}.csv")
        assert r.exit_code == 0, r.stderr
        notes[column] = r.stderr
    assert "count, the rows with a number in w, is mostly noise" in notes["w"], notes["w"]
    assert "the rows with a number in x" not in notes["x"], notes["x"]
