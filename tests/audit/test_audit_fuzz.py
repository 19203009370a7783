"""Audit: hostile inputs (property-based). Every input either succeeds or fails with a documented
exit code and one line on stderr: never a traceback, never a debit without output, never a partial file.

``make test`` runs a few dozen examples per target; ``make audit`` (the ``audit`` marker) runs hundreds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from dptest import ledger_argv, runner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dpcli.cli.app import app
from dpcli.errors import ExitCode

DOCUMENTED = {int(c) for c in ExitCode} - {int(ExitCode.INTERNAL)}
FAST, FULL = 6, 300
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

cells = st.one_of(
    st.sampled_from(["", "a", "b", "u1", "u2", "1", "-3", "2.5", "nan", "inf", "-inf", "1e308", "\"x,y\"", "null",
                     "NA", "é", "💥", " ", "0x1F", "2026-11-01"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6),
)


@st.composite
def csv_text(draw) -> str:
    header = draw(st.sampled_from(["u,g,x", "u,g", "g,x", "u,g,x,x", "", "u;g;x", "\ufeffu,g,x"]))
    rows = draw(st.lists(st.lists(cells, min_size=0, max_size=4), max_size=8))
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    return header + sep + sep.join(",".join(r) for r in rows)


def _ledger_entries() -> int:
    r = runner.invoke(app, ["budget", "history", "--json"])
    return len(json.loads(r.stdout)) if r.exit_code == 0 else -1


def _check(r, out: Path, before: int) -> None:
    assert r.exit_code in DOCUMENTED, (r.exit_code, r.stderr, r.exception)
    if r.exit_code == 0:
        return
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    if r.exit_code == ExitCode.USAGE and lines and lines[0].startswith("Usage:"):
        lines = [line for line in lines if line.startswith("Error:")]  # the parser's own usage block
    assert len(lines) == 1 and lines[0].startswith(("dpcli", "Error:")), r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists(), "a failed run left an output file"
    # A run is debited once it begins reading (issue 37): a record that does not parse (exit 65, or a file
    # changed while read, 66) may come after the debit, and then says so; a usage error never does.
    charged = "the run is charged (it had begun reading)" in r.stderr
    assert r.exit_code in (ExitCode.DATA, ExitCode.NO_INPUT) or not charged, r.stderr
    assert _ledger_entries() == before + int(charged), "a failed run was debited without saying so"


def _histogram_case(tmp: Path, text: str, extra: list[str]) -> None:
    runner.invoke(app, ledger_argv("approx", "--epsilon", "1000", "--delta", "0.5"))  # refused after the first example
    data, out = tmp / "in.csv", tmp / "out.csv"
    data.write_text(text, encoding="utf-8")
    if out.exists():
        out.unlink()
    before = _ledger_entries()
    r = runner.invoke(app, ["histogram", str(data), "--by", "g", "--privacy-unit", "u", "--epsilon", "1",
                            "--delta", "1e-6", *extra, "-o", str(out)])
    _check(r, out, before)


@settings(max_examples=FAST, **SETTINGS)
@given(text=csv_text(), mean=st.booleans())
@example(text="\n\x1e", mean=False)  # found by the full run: a column name holding a record separator
@example(text="u\u2028,g\n1,2\n", mean=True)
def test_hostile_csv_histogram(tmp_path, text, mean):
    _histogram_case(tmp_path, text, ["--agg", "count,mean", "--value", "x", "--bounds", "0:10"] if mean else [])


@pytest.mark.audit
@settings(max_examples=FULL, **SETTINGS)
@given(text=csv_text(), mean=st.booleans())
def test_hostile_csv_histogram_full(tmp_path, text, mean):
    _histogram_case(tmp_path, text, ["--agg", "count,mean", "--value", "x", "--bounds", "0:10"] if mean else [])


numbers = st.one_of(st.sampled_from(["0", "-1", "1e-400", "1e400", "nan", "inf", "1/3", "0.1", "", "abc", "1,5",
                                     "9" * 40, "-0", "1e-12"]), st.text(max_size=5))


def _options_case(tmp: Path, eps: str, delta: str, k: str, bounds: str) -> None:
    runner.invoke(app, ledger_argv("approx", "--epsilon", "1000", "--delta", "0.5"))  # refused after the first example
    data, out = tmp / "ok.csv", tmp / "out.csv"
    data.write_text("u,g,x\n" + "".join(f"u{i},g{i % 3},{i % 7}\n" for i in range(60)))
    if out.exists():
        out.unlink()
    before = _ledger_entries()
    for cmd in (
        ["histogram", str(data), "--by", "g", "--privacy-unit", "u", "--epsilon", eps, "--delta", delta,
         "--agg", "sum", "--value", "x", "--bounds", bounds],
        ["topk", str(data), "--by", "g", "-k", k, "--privacy-unit", "u", "--epsilon-per", eps, "--delta", delta],
    ):
        r = runner.invoke(app, [*cmd, "-o", str(out)])
        _check(r, out, before)
        if r.exit_code == 0:
            out.unlink()
            before = _ledger_entries()


@settings(max_examples=FAST, **SETTINGS)
@given(eps=numbers, delta=numbers, k=numbers, bounds=st.one_of(st.sampled_from(["0:10", "10:0", "a:b", ":", "0:inf",
                                                                            "-1e9:1e9", "nan:1"]), st.text(max_size=6)))
def test_hostile_options(tmp_path, eps, delta, k, bounds):
    _options_case(tmp_path, eps, delta, k, bounds)


toml_values = st.one_of(st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=8), st.booleans(),
                        st.lists(st.integers(-2, 5), max_size=3))


@settings(max_examples=FAST, **SETTINGS)
@given(edits=st.dictionaries(st.sampled_from(["epsilon", "moe_calibration", "levels", "thresholds", "delta",
                                              "name", "ratio", "population", "[x", "unit"]), toml_values, max_size=4),
       garbage=st.sampled_from(["", "\n[[[", "\nkey = ", "\n\x00", "\nepsilon = 1\nepsilon = 2"]))
def test_hostile_tabulate_specs(tmp_path, edits, garbage):
    """A valid spec with random top-level keys overwritten (or appended garbage): `tabulate plan` either
    plans or refuses with a documented code and one line."""
    root = Path(__file__).resolve().parents[2] / "sample_data" / "safetab_spec.toml"
    text = root.read_text()
    lines = []
    for key, value in edits.items():
        lines.append(f"{key} = {json.dumps(value) if not isinstance(value, float) or value == value else 'nan'}")
    spec = tmp_path / "spec.toml"
    spec.write_text("\n".join(lines) + "\n" + text + garbage)
    r = runner.invoke(app, ["tabulate", "--dry-run", "--spec", str(spec)])
    assert r.exit_code in DOCUMENTED, (r.exit_code, r.stderr, r.exception)
    if r.exit_code:
        assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1 and "Traceback" not in r.stderr


# ---- every numeric option of every command over the full float range ----------------------------
# Values: the whole double range (subnormals, ±inf, nan), numbers outside it (1e-400, 1e400), huge
# integers, enormous exponents and odd spellings. Property: exit code documented and ≠ 1, one line on
# stderr when non-zero, no debit and no output file on failure. --bounds/--granularity and the stream
# times (--window, --through) stay fixed and valid here: other fixes own their extremes.

EXTREMES = ["0", "-0", "-1", "5e-324", "2.2e-308", "1e-400", "1e-300", "1e-100", "1e-24", "1e-12", "1e-9", "0.5",
            "0.999999999999999999999", "1", "1e3", "1e6", "1e12", "1e300", "1e308", "1.8e308", "1e400", "inf",
            "-inf", "nan", "NaN", "Infinity", str(10**30), "1/0", "0/0", "1/3", "1e", "e5", " 1", "1 ", "+1", "1_0",
            "0x10", "", ".", "1,5", "1e-1000000000", "1e1000000000", "0e-999999999", "0." + "1" * 30, "9" * 120,
            "1" + "0" * 5000]
INT_EXTREMES = ["0", "-1", "1", "2", "3", str(10**4), str(10**6), str(10**7), str(10**9), str(10**12), str(10**15),
                str(10**30), "9" * 5000, "1e3", "1.5", " 3", "", "nan", "-0"]
num_text = st.one_of(
    st.sampled_from(EXTREMES),
    st.floats().map(repr),
    st.integers(-400, 400).map(lambda e: f"1e{e}"),
    st.integers(-(10**30), 10**30).map(str),
    st.fractions(max_denominator=10**20).map(str),
    st.text(max_size=5),
)
int_text = st.one_of(st.sampled_from(INT_EXTREMES), st.integers(-(10**20), 10**20).map(str))
NUM_FULL = 200
NUM_SETTINGS = dict(SETTINGS, derandomize=True)

#: Per command: (base arguments, {numeric option: "num" or "int" with its valid default}).
_H = ["histogram", "{csv}", "--by", "g", "--privacy-unit", "u"]
_T = ["topk", "{csv}", "--by", "g", "--privacy-unit", "u"]
_S = ["stream-replay", "{csv}", "--time", "t", "--by", "g", "--privacy-unit", "u", "--window", "1d"]
NUMERIC_CASES: dict[str, list[tuple[list[str], dict[str, tuple[str, str]]]]] = {
    "histogram": [
        (_H, {"--epsilon": ("num", "1"), "--delta": ("num", "1e-6"), "--max-partitions": ("int", "2"),
              "--max-contributions": ("int", "2")}),
        (_H + ["--selection", "unklap"], {"--epsilon": ("num", "1"), "--delta": ("num", "1e-6"),
                                          "--max-groups": ("int", "10"), "--max-partitions": ("int", "1")}),
        (_H + ["--keys", "{keys}", "--noise", "gaussian", "--agg", "count,mean,median", "--value", "x",
               "--bounds", "0:10"], {"--rho": ("num", "0.5"), "--max-contributions": ("int", "1")}),
        (_H + ["--agg", "count,sum,variance,p90", "--value", "x", "--bounds", "0:10", "--noise", "gaussian"],
         {"--epsilon": ("num", "1"), "--delta": ("num", "1e-6"), "--max-partitions": ("int", "1")}),
        (_H + ["--keys", "{keys}", "--schedule", "s"], {"--total-epsilon": ("num", "1"), "--gamma": ("num", "0.5"),
                                                       "--beta": ("num", "0.05")}),
        (_H + ["--keys", "{keys}", "--schedule", "s", "--scheduler", "bbimprover"],
         {"--total-epsilon": ("num", "1"), "--total-delta": ("num", "1e-6"), "--improver-c": ("num", "0.25")}),
        (_H + ["--keys", "{keys}", "--schedule", "s", "--scheduler", "fixed"],
         {"--total-epsilon": ("num", "1"), "--epsilon": ("num", "0.1")}),
    ],
    "topk": [
        (_T, {"-k": ("int", "2"), "--epsilon-per": ("num", "1"), "--delta": ("num", "1e-6"), "--max-groups": ("int", "5")}),
        (_T + ["--keys", "{keys}", "--count", "rows"], {"-k": ("int", "2"), "--epsilon-per": ("num", "1"),
                                                         "--max-contributions": ("int", "2")}),
        (_T + ["-k", "1", "--keys", "{keys}", "--schedule", "s", "--scheduler", "fixed"],
         {"--total-epsilon": ("num", "1"), "--epsilon": ("num", "0.1")}),
    ],
    "tabulate": [(["tabulate", "--dry-run", "--spec", "{spec}"], {"--delta": ("num", "1e-10")})],
    "stream-replay": [
        (_S + ["--value", "x"], {"--epsilon": ("num", "1"), "--delta": ("num", "1e-6"), "--max-contributions": ("int", "2"),
                                 "--triggers": ("int", "4"), "--mu": ("int", "0"), "--bounds": ("text", "-10:10")}),
    ],
    "budget-init": [
        (["budget", "init", "fz", "--mode", "pure"], {"--epsilon": ("num", "1"), "--refresh-days": ("int", "30")}),
        (["budget", "init", "fz", "--mode", "approx"], {"--epsilon": ("num", "1"), "--delta": ("num", "1e-6")}),
        (["budget", "init", "fz", "--mode", "zcdp"], {"--rho": ("num", "1"), "--delta": ("num", "1e-6"),
                                                      "--report-delta": ("num", "1e-9")}),
        (["budget", "init", "fz", "--mode", "rdp"], {"--epsilon": ("num", "1"), "--delta": ("num", "1e-6")}),
        (["budget", "init", "fz", "--mode", "br"], {"--epsilon-per": ("num", "0.1"), "--delta": ("num", "1e-9"),
                                                    "--info-budget": ("int", "100"), "--call-budget": ("int", "10"),
                                                    "--delta-prime": ("num", "1e-9")}),
    ],
    "budget-compose": [
        (["budget", "compose", "--mode", "br"], {"--epsilon-per": ("num", "0.1"), "--delta-per": ("num", "1e-9"),
                                                 "--delta-prime": ("num", "1e-9"), "--count": ("int", "10"),
                                                 "--call-budget": ("int", "3")}),
        (["budget", "compose", "--mode", "zcdp"], {"--rho": ("num", "1"), "--delta": ("num", "1e-9")}),
        (["budget", "compose", "--mode", "pure"], {"--epsilon": ("num", "1"), "--count": ("int", "3")}),
        (["budget", "compose", "--mode", "approx"], {"--epsilon": ("num", "1"), "--delta-per": ("num", "1e-9"),
                                                     "--delta-prime": ("num", "1e-6"), "--count": ("int", "10")}),
        (["budget", "compose", "--mode", "rdp"], {"--epsilon": ("num", "1"), "--delta": ("num", "1e-9"),
                                                            "--count": ("int", "10")}),
    ],
}


@st.composite
def numeric_call(draw, command: str) -> list[str]:
    """One invocation of ``command`` with some of its numeric options replaced by hostile values."""
    base, options = draw(st.sampled_from(NUMERIC_CASES[command]))
    args = list(base)
    for flag, (kind, default) in options.items():
        if draw(st.booleans()):
            default = draw(num_text if kind == "num" else int_text)
        args += [flag, default]
    return args


@pytest.mark.parametrize("clamp", ["5e-324", "1e-321", "1.7e308"])
def test_numeric_options_stream_clamp_extremes(tmp_path, clamp):
    _numeric_case(tmp_path, [*_S, "--triggers", "4", "--max-contributions", "2", "--epsilon", "1", "--delta", "1e-6",
                             "--value", "x", "--bounds", f"-{clamp}:{clamp}"])


def _files(tmp: Path) -> dict[str, str]:
    rows = "".join(f"u{i},g{i % 3},{i % 7},2026-01-01T{i % 24:02d}:00:00\n" for i in range(40))
    (tmp / "n.csv").write_text("u,g,x,t\n" + rows)
    (tmp / "nk.csv").write_text("g\ng0\ng1\ng2\n")
    spec = Path(__file__).resolve().parents[2] / "sample_data" / "safetab_spec.toml"
    return {"csv": str(tmp / "n.csv"), "keys": str(tmp / "nk.csv"), "spec": str(spec)}


def _numeric_case(tmp: Path, args: list[str]) -> None:
    files = {"{" + k + "}": v for k, v in _files(tmp).items()}
    args = [files.get(a, a) for a in args]  # placeholders only: fuzzed values may hold braces
    out = tmp / "out.csv"
    if out.exists():
        out.unlink()
    if args[0] == "budget":
        state = tmp / "budget-state"  # a fresh ledger directory for each init, so every example can create one
        if state.exists():
            shutil.rmtree(state)
        r = runner.invoke(app, ["--state-dir", str(state), *args])
        _check_budget(r)
        return
    runner.invoke(app, ledger_argv("approx", "--epsilon", "1e6", "--delta", "0.5"))  # refused after the first example
    before = _ledger_entries()
    r = runner.invoke(app, [*args, "-o", str(out)] if args[0] != "tabulate" else args)
    _check(r, out, before)


def _check_budget(r) -> None:
    assert r.exit_code in DOCUMENTED, (r.exit_code, r.stderr, r.exception)
    if r.exit_code:
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        if r.exit_code == ExitCode.USAGE and lines and lines[0].startswith("Usage:"):
            lines = [line for line in lines if line.startswith("Error:")]
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    else:  # an answer: finite numbers only
        assert "nan" not in r.stdout.lower(), r.stdout


#: Inputs named in issue 15 (finding 9); they crashed with exit 1 before.
NAMED = [
    ("histogram", [*_H, "--epsilon", "1e-400", "--delta", "1e-6"]),
    ("histogram", [*_H, "--epsilon", "1", "--delta", "1e-400"]),
    ("topk", [*_T, "-k", "2", "--epsilon-per", "1e-400", "--delta", "1e-6"]),
    ("topk", [*_T, "-k", "2", "--epsilon-per", "1", "--delta", "1e-400"]),
    ("tabulate", ["tabulate", "--dry-run", "--spec", "{spec}", "--delta", "1e-400"]),
    ("stream-replay", [*_S, "--triggers", "4", "--max-contributions", "2", "--epsilon", "1e-400", "--delta", "1e-6"]),
    ("stream-replay", [*_S, "--triggers", "4", "--max-contributions", "2", "--epsilon", "1", "--delta", "1e-400"]),
    ("budget-init", ["budget", "init", "fz", "--mode", "approx", "--epsilon", "1e-400", "--delta", "1e-6"]),
    ("budget-init", ["budget", "init", "fz", "--mode", "approx", "--epsilon", "1", "--delta", "1e-400"]),
    ("budget-compose", ["budget", "compose", "--mode", "zcdp", "--rho", "1e300", "--delta", "1e-9"]),
    ("budget-compose", ["budget", "compose", "--mode", "zcdp", "--rho", "1e-300", "--delta", "1e-9"]),
]


def _numeric_test(command: str, examples: int):
    @settings(max_examples=examples, **NUM_SETTINGS)
    @given(args=numeric_call(command))
    def test(tmp_path, args):
        _numeric_case(tmp_path, args)

    for name, args in NAMED:
        if name == command:
            test = example(args=args)(test)
    return test


#: Examples per command in ``make test`` (a plan or a ledger call is cheap, a release is not).
NUM_FAST_BY_COMMAND = {"histogram": 5, "topk": 4, "tabulate": 3, "stream-replay": 4, "budget-init": 8,
                       "budget-compose": 12}

test_numeric_options_histogram = _numeric_test("histogram", NUM_FAST_BY_COMMAND["histogram"])
test_numeric_options_topk = _numeric_test("topk", NUM_FAST_BY_COMMAND["topk"])
test_numeric_options_tabulate = _numeric_test("tabulate", NUM_FAST_BY_COMMAND["tabulate"])
test_numeric_options_stream_replay = _numeric_test("stream-replay", NUM_FAST_BY_COMMAND["stream-replay"])
test_numeric_options_budget_init = _numeric_test("budget-init", NUM_FAST_BY_COMMAND["budget-init"])
test_numeric_options_budget_compose = _numeric_test("budget-compose", NUM_FAST_BY_COMMAND["budget-compose"])
test_numeric_options_histogram_full = pytest.mark.audit(_numeric_test("histogram", NUM_FULL))
test_numeric_options_topk_full = pytest.mark.audit(_numeric_test("topk", NUM_FULL))
test_numeric_options_tabulate_full = pytest.mark.audit(_numeric_test("tabulate", NUM_FULL))
test_numeric_options_stream_replay_full = pytest.mark.audit(_numeric_test("stream-replay", NUM_FULL))
test_numeric_options_budget_init_full = pytest.mark.audit(_numeric_test("budget-init", NUM_FULL))
test_numeric_options_budget_compose_full = pytest.mark.audit(_numeric_test("budget-compose", NUM_FULL))
