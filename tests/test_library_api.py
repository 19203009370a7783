"""The library API: the README's example runs as written, and debits before it returns."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import dpcli

ROOT = Path(__file__).parent.parent


def test_the_documented_example_runs_charges_and_replays_for_free(tmp_path, monkeypatch):
    """Run the example of dpcli/__init__.py's docstring on the sample data."""
    example = re.search(r"::\n\n(.*?)\n\nSee ", dpcli.__doc__, re.S).group(1)
    code = "\n".join(line[4:] for line in example.splitlines())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "views.parquet").write_bytes((ROOT / "sample_data" / "page_views.parquet").read_bytes())
    namespace: dict = {}
    exec(compile(code, "example", "exec"), namespace)  # noqa: S102 (our own docstring)
    first = namespace["release"]
    assert first.report["charged"] and first.report["ledger"]["remaining"] == {"epsilon": "1.5", "delta": "0.0000009"}
    assert first.table.columns == ["country", "count"] and first.table.height > 0
    again = dpcli.release_histogram("views.parquet", namespace["query"], state_dir=namespace["state"], analyst="me")
    assert not again.report["charged"] and again.table.equals(first.table)  # same seed: a free replay
    entries = dpcli.read_ledger(namespace["state"], "me").entries
    # the debit made before reading, its completion (output and summary, no cost), the free replay
    assert [bool(e["events"]) for e in entries] == [True, False, False] and entries[1]["completes"] == 1


def test_the_readme_shows_the_same_example():
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"## Library.*?```python\n(.*?)```", readme, re.S).group(1)
    example = re.search(r"::\n\n(.*?)\n\nSee ", dpcli.__doc__, re.S).group(1)
    assert shown.strip() == "\n".join(line[4:] for line in example.splitlines()).strip()


def test_library_errors_name_fields_and_the_cli_spells_them_as_flags(tmp_path):
    q = dpcli.HistogramQuery(by=("country",), unit="user_id", domain="keys")
    with pytest.raises(dpcli.DpcliError) as err:
        dpcli.release_histogram("views.parquet", q, state_dir=tmp_path, analyst="me")
    assert err.value.field == "keys" and str(err.value).startswith("keys ")
    from dpcli.cli._common import error_line
    assert error_line(err.value).startswith("--keys ")


def test_import_dpcli_and_help_do_not_load_polars_or_numpy():
    code = "import sys, dpcli; dpcli.__version__; print(sorted(m for m in ('polars', 'numpy') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_a_library_query_can_leave_bounds_to_dpcli(tmp_path):
    """``HistogramQuery(auto=AutoBounds(...))``: the library form of ``--max-contributions auto --bounds auto``;
    the release reports the values chosen and charges the choice in the same entry."""
    from fractions import Fraction

    state = tmp_path / "state"
    dpcli.init_ledger(state, "me", dpcli.Limits("approx", {"epsilon": Fraction(2), "delta": Fraction(1, 10**6)}))
    query = dpcli.HistogramQuery(by=("country",), unit="user_id", aggregations=("count", "mean"), value="duration_s",
                                 epsilon=Fraction(1), delta=Fraction(1, 10**7),
                                 auto=dpcli.AutoBounds(contributions=True, values=True))
    release = dpcli.release_histogram(str(ROOT / "sample_data" / "page_views.parquet"), query, state_dir=state,
                                      analyst="me")
    chosen = release.report["auto"]
    assert set(chosen) == {"max_contributions", "bounds", "epsilon"} and chosen["epsilon"] == "0.1"
    entry, done = dpcli.read_ledger(state, "me").entries
    assert done["completes"] == entry["seq"] and done["events"] == []
    assert [e["mechanism"] for e in entry["events"]] == ["histogram/laplace+threshold", "histogram/auto-bounds"]
