"""dpcli: differentially private statistics over CSV/Parquet files, as a CLI and a library.

The library in a few names (imported on first use, so ``import dpcli`` stays cheap)::

    from fractions import Fraction
    from pathlib import Path
    import dpcli

    state = Path("dp-state")
    dpcli.init_ledger(state, "me", dpcli.Limits("approx", {"epsilon": Fraction(2), "delta": Fraction(1, 10**6)}))
    query = dpcli.HistogramQuery(by=("country",), unit="user_id", aggregations=("count",),
                                 epsilon=Fraction(1, 2), delta=Fraction(1, 10**7))
    release = dpcli.release_histogram("views.parquet", query, state_dir=state, analyst="me")
    print(release.table, release.report["ledger"]["remaining"])

See ARCHITECTURE.md for the modules behind them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

#: Public name → module that defines it.
_EXPORTS = {
    "HistogramQuery": "dpcli.tasks.histogram",
    "TopKQuery": "dpcli.tasks.topk",
    "AutoBounds": "dpcli.tasks.auto_bounds",
    "Limits": "dpcli.core.accounting.budget",
    "PrivacyEvent": "dpcli.core.events",
    "accountant_for": "dpcli.core.accounting.accountants",
    "init_ledger": "dpcli.state.ledger",
    "read_ledger": "dpcli.state.ledger",
    "open_input": "dpcli.io.inputs",
    "release_histogram": "dpcli.release",
    "Release": "dpcli.release",
    "DpcliError": "dpcli.errors",
}

__all__ = [  # the names of _EXPORTS, spelled out for static tools
    "AutoBounds", "DpcliError", "HistogramQuery", "Limits", "PrivacyEvent", "Release", "TopKQuery", "__version__",
    "accountant_for", "init_ledger", "open_input", "read_ledger", "release_histogram",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers (nothing is imported at run time)
    from dpcli.core.accounting.accountants import accountant_for
    from dpcli.core.accounting.budget import Limits
    from dpcli.core.events import PrivacyEvent
    from dpcli.errors import DpcliError
    from dpcli.io.inputs import open_input
    from dpcli.release import Release, release_histogram
    from dpcli.state.ledger import init_ledger, read_ledger
    from dpcli.tasks.auto_bounds import AutoBounds
    from dpcli.tasks.histogram import HistogramQuery
    from dpcli.tasks.topk import TopKQuery


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dpcli' has no attribute {name!r}")
