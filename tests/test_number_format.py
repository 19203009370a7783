"""Issue 39 item 8: one number format across commands.

Released tables (:func:`dpcli.io.outputs.shown`): integers as integers (sql's count margins as histogram's),
never ``-0.0``, the times dpcli computes as ISO 8601 in UTC with ``Z`` (the data's own datetimes as they
were). ε, δ and ρ in text for people (:func:`dpcli.core.display.parameter_text`): 4 significant digits,
spent and charged rounded up, remaining rounded down, ``--json`` exact.
"""

from __future__ import annotations

import json
from datetime import datetime
from fractions import Fraction

import polars as pl
import pytest
from dptest import PAGES, PV_SMALL, cli, init_ledger

from dpcli.core.display import parameter_text, quantity_text, utc_text
from dpcli.io.outputs import shown
from dpcli.tasks import Result
from dpcli.tasks.histogram import HistogramTask

COUNT_SQL = "SELECT WITH ANONYMIZATION country, ANON_COUNT(*, 5) AS c FROM v GROUP BY country"


def _sql(*extra: str) -> object:
    return cli("-q", "sql", COUNT_SQL, "--table", f"v={PV_SMALL}", "--privacy-unit", "v.user_id", "--epsilon", "1",
               "--delta", "1e-7", "--max-partitions", "1", "--with-error", *extra)


def test_sql_count_margins_print_as_integers_as_histograms_do():
    init_ledger("approx")
    r = _sql()
    assert r.exit_code == 0, r.stderr
    header, first = r.stdout.splitlines()[:2]
    assert header == "country,c,c_moe95"
    assert all(cell.lstrip("-").isdigit() for cell in first.split(",")[1:]), first  # "1704", never "1704.0"
    doc = json.loads(_sql("--json").stdout)
    assert all(isinstance(row["c"], int) and isinstance(row["c_moe95"], int) for row in doc["result"])
    hist = cli("-q", "histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--max-partitions", "1",
               "--max-contributions", "5", "--epsilon", "1", "--delta", "1e-7", "--with-error")
    assert hist.stdout.splitlines()[1].split(",")[2].isdigit()  # the same format in both commands


def test_a_mean_that_rounds_to_zero_prints_0_never_minus_0(monkeypatch):
    """A noisy mean of -0.04 with a margin of ±1.3 is shown to one decimal: ``0.0``, not ``-0.0``, in CSV,
    JSON and the table (the released value is the task's; only its text is at stake)."""
    real = HistogramTask.run

    def run(self, frames, plan, seed, engine):
        got = real(self, frames, plan, seed, engine)
        n = got.table.height
        table = got.table.with_columns(pl.Series("mean_duration_s", [-0.04] * n),
                                       pl.Series("mean_duration_s_moe95", [1.3] * n))
        return Result(table, got.metadata, got.actual, got.times)

    monkeypatch.setattr(HistogramTask, "run", run)
    init_ledger("approx")
    args = ["-q", "histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--agg", "mean", "--value",
            "duration_s",
            "--bounds", "0:600", "--max-partitions", "1", "--max-contributions", "5", "--epsilon", "1", "--delta",
            "1e-7", "--with-error"]
    csv = cli(*args)
    assert csv.exit_code == 0, csv.stderr
    assert csv.stdout.splitlines()[1].split(",")[1:] == ["0.0", "1.3"] and "-0" not in csv.stdout
    doc = json.loads(cli(*args, "--json").stdout)
    assert doc["result"][0]["mean_duration_s"] == 0.0 and '"-0' not in json.dumps(doc["result"])
    assert "-0" not in cli(*args, "--format", "table").stdout


def test_shown_keeps_values_and_only_changes_their_text():
    df = pl.DataFrame({"count": [10, -3], "count_moe95": [141.2, 70.0], "sum": [2.0, -0.0],
                       "mean": [-0.0001, 1.5], "mean_moe95": [0.2, 0.3]})
    out = shown(df)
    assert out.schema["count_moe95"] == pl.Int64 and out["count_moe95"].to_list() == [142, 70]  # rounded up first
    assert out.schema["sum"] == pl.Float64  # a float column stays one (its grid may be finer than 1)
    assert [str(x) for x in out["sum"].to_list()] == ["2.0", "0.0"]
    assert [str(x) for x in out["mean"].to_list()] == ["0.0", "1.5"]
    halves = shown(pl.DataFrame({"count": [1, 2], "count_moe95": [3.42, 3.0]}))
    assert halves.schema["count_moe95"] == pl.Float64  # 3.5 is no integer: the column stays as it is


def _stream_input(tmp_path):
    ts = [f"2026-11-01T{h:02d}:{m:02d}:00" for h in range(24) for m in range(0, 60, 2)]
    f = tmp_path / "ev.csv"
    pl.DataFrame({"ts": ts, "user": [f"u{i % 300}" for i in range(len(ts))],
                  "page": [f"p{i % 2}" for i in range(len(ts))]}).write_csv(f)
    return f


def _stream(f, *extra):
    return cli("-q", "stream-replay", f, "--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d",
               "--trigger-every", "6h", "--max-contributions", "5", "--epsilon", "3", "--delta", "1e-9",
               "--through", "2026-11-02", *extra)


def test_stream_times_are_iso_8601_utc_with_z_in_every_text_output(tmp_path):
    init_ledger("approx")
    f = _stream_input(tmp_path)
    csv = _stream(f)
    assert csv.exit_code == 0, csv.stderr
    rows = [line.split(",") for line in csv.stdout.splitlines()[1:]]
    assert rows and all(r[0].endswith("T00:00:00Z") and r[2].endswith(":00:00Z") for r in rows), rows[:2]
    doc = json.loads(_stream(f, "--json").stdout)
    assert all(row["window_start"] == "2026-11-01T00:00:00Z" for row in doc["result"])
    assert doc["summary"]["through"] == "2026-11-02T00:00:00Z"
    assert "2026-11-01T00:00:00Z" in _stream(f, "--format", "table").stdout
    out = tmp_path / "s.parquet"
    assert _stream(f, "-o", out).exit_code == 0
    assert pl.read_parquet(out).schema["window_start"] == pl.Datetime("us")  # Parquet keeps the type


def test_a_datetime_taken_from_the_data_keeps_its_own_format():
    """Only the times dpcli computes change: a group key read from the data is the data's (here a naive
    datetime column, which polars writes as before)."""
    moment = datetime(2013, 1, 2)
    df = pl.DataFrame({"hour": [moment], "window_start": [moment], "count": [1]})
    out = shown(df, times=("window_start",))
    assert out["hour"].to_list() == [moment] and out["window_start"].to_list() == ["2013-01-02T00:00:00Z"]
    assert utc_text(moment) == "2013-01-02T00:00:00Z"


@pytest.mark.parametrize(("value", "up", "down"), [
    ("0.112341863388128", "0.1124", "0.1123"),
    ("0.5", "0.5", "0.5"),  # short: exact either way
    (Fraction(1, 3), "0.3334", "0.3333"),
    ("0.000000001", "1e-09", "1e-09"),
    ("0.00000000066666", "6.667e-10", "6.666e-10"),
    ("50", "50", "50"),
    ("12345", "12350", "12340"),
])
def test_parameters_have_4_significant_digits_rounded_the_safe_way(value, up, down):
    assert (parameter_text(value, "up"), parameter_text(value, "down")) == (up, down)


LONG = "0.112341863388128"  # an ε with more digits than anyone reads
PAGES_RELEASE = ["histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES,
                 "--max-partitions", "1", "--max-contributions", "1", "-o", "/dev/null"]


def test_budget_show_rounds_spent_up_and_remaining_down_to_4_digits_while_json_is_exact():
    init_ledger("pure", "--epsilon", "1")
    assert cli(*PAGES_RELEASE, "--epsilon", LONG).exit_code == 0
    lines = dict(line.split(None, 1) for line in cli("budget", "show").stdout.splitlines())
    assert lines["spent"] == "epsilon=0.1124"  # 0.11234… rounded up
    assert lines["remaining"] == "epsilon=0.8876"  # 0.88765… rounded down, never up to 0.8877
    assert lines["guarantee"] == "(ε, δ) = (0.1124, 0)" and lines["limits"] == "epsilon=1"
    doc = json.loads(cli("budget", "show", "--json").stdout)
    assert doc["spent"] == {"epsilon": LONG} and doc["remaining"] == {"epsilon": "0.887658136611872"}
    charged = [ev["epsilon"] for ev in json.loads(cli("budget", "history", "--json").stdout)[0]["events"]]
    assert sum(Fraction(e) for e in charged) == Fraction(LONG)  # the ledger's figures are exact
    text = cli("budget", "history").stdout
    assert all(f"epsilon={parameter_text(e, 'up')}" in text for e in charged), text  # each charge rounded up
    assert all(len(e) > 6 for e in charged) and not any(e in text for e in charged)


def test_the_summary_line_and_a_refusal_round_what_is_left_down():
    init_ledger("pure", "--epsilon", "1")
    r = cli("-v", *PAGES_RELEASE, "--epsilon", LONG)
    assert r.exit_code == 0 and "; remaining epsilon=0.8876" in r.stderr, r.stderr
    refused = cli(*PAGES_RELEASE, "--epsilon", "0.9")
    assert refused.exit_code == 77 and "ε left is 0.8876; this query needs 0.9" in refused.stderr


def test_a_schedules_spend_is_rounded_up_in_budget_show():
    init_ledger("approx")
    r = cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--agg", "count-units", "--keys", PAGES,
            "--schedule", "daily", "--total-epsilon", "1", "-o", "/dev/null")
    assert r.exit_code == 0, r.stderr
    (sc,) = json.loads(cli("budget", "show", "--json").stdout)["schedules"]
    assert len(sc["epsilon_spent"]) > 8  # exact in JSON
    line = next(line for line in cli("budget", "show").stdout.splitlines() if line.startswith("schedule"))
    assert f"ε spent {parameter_text(sc['epsilon_spent'], 'up')} of 1 reserved" in line
    assert Fraction(parameter_text(sc["epsilon_spent"], "up")) >= Fraction(sc["epsilon_spent"])


@pytest.mark.parametrize(("value", "text"), [(2683.4, "2,683"), (-1e6, "-1,000,000"), (227.6, "227.6"),
                                             (0.123456, "0.1235"), (-0.0, "0"), (-0.00001, "-1e-05"), ("3/8", "0.375"),
                                             (float("inf"), "inf")])
def test_quantities_in_sentences_have_one_format(value, text):
    """Notes, dry runs and plots print a quantity one way (they printed 2.68e+03, 2,683 and 2.68e+03)."""
    assert quantity_text(value) == text


def test_budget_compose_prints_4_digits_rounded_up_and_json_exact():
    r = cli("budget", "compose", "--mode", "rdp", "--epsilon", "0.1", "--count", "14", "--delta", "1e-7")
    assert r.exit_code == 0 and "epsilon = 1.4, delta = 1e-07" in r.stdout and "pure_epsilon = 1.4\n" in r.stdout
    r = cli("budget", "compose", "--mode", "zcdp", "--rho", "0.0123456", "--delta", "1e-7")
    doc = json.loads(cli("budget", "compose", "--mode", "zcdp", "--rho", "0.0123456", "--delta", "1e-7",
                         "--json").stdout)
    assert f"epsilon = {parameter_text(doc['epsilon'], 'up')}," in r.stdout and len(str(doc["epsilon"])) > 8
    assert float(parameter_text(doc["epsilon"], "up")) >= doc["epsilon"]  # a guarantee is never understated
