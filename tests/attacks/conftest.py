"""Fixtures shared by the attack tests (each file holds the attacks on one rule of the README's threat model)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import pytest
from dptest import Service

from dpcli.core.accounting import composition as accounting

_RHO = functools.lru_cache(maxsize=None)(accounting.rho_for_epsilon)


@pytest.fixture(autouse=True)
def fast_calibration(monkeypatch):
    """The ρ calibration gives the same value for the same (ε, δ): compute it once per process."""
    monkeypatch.setattr(accounting, "rho_for_epsilon", _RHO)


@pytest.fixture
def svc(tmp_path, monkeypatch) -> Service:
    """A service-mode deployment: its catalog installed, and an approx ledger for alice, bob and the operator."""
    service = Service(tmp_path, monkeypatch)
    service.setup()
    return service


@pytest.fixture
def forced_seed(monkeypatch):
    """Every release seed is one constant: it no longer depends on the key, the data or the state token."""
    monkeypatch.setattr("dpcli.release.seeds.derive_seed", lambda key, material: hashlib.sha256(b"fixed").digest())


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """A public list of the groups G, H and X (the seed attacks' polyglot data)."""
    path = tmp_path / "groups.csv"
    path.write_bytes(b"g\nG\nH\nX\n")
    return path
