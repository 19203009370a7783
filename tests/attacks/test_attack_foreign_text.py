"""Rule: no foreign text on any channel, and no private thing reaches an output (issue 29, attack 2).

Two checks:

* **The package walk.** Every ``except … as exc`` in dpcli may use the exception only in ways that
  cannot print its text (its type, ``os_reason``, ``withheld``, a re-raise), except at the places
  listed in :data:`ALLOWED` with the reason its text is dpcli's own.
* **The canary.** A unique marker is put in every private thing — the records, the data's other
  column names, the key, ledgers, state files, the catalog — and every command is run with every
  option that takes a path pointed at every private file (directly and through a symlink), with and
  without ``-v``, as a service-mode analyst and in personal mode. No marker may appear in stdout,
  stderr, an output file, or a message, and no private file may change.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from dptest import Service, cli

PACKAGE = Path(__file__).resolve().parents[2] / "dpcli"
SAFE_CALLS = {"type", "os_reason", "withheld", "isinstance", "getattr"}
SAFE_ATTRIBUTES = {"errno", "__traceback__", "exit_code", "reason", "entries_missing", "fix", "field"}

#: (file, line's code) → why the exception's text is dpcli's own or never printed.
ALLOWED = {
    ("cli/_common.py", "safe_traceback(exc)"): "the boundary itself: prints only DpcliError messages",
    ("cli/_common.py", "error_line(exc)"): "a DpcliError: dpcli wrote its message",
    ("cli/_common.py", "_where(exc)"): "the file and line of dpcli's own code, never the message",
    ("io/opening.py", "self._error = exc"): "kept to be re-raised in the taking thread, never printed",
    ("cli/tabulate.py", "str(exc)"): "a DpcliError (no ledger): dpcli wrote its message",
    ("state/ledger/charges.py", "str(exc)"): "a BudgetError: dpcli wrote its message",
    ("state/ledger/charges.py", "{exc}"): "bud.ChargeRefused, dpcli's own exception about public costs",
    ("state/ledger/model.py", "{exc}"): "bud.ChargeRefused, dpcli's own exception about public costs",
    ("cli/_options.py", "str(exc)"): "core.schedules.check_cdp_total's ValueError about public parameters",
    ("cli/budget.py", "str(exc)"): "core.budget.Limits' ValueError about the limits given as options",
    ("tasks/tabulate_spec.py", "str(exc)"): "only the digits of a TOML error's line and column are kept",
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
    from dptest import init_pure_ledger

    init_pure_ledger()
    data = tmp_path / "d.parquet"
    import polars as pl

    pl.DataFrame({"user": [1, 2, 3], "g": [1, 2, 3]}).write_parquet(data)
    keys = tmp_path / "k.csv"
    keys.write_text("g\nMARKER-VALUE-913\n")
    r = cli("-v", "histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--epsilon", "1")
    assert r.exit_code == 65, r.stderr
    assert "MARKER-VALUE-913" not in r.stderr + r.stdout


# --- the canary ---------------------------------------------------------------------------------

KEY_MARK = "ca11ab1e" * 8  # the key's hex: its bytes are these
RECORD_MARK = "CANARYREC"  # in every private value and unit
COLUMN_MARK = "CANARYCOL"  # a private column name
LOCATION_MARK = "CANARYLOC"  # in every catalog location (a directory name)

#: Each case: a command line with ``{P}`` where the private path goes (``{O}``: a fresh output path).
CASES = [
    ["histogram", "{P}", "--by", "page", "--epsilon", "1", "--delta", "1e-6", "-o", "{O}"],
    ["histogram", "{D}", "--by", "page", "--epsilon", "1", "--keys", "{P}", "-o", "{O}"],
    ["histogram", "{D}", "--by", "page", "--epsilon", "1", "--delta", "1e-6", "-o", "{P}"],
    ["topk", "{P}", "--by", "page", "-k", "1", "--epsilon", "1", "-o", "{O}"],
    ["topk", "{D}", "--by", "page", "-k", "1", "--epsilon", "1", "--keys", "{P}", "-o", "{O}"],
    ["tabulate", "{P}", "--spec", "{P}", "-o", "{O}"],
    ["tabulate", "--dry-run", "--spec", "{P}"],
    ["stream-replay", "{P}", "--time", "t", "--by", "page", "--window", "1d", "--triggers", "1",
     "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6", "-o", "{O}"],
    ["stream-replay", "{D}", "--time", "t", "--by", "page", "--window", "1d", "--triggers", "1",
     "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6", "--state", "{P}", "-o", "{O}"],
    ["plot", "{P}"],
    ["plot", "{O}", "--summary", "{P}"],
    ["budget", "show", "--plot", "{P}"],
    ["catalog", "set", "{P}"],
]


def _marks(*extra: str) -> tuple[str, ...]:
    return (KEY_MARK, RECORD_MARK, COLUMN_MARK, LOCATION_MARK, *extra)


def _private_data(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "visits.csv"
    rows = "".join(f"{RECORD_MARK}u{i},/p/{i % 3},{RECORD_MARK}{i},2026-11-0{1 + i % 3}T10:00:00Z\n" for i in range(60))
    data.write_text(f"user,page,{COLUMN_MARK},t\n{rows}")
    return data


def _fixed_key(state: Path) -> None:
    (state / "secret.key").write_bytes(b"dpcli-secret-key-v1\n" + KEY_MARK.encode() + b"\n")
    (state / "secret.key").chmod(0o600)


def _state_marks(state: Path) -> tuple[str, ...]:
    """Markers of the state as dpcli wrote it: ledger ids and chain heads, seals, stream seeds."""
    marks = []
    for f in state.rglob("*"):
        if f.is_file() and f.suffix in (".json", ".hwm", ".stream"):
            text = f.read_text()
            for field in ("ledger_id", "genesis", "mac", "seed", "secret", "reservation", "sha256"):
                marks += [m for m in _values_of(text, field) if isinstance(m, str) and len(m) >= 16]
    return tuple(marks)


def _values_of(text: str, field: str) -> list[str]:
    out = []
    for line in text.splitlines() or [text]:
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            try:
                doc = json.loads(text)
            except json.JSONDecodeError:
                return out
        stack = [doc]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                out += [v for k, v in node.items() if k == field]
                stack += list(node.values())
            elif isinstance(node, list):
                stack += node
    return out


def _check(result, marks: tuple[str, ...], where: str, argv: list[str]) -> None:
    """No marker in what the run printed, once the caller's own arguments (which a message may echo:
    they are the caller's) are taken out; a resolved path or any content read would still show."""
    assert result.exit_code in (0, 2, 65, 66, 73, 77, 78), (where, result.exit_code, result.stderr)
    text = result.stdout + result.stderr
    for arg in sorted(argv, key=len, reverse=True):
        text = text.replace(arg, "<arg>")
    for mark in marks:
        assert mark not in text, f"{where}: {mark!r} leaked:\n{text}"


def _fill(case: list[str], private: Path, data: str, out: Path) -> list[str]:
    return [a.replace("{P}", str(private)).replace("{D}", data).replace("{O}", str(out)) for a in case]


def _snapshot(files: list[Path]) -> dict[Path, bytes]:
    return {f: f.read_bytes() for f in files}


def test_canary_service_mode(tmp_path, monkeypatch):
    svc = Service(tmp_path, monkeypatch)
    svc.data = tmp_path / LOCATION_MARK
    _private_data(svc.data)
    (svc.data / "pages.csv").write_text("page\n/p/0\n/p/1\n/p/2\n")
    svc.catalog_toml = svc.catalog_toml.replace(str(tmp_path / "data"), str(svc.data)).replace(
        'privacy_unit = "user"', 'privacy_unit = "user"\nformat = "csv"')
    svc.state.mkdir(parents=True, mode=0o700)
    _fixed_key(svc.state)
    svc.setup()
    stream = ["stream-replay", "visits", "--time", "t", "--by", "page", "--window", "1d", "--triggers", "1",
              "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6", "--through", "2026-11-05"]
    assert svc.run("alice", *stream, "--state", "daily").exit_code == 0
    privates = [svc.data / "visits.csv", svc.state / "secret.key", svc.state / "catalog.json",
                svc.state / "ledgers" / "alice.json", svc.state / "ledgers" / "alice.hwm",
                svc.state / "streams" / "alice" / "daily.stream"]
    before = _snapshot(privates)
    marks = _marks(*_state_marks(svc.state))
    out = svc.out / "alice" / "o.csv"
    for private in privates:
        for case in CASES:
            for verbose in ([], ["-v"]):
                args = [*verbose, *_fill(case, private, "visits", out)]
                _check(svc.run("alice", *args), marks, f"service {args}", args)
                assert not out.exists() or not any(m in out.read_text() for m in marks)
    assert _snapshot(privates) == before


def test_canary_personal_mode(tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    _fixed_key(state)
    data = _private_data(tmp_path / "mine")
    assert cli("budget", "init", "default", "--mode", "approx", "--epsilon", "50", "--delta", "1e-4").exit_code == 0
    stream_state = tmp_path / "daily.stream"
    stream = ["stream-replay", data, "--time", "t", "--by", "page", "--privacy-unit", "user", "--window", "1d",
              "--triggers", "1", "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6",
              "--through", "2026-11-05"]
    assert cli(*stream, "--state", stream_state).exit_code == 0
    cat = tmp_path / "catalog.toml"
    cat.write_text(f'[public.pages]\nlocation = "{tmp_path / LOCATION_MARK / "p.csv"}"\nanalysts = ["*"]\n')
    assert cli("catalog", "set", cat).exit_code == 0
    privates = [state / "secret.key", state / "catalog.json", state / "ledgers" / "default.json",
                state / "ledgers" / "default.hwm", stream_state]
    links = []
    for i, private in enumerate(privates):
        link = tmp_path / f"link{i}.csv"
        link.symlink_to(private)
        links.append(link)
    before = _snapshot(privates)
    marks = (KEY_MARK, LOCATION_MARK, *_state_marks(state), *_values_of(stream_state.read_text(), "seed"))
    out = tmp_path / "o.csv"
    for private in (*privates, *links):
        for case in CASES:
            if case[:2] == ["catalog", "set"]:
                continue  # the owner installs catalogs: reading their own TOML is the point
            if "--state" in case and private.resolve() == stream_state.resolve():
                continue  # a stream's own state file, used as one: the point of --state
            case = [*case, "--privacy-unit", "user"] if case[0] in ("histogram", "topk", "stream-replay") else case
            for verbose in ([], ["-v"]):
                args = [*verbose, *_fill(case, private, str(data), out)]
                _check(cli(*args), marks, f"personal {args}", args)
    assert _snapshot(privates) == before
