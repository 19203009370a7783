"""Helpers shared by the test files (importable as ``dptest``: ``tests/`` is on pytest's pythonpath).

One builder per idea: an in-memory input table, a keyed stream from any label, the CLI runner (every
test runs dpcli in process through :data:`runner` or :func:`cli`, or as the console script runs it with
:func:`console`), a ledger of any mode and limits
(:func:`init_ledger`, :func:`ledger_argv`) and the analyst's ledger history as the CLI prints it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import polars as pl
import typer.testing
from typer.testing import CliRunner

from dpcli.cli.app import app
from dpcli.core.prf import KeyedStream

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"
#: The sample page views (Parquet) and its public list of pages, as command-line arguments.
PV, PAGES = str(SAMPLE / "page_views.parquet"), str(SAMPLE / "pages_public.csv")
#: A tenth of the sample page views, for tests that need some realistic data and not its size: the users whose
#: number ends in 0 (2,864 users, 26,150 rows: all 8 countries, 399 of the 400 pages, the 21 days, each user's
#: rows whole). Made by ``pl.read_parquet(PV).filter(pl.col("user_id").str.slice(1)
#: .cast(pl.Int64) % 10 == 0)``. A run on it costs about a tenth of one on :data:`PV`.
PV_SMALL = str(ROOT / "tests" / "data" / "page_views_small.parquet")
#: The first 20,000 of the 200,000 sample persons (``sample_data/persons.parquet``, all 1,000 blocks), for tests
#: of tabulate that need some persons, not the sample's size: ``pl.read_parquet(…).head(20_000)``.
PERSONS_SMALL = str(ROOT / "tests" / "data" / "persons_small.parquet")

_build_command = typer.testing._get_command
_built: dict[int, tuple[Any, Any]] = {}


def _command_once(app: Any) -> Any:
    """The click command of ``app``, built once per process as the console script builds it.

    typer's ``CliRunner.invoke`` builds it anew on every call, inspecting the signature of every
    command (about 20 ms: most of a small command's run, and two thirds of ``make test``)."""
    hit = _built.get(id(app))
    if hit is None or hit[0] is not app:
        hit = _built[id(app)] = (app, _build_command(app))
    return hit[1]


typer.testing._get_command = _command_once

#: The one CLI runner of the tests (``runner.invoke(app, args, input=…, env=…)``; or :func:`cli`).
runner = CliRunner()


def table(df: pl.DataFrame) -> pl.LazyFrame:
    """An in-memory input as the tasks take it: a lazy frame."""
    return df.lazy()


def stream(i: Any, label: str = "t") -> KeyedStream:
    """A keyed stream whose seed is the SHA-256 of ``repr(i)`` (tests only; releases derive theirs from the key)."""
    return KeyedStream(hashlib.sha256(repr(i).encode()).digest(), label)


def cli(*args: Any, input: str | bytes | None = None, env: dict[str, str] | None = None) -> Any:
    """Run ``dpcli ARGS`` in process (``input``: its standard input); the result (exit_code, stdout, stderr)."""
    return runner.invoke(app, [str(a) for a in args], input=input, env=env)


def console(*args: Any, input: str | bytes | None = None, env: dict[str, str | None] | None = None,
            cwd: Path | str | None = None, text: bool = True) -> subprocess.CompletedProcess:
    """``dpcli ARGS`` as the console script runs it (:func:`dpcli.cli.app.main`: old spellings rewritten with
    a note, shell completion answered), in this process, in ``cwd`` with ``env``'s changes: its exit code,
    stdout and stderr (``text``: decoded), as :func:`subprocess.run` would give them."""
    from dpcli.cli.app import main

    here = os.getcwd()
    with runner.isolation(input=input, env=env) as streams:
        if cwd is not None:
            os.chdir(cwd)
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        except Exception:  # shown as the console script would show an uncaught error
            sys.stderr.write(traceback.format_exc())
            code = 1
        finally:
            os.chdir(here)
            sys.stdout.flush()
            sys.stderr.flush()
        out, err = streams[0].getvalue(), streams[1].getvalue()
    if text:
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
    return subprocess.CompletedProcess(["dpcli", *map(str, args)], code, out, err)


def history(analyst: str = "default") -> list[dict[str, Any]]:
    """The analyst's ledger entries, from ``dpcli budget history --json``."""
    return json.loads(cli("budget", "history", analyst, "--json").stdout)


#: Units in :func:`one_group_csv`'s files (the input attacks): each has one row in the file's group.
N_UNITS = 200


def one_group_csv(group: str, extra: int = 0) -> str:
    """A CSV of ``N_UNITS + extra`` units (``user``), one row each, all in group ``g`` = ``group``."""
    return "user,g\n" + "".join(f"u{i},{group}\n" for i in range(N_UNITS + extra))


#: A ledger's limits when a test names only its mode: room to spare for any test's releases.
LIMITS = {
    "pure": ("--epsilon", "50"),
    "approx": ("--epsilon", "50", "--delta", "1e-5"),
    "zcdp": ("--rho", "50", "--delta", "1e-5"),
    "rdp": ("--epsilon", "50", "--delta", "1e-5"),
    "br": ("--epsilon-per", "0.5", "--delta", "1e-10", "--info-budget", "3000", "--call-budget", "30",
           "--delta-prime", "1e-9"),
    "pld": ("--epsilon", "50", "--delta", "1e-5"),
}


def ledger_argv(mode: str = "pure", *limits: Any, analyst: str = "default") -> list[str]:
    """``budget init ANALYST --mode MODE LIMITS`` as arguments (``LIMITS``: those given, or :data:`LIMITS`)."""
    return ["budget", "init", analyst, "--mode", mode, *(str(a) for a in limits or LIMITS[mode])]


def init_ledger(mode: str = "pure", *limits: Any, analyst: str = "default", state_dir: Path | str | None = None,
                env: dict[str, str] | None = None) -> None:
    """``dpcli budget init ANALYST --mode MODE LIMITS`` (see :func:`ledger_argv`), asserted to succeed, in
    ``state_dir`` if given (else in the test's own ``DPCLI_STATE_DIR``, or ``env``'s)."""
    where = ["--state-dir", state_dir] if state_dir is not None else []
    r = cli(*where, *ledger_argv(mode, *limits, analyst=analyst), env=env)
    assert r.exit_code == 0, r.stderr


#: Notes computed from a release's noisy output (post-processing, see dpcli.advice): they may differ
#: between two releases exactly as the released values do.
OUTPUT_NOTES = ("is mostly noise", "groups released: no group", "released mean(s) lie within",
                "so chosen from the data with", "note: bounds cut", "the caps cut about",
                "of the kept values were clamped to")


def released_nothing(r: Any) -> bool:
    """A failed run's stdout holds no release: nothing, or (under ``--json``) only the JSON error object that
    repeats its last stderr line and its exit code (issue 39, item 10)."""
    if r.stdout == "":
        return True
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    return bool(json.loads(r.stdout) == {"error": last, "exit": r.exit_code})


def without_output_notes(stderr: str) -> str:
    """``stderr`` without the notes computed from the released values (all other lines kept)."""
    return "".join(ln for ln in stderr.splitlines(keepends=True) if not any(n in ln for n in OUTPUT_NOTES))


def dataset(tmp_path: Path, name: str) -> Path:
    """The sample page views as a dataset directory ``tmp_path/big``: three Parquet files named
    ``name.format(i=…)``, one in a hive-style subdirectory, and a ``_SUCCESS`` marker."""
    big = tmp_path / "big"
    (big / "day=2").mkdir(parents=True)
    views = SAMPLE / "page_views.parquet"
    for i, part in enumerate(pl.read_parquet(views).iter_slices(100_000)):
        part.write_parquet(big / ("day=2" if i % 2 else "") / name.format(i=i))
    (big / "_SUCCESS").write_text("")
    return big


def safe_tmp() -> Path:
    """A fresh directory no one but root and this user can rename or write on any component of its path:
    ``catalog set`` refuses a location under pytest's ``tmp_path`` (``/tmp`` is sticky and world-writable).
    Under the checkout (``.test-tmp/``), else under the home directory; removed when the process ends."""
    import atexit
    import shutil
    import tempfile

    from dpcli.access.walk import trusted_uids, unsafe_component

    for base in (ROOT / ".test-tmp", Path.home() / ".cache" / "dpcli-tests"):
        try:
            base.mkdir(mode=0o755, parents=True, exist_ok=True)
            if unsafe_component(str(base.resolve()), trusted_uids()) is None:
                made = Path(tempfile.mkdtemp(dir=base.resolve()))
                made.chmod(0o755)
                atexit.register(shutil.rmtree, made, True)
                return made
        except OSError:
            continue
    raise AssertionError("no directory safe from renames for a service deployment (see dptest.safe_tmp)")


class Service:
    """A service-mode deployment inside a test: a service account's home, its state directory, private
    data, a catalog, output directories, and CLI runs as the owner (personal mode) or as an analyst
    invoking dpcli through sudo (the identity source is replaced; see :mod:`dpcli.access`).

    Private data: ``visits.csv`` (units ``user``, groups ``page``, a ``secret`` column), ``pages.csv``
    (a public list) in ``data/``; outputs go to ``out/<analyst>/``.
    """

    SERVICE_UID_OFFSET = 40000  # analysts' fake uids: far from any real one
    #: The interpreter the service-mode runs report (an operator's set-up steps refuse one other users cannot
    #: run, and this machine's may be in root's home); None: ``sys.executable`` as it is (a test patches it).
    interpreter: str | None = "/bin/sh"

    def __init__(self, tmp_path: Path, monkeypatch: Any, analysts: tuple[str, ...] = ("alice", "bob"),
                 operators: tuple[str, ...] = ("ops",)) -> None:
        import os

        self.monkeypatch = monkeypatch
        tmp_path = safe_tmp()  # (the operator's locations must be safe from renames: not under /tmp)
        self.root = tmp_path
        self.home = tmp_path / "svc-home"
        self.state = self.home / ".local" / "share" / "dpcli"
        self.data = tmp_path / "data"
        self.out = tmp_path / "out"
        self.euid = os.geteuid()
        self.names = {self.SERVICE_UID_OFFSET + i: n for i, n in enumerate((*analysts, *operators))}
        self.data.mkdir()
        self.home.mkdir()
        for name in analysts:
            (self.out / name).mkdir(parents=True)
        monkeypatch.delenv("DPCLI_STATE_DIR", raising=False)
        rows = "".join(f"u{i},/p/{i % 3},s{i}\n" for i in range(300))
        (self.data / "visits.csv").write_text("user,page,secret\n" + rows)
        (self.data / "pages.csv").write_text("page\n/p/0\n/p/1\n/p/2\n")
        outputs = "".join(f'[[outputs]]\ndirectory = "{self.out / n}"\nanalysts = ["{n}"]\n' for n in analysts)
        self.catalog_toml = (
            f'operators = {list(operators)!r}\n'
            f'[datasets.visits]\nlocation = "{self.data / "visits.csv"}"\nprivacy_unit = "user"\nanalysts = ["*"]\n'
            f'[public.pages]\nlocation = "{self.data / "pages.csv"}"\nanalysts = ["*"]\n' + outputs
        ).replace("'", '"')

    def owner(self, *args: Any) -> Any:
        """``dpcli ARGS`` as the service account itself (personal mode: the owner is the operator)."""
        self._identity(None)
        return runner.invoke(app, ["--state-dir", str(self.state), *[str(a) for a in args]])

    def setup(self, epsilon: str = "10", ledgers: bool = True) -> None:
        """The owner installs the catalog and (``ledgers``) creates an approx ledger for every analyst."""
        cat = self.home / "catalog.toml"
        cat.write_text(self.catalog_toml)
        r = self.owner("catalog", "set", cat)
        assert r.exit_code == 0, r.stderr
        for name in self.names.values() if ledgers else ():
            r = self.owner(*ledger_argv("approx", "--epsilon", epsilon, "--delta", "1e-4", analyst=name))
            assert r.exit_code == 0, r.stderr

    def run(self, analyst: str, *args: Any, env: dict[str, str] | None = None, input: str | None = None) -> Any:
        """``dpcli ARGS`` invoked by ``analyst`` through sudo, as the service account (service mode);
        ``input`` is what they pipe in."""
        self._identity(analyst, env)
        return runner.invoke(app, [str(a) for a in args], input=input)

    def _identity(self, analyst: str | None, env: dict[str, str] | None = None) -> None:
        from dpcli import access
        from dpcli.access import identity

        uids = {n: u for u, n in self.names.items()}
        environ = dict(env or {})
        if analyst is not None:
            environ.update({"SUDO_UID": str(uids[analyst]), "SUDO_USER": analyst})
        import sys

        home, euid, names, interpreter = self.home, self.euid, self.names, self.interpreter
        self.monkeypatch.setattr(identity, "SOURCE", access.IdentitySource(
            uid=lambda: euid, euid=lambda: euid, environ=lambda: environ,
            user_name=lambda uid: names.get(uid, "svc"), user_home=lambda uid: home if uid == euid else None,
            user_id=lambda name: uids.get(name), interpreter=lambda: interpreter or sys.executable))


#: The golden tests' secret key: with it the same data and command give the same release on every run.
FIXED_KEY = b"dpcli-secret-key-v1\n" + bytes(range(32)).hex().encode() + b"\n"


def use_fixed_key(state_dir: Path) -> None:
    """Put :data:`FIXED_KEY` in ``state_dir`` (created 0700), 0600 as dpcli requires, before the ledger is made."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = state_dir / "secret.key"
    key.write_bytes(FIXED_KEY)
    key.chmod(0o600)
