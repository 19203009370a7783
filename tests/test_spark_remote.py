"""``--engine spark`` against real servers started by the tests: a standalone cluster and a Spark
Connect server, both from pyspark's own launch scripts, listening on 127.0.0.1 only.

Each server is a child process in its own session; the test waits for the line that says it is up
(read by a thread that keeps draining its output, with a deadline: no fixed sleeps), and stops the
whole process group afterwards. Connect clients run in subprocesses: a Connect session switches
pyspark's functions to Connect mode for the whole process.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import polars as pl
import pytest

pyspark = pytest.importorskip("pyspark")

from dptest import dataset, init_ledger, runner  # noqa: E402

from dpcli import bounding  # noqa: E402
from dpcli.spark import engine as _engine  # noqa: E402
from dpcli.cli.app import app  # noqa: E402
from dpcli.io.inputs import open_input

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent
PV, PAGES = str(ROOT / "sample_data" / "page_views.parquet"), str(ROOT / "sample_data" / "pages_public.csv")
SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT = 180  # seconds for a JVM to come up on a slow CI machine


class Server:
    """A child process whose output is drained by a thread; :meth:`wait_for` returns a regex's first match."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: str) -> re.Match[str]:
        import time

        deadline = time.monotonic() + START_TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.log.append(line)
            if m := re.search(pattern, line):
                return m
        self.stop()
        pytest.fail(f"no {pattern!r} from {self.proc.args[:3]}; output:\n" + "".join(self.log[-30:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _server_env(tmp: Path) -> dict[str, str]:
    from dpcli.spark.session import java_home

    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(tmp / "logs"), "SPARK_PID_DIR": str(tmp)}
    home = java_home(tmp)
    if home is not None:
        env["JAVA_HOME"] = home
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    return env


@pytest.fixture(scope="module")
def standalone_master(tmp_path_factory) -> Iterator[str]:
    """A standalone master and one worker (2 cores) on 127.0.0.1; yields the master's spark:// URL."""
    tmp = tmp_path_factory.mktemp("standalone")
    env = _server_env(tmp)
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    master = Server([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                     "--webui-port", "0"], env, tmp)
    url = master.wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)").group(1)
    worker = Server([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
                     "--webui-port", "0", "--cores", "2", "--memory", "2g", "--work-dir", str(tmp / "work"), url],
                    env, tmp)
    worker.wait_for(r"Successfully registered with master")
    yield url
    worker.stop()
    master.stop()


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory) -> Iterator[str]:
    """A Spark Connect server (local[2] inside) on 127.0.0.1; yields its sc:// URL."""
    tmp = tmp_path_factory.mktemp("connect")
    server = Server([str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[2]", "--class",
                     "org.apache.spark.sql.connect.service.SparkConnectServer",
                     "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                     "--conf", "spark.connect.grpc.binding.port=0", "--conf", "spark.ui.enabled=false",
                     "spark-internal"], _server_env(tmp), tmp)
    port = server.wait_for(r"Spark Connect server started at: 127\.0\.0\.1:(\d+)").group(1)
    yield f"sc://127.0.0.1:{port}"
    server.stop()


def _history(state: Path) -> list[dict]:
    return json.loads(runner.invoke(app, ["--state-dir", str(state), "budget", "history", "--json"]).stdout)


QUERY = ["histogram", PV, "--by", "country", "--privacy-unit", "user_id", "--agg", "count,count-units,sum,mean",
         "--value", "duration_s", "--bounds", "0:600", "--max-contributions", "3", "--max-partitions", "2",
         "--epsilon", "1", "--delta", "1e-8", "--no-report-bias"]  # the bias report is polars' only


def test_a_standalone_cluster_releases_polars_bytes(standalone_master, tmp_path, monkeypatch):
    """`--master spark://127.0.0.1:PORT`: executors launched by a real worker bound the data; with
    the seed forced equal, the release is polars' byte for byte; without, it is charged afresh."""
    from pyspark.sql import SparkSession

    state = tmp_path / "state"
    init_ledger("approx", state_dir=state)
    cluster = ["--engine", "spark", "--master", standalone_master]
    try:
        charged = runner.invoke(app, ["--state-dir", str(state), *QUERY, *cluster])
        assert charged.exit_code == 0, charged.stderr
        assert SparkSession.getActiveSession().sparkContext.master == standalone_master
        first = runner.invoke(app, ["--state-dir", str(state), *QUERY])
        original = _engine.bounding_engine
        monkeypatch.setattr(_engine, "bounding_engine",
                            lambda *a, **kw: replace(original(*a, **kw), seed_tag=""))  # polars' seed
        again = runner.invoke(app, ["--state-dir", str(state), *QUERY, *cluster])
        assert first.exit_code == again.exit_code == 0, again.stderr
        assert again.stdout == first.stdout and first.stdout.count("\n") > 1
        assert [e.get("replay_of") is not None for e in _history(state)] == [False, False, True]
    finally:
        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    return subprocess.run([sys.executable, "-m", "dpcli", "--state-dir", str(state), *args], env=env,
                          capture_output=True, text=True, timeout=600)


_TOTALS = """
import sys
from fractions import Fraction
from dpcli import bounding
from dpcli.spark.bounding import bounded_totals, read_input
from dpcli.spark.session import connect_session

session = connect_session(sys.argv[1])
spec = bounding.BoundingSpec(unit="user_id", by=("page",), max_partitions=2, max_contributions=3,
                             value="duration_s", grid=bounding.ValueGrid(0.0, 600.0, Fraction(1, 8)))
bounded_totals(read_input(session, sys.argv[2], "parquet"), spec, int(sys.argv[3])).write_parquet(sys.argv[4])
"""


def test_spark_connect_bounds_exactly_like_polars(connect_server, tmp_path):
    """Through a Connect server (a gRPC client: no JVM on this side), the same kept rows and totals."""
    salt = 0x0123_4567_89AB_CDEF_FEDC_BA98_7654_3210
    out = tmp_path / "totals.parquet"
    done = subprocess.run([sys.executable, "-c", _TOTALS, connect_server, "file://" + PV, str(salt), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    spec = bounding.BoundingSpec(unit="user_id", by=("page",), max_partitions=2, max_contributions=3,
                                 value="duration_s", grid=bounding.ValueGrid(0.0, 600.0, Fraction(1, 8)))
    expected = bounding.bounded_totals(open_input(PV).frame, spec, salt)
    assert pl.read_parquet(out).equals(expected) and expected.height == 400


def test_remote_histogram_and_topk_on_a_uri_are_charged_every_run(connect_server, tmp_path):
    """`--remote sc://…` on a file:// dataset URI (listed by Spark: its manifest), histogram and topk:
    released, each run charged afresh (a manifest proves nothing), and nothing from the JVM on stderr."""
    big = dataset(tmp_path, "part-[{i}].parquet")  # a glob-like name, read literally
    state = tmp_path / "state"
    init_ledger("approx", state_dir=state)
    remote = ["--engine", "spark", "--remote", connect_server]
    hist = ["histogram", f"file://{big}", "--by", "page", "--privacy-unit", "user_id", "--keys", PAGES,
            "--epsilon", "0.5", "--max-partitions", "8"]
    runs = [_cli(state, *hist, *remote), _cli(state, *hist, *remote),
            _cli(state, "topk", f"file://{big}", "--by", "page", "-k", "5", "--privacy-unit", "user_id",
                 "--epsilon-per", "0.1", "--delta", "1e-8", *remote)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
        assert "WARN" not in r.stderr and "INFO" not in r.stderr
    assert runs[0].stdout.startswith("page,count\n") and runs[0].stdout.count("\n") == 51
    assert runs[0].stdout != runs[1].stdout
    assert runs[2].stdout.count("\n") == 6
    assert [e.get("replay_of") is not None for e in _history(state)] == [False, False, False]


@pytest.mark.parametrize("args, needle", [
    (["--remote", "sc://127.0.0.1:1", "--master", "local[2]"], "drop --master and --spark-conf"),
    (["--remote", "sc://127.0.0.1:1", "--spark-conf", "spark.executor.memory=1g"], "drop --master and --spark-conf"),
    (["--remote", "http://127.0.0.1:1"], "must look like sc://HOST:PORT"),
    (["--remote", "sc://127.0.0.1:1"], "cannot reach the Spark Connect server"),  # at once, not after 10 minutes
    (["--remote", "sc://:15002"], "must look like sc://HOST:PORT"),
])
def test_remote_misuse_is_a_usage_error_with_no_debit(tmp_path, args, needle):
    state = tmp_path / "state"
    init_ledger("approx", state_dir=state)
    r = runner.invoke(app, ["--state-dir", str(state), "histogram", PV, "--by", "page", "--privacy-unit", "user_id",
                            "--keys", PAGES, "--epsilon", "1", "--engine", "spark", *args])
    assert r.exit_code == 2 and needle in r.stderr, r.stderr
    assert _history(state) == []
