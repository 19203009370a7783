"""Every test gets its own state directory; nothing touches the user's real ledgers."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("DPCLI_STATE_DIR", str(d))
    monkeypatch.delenv("DPCLI_ANALYST", raising=False)
    return d


@pytest.fixture(autouse=True)
def personal_gate():
    """Each test starts in personal mode (a CLI run installs its own gate: see dpcli.access)."""
    from dpcli import access

    previous = access.install(access.Gate(access.Caller("", False)))
    yield
    access.install(previous)


@pytest.fixture(autouse=True)
def seeded_keys(request, monkeypatch):
    """Every secret key a test's in-process runs create is drawn from a stream fixed by the test's name (the i-th
    key of the test: sha256(node id, i)), so a test that releases noise gives the same release on every run and
    a failure is reproducible: no test passes or fails by the luck of its keys. Keys still differ between the
    state directories of one test and between tests; subprocesses draw real keys."""
    import hashlib
    import secrets
    import types

    from dpcli.state import keys

    drawn = [0]

    def token_bytes(n: int | None = None) -> bytes:
        drawn[0] += 1
        digest = hashlib.sha256(f"{request.node.nodeid}\0{drawn[0]}".encode()).digest()
        return digest[: n or 32]

    monkeypatch.setattr(keys, "secrets", types.SimpleNamespace(token_bytes=token_bytes, token_hex=secrets.token_hex))


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A local Spark session for the module's ``--engine spark`` tests (stopped at the module's end: a test of
    session settings elsewhere starts its own)."""
    pytest.importorskip("pyspark")
    from dpcli.spark.session import spark_session

    session = spark_session("local[2]", [], tmp_path_factory.mktemp("spark-state"))
    yield session
    session.stop()
