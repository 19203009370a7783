"""dpcli histogram: bounded contributions, partition selection, known domain, quantiles, dry runs, replay,
errors (library and CLI).
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from dptest import PAGES, PV_SMALL, SAMPLE, cli, init_ledger, runner, table, without_output_notes
from dptest import history as entries

from dpcli import bounding
from dpcli.cli.app import app
from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks import histogram as hist


def base_data(n_units: int = 300, seed: int = 1) -> pl.DataFrame:
    rng = np.random.default_rng(seed)  # test data only; never noise
    rows = rng.integers(1, 6, n_units)
    unit = np.repeat([f"u{i}" for i in range(n_units)], rows)
    return pl.DataFrame(
        {
            "user": unit,
            "g": rng.choice(["a", "b", "c"], unit.size),
            "x": rng.uniform(0, 10, unit.size).round(2),
        }
    )


def release(df, q, seed=b"s" * 32, keys=None, mode="approx"):
    plan = hist.plan_histogram(q, mode, {})
    return hist.run_histogram(table(df), q, plan, KeyedStream(seed, "histogram"), keys)


# ---- contribution bounding -------------------------------------------------------------------


def test_one_heavy_unit_moves_outputs_by_at_most_the_bound():
    """Same seed on D and D + one unit with 10,000 rows in group 'a': the noise is identical,
    so the difference is exactly the bounded contribution (count ≤ C, sum ≤ C·max|bound|)."""
    d = base_data()
    heavy = pl.DataFrame({"user": ["heavy"] * 10_000, "g": ["a"] * 10_000, "x": [1e9] * 10_000})
    keys = pl.DataFrame({"g": ["a", "b", "c"]})
    q = hist.HistogramQuery(
        by=("g",), unit="user", aggregations=("count", "sum"), value="x", bounds=(0.0, 10.0),
        max_contributions=3, max_partitions=1, epsilon=Fraction(1), domain="keys",
    )
    r0 = release(d, q, keys=keys).table
    r1 = release(pl.concat([d, heavy]), q, keys=keys).table
    diff = (r1["count"] - r0["count"]).to_list()
    assert diff == [3, 0, 0]
    assert (r1["sum_x"] - r0["sum_x"]).to_list() == [30.0, 0.0, 0.0]


# ---- partition selection ---------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 4])
def test_singleton_groups_leak_with_probability_at_most_delta(k):
    """3000 units, each alone in k groups of its own. A unit is exposed if any of its groups is
    released; the exposure rate must match 1 - (1 - p)^k ≤ δ where p is the exact tail at the
    threshold. Tolerance: 5 binomial standard deviations around the exact rate."""
    n, delta = 3000, Fraction(1, 20)
    df = pl.DataFrame({"user": np.repeat(np.arange(n), k), "g": np.arange(n * k)})
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("count-units",), max_partitions=k,
                            epsilon=Fraction(1), delta=delta)
    plan = hist.plan_histogram(q, "approx", {})
    p = plan.measurements["units"].noise.tail(plan.threshold - 1)
    rate = 1 - (1 - p) ** k
    assert rate <= float(delta)
    out = hist.run_histogram(table(df), q, plan, KeyedStream(b"x" * 32, "h")).table
    exposed = (out["g"] // k).n_unique() if out.height else 0
    sd = math.sqrt(n * rate * (1 - rate))
    assert abs(exposed - n * rate) <= 5 * sd + 1
    # Power: the rate is not trivially small, so a threshold one lower would be caught.
    assert n * rate > 30


def test_selection_threshold_matches_the_closed_form():
    """Laplace: τ = 1 + ⌈−b·ln(p*(1 + e^{−1/b}))⌉ with p* = 1 − (1 − δ)^{1/K} (continuous analogue
    in paper 002: 1 − b·ln(2 − 2(1 − δ)^{1/K}))."""
    noise = mech.laplace(4, Fraction(1, 2))  # b = 8
    tau = mech.selection_threshold(noise, 4, 1e-6)
    p_star = 1 - (1 - 1e-6) ** 0.25
    assert noise.tail(tau - 1) <= p_star < noise.tail(tau - 2)
    continuous = 1 - 8 * math.log(2 - 2 * (1 - 1e-6) ** 0.25)
    assert abs(tau - continuous) <= 2


def test_known_domain_lists_every_key_and_nothing_else():
    d = base_data()
    keys = pl.DataFrame({"g": ["a", "zzz", "b"]})  # 'c' is in the data but not public; 'zzz' is empty
    q = hist.HistogramQuery(by=("g",), unit="user", epsilon=Fraction(1, 2), domain="keys")
    out = release(d, q, keys=keys.sort("g")).table
    assert out["g"].to_list() == ["a", "b", "zzz"]
    assert abs(out.filter(pl.col("g") == "zzz")["count"].item()) < 40  # pure noise around 0 (b = 2)


def test_unklap_returns_top_groups_above_noisy_bottom():
    rng = np.random.default_rng(3)
    sizes = {f"g{i}": int(s) for i, s in enumerate([2000, 800, 300, 5, 1, 1])}
    users = np.concatenate([[f"{g}-{j}" for j in range(s)] for g, s in sizes.items()])
    groups = np.concatenate([[g] * s for g, s in sizes.items()])
    df = pl.DataFrame({"user": users, "g": groups})
    rng.shuffle(users)
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("count-units",), epsilon=Fraction(1),
                            delta=Fraction(1, 10**9), domain="unklap", max_groups=4)
    r = release(df, q)
    assert r.table["g"].to_list() == ["g0", "g1", "g2"]  # sorted by noisy count; small groups below ⊥
    assert r.metadata["bottom"] > 5


def test_quantiles_and_means_are_close_with_a_large_budget():
    rng = np.random.default_rng(5)
    n = 20000
    df = pl.DataFrame({"user": np.arange(n), "g": ["a"] * n, "x": rng.uniform(0, 100, n)})
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("mean", "median", "p90"), value="x",
                            bounds=(0.0, 100.0), epsilon=Fraction(20), domain="keys")
    out = release(df, q, keys=pl.DataFrame({"g": ["a"]})).table.row(0, named=True)
    assert abs(out["mean_x"] - df["x"].mean()) < 0.5
    assert abs(out["median_x"] - df["x"].median()) < 1.0
    assert abs(out["p90_x"] - df["x"].quantile(0.9)) < 1.0


def test_plan_is_data_independent_and_splits_the_budget():
    q = hist.HistogramQuery(by=("g",), unit="u", aggregations=("count", "mean"), value="x", bounds=(0.0, 1.0),
                            epsilon=Fraction(1), delta=Fraction(1, 10**6), max_partitions=2)
    plan = hist.plan_histogram(q, "approx", {})
    assert list(plan.measurements) == ["rows", "csum", "units"]
    assert plan.measurements["rows"].noise.param == Fraction(2 * 3)  # K·C / (ε/3)
    assert [e.kind for e in plan.events] == ["approx"] and plan.events[0].epsilon == 1
    with pytest.raises(UsageError, match="--delta"):
        hist.plan_histogram(hist.HistogramQuery(by=("g",), unit="u", epsilon=Fraction(1)), "approx", {})
    g = hist.plan_histogram(
        hist.HistogramQuery(by=("g",), unit="u", noise="gaussian", rho=Fraction(1, 2), domain="keys"), "zcdp", {}
    )
    assert g.events[0].kind == "zcdp" and g.measurements["rows"].noise.kind == "gaussian"


# ---- CLI ---------------------------------------------------------------------------------------


@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "events.csv"
    base_data(400).write_csv(p)
    return p


def hist_cli(*args):
    return runner.invoke(app, ["histogram", *map(str, args)])


def test_cli_replay_is_identical_and_free_and_new_data_is_renoised(data_file, tmp_path):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    args = [data_file, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6", "--max-partitions", "2"]
    r1, r2 = hist_cli(*args), hist_cli(*args)
    assert r1.exit_code == 0, r1.stderr
    assert r1.stdout == r2.stdout and r1.stdout.startswith("g,count\n")
    h = entries()
    assert len(h) == 2 and h[1]["replay_of"] == 1 and h[1]["events"] == []
    changed = tmp_path / "changed.csv"
    changed.write_text(data_file.read_text() + "newuser,a,1.0\n")
    r3 = hist_cli(changed, *args[1:])
    assert r3.exit_code == 0 and r3.stdout != r1.stdout
    assert len(entries()) == 3 and entries()[2]["events"]


def test_cli_json_and_output_file(data_file, tmp_path):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    out = tmp_path / "out.parquet"
    r = hist_cli(data_file, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--keys", _keys(tmp_path),
                 "--with-error", "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["charged"] and summary["groups"] == 3 and summary["ledger"]["remaining"]["epsilon"] == "9"
    df = pl.read_parquet(out)
    assert df.columns == ["g", "count", "count_moe95"] and df["g"].to_list() == ["a", "b", "c"]
    r = hist_cli(data_file, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--keys", _keys(tmp_path), "--json")
    doc = json.loads(r.stdout)
    assert [row["g"] for row in doc["result"]] == ["a", "b", "c"] and "summary" in doc


def _keys(tmp_path):
    p = tmp_path / "keys.csv"
    p.write_text("g\na\nb\nc\n")
    return p


@pytest.mark.parametrize(
    "opts, code, needle",
    [
        ({"--value": "x", "--agg": "sum", "--bounds": "5:1"}, 2, "--bounds"),
        ({"--value": "x", "--agg": "sum", "--bounds": "abc"}, 2, "--bounds"),
        ({"--value": "nope", "--agg": "sum", "--bounds": "0:1"}, 65, "'nope' not found"),
        ({"--by": "missing"}, 65, "'missing' not found"),
        ({"--privacy-unit": "who"}, 65, "'who' not found"),
        ({"--epsilon": "0"}, 2, "--epsilon must be > 0"),
        ({"--epsilon": "-1"}, 2, "--epsilon must be > 0"),
        ({"--delta": "1"}, 2, "--delta must be in"),
        ({"--agg": "bogus"}, 2, "unknown aggregation"),
        ({"--epsilon": "100"}, 77, "budget refused"),
    ],
)
def test_cli_bad_options_and_columns_fail_cleanly(data_file, tmp_path, opts, code, needle):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    out = tmp_path / "o.csv"
    merged = {"--by": "g", "--privacy-unit": "user", "--epsilon": "1", "--delta": "1e-6", **opts}
    r = hist_cli(data_file, *[x for kv in merged.items() for x in kv], "-o", out)
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert needle in r.stderr and r.stderr.count("\n") == 1 and r.stderr.startswith("dpcli: error:")
    assert entries() == [] and not out.exists()


def test_value_column_type_comes_from_the_schema_not_the_records(data_file, tmp_path):
    """A CSV value column is text, parsed per record (a column of words releases like one with no values);
    only a declared non-numeric, non-text type (Parquet's boolean here) is a schema error."""
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    args = ["--by", "g", "--privacy-unit", "user", "--agg", "sum", "--bounds", "0:1", "--epsilon", "1", "--delta", "1e-6",
            "--max-contributions", "1", "--max-partitions", "1"]
    r = hist_cli(data_file, *args, "--value", "g")
    assert r.exit_code == 0 and without_output_notes(r.stderr) == "", r.stderr
    p = tmp_path / "flags.parquet"
    pl.DataFrame({"user": ["u1", "u2"], "g": ["a", "a"], "flag": [True, False]}).write_parquet(p)
    out = tmp_path / "o.csv"
    r = hist_cli(p, *args, "--value", "flag", "-o", out)
    assert r.exit_code == 65 and "'flag' must be numeric" in r.stderr and r.stderr.count("\n") == 1
    assert len(entries()) == 1 and not out.exists()


@pytest.mark.parametrize(
    "content, code, needle, charged",
    [
        (None, 66, "does not exist", 0),
        ("", 65, "is empty", 0),
        # a record that does not parse is found by reading: the run was debited before it read (and a
        # rerun is a free replay of the same failure)
        ('user,g,x\n"unterminated,a,1\n', 65, "cannot", 1),
    ],
)
def test_cli_bad_input_files_fail_cleanly(tmp_path, content, code, needle, charged):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    f = tmp_path / "in.csv"
    if content is not None:
        f.write_text(content)
    out = tmp_path / "o.csv"
    r = hist_cli(f, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6", "-o", out)
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert needle in r.stderr and r.stderr.count("\n") == 1
    assert len(entries()) == charged and not out.exists()
    assert ("the run is charged (it had begun reading), and a rerun on the same input is a free replay"
            in r.stderr) == bool(charged)
    if charged:
        again = hist_cli(f, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6", "-o", out)
        assert again.exit_code == code and len(entries()) == charged and not out.exists()


@pytest.mark.parametrize("content", ["user,g,x\n", "user,g,x\n,a,1\nu2,a,2\n", "user,g,x\nu1,a,NaN\nu2,a,inf\n"])
def test_cli_bad_records_and_no_rows_are_released_not_refused(tmp_path, content):
    """Formerly exit 65 ("no rows", "null values", "non-finite"): an oracle on private records (issue 15)."""
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    f = tmp_path / "in.csv"
    f.write_text(content)
    agg = ["--agg", "sum", "--value", "x", "--bounds", "0:5"] if "NaN" in content else []
    r = hist_cli(f, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6", *agg,
                 "--max-contributions", "1", "--max-partitions", "1")
    assert r.exit_code == 0 and without_output_notes(r.stderr) == "", r.stderr  # only notes on the noisy output
    assert len(entries()) == 1


def test_cli_without_ledger_and_br_ledger_charges_alg5(data_file, tmp_path, state_dir):
    state_dir.mkdir()  # no ledger in it: exit 77
    r = hist_cli(data_file, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6")
    assert r.exit_code == 77 and "budget init" in r.stderr
    init_ledger("br", "--epsilon-per", "0.5", "--delta", "1e-9", "--info-budget", "10", "--call-budget", "3",
                "--delta-prime", "1e-9")
    r = hist_cli(data_file, "--by", "g", "--privacy-unit", "user", "--selection", "unklap", "--agg", "count-units",
                 "--max-partitions", "2")
    assert r.exit_code == 0, r.stderr
    r = hist_cli(data_file, "--by", "g", "--privacy-unit", "user", "--keys", _keys(tmp_path), "--max-partitions", "3")
    assert r.exit_code == 0, r.stderr
    ev = [e["events"][0] for e in entries()]
    assert (ev[0]["units"], ev[0]["calls"]) == (1, 1) and (ev[1]["units"], ev[1].get("calls", 0)) == (3, 0)
    r = hist_cli(data_file, "--by", "g", "--privacy-unit", "user", "--agg", "count,count-units", "--keys", _keys(tmp_path))
    assert r.exit_code == 2 and "br ledger" in r.stderr


def test_cli_zcdp_ledger_defaults_to_gaussian(data_file):
    init_ledger("zcdp", "--rho", "1")  # no δ in the ledger: thresholding (δ > 0) is refused
    r = hist_cli(data_file, "--by", "g", "--privacy-unit", "user", "--rho", "0.25", "--delta", "1e-6")
    assert r.exit_code == 77 and "δ left is 0" in r.stderr
    init_ledger("zcdp", "--rho", "1", "--delta", "1e-5", analyst="z2")
    r = runner.invoke(app, ["--analyst", "z2", "histogram", str(data_file), "--by", "g", "--privacy-unit", "user", "--rho", "0.25", "--delta", "1e-6", "--json",
                            "-o", "-"])
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["measurements"]["units"]["noise"] == "discrete_gaussian"
    assert s["ledger"]["remaining"]["rho"] == "0.75"


def test_cli_reads_csv_from_stdin_without_input_format(data_file, tmp_path):
    """Issue 17: `cat events.csv | dpcli histogram - …` is CSV unless --input-format says otherwise."""
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    args = ["--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6"]
    r = runner.invoke(app, ["histogram", "-", *args], input=data_file.read_bytes())
    assert r.exit_code == 0, r.stderr
    assert r.stdout == hist_cli(data_file, *args).stdout  # same bytes, same fingerprint → same release
    semi = tmp_path / "semi.csv"
    semi.write_bytes(data_file.read_bytes().replace(b",", b";"))
    r = runner.invoke(app, ["histogram", "-", "--delimiter", ";", *args], input=semi.read_bytes())
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0] == "g,count"


def test_large_parquet_inputs_bound_in_unit_buckets_with_identical_results(tmp_path, monkeypatch):
    """Bucketing by unit (to bound memory on big Parquet files) changes no released value: every
    bound is per unit, and group totals and quantile bins add up across buckets."""
    from dpcli.frames import cheap_row_count
    from dpcli.io.inputs import open_input
    from dpcli.tasks import topk as tk

    d = base_data(n_units=2000, seed=5)
    path = tmp_path / "d.parquet"
    d.write_parquet(path)
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("count", "count-units", "sum", "median"),
                            value="x", bounds=(0.0, 10.0), max_partitions=2, max_contributions=2,
                            epsilon=Fraction(1), delta=Fraction(1, 10**6))
    plan = hist.plan_histogram(q, "approx", {})
    tq = tk.TopKQuery(by=("g",), k=2, unit="user", epsilon_per=Fraction(1), delta=Fraction(1, 10**9))
    tplan = tk.plan_topk(tq, "approx", {})
    def run() -> tuple[pl.DataFrame, pl.DataFrame]:
        t = open_input(str(path))
        rows = cheap_row_count(t)
        return (hist.run_histogram(t.frame, q, plan, KeyedStream(b"b" * 32, "histogram"), rows=rows).table,
                tk.run_topk(t.frame, tq, tplan, KeyedStream(b"t" * 32, "topk"), rows=rows).table)

    one, top_one = run()
    monkeypatch.setattr(bounding, "SINGLE_PASS_ROWS", 1000)
    monkeypatch.setattr(bounding, "BUCKET_ROWS", 700)  # ~7,000 rows: 10 passes
    assert bounding.unit_buckets(cheap_row_count(open_input(str(path)))) >= 5
    many, top_many = run()
    assert one.height == 3 and one.equals(many)
    assert top_one.equals(top_many)


# ---- issue 17 (the first hour): quantiles under ρ, margins in a dry run -------------------------


# --- the bugs of the report -------------------------------------------------------------------


@pytest.mark.parametrize("mode, extra", [
    (("zcdp", "--rho", "5"), ("--keys", PAGES)),
    (("approx", "--epsilon", "20", "--delta", "1e-5"), ("--keys", PAGES, "--delta", "1e-8")),
    (("zcdp", "--rho", "5", "--delta", "1e-6"), ("--delta", "1e-9")),  # groups discovered
])
def test_quantiles_with_rho_release(mode, extra):
    """The README's quantile example with --rho (reported as `need num ≥ 0 without a scale`)."""
    init_ledger(*mode)
    r = cli("histogram", SAMPLE / "page_views.csv", "--by", "page", "--privacy-unit", "user_id", "--agg",
            "median,p90", "--value", "duration_s", "--bounds", "0:600", "--noise", "gaussian", "--rho", "0.1", *extra)
    assert r.exit_code == 0, r.stderr
    out = pl.read_csv(r.stdout.encode())
    assert out.height > 0 and out["median_duration_s"].is_between(0, 600).all()
    assert (out["p90_duration_s"] >= 0).all()


# --- dry runs, topk --epsilon, stream margins --------------------------------------------------


def test_dry_run_shows_margins_in_output_units_and_whether_the_ledger_accepts():
    init_ledger("pure", "--epsilon", "1")
    args = ["histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--agg", "count,sum",
            "--value", "duration_s", "--bounds", "0:600", "--granularity", "0.5", "--max-partitions", "1",
            "--max-contributions", "1", "--epsilon", "0.5", "--dry-run"]
    doc = json.loads(cli(*args, "--json").stdout)
    assert doc["ledger"] == {"analyst": "default", "accepts": True, "refusal": None}
    rows, s = doc["calibration"]["rows"], doc["calibration"]["sum"]
    assert rows["moe95"] >= 1 and s["moe95"] == pytest.approx(
        dpcli_noise_margin(s) * 0.5)  # grid units × granularity
    text = cli(*args).stdout
    assert "95% margin ±" in text and "would accept" in text
    too_much = json.loads(cli(*args[:-3], "--epsilon", "2", "--dry-run", "--json").stdout)
    assert too_much["ledger"]["accepts"] is False and "ε left is 1" in too_much["ledger"]["refusal"]
    assert entries() == []  # a dry run charges nothing


def dpcli_noise_margin(description: dict) -> int:
    from fractions import Fraction

    from dpcli.core.mechanisms import Noise

    return Noise("laplace", Fraction(description["scale"])).margin95()


def test_a_parquet_text_column_given_to_value_is_refused_before_any_charge(tmp_path):
    """Issue 39, item 1: a Parquet column's type is schema. `--value country` (a String column) used to be
    charged and release nothing (or, with --keys, pure noise); it is exit 65 naming the column, nothing
    charged. In a CSV every column is text and values are parsed per record: the same column is no error."""
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    args = ["--by", "country", "--privacy-unit", "user_id", "--agg", "mean", "--value", "country", "--bounds",
            "0:100", "--epsilon", "0.5", "--delta", "1e-7"]
    r = cli("histogram", PV_SMALL, *args)
    assert r.exit_code == 65 and "column 'country' must be numeric but is String" in r.stderr, r.stderr
    assert entries() == []
    csv = cli("histogram", str(SAMPLE / "page_views.csv"), *args)
    assert csv.exit_code == 0, csv.stderr


def test_a_dry_run_refuses_a_list_without_the_grouped_column(tmp_path):
    """Issue 39, item 4: `--dry-run --keys airports.csv` (a list without the grouped column `dest`) was
    accepted and the real run then exited 65. A public list's header is public: the plan checks it, with the
    release's own message, and reads no record of the data."""
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    keys = tmp_path / "airports.csv"
    keys.write_text("faa,name\nJFK,Kennedy\n")
    args = ["--by", "country", "--privacy-unit", "user_id", "--keys", str(keys), "--epsilon", "1"]
    dry = cli("histogram", PV_SMALL, *args, "--dry-run")
    real = cli("histogram", PV_SMALL, *args)
    assert dry.exit_code == real.exit_code == 65, (dry.stderr, real.stderr)
    assert dry.stderr == real.stderr and "lacks column 'country'" in dry.stderr
    assert entries() == []
    good = cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES, "--epsilon", "1",
               "--dry-run")
    assert good.exit_code == 0, good.stderr
