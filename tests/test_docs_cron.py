"""docs/cron.md runs as written: its set-up lines, Makefile, retry script and crontab line, over simulated days.

The files are taken from the page (the ```make block, the ```shell blocks that start with ``# once`` and
``#!/bin/sh``, the ```crontab block) into a job directory with generated data: each day's events
(``incoming/``), the snapshot of every event so far (``snapshots/``) and the public list of pages. make
runs in a real shell; ``dpcli`` is a shim that runs each command line in this process (as
``tests/test_docs_examples.py`` does), so a day costs its releases and not an interpreter start each,
and lets a test act between two runs (hold the ledger's lock, deliver a late file). Two runs at once
use the installed console script for one of them. Retries wait 0 s (``DP_WAIT``).

Sections: the daily histogram and top-k; the crontab line over all four jobs; then the schedule (retries
free, a corrected day refused: docs/commands/schedules.md) and the stream (events of later triggers kept,
retries, rewrites refused: docs/commands/stream-replay.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path

import pytest
from dptest import console
from test_docs_examples import SHIM, _receive, _send

from dpcli.state.lock import exclusive_lock
from dpcli.state.paths import lock_path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "cron.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
DAY1 = date(2026, 11, 1)
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def block(lang: str, first_line: str = "") -> str:
    """The one fenced block of docs/cron.md in ``lang`` whose first line starts with ``first_line``."""
    found = [body for fence, body in FENCE.findall(DOC.read_text()) if fence == lang and body.startswith(first_line)]
    assert len(found) == 1, (lang, first_line, len(found))
    return found[0]


def day(i: int) -> str:
    return (DAY1 + timedelta(days=i - 1)).isoformat()


# --- the simulated days: generated events --------------------------------------------------------------

PAGES = ("/p/0", "/p/1", "/p/2", "/p/3")
HEADER = "user_id,page,country,ts\n"


def events(i: int) -> str:
    """Day ``i``'s events (600 from 400 users; /p/3 the most visited), sorted by time: the same every call."""
    rng, start = random.Random(i), datetime(DAY1.year, DAY1.month, DAY1.day) + timedelta(days=i - 1)
    rows = []
    for _ in range(600):
        user, t = rng.randrange(400), start + timedelta(seconds=rng.randrange(86400))
        rows.append(f"u{user},{PAGES[min(rng.randrange(6), 3)]},{('BR', 'CA', 'US', 'DE')[user % 4]},"
                    f"{t.isoformat()}Z\n")
    return "".join(sorted(rows, key=lambda r: r.rsplit(",", 1)[1]))


CORRUPT = 'u1,/p/1,BR,"2026-11-01T01:00:00Z\n'  # an unterminated quote: the CSV does not parse as a whole


# --- dpcli run in this process, through a shim ----------------------------------------------------------


@dataclass
class Shim:
    """``dpcli`` for the shell: a program on PATH that hands its command line to this process, which runs it
    (:func:`dptest.console`) one at a time. ``before``/``after`` run around each command (argv; argv and exit
    code); ``runs`` records (argv, exit code)."""

    directory: Path
    before: Callable[[list[str]], None] = lambda argv: None
    after: Callable[[list[str], int], None] = lambda argv, code: None
    runs: list[tuple[list[str], int]] = field(default_factory=list)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        self.directory.mkdir()
        (self.directory / "dpcli").write_text(f"#!{sys.executable} -I\n{SHIM}")
        (self.directory / "dpcli").chmod(0o755)
        address = str(self.directory / "socket")
        server = socket.socket(socket.AF_UNIX)
        server.bind(address)
        server.listen()
        stop = threading.Event()
        thread = threading.Thread(target=self._serve, args=(server, stop))
        thread.start()
        try:
            yield
        finally:
            stop.set()
            with socket.socket(socket.AF_UNIX) as wake:  # the server waits in accept(): one last caller
                wake.connect(address)
            thread.join()
            server.close()

    def _serve(self, server: socket.socket, stop: threading.Event) -> None:
        while True:
            sock, _ = server.accept()
            if stop.is_set():
                sock.close()
                return
            with sock:
                sock.settimeout(600)
                request, stdin = json.loads(_receive(sock)), _receive(sock)
                env = {k: None for k in os.environ if k.startswith("DPCLI_")} | request["env"]
                self.before(request["argv"])
                r = console(*request["argv"], input=stdin, env=env, cwd=request["cwd"], text=False)
                self.runs.append((request["argv"], r.returncode))
                self.after(request["argv"], r.returncode)
                _send(sock, str(r.returncode).encode())
                _send(sock, r.stdout)
                _send(sock, r.stderr)


@dataclass
class Job:
    """The job directory of docs/cron.md (``/srv/dp``) and its state directory (``/srv/dp-state``), set up by
    the page's set-up lines, with make run as cron would on the night after a day."""

    work: Path
    shim: Shim

    @classmethod
    def create(cls, tmp_path: Path) -> Job:
        work = tmp_path / "dp"
        for d in ("incoming", "snapshots"):
            (work / d).mkdir(parents=True)
        (work / "Makefile").write_text(block("make"))
        (work / "dp-retry").write_text(block("shell", "#!/bin/sh"))
        (work / "dp-retry").chmod(0o755)
        (work / "pages.csv").write_text("page\n" + "".join(f"{p}\n" for p in PAGES))
        return cls(work, Shim(tmp_path / "shim"))

    @property
    def state(self) -> Path:
        return self.work.parent / "dp-state"

    def env(self, path: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPCLI_")}
        env.update(DPCLI_STATE_DIR=str(self.state), DPCLI_DOCS_SHIM=str(self.shim.directory / "socket"),
                   PATH=f"{path or self.shim.directory}{os.pathsep}{env['PATH']}", DP_WAIT="0", DP_TRIES="2",
                   START=day(1))
        return env

    def shell(self, script: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """``script`` run by sh in the job directory, with /srv/dp standing for it."""
        script = script.replace("/srv/dp", str(self.work))
        return subprocess.run(["sh", "-c", script], cwd=self.work, env={**self.env(), **extra},
                              capture_output=True, text=True, timeout=300)

    def set_up(self) -> None:
        r = self.shell(block("shell", "# once"))
        assert r.returncode == 0, r.stderr

    def deliver(self, i: int, text: str | None = None, snapshot: bool = True) -> None:
        """Day ``i``'s events land in incoming/ (``text``: other content), and (``snapshot``) its snapshot."""
        (self.work / "incoming" / f"views-{day(i)}.csv").write_text(HEADER + (events(i) if text is None else text))
        if snapshot:
            every = "".join(events(j) for j in range(1, i + 1))
            (self.work / "snapshots" / f"views-{day(i)}.csv").write_text(HEADER + every)

    def night(self, i: int, *targets: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """make, on the night after day ``i`` (``DAY``: that day)."""
        return subprocess.run(["make", "-k", "-s", f"DAY={day(i)}", "DPCLI=dpcli --lock-timeout 0", *targets],
                              cwd=self.work, env={**self.env(), **extra}, capture_output=True, text=True,
                              timeout=300)

    def out(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted((self.work / "out").iterdir())}

    def history(self) -> list[dict]:
        r = console("budget", "history", "--json", env={"DPCLI_STATE_DIR": str(self.state)})
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def codes(self, command: str, i: int) -> list[int]:
        """The exit codes of the runs of ``command`` on day ``i``'s file, in order."""
        return [code for argv, code in self.shim.runs if argv[2] == command and any(day(i) in a for a in argv)]


def alerts(r: subprocess.CompletedProcess[str]) -> list[str]:
    return re.findall(r"dp-retry: ALERT: exit (\d+) after (\d+) run", r.stderr)


def paid(entries: list[dict]) -> list[str]:
    """The seeds of the ledger entries that were charged (free replays and covered runs are not)."""
    return [e["seed_id"] for e in entries if e["events"]]


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    job = Job.create(tmp_path)
    with job.shim.serving():
        job.set_up()
        yield job


def test_the_page_has_each_file_once_and_the_makefile_names_each_job():
    text = block("make")
    for target in ("out/countries-%.csv:", "out/top-pages-%.csv:", "out/pages-%.csv:", "stream:"):
        assert f"\n{target}" in text, target
    assert re.search(r"^\t\$\(RUN\) histogram", text, re.M)  # recipe lines start with a tab
    retry = block("shell", "#!/bin/sh")
    assert "66|75)" in retry and "exit \"$rc\"" in retry
    for code in ("65", "77", "78"):
        assert code in retry


# --- the daily histogram and top-k ------------------------------------------------------------------------


def test_the_daily_jobs_over_simulated_days(job):
    """Day 1 plain; day 2 the ledger busy at the first try (75, retried); day 3's file missing all night
    (66 twice, then an alert); day 4 corrupt (65: one run, an alert) while day 3's lands late and is caught
    up; day 5 with day 4 replaced. Every day is released exactly once; failed runs charge nothing."""
    job.deliver(1)
    r = job.night(1, "daily")
    assert r.returncode == 0 and alerts(r) == [], r.stderr
    assert sorted(job.out()) == [f"countries-{day(1)}.csv", f"top-pages-{day(1)}.csv"]

    job.deliver(2)
    held = contextlib.ExitStack()
    held.enter_context(exclusive_lock(lock_path(job.state, "default"), 0))  # another dpcli holds the ledger
    job.shim.after = lambda argv, code: held.close()
    r = job.night(2, "daily")
    job.shim.after = lambda argv, code: None
    assert r.returncode == 0 and alerts(r) == [], r.stderr
    assert job.codes("histogram", 2) == [75, 0] and job.codes("topk", 2) == [0]

    r = job.night(3, "daily")  # day 3's file has not come
    assert r.returncode == 2 and alerts(r) == [("66", "2"), ("66", "2")], r.stderr
    assert job.codes("histogram", 3) == job.codes("topk", 3) == [66, 66]
    assert not [n for n in job.out() if day(3) in n]

    job.deliver(3)  # late
    job.deliver(4, events(4) + CORRUPT)
    r = job.night(4, "daily")
    assert r.returncode == 2 and alerts(r) == [("65", "1"), ("65", "1")], r.stderr
    assert "does not parse" in r.stderr
    assert {n for n in job.out() if day(3) in n} == {f"countries-{day(3)}.csv", f"top-pages-{day(3)}.csv"}
    assert not [n for n in job.out() if day(4) in n]

    job.deliver(4)  # replaced by a good file
    job.deliver(5)
    r = job.night(5, "daily")
    assert r.returncode == 0 and alerts(r) == [], r.stderr
    assert len(job.out()) == 10
    entries = job.history()
    # each release charged once; day 4's corrupt file was read before it failed, so both its runs paid (2 more)
    assert len(entries) == len(set(paid(entries))) == 12

    # A lost release file: make runs the job again, a free replay with the same bytes.
    before = job.out()
    (job.work / "out" / f"countries-{day(2)}.csv").unlink()
    r = job.night(5, "daily")
    assert r.returncode == 0 and job.out() == before
    entries = job.history()
    assert len(entries) == 13 and entries[-1]["replay_of"] is not None and len(paid(entries)) == 12


def test_the_crontab_line_mails_nothing_on_success_and_the_alerts_on_failure(job):
    """The crontab's command as cron runs it, over all four jobs: its output is what cron mails."""
    lines = [ln for ln in block("crontab").splitlines() if ln and not ln.startswith("#")]
    variables = dict(ln.split("=", 1) for ln in lines if re.match(r"[A-Z_]+=", ln))
    assert set(variables) == {"MAILTO", "DPCLI_STATE_DIR", "PATH"} and variables["DPCLI_STATE_DIR"] == "/srv/dp-state"
    (entry,) = [ln for ln in lines if not re.match(r"[A-Z_]+=", ln)]
    fields = entry.split(maxsplit=5)
    assert len(fields) == 6 and fields[:5] == ["30", "2", "*", "*", "*"]
    command = fields[5]
    assert "%" not in command  # cron would turn it into a newline

    job.deliver(1)
    mail = job.shell(command, DAY=day(1))
    assert mail.returncode == 0 and mail.stdout == mail.stderr == ""
    assert len(job.out()) == 4  # histogram, top-k, schedule, stream
    job.deliver(2, events(2) + CORRUPT)
    mail = job.shell(command, DAY=day(2))
    assert mail.returncode == 0 and "dp-retry: ALERT: exit 65 after 1 run(s): dpcli histogram" in mail.stdout
    log = (job.work / "log" / "make.log").read_text()
    assert "Error 65" in log and "internal error" not in log and "Traceback" not in log


# --- two runs at once --------------------------------------------------------------------------------------


def test_two_runs_at_once_release_each_job_once(job):
    """Tonight's make while another is still running (one through the shim, the other with the console
    script: two processes at once on one ledger): both succeed, each release is charged once, the files
    are those one run writes."""
    job.deliver(1)
    env = job.env()
    console_script = job.env(str(Path(sys.executable).parent))
    runs = [subprocess.Popen(["make", "-k", "-s", f"DAY={day(1)}"], cwd=job.work, env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for e in (env, console_script)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in runs]
    assert all(code == 0 for code, _, _ in results), results
    assert len(job.out()) == 4
    charged = paid(job.history())
    assert len(charged) == len(set(charged)) == 4  # each release (or reservation) charged once


# --- the schedule ---------------------------------------------------------------------------------------


def test_the_schedule_over_simulated_days(job):
    """The schedule runs on the latest snapshot only: a night without its snapshot alerts (66) and that day
    is never released later; a rerun on the same snapshot returns the same release, free; a changed file
    for a day already released alerts (65) and leaves the published file as it was."""
    job.deliver(1)
    assert job.night(1, "schedule").returncode == 0
    job.deliver(2, snapshot=False)
    r = job.night(2, "schedule")
    assert r.returncode == 2 and alerts(r) == [("66", "2")], r.stderr
    job.deliver(3)
    assert job.night(3, "schedule").returncode == 0
    assert sorted(job.out()) == [f"pages-{day(1)}.csv", f"pages-{day(3)}.csv"]
    before, spent = job.out(), console("budget", "show", "--json", env={"DPCLI_STATE_DIR": str(job.state)}).stdout
    (job.work / "out" / f"pages-{day(3)}.csv").unlink()
    assert job.night(3, "schedule").returncode == 0 and job.out() == before
    after = console("budget", "show", "--json", env={"DPCLI_STATE_DIR": str(job.state)}).stdout
    assert json.loads(after)["spent"] == json.loads(spent)["spent"]
    # a corrected file for a day already released is refused, and the published file is left as it was
    snapshot = job.work / "snapshots" / f"views-{day(3)}.csv"
    snapshot.write_text(snapshot.read_text() + snapshot.read_text().splitlines()[1] + "\n")
    (job.work / "out" / f"pages-{day(3)}.csv").unlink()
    r = job.night(3, "schedule")
    assert r.returncode == 2 and alerts(r) == [("65", "1")], r.stderr
    assert sorted(job.out()) == [f"pages-{day(1)}.csv"]


# --- the stream -----------------------------------------------------------------------------------------


def test_the_stream_over_simulated_days(job):
    """Days are fed in order: a missing day holds the later ones back (66, the loop stops), a corrupt one too
    (65); once they land, the next night feeds them in order. A rerun of the last day fed gives the same
    bytes; a rerun of an earlier one would rewrite a released day and is refused (exit 2)."""
    job.deliver(1)
    assert job.night(1, "stream").returncode == 0
    job.deliver(3)  # day 2 is late, day 3 is there
    r = job.night(3, "stream")
    assert r.returncode == 2 and alerts(r) == [("66", "2")], r.stderr
    assert sorted(job.out()) == [f"stream-{day(1)}.csv"]  # day 3 waits for day 2
    job.deliver(2)
    job.deliver(4, events(4) + CORRUPT)
    r = job.night(4, "stream")
    assert r.returncode == 2 and alerts(r) == [("65", "1")], r.stderr
    assert sorted(job.out()) == [f"stream-{day(i)}.csv" for i in (1, 2, 3)]
    job.deliver(4)
    assert job.night(4, "stream").returncode == 0
    published = job.out()
    assert len(published) == 4 and any(b.count(b"\n") > 1 for b in published.values())  # rows released
    assert [code for argv, code in job.shim.runs if argv[2] == "stream-replay"] == [0, 66, 66, 0, 0, 65, 0]

    (job.work / "out" / f"stream-{day(4)}.csv").unlink()  # the last day's file lost: a retry, same bytes
    assert job.night(4, "stream").returncode == 0 and job.out() == published
    (job.work / "out" / f"stream-{day(2)}.csv").unlink()  # an earlier day: a rewrite, refused
    r = job.night(4, "stream")
    assert r.returncode == 2 and alerts(r) == [("2", "1")], r.stderr
