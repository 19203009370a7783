"""Rule 9, no foreign text on any channel: only messages dpcli wrote, never a library's or the system's text.

Issue 29, attack 2. **The package walk**: every ``except … as exc`` in dpcli may use the exception only
in ways that cannot print its text (its type, ``os_reason``, ``withheld``, a re-raise), except at the
places listed in :data:`ALLOWED` with the reason its text is dpcli's own; polars' cast error on a
``--keys`` list that does not match the data was printed with the list's values.

Earlier and later: ``-v`` tracebacks (issue 17 made ``-v`` print them) must not become a side door for
records (a library's message can quote the value of a record: polars names the field it could not
parse, ``float()`` echoes its text); a polars type's text is foreign (an Enum's lists its categories,
a Struct's its fields: issue 29's service-mode review); a malformed stream state names no stored value
(issue 20). The canary, which points every path-taking option of every command at every private file,
is ``test_rule9_canary.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import polars as pl
import pytest
from dptest import cli, init_ledger, runner
from service_checks import _add, _one_line

from dpcli.cli.app import app
from dpcli.errors import DataError
from dpcli.tasks.histogram import HistogramTask

PACKAGE = Path(__file__).resolve().parents[2] / "dpcli"
SAFE_CALLS = {"type", "os_reason", "withheld", "isinstance", "getattr"}
SAFE_ATTRIBUTES = {"errno", "__traceback__", "exit_code", "reason", "entries_missing", "fix", "field"}

#: (file, line's code) → why the exception's text is dpcli's own or never printed.
ALLOWED = {
    ("cli/_common.py", "safe_traceback(exc)"): "the boundary itself: prints only DpcliError messages",
    ("cli/_common.py", "error_line(exc)"): "a DpcliError: dpcli wrote its message",
    ("cli/_common.py", "_where(exc)"): "the file and line of dpcli's own code, never the message",
    ("cli/_common.py", "_internal(exc, verbose, as_json)"): "the boundary itself: safe_traceback and _where only",
    ("cli/app.py", "end.code"): "a SystemExit's status, a number",
    ("cli/budget_plan.py", "exc.format_message"): "typer's own usage error about the planned command line as typed "
                                                 "(as cli/app.py's)",
    ("state/ledger/planning.py", "{exc}"): "bud.ChargeRefused, dpcli's own exception about public costs",
    ("cli/app.py", "exc.format_message"): "typer's own usage error about the command line as typed (typer prints "
                                            "the same text itself without --json)",
    ("cli/_common.py", "is_native_panic(exc)"): "the exception's type name only",
    ("io/opening.py", "self._error = exc"): "kept to be re-raised in the taking thread, never printed",
    ("cli/tabulate.py", "str(exc)"): "a DpcliError (no ledger): dpcli wrote its message",
    ("state/ledger/charges.py", "str(exc)"): "a BudgetError: dpcli wrote its message",
    ("release/plain.py", "exc.detail"): "a BudgetError from ledger.charge: dpcli wrote its message (a margin "
                                       "target's refusal adds the best reachable margin to it)",
    ("state/ledger/charges.py", "{exc}"): "bud.ChargeRefused, dpcli's own exception about public costs",
    ("state/ledger/model.py", "{exc}"): "bud.ChargeRefused, dpcli's own exception about public costs",
    ("state/ledger/costs.py", "{exc}"): "bud.ChargeRefused, dpcli's own exception about public costs",
    ("cli/budget_pld.py", "str(exc)"): "ChargeRefused from dpcli.core.accounting.pld: dpcli wrote its message",
    ("core/schedules.py", "str(exc)"): "check_cdp_total's ValueError about public parameters (ScheduleSpec)",
    ("cli/budget.py", "str(exc)"): "core.budget.Limits' ValueError about the limits given as options",
    ("tasks/tabulate/query.py", "str(exc)"): "only the digits of a TOML error's line and column are kept",
    ("tasks/sql/parse.py", "_where(exc)"): "only the integers of sqlglot's structured line and column are kept",
    ("access/catalog.py", "below.why"): "as in io/inputs.py: 'a symlink' or unsafe_stat's owner and mode",
    ("io/datasets.py", "below.why"): "dpcli.access.walk.Below's reason, dpcli's own: 'a symlink' or unsafe_stat's "
                                    "owner and mode (never the name below the dataset)",
}


def _uses_of_caught_exceptions() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for handler in ast.walk(tree):
            if not isinstance(handler, ast.ExceptHandler) or not handler.name:
                continue
            for node in ast.walk(handler):
                if not (isinstance(node, ast.Name) and node.id == handler.name and isinstance(node.ctx, ast.Load)):
                    continue
                parent = parents[node]
                if isinstance(parent, ast.Raise):
                    continue
                if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in SAFE_CALLS:
                    continue
                if isinstance(parent, ast.Attribute) and parent.attr in SAFE_ATTRIBUTES:
                    continue
                code = ast.unparse(parent) if not isinstance(parent, ast.FormattedValue) else "{exc}"
                found.append((str(path.relative_to(PACKAGE)), node.lineno, code))
    return found


def test_no_exception_text_reaches_an_output_but_dpclis_own():
    leaks = [f"dpcli/{f}:{line}: {code}" for f, line, code in _uses_of_caught_exceptions()
             if (f, code) not in ALLOWED]
    assert leaks == [], "exception text may reach an output:\n" + "\n".join(leaks)


def test_the_walk_sees_a_leak():  # the walk itself can fail
    tree = "try:\n    pass\nexcept ValueError as exc:\n    print(f'bad: {exc}')\n"
    handler = next(n for n in ast.walk(ast.parse(tree)) if isinstance(n, ast.ExceptHandler))
    names = [n for n in ast.walk(handler) if isinstance(n, ast.Name) and n.id == "exc"]
    assert names and not any(isinstance(n.ctx, ast.Store) for n in names)


def test_attack_2_a_list_that_does_not_cast_names_no_value(tmp_path):
    """polars' cast error was printed as it is, with the list's values and their exact count."""
    init_ledger()
    data = tmp_path / "d.parquet"
    import polars as pl

    pl.DataFrame({"user": [1, 2, 3], "g": [1, 2, 3]}).write_parquet(data)
    keys = tmp_path / "k.csv"
    keys.write_text("g\nMARKER-VALUE-913\n")
    r = cli("-v", "histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--epsilon", "1")
    assert r.exit_code == 65, r.stderr
    assert "MARKER-VALUE-913" not in r.stderr + r.stdout


# ---- -v tracebacks (issue 17) -----------------------------------------------------------------------


SECRET = "SECRET-RECORD-7431"


def _polars_quoting_a_record() -> None:
    pl.Series([SECRET]).cast(pl.Int64, strict=True)  # polars' message quotes the value


def _float_quoting_a_record() -> None:
    float(SECRET)


def _dpcli_error_chained_from_polars() -> None:
    try:
        _polars_quoting_a_record()
    except pl.exceptions.PolarsError as exc:
        raise DataError("cannot read the value column") from exc


@pytest.mark.parametrize("fail", [_polars_quoting_a_record, _float_quoting_a_record, _dpcli_error_chained_from_polars])
@pytest.mark.parametrize("verbose", [[], ["-v"]])
def test_no_record_reaches_stderr_through_a_traceback(tmp_path, monkeypatch, fail, verbose):
    data = tmp_path / "d.csv"
    data.write_text(f"u,g\nu1,{SECRET}\n")
    init_ledger("pure", "--epsilon", "5")

    monkeypatch.setattr(HistogramTask, "run", lambda *args, **kwargs: fail())
    r = runner.invoke(app, [*verbose, "histogram", str(data), "--by", "g", "--privacy-unit", "u", "--epsilon", "1",
                            "--keys", str(data)])
    assert r.exit_code in (1, 65), r.stderr
    assert SECRET not in r.stderr and SECRET not in r.stdout
    assert ("Traceback (most recent call last)" in r.stderr) == bool(verbose)
    assert r.stderr.rstrip().splitlines()[-1].startswith(("dpcli: error:", "dpcli: internal error"))


# ---- types and stored values in messages (issues 29 and 20) ----------------------------------------


def test_attack_a_column_type_names_no_category_and_no_field(svc):
    """A polars type's text is foreign: an Enum's lists its categories (data values, even unseen ones),
    a Struct's its fields (private column names). Errors printed it as the column's type."""
    data = svc.data / "typed.parquet"
    enum = pl.Enum(["flu", "CANARY-CATEGORY"])
    pl.DataFrame({"user": ["a", "b"], "page": ["x", "y"], "diag": pl.Series(["flu", "flu"], dtype=enum),
                  "nest": [{"CANARY_FIELD": 1}, {"CANARY_FIELD": 2}]}).write_parquet(data)
    _add(svc, "datasets", "typed", data)
    runs = [["histogram", "{D}", "--by", "page", "--agg", "sum", "--value", "diag", "--bounds", "0:1"],
            ["histogram", "{D}", "--by", "nest", "--keys", "-"],
            ["stream-replay", "{D}", "--time", "diag", "--by", "page", "--window", "1d", "--triggers", "1",
             "--max-contributions", "1"]]
    for service in (True, False):
        for args in runs:
            args = [a.replace("{D}", "typed" if service else str(data)) for a in args]
            args += ["--epsilon", "1", "--delta", "1e-6"] + ([] if service else ["--privacy-unit", "user"])
            r = svc.run("alice", *args, input="nest\n1\n") if service else svc.owner("--analyst", "alice", *args)
            assert r.exit_code in (2, 65), (args, r.stderr)
            assert "CANARY" not in r.stderr, r.stderr


def test_attack_a_stream_whose_column_types_changed_names_no_category(svc):
    """A stream state records its key columns' types; when the operator replaced the data with other
    types, the refusal printed both types in full: an Enum's categories (here of the group column)."""
    data = svc.data / "events.parquet"

    def write(categories: list[str]) -> None:
        pl.DataFrame({"user": ["a", "b"], "page": pl.Series(["x", "x"], dtype=pl.Enum(categories)),
                      "t": ["2026-11-01T10:00:00Z"] * 2}).write_parquet(data)

    write(["x", "CANARY-THEN"])
    _add(svc, "datasets", "events", data)
    stream = ["stream-replay", "events", "--time", "t", "--by", "page", "--window", "1d", "--triggers", "1",
              "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6", "--state", "s"]
    assert svc.run("alice", *stream, "--through", "2026-11-02").exit_code == 0
    write(["x", "CANARY-NOW"])
    r = svc.run("alice", *stream, "--through", "2026-11-03")
    assert r.exit_code == 65 and "schema changed" in _one_line(r), r.stderr
    assert "CANARY" not in r.stderr


def test_a_malformed_state_names_no_stored_value():
    """A state whose stored key cannot be read back: the error names the problem, never the value
    (a state file holds units and keys of the data; stderr is public)."""
    import json
    from fractions import Fraction

    import pytest

    from dpcli.errors import StateError
    from dpcli.tasks import stream as sr

    q = sr.StreamQuery(time="ts", keys=("key",), unit="user", window=1000, triggers=10, max_records=3,
                       epsilon=Fraction(6), delta=Fraction(1, 10**9))
    plan = sr.plan_stream(q)
    body = {"seed": "00" * 32, "stream": {"watermark": 1, "used": {"units": ["secret-unit-4711"], "records": [1]},
                                          "windows": [{"start": 0, "fired": 1, "keys": [[[{"$d": "secret-key-4711"}], {}]]}]}}
    with pytest.raises(StateError) as err:
        sr.load_state(json.loads(json.dumps(body)), q, plan)
    assert "4711" not in str(err.value) and "malformed" in str(err.value)
