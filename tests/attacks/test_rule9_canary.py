"""Rule 9's canary: no private thing reaches an output, whichever path any option is pointed at.

Issue 29, attack 2. A unique marker is put in every private thing — the records, the data's other
column names, the key, ledgers, state files, the catalog — and every command is run with every option
that takes a path pointed at every private file (directly and through a symlink), with and without
``-v``, as a service-mode analyst and in personal mode. No marker may appear in stdout, stderr, an
output file, or a message, and no private file may change. Before: the key printed through a symlink
named ``x.csv``.
"""

from __future__ import annotations

import json
from pathlib import Path

from dptest import Service, cli, init_ledger, safe_tmp

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
    ["sql", "SELECT page, ANON_COUNT(*) FROM t GROUP BY page", "--table", "t={P}", "--epsilon", "1", "--delta", "1e-6",
     "-o", "{O}"],
    ["sql", "SELECT v.page, ANON_COUNT(*) FROM v JOIN p ON v.page = p.page GROUP BY v.page", "--table", "v={D}",
     "--public-table", "p={P}", "--epsilon", "1", "--delta", "1e-6", "-o", "{O}"],
    ["sql", "SELECT page, ANON_COUNT(*) FROM t GROUP BY page", "--table", "t={D}", "--keys", "{P}", "--epsilon", "1",
     "-o", "{O}"],
    ["sql", "-f", "{P}", "--epsilon", "1"],
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
    svc.data = svc.root / LOCATION_MARK  # (a directory safe from renames, as catalog set requires)
    _private_data(svc.data)
    (svc.data / "pages.csv").write_text("page\n/p/0\n/p/1\n/p/2\n")
    svc.catalog_toml = svc.catalog_toml.replace(str(svc.root / "data"), str(svc.data)).replace(
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
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-4")
    stream_state = tmp_path / "daily.stream"
    stream = ["stream-replay", data, "--time", "t", "--by", "page", "--privacy-unit", "user", "--window", "1d",
              "--triggers", "1", "--max-contributions", "1", "--epsilon", "1", "--delta", "1e-6",
              "--through", "2026-11-05"]
    assert cli(*stream, "--state", stream_state).exit_code == 0
    cat = tmp_path / "catalog.toml"
    listed = safe_tmp() / LOCATION_MARK  # (catalog set takes only locations safe from renames: not under /tmp)
    listed.mkdir()
    cat.write_text(f'[public.pages]\nlocation = "{listed / "p.csv"}"\nanalysts = ["*"]\n')
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
            case = [*case, "--privacy-unit", "user"] if case[0] in ("histogram", "topk", "stream-replay", "sql") else case
            for verbose in ([], ["-v"]):
                args = [*verbose, *_fill(case, private, str(data), out)]
                _check(cli(*args), marks, f"personal {args}", args)
    assert _snapshot(privates) == before
