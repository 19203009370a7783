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
