"""The release path, the only way a release happens (:func:`run`), and its library forms.

* :mod:`~dpcli.release.path`: limits → plan once → payable? → open → seed → run → charge;
* :mod:`~dpcli.release.seeds`: the seed material, built in one place for every command;
* :mod:`~dpcli.release.inputs`: a task's inputs, opened once and checked;
* :mod:`~dpcli.release.schedules`: runs of a ``--schedule`` over growing snapshots;
* :mod:`~dpcli.release.streams`: runs of a stream kept in a ``--state`` file.

Library use (no CLI involved)::

    import dpcli
    query = dpcli.HistogramQuery(by=("country",), unit="user_id", aggregations=("count",),
                                 epsilon=Fraction(1, 2), delta=Fraction(1, 10**7))
    release = dpcli.release_histogram("views.parquet", query, state_dir=Path("state"), analyst="me")
    release.table, release.report  # the noisy table; what was charged and what is left
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dpcli.access import Source
from dpcli.errors import UsageError
from dpcli.release.inputs import Sources
from dpcli.release.path import (
    Continuation,
    LedgerRef,
    Output,
    Planned,
    Prepared,
    Release,
    charge,
    cost_text,
    plan,
    run,
)

if TYPE_CHECKING:
    from dpcli.tasks.histogram import HistogramQuery

__all__ = ["Continuation", "LedgerRef", "Output", "Planned", "Prepared", "Release", "Sources", "charge", "cost_text",
           "plan", "release_histogram", "run"]


def release_histogram(
    source: str,
    query: HistogramQuery,
    *,
    state_dir: Path,
    analyst: str = "default",
    keys: str | None = None,
    input_format: str | None = None,
    lock_timeout: float = 30.0,
) -> Release:
    """Run and charge one histogram release on a file: the library form of ``dpcli histogram``.

    ``keys`` is a public list of groups (known domain); without it groups are discovered and
    thresholded. The analyst's ledger in ``state_dir`` must exist and is debited before this returns.
    """
    from dpcli.tasks.histogram import HistogramTask

    if (keys is None) == (query.domain == "keys"):
        raise UsageError("a public list of groups is given exactly when the query's domain is 'keys'", field="keys")
    lists = {"keys": Source(keys, keys, public=True)} if keys is not None else {}
    return run(HistogramTask(query), Sources(Source(source, source, input_format), lists),
               LedgerRef(state_dir, analyst, lock_timeout))
