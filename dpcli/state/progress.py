"""What this process has made durable so far: the ledger entries that cost budget and the files written.

An interrupted run (SIGINT, SIGTERM) says both (:func:`dpcli.cli._common.interrupted_line`). Both are
public facts (README, "Threat model"): the ledger's entries are what ``dpcli budget history`` shows, and an
output file is there to see; neither depends on a record, since a run debits before it reads its first one
and writes only once it has its release. The CLI starts a fresh record for every command it runs
(:func:`start`), so commands run in one process (a test's runner) do not see each other's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Done", "charged", "snapshot", "start", "written"]


@dataclass
class Done:
    """The ledgers a run's entries charged (by analyst, in order) and the outputs it wrote."""

    charged: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)


_done = Done()


def start() -> None:
    """Begin a command's record."""
    global _done
    _done = Done()


def charged(analyst: str) -> None:
    """A ledger entry that costs budget was made durable in ``analyst``'s ledger."""
    if analyst not in _done.charged:
        _done.charged.append(analyst)


def written(where: str) -> None:
    """An output was written in full to ``where`` (a path as the user gave it, or "standard output")."""
    if where not in _done.written:
        _done.written.append(where)


def snapshot() -> Done:
    """A copy of the record so far."""
    return Done(list(_done.charged), list(_done.written))
