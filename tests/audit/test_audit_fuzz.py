"""Audit: hostile inputs (property-based). Every input either succeeds or fails with a documented
exit code and one line on stderr: never a traceback, never a debit without output, never a partial file.

``make test`` runs a few dozen examples per target; ``make audit`` (the ``slow`` marker) runs hundreds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dpcli.cli.app import app
from dpcli.errors import ExitCode

runner = CliRunner()
DOCUMENTED = {int(c) for c in ExitCode} - {int(ExitCode.INTERNAL)}
FAST, FULL = 25, 300
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
    assert _ledger_entries() == before, "a failed run was debited"


def _histogram_case(tmp: Path, text: str, extra: list[str]) -> None:
    runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "1000", "--delta", "0.5"])
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


@pytest.mark.slow
@settings(max_examples=FULL, **SETTINGS)
@given(text=csv_text(), mean=st.booleans())
def test_hostile_csv_histogram_full(tmp_path, text, mean):
    _histogram_case(tmp_path, text, ["--agg", "count,mean", "--value", "x", "--bounds", "0:10"] if mean else [])


numbers = st.one_of(st.sampled_from(["0", "-1", "1e-400", "1e400", "nan", "inf", "1/3", "0.1", "", "abc", "1,5",
                                     "9" * 40, "-0", "1e-12"]), st.text(max_size=5))


def _options_case(tmp: Path, eps: str, delta: str, k: str, bounds: str) -> None:
    runner.invoke(app, ["budget", "init", "default", "--mode", "approx", "--epsilon", "1000", "--delta", "0.5"])
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
    r = runner.invoke(app, ["tabulate", "plan", "--spec", str(spec)])
    assert r.exit_code in DOCUMENTED, (r.exit_code, r.stderr, r.exception)
    if r.exit_code:
        assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1 and "Traceback" not in r.stderr
