"""Rule 7, bad public inputs are usage errors: extreme and oddly spelled numbers in options.

Attack: extreme and oddly spelled numbers in options (issue 15, finding 9). Every numeric option must
end in a clear one-line usage error (exit 2) or a correct answer: never an internal error (exit 1),
never a hang, never a silently wrong mechanism. Before the fix, ε or δ below the double range crashed
in float conversions, ``1e-1000000000`` hung building 10^10^9, a tiny ε hung the 95% margin loop, big
counts overflowed numpy, and an ε with many digits made the exponential race's int64 products wrap
around (a wrong distribution, not just a crash).

Later reviews added: the public options of the review of issue 15 (δ that underflows, huge
``--max-groups`` and ``-k``, a quantile with many digits, a composition that overflows); stream-replay's
times and windows at their extremes (issue 15, finding 9); ``--improver-c 0.24999999999999999999``,
which passed the exact check c < 1/4 but was stored as the float 0.25 (review of BBImprover for cron);
and a query column named like the bounding's internal columns (selection v3: a unit column named
``__dp_grid`` became each row's grid value, so one person with 8 rows counted as 8 units).
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from dptest import init_ledger, released_nothing, runner
from keyed_order_cases import GRID
from small_tables import csv_rows, write
from stream_reports import BASE, _rows, _write

from dpcli import bounding
from dpcli.cli.app import app
from dpcli.core.accounting import composition as acc
from dpcli.errors import UsageError

SPEC = Path(__file__).resolve().parents[2] / "sample_data" / "safetab_spec.toml"


class TooSlow(BaseException):
    """Raised by :func:`deadline` (a BaseException, so dpcli's error handler cannot swallow it)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail the test instead of hanging when the block runs longer than ``seconds``."""

    def _raise(*_: object) -> None:
        raise TooSlow(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run(*args: str, seconds: float = 20.0):
    with deadline(seconds):
        return runner.invoke(app, list(args))


def usage_error(r, *needles: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    if lines and lines[0].startswith("Usage:"):  # the option parser's own block (ints out of range)
        lines = [line for line in lines if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def data(tmp_path: Path) -> dict[str, str]:
    rows = "".join(f"u{i},g{i % 3},{i % 7},2026-01-01T{i % 24:02d}:00:00\n" for i in range(60))
    (tmp_path / "d.csv").write_text("u,g,x,t\n" + rows)
    (tmp_path / "k.csv").write_text("g\ng0\ng1\ng2\n")
    return {"csv": str(tmp_path / "d.csv"), "keys": str(tmp_path / "k.csv"), "out": str(tmp_path / "o.csv")}


def history() -> int:
    return len(json.loads(run("budget", "history", "--json").stdout))


def commands(d: dict[str, str], eps: str = "1", delta: str = "1e-6") -> dict[str, list[str]]:
    return {
        "histogram": ["histogram", d["csv"], "--by", "g", "--privacy-unit", "u", "--epsilon", eps, "--delta", delta],
        "topk": ["topk", d["csv"], "--by", "g", "-k", "2", "--privacy-unit", "u", "--epsilon-per", eps,
                 "--delta", delta],
        "stream-replay": ["stream-replay", d["csv"], "--time", "t", "--by", "g", "--privacy-unit", "u",
                          "--window", "1d", "--triggers", "4", "--max-contributions", "2", "--epsilon", eps,
                          "--delta", delta],
    }


@pytest.mark.parametrize("command", ["histogram", "topk", "stream-replay"])
def test_epsilon_and_delta_below_the_double_range_are_usage_errors(data, command):
    init_ledger("approx", "--epsilon", "1000", "--delta", "0.5")
    before = history()
    usage_error(run(*commands(data, eps="1e-400")[command], "-o", data["out"]), "must be in [1e-12, 1e6]")
    usage_error(run(*commands(data, delta="1e-400")[command], "-o", data["out"]), "must be in [1e-100, 0.5]")
    assert history() == before and not Path(data["out"]).exists()


def test_budget_init_and_tabulate_plan_refuse_numbers_below_the_double_range():
    usage_error(run("budget", "init", "a", "--mode", "pure", "--epsilon", "1e-400"), "--epsilon")
    usage_error(run("budget", "init", "a", "--mode", "approx", "--epsilon", "1", "--delta", "1e-400"), "--delta")
    usage_error(run("budget", "init", "a", "--mode", "zcdp", "--rho", "1", "--report-delta", "1e-400"))
    usage_error(run("tabulate", "--dry-run", "--spec", str(SPEC), "--delta", "1e-400"), "--delta")


@pytest.mark.parametrize("rho", ["1e300", "1e-300", "1e400", "5e-324"])
def test_compose_zcdp_extreme_rho_is_a_usage_error(rho):
    r = run("budget", "compose", "--mode", "zcdp", "--rho", rho, "--delta", "1e-9")
    usage_error(r, "--rho must be in [1e-24, 1e12]")


@pytest.mark.parametrize("rho", ["1e12", "1e-24", "1e-12"])
def test_compose_zcdp_at_the_range_edges_is_safe(rho):
    r = run("budget", "compose", "--mode", "zcdp", "--rho", rho, "--delta", "1e-9", "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    eps = out["epsilon"]
    assert math.isfinite(eps) and 0 <= eps <= out["epsilon_analytic"]
    assert acc.zcdp_delta(float(rho), eps) <= 1e-9  # the stated ε really holds at δ


@pytest.mark.parametrize("text", ["1e-1000000000", "1e1000000000", "0e-999999999", "9" * 200])
def test_enormous_exponents_and_digit_strings_are_refused_fast(text):
    with deadline(3):
        usage_error(run("budget", "init", "a", "--mode", "pure", "--epsilon", text), "--epsilon")


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1/0", "1e", "0x10", "", "1,5"])
def test_odd_spellings_are_usage_errors(text):
    usage_error(run("budget", "compose", "--mode", "pure", "--epsilon", text), "--epsilon")


def test_odd_but_valid_spellings_are_answered():
    for text, want in ((" 1", "3"), ("1/3", "1"), ("+0.5", "1.5"), ("1_0", "30")):
        r = run("budget", "compose", "--mode", "pure", "--epsilon", text, "--count", "3", "--json")
        assert r.exit_code == 0 and json.loads(r.stdout)["epsilon"] == want, (text, r.stdout, r.stderr)


def test_tiny_epsilon_with_margins_finishes(data):
    """ε = 1e-10: Laplace scale 3e10. The 95% margin used to count down from 3b one step at a time."""
    init_ledger("pure", "--epsilon", "1")
    r = run("histogram", data["csv"], "--by", "g", "--privacy-unit", "u", "--keys", data["keys"],
            "--epsilon", "1e-10", "--with-error", "-o", data["out"], seconds=10)
    assert r.exit_code == 0, r.stderr


def test_many_digit_epsilon_cannot_wrap_the_exponential_race(tmp_path, monkeypatch):
    """ε_per = 0.1844674407370957 and a count gap of 10^4: rate numerator × gap = 2^64 + 18384.

    numpy's int64 product wrapped to 18384, so the race accepted the 1-unit groups as readily as the
    10001-unit one: top-1 came out 'b' or 'c' in most runs although the mechanism gives them e^-1844.
    """
    rows = "".join(f"u{i},a\n" for i in range(10_001)) + "v1,b\nv2,c\n"
    (tmp_path / "w.csv").write_text("u,g\n" + rows)
    (tmp_path / "dom.csv").write_text("g\na\nb\nc\n")
    winners = []
    for i in range(5):
        monkeypatch.setenv("DPCLI_STATE_DIR", str(tmp_path / f"state{i}"))  # a fresh key: fresh noise
        init_ledger("pure", "--epsilon", "10")
        r = run("topk", str(tmp_path / "w.csv"), "--by", "g", "-k", "1", "--privacy-unit", "u",
                "--epsilon-per", "0.1844674407370957", "--keys", str(tmp_path / "dom.csv"), "--no-counts")
        assert r.exit_code == 0, r.stderr
        winners.append(r.stdout.splitlines()[1].split(",")[1])
    assert winners == ["a"] * 5


def test_epsilon_with_thirty_digits_is_answered(data):
    init_ledger("approx", "--epsilon", "1e6", "--delta", "0.5")
    for eps in ("0.123456789012345678901234567890", "1e-11", "1e3"):
        r = run(*commands(data, eps=eps)["topk"])
        assert r.exit_code == 0, (eps, r.stderr)


def test_topk_delta_below_unkgumbs_resolution_is_a_usage_error(data):
    init_ledger("approx", "--epsilon", "1000", "--delta", "0.5")
    usage_error(run(*commands(data, delta="1e-20")["topk"], "--selection", "unkgumb"), "UnkGumb")
    # the threshold selection (the default) has no such floor: its threshold is ln(K̄/δ)-sized
    assert run(*commands(data, delta="1e-20")["topk"]).exit_code == 0


def test_large_and_small_epsilon_in_every_noise_path(data):
    """UnkLap overflowed e^{ε/2}; the Gaussian calibration overflowed or rounded ρ to 0; DP-SQLP e^ε."""
    init_ledger("zcdp", "--rho", "1e12", "--delta", "0.5")
    h = commands(data)["histogram"][:6]
    for extra in (["--selection", "unklap", "--epsilon", "1e3", "--delta", "1e-6", "--noise", "laplace"],
                  ["--epsilon", "1e6", "--delta", "1e-6"], ["--rho", "1e6", "--keys", data["keys"]]):
        r = run(*h, *extra)
        assert r.exit_code == 0, (extra, r.stderr)
    assert run(*h, "--epsilon", "1e-12", "--delta", "1e-6").exit_code == 0  # ρ ≈ δ²: σ ≈ 2e6, fine
    usage_error(run(*h, "--epsilon", "1e-12", "--delta", "1e-100"), "noise too large")
    usage_error(run(*commands(data, eps="1e4")["stream-replay"]), "--epsilon")


@pytest.mark.parametrize(
    "args",
    [
        ["histogram", "{csv}", "--by", "g", "--privacy-unit", "u", "--epsilon", "1", "--delta", "1e-6",
         "--max-partitions", str(10**12)],
        ["histogram", "{csv}", "--by", "g", "--privacy-unit", "u", "--epsilon", "1", "--delta", "1e-6",
         "--selection", "unklap", "--max-groups", str(10**30)],
        ["topk", "{csv}", "--by", "g", "-k", str(10**30), "--privacy-unit", "u", "--epsilon-per", "1", "--delta", "1e-6"],
        ["topk", "{csv}", "--by", "g", "-k", "1", "--max-groups", str(10**12), "--privacy-unit", "u", "--epsilon-per", "1",
         "--delta", "1e-6"],
        ["budget", "compose", "--mode", "approx", "--epsilon", "1", "--count", str(10**30)],
    ],
)
def test_huge_counts_are_usage_errors(data, args):
    init_ledger("approx", "--epsilon", "1000", "--delta", "0.5")
    usage_error(run(*[a.format(**data) for a in args], seconds=10))


def test_compose_huge_count_is_answered_without_building_a_list():
    r = run("budget", "compose", "--mode", "approx", "--epsilon", "0.1", "--delta-per", "1e-9", "--count",
            str(10**12), "--delta-prime", "1e-6", "--json", seconds=5)
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["epsilon"] >= 1e11 and out["delta"] == 1.0 and out["advanced_epsilon"] <= out["epsilon"]


@pytest.mark.parametrize("value", ["inf", "1e400", "nan"])
def test_lock_timeout_that_never_expires_is_a_usage_error(value):
    """--lock-timeout inf (or nan: every comparison false) waited forever on a held lock."""
    init_ledger("pure", "--epsilon", "1")
    usage_error(run("--lock-timeout", value, "budget", "show"), "--lock-timeout")


# ---- the review of issue 15: extreme public options -----------------------------------------------


EXTREME = {
    "delta_underflows": (["histogram", "{data}", "--by", "g", "--privacy-unit", "uid", "--epsilon", "1",
                          "--delta", "1e-400"], None),
    "huge_max_groups": (["histogram", "{data}", "--by", "g", "--privacy-unit", "uid", "--epsilon", "1",
                         "--selection", "unklap", "--max-groups", "99999999999999999999999", "--delta", "1e-6"], None),
    "quantile_digits": (["histogram", "{data}", "--by", "g", "--privacy-unit", "uid", "--agg", "p99.99999999999999999",
                         "--value", "v", "--bounds", "0:10", "--epsilon", "1", "--keys", "{keys}"],
                        None),
    "huge_k": (["topk", "{data}", "--by", "g", "--privacy-unit", "uid", "-k", "99999999999999999999",
                "--epsilon-per", "1", "--delta", "1e-6"], None),
    "compose_overflow": (["budget", "compose", "--mode", "zcdp", "--rho", "1e300", "--delta", "1e-300"], None),
}


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=[pytest.mark.xfail(strict=True, reason=why)] if why else [])
    for name, (_, why) in EXTREME.items()
])
def test_extreme_public_options_are_usage_errors(tmp_path, case):
    init_ledger("approx", "--epsilon", "50", "--delta", "0.1")
    data = write(tmp_path / "a.csv", csv_rows(50))
    keys = write(tmp_path / "k.csv", ["g", "0", "1", "2"])
    argv = [a.format(data=data, keys=keys) for a in EXTREME[case][0]]
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, r.stderr
    assert "internal error" not in r.stderr


# ---- stream-replay's options at their extremes (issue 15, finding 9) ------------------------------


OPTIONS = {  # option overrides → the exit codes allowed (never 1)
    "through 1e11": (["--through", "100000000000"], {0}),
    "through -1e11": (["--through", "-100000000000"], {2}),
    "through 1e20": (["--through", "100000000000000000000"], {2}),
    "through 9999": (["--through", "9999-12-31T23:59:59"], {0}),
    "through 0001": (["--through", "0001-01-01T00:00:00"], {0}),
    "through 0001 +05:00": (["--through", "0001-01-01T00:00:00+05:00"], {2}),
    "through 9999 -05:00": (["--through", "9999-12-31T23:59:59-05:00"], {2}),
    "window huge": (["--window", "99999999999999d", "--triggers", "4"], {2}),
    "trigger every second": (["--window", "7d", "--trigger-every", "1s"], {2}),
    "clamp huge": (["--value", "v", "--bounds", "-1e300:1e300"], {0, 2}),
    "clamp tiny": (["--value", "v", "--bounds", "-5e-324:5e-324"], {0, 2}),
    "max-records huge": (["--max-contributions", "1000000000000000000"], {0, 2}),
    "epsilon huge": (["--epsilon", "1e6"], {0, 2}),
    "mu huge": (["--mu", "1000000000000000000"], {0, 2}),
}


def test_extreme_options_are_usage_errors_or_work(tmp_path):
    """(c) public options at extremes (each case of OPTIONS, full replay and --state): exit 0 or 2 with
    one line, never 1 (a crash)."""
    f = _write(tmp_path, "d.csv", _rows(value=True))
    init_ledger("approx", "--epsilon", "1000", "--delta", "0.5")
    for n, (case, (extra, allowed)) in enumerate(OPTIONS.items()):
        base = list(BASE)
        if "--window" in extra:  # replace --window/--trigger-every
            i = base.index("--window")
            del base[i: i + 4]
        for mode in ([], ["--state", str(tmp_path / f"{n}.state")])[: 2 if "--through" in extra else 1]:
            r = runner.invoke(app, ["stream-replay", str(f), *base, *extra, *mode])
            assert r.exit_code in allowed, (case, mode, r.exit_code, r.stderr)
            # one line, or typer's own usage block for a bound it checks (max=), whose last line names it
            assert r.stderr.count("\n") <= 1 or r.stderr.rstrip().splitlines()[-1].startswith("Error:"), (case, r.stderr)


# ---- BBImprover's c (review of noise stream v2 and BBImprover for cron) ----------------------------


@pytest.fixture
def snapshot(tmp_path):
    p = tmp_path / "snap.csv"
    pl.DataFrame({"user": [f"u{i}" for i in range(50)], "g": ["a", "b"] * 25}).write_csv(p)
    keys = tmp_path / "keys.csv"
    keys.write_text("g\na\nb\n")
    return p, keys


def _history() -> list:
    return json.loads(runner.invoke(app, ["budget", "history", "default", "--json"]).stdout)


@pytest.mark.parametrize("c", ["0.25", "1/4", "0.24999999999999999999", "0.3", "0.5"])
def test_c_at_or_above_a_quarter_is_refused_with_one_line(snapshot, c):
    """Including a c just below 1/4 whose float is 0.25 (it was stored as c = 0.25)."""
    path, keys = snapshot
    init_ledger("approx", "--epsilon", "5", "--delta", "1e-5")
    r = runner.invoke(app, ["histogram", str(path), "--by", "g", "--privacy-unit", "user", "--keys", str(keys),
                            "--schedule", "s", "--total-epsilon", "1", "--scheduler", "bbimprover",
                            "--total-delta", "1e-6", "--improver-c", c, "--json", "-o", "-"])
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "(0, 1/4)" in r.stderr
    assert released_nothing(r) and _history() == []


# ---- selection v3: a query column named like an internal one ---------------------------------------


def test_attack_a_query_column_named_like_an_internal_column_is_refused():
    """FINDING: the bounding writes its own columns (``__dp_grid``, ``__dp_order``…) over the
    input's. A privacy unit column named ``__dp_grid`` became each row's grid value, so one person
    with 8 rows counted as 8 units with C = K = 1 (rows 8, not 1); other names failed late. Now any
    query column with the internal prefix is a usage error, before any data is read."""
    for kw in ({"unit": "__dp_grid", "by": ("g",)}, {"unit": "u", "by": ("__dp_order",)},
               {"unit": "u", "by": ("g", "__dp_rows")}, {"unit": "u", "by": ("g",), "value": "__dp_csum"}):
        value = kw.pop("value", "v")
        with pytest.raises(UsageError, match="__dp_"):
            bounding.BoundingSpec(**kw, max_partitions=1, max_contributions=1, value=value, grid=GRID)


@pytest.mark.parametrize("query", [
    "SELECT ANON_SUM(" + "(" * 3000 + "val" + ")" * 3000 + ", 0, 1) AS s FROM t",  # sqlglot's parser recursed
    "SELECT ANON_COUNT(*) AS c FROM t WHERE " + " AND ".join(["val > 1"] * 5000),  # the resolver recursed
    "SELECT ANON_COUNT(*) AS c FROM " + "(SELECT uid FROM " * 300 + "t" + ") s" * 300,
    "WITH c AS (SELECT uid FROM c) SELECT ANON_COUNT(*) AS c FROM c",  # a CTE reading itself recursed forever
    "WITH a AS (SELECT uid FROM b), b AS (SELECT uid FROM a) SELECT ANON_COUNT(*) AS c FROM a",
    "WITH " + ", ".join(f"c{i} AS (SELECT uid FROM c{i - 1} JOIN c{i - 1} x USING (uid))" for i in range(1, 40))
    .replace("c0 JOIN c0 x USING (uid)", "t") + " SELECT ANON_COUNT(*) AS c FROM c39",  # 2^38 table reads
])
def test_attack_a_deeply_nested_query_is_a_usage_error(tmp_path, query):
    """A query nested thousands of levels deep (review of issue 32): RecursionError in the parser or
    the resolver was an internal error (exit 1), and so was a CTE that reads itself; CTEs that each join
    the one before doubled the plan at each step (2^38 reads, never finished). Each is the query's fault:
    a one-line usage error (exit 2)."""
    data = write(tmp_path / "t.csv", ["uid,val", *(f"u{i},{i % 5}" for i in range(20))])
    r = runner.invoke(app, ["sql", query, "--table", f"t={data}", "--privacy-unit", "t.uid", "--epsilon", "1"])
    assert r.exit_code == 2, r.stderr
    assert r.stderr.count("\n") == 1 and any(w in r.stderr for w in ("nests more than", "reads itself",
                                                                     "reads tables more than"))


@pytest.mark.parametrize("call", ["ANON_VAR(x, 0, 1e200)", "ANON_STDDEV(x, -1e300, 1e300)",
                                  "ANON_VARIANCE(x, 0, 1e160)"])
def test_attack_sql_variance_bounds_beyond_a_double_are_a_usage_error_before_reading(tmp_path, monkeypatch, call):
    """Issue 37, class 4: ``ANON_VAR(x, 0, 1e200)`` overflowed ((U − L)/2)² after the data was read (exit 1);
    the bounds are public, so they are refused first (exit 2), the release path never entered."""
    import dpcli.release as release

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("the release path was entered")

    data = tmp_path / "v.csv"
    pl.DataFrame({"user": ["a", "b"], "x": [1.0, 2.0]}).write_csv(data)
    init_ledger(state_dir=tmp_path / "state")
    monkeypatch.setattr(release, "run", never)
    r = runner.invoke(app, ["sql", f"SELECT {call} AS v FROM v", "--table", f"v={data}", "--privacy-unit", "v.user",
                            "--epsilon", "1"], env={"DPCLI_STATE_DIR": str(tmp_path / "state")})
    assert r.exit_code == 2, r.stderr
    assert "larger than 1e300" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_sql_variance_bounds_within_a_double_still_run(tmp_path):
    data = tmp_path / "v.csv"
    pl.DataFrame({"user": ["a", "b"], "x": [1.0, 2.0]}).write_csv(data)
    init_ledger(state_dir=tmp_path / "state")
    r = runner.invoke(app, ["sql", "SELECT ANON_VAR(x, 0, 1e150) AS v FROM v", "--table", f"v={data}",
                            "--privacy-unit", "v.user", "--epsilon", "1"], env={"DPCLI_STATE_DIR": str(tmp_path / "state")})
    assert r.exit_code == 0, r.stderr
