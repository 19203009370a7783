"""Release files dpcli reads back for the caller (``dpcli plot``, ``dpcli diff``), and the ledger entry that wrote each.

In service mode a release is read only when it lies in the caller's output directories (asked of the gate, which
then opens nothing else) and its digest, taken from the bytes read, is one the caller's own ledger recorded when
dpcli wrote it (:func:`service_acceptor`): ``plot`` and ``diff`` share this one check, so neither reads a file the
other may not. In personal mode any file is read, and the entry, if the caller's ledger has one, still gives a file
its report (:class:`Written`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpcli.errors import BudgetError, DataError, UsageError

if TYPE_CHECKING:
    from dpcli.plot.release_view import ReleaseView


@dataclass
class Written:
    """The caller's ledger entries (read once), to find the entry that wrote a file from the file's digest;
    ``found``: the entry of each digest looked up so far."""

    entries: tuple[dict[str, Any], ...]
    found: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def entry(self, digest: str) -> dict[str, Any] | None:
        """The latest entry that recorded writing a file with ``digest`` (``-o``), if any."""
        if digest not in self.found:
            self.found[digest] = next((e for e in reversed(self.entries) if e.get("output") == digest), None)
        return self.found[digest]


def callers_ledger(state_dir: Path, analyst: str, required: bool) -> Written:
    """The entries of the caller's own ledger (never another analyst's); without a ledger none, unless
    ``required`` (service mode: the refusal of :func:`dpcli.state.ledger.read_ledger`)."""
    from dpcli.state import ledger

    try:
        return Written(ledger.read_ledger(state_dir, analyst).entries)
    except BudgetError:
        if required:
            raise
        return Written(())


def service_acceptor(release: str, state_dir: Path, command: str) -> tuple[Callable[[str], None], Written] | None:
    """Service mode: refuse a ``release`` outside the caller's output directories, then let the gate open it, and
    return a check of its digest against the caller's ledger (to hand to
    :func:`dpcli.plot.release_view.read_release`) with the entries it looks in; None in personal mode and for an
    operator (any file is read)."""
    from dpcli.access import gate
    from dpcli.access.walk import inside

    g = gate()
    if not g.restricted:
        return None
    verb = "draws" if command == "plot" else "reads"
    if not any(inside(g.typed(release), d) for d in g.output_dirs()):
        raise UsageError(f"{command}: in service mode dpcli {verb} only releases in your output directories")
    g.allow_read(release)
    written = callers_ledger(state_dir, g.analyst, required=True)

    def accept(digest: str) -> None:
        if written.entry(digest) is None:
            raise UsageError(f"{release!r} is not a release dpcli wrote for you (no entry of your ledger has its "
                             "digest)")

    return accept, written


def read_with_report(path: str, summary_path: str | None, state_dir: Path, analyst: str,
                     command: str = "diff") -> ReleaseView:
    """A release and its report, for ``dpcli diff`` and ``dpcli plot``: the summary given (``summary_path``), the
    ``--json`` document's own, or the report kept by the caller's ledger entry that wrote the file (found by the
    digest of the bytes read). In service mode only the last, for a file :func:`service_acceptor` lets through; the
    caller refuses a summary path there, and ``diff`` (not ``plot``, which draws without one) an entry that keeps
    no report."""
    from dpcli.plot.diff_reports import report_of_entry
    from dpcli.plot.release_view import read_table, recognise

    checked = service_acceptor(path, state_dir, command)
    digests: list[str] = []

    def accept(digest: str) -> None:
        if checked is not None:
            checked[0](digest)
        digests.append(digest)

    read = read_table(path, summary_path if checked is None else None, accept)
    if read.summary and checked is None:
        return recognise(read.table, path, read.summary, read.shown)
    written = checked[1] if checked is not None else (
        callers_ledger(state_dir, analyst, required=False) if state_dir.is_dir() else Written(()))
    entry = written.entry(digests[0]) if digests else None
    report = report_of_entry(entry) if entry is not None else {}
    if checked is not None and not report and command == "diff":
        raise DataError(f"{path!r}: the entry of your ledger that wrote it keeps no report of its noise (written by "
                        "an older dpcli), so it cannot be compared")
    return recognise(read.table, path, report or read.summary, read.shown)
