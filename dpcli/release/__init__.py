"""The release path, the only way a release happens (:func:`run`), and its library forms.

* :mod:`~dpcli.release.path`: check → the ledger's defaults → admit → open → run, and the dry run, for every
  continuation of a release (:class:`Continuation`, in :mod:`~dpcli.release.steps` with the steps they share:
  seed and run the task, charge);
* :mod:`~dpcli.release.plain`: one release (:class:`OneRelease`, the default);
* :mod:`~dpcli.release.scheduled`: a run of a ``--schedule`` over growing snapshots (:class:`Scheduled`; its
  state in :mod:`~dpcli.release.schedules`, its dry run in :mod:`~dpcli.release.schedule_plan`);
* :mod:`~dpcli.release.stream_runs`: a run of a stream, kept in a ``--state`` file or not (:class:`StreamRuns`;
  the state in :mod:`~dpcli.release.streams`);
* :mod:`~dpcli.release.seeds`: the seed material, built in one place for every command;
* :mod:`~dpcli.release.inputs`: a task's inputs, opened once and checked.

Library use (no CLI involved)::

    import dpcli
    query = dpcli.HistogramQuery(by=("country",), unit="user_id", aggregations=("count",),
                                 epsilon=Fraction(1, 2), delta=Fraction(1, 10**7))
    release = dpcli.release_histogram("views.parquet", query, state_dir=Path("state"), analyst="me")
    release.table, release.report  # the noisy table; what was charged and what is left
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpcli.access import Source
from dpcli.errors import UsageError
from dpcli.release.inputs import Sources
from dpcli.release.path import plan, run
from dpcli.release.plain import OneRelease
from dpcli.release.steps import Continuation, LedgerRef, Output, Planned, Prepared, Release, charge, cost_text

if TYPE_CHECKING:
    from dpcli.release.scheduled import Scheduled
    from dpcli.release.stream_runs import StreamRuns
    from dpcli.tasks.histogram import HistogramQuery

__all__ = ["Continuation", "LedgerRef", "OneRelease", "Output", "Planned", "Prepared", "Release", "Scheduled",
           "Sources", "StreamRuns", "charge", "cost_text", "plan", "release_histogram", "run"]

#: The continuations loaded when first named (a run without ``--schedule`` or ``--state`` never imports them).
_LAZY = {"Scheduled": "dpcli.release.scheduled", "StreamRuns": "dpcli.release.stream_runs"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
