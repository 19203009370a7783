"""A run killed at its first read of private data: the probe the rule-10 timing tests share.

Every private record a release reads is collected through polars' ``LazyFrame.collect`` or
``collect_all``. :func:`kill_at_first_read` replaces both with a probe that first notes what
``observe()`` says (what the ledger holds at that moment), then interrupts the run as a killed process
would. Public lists read to build the seed or check the query (:data:`PUBLIC_READS`) pass through.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import polars as pl
import pytest

T = TypeVar("T")

#: The functions that collect *public* lists (a `--keys` list, a tabulation's block list, a public table's
#: key multiplicities, a list's own checks) before the debit: their rows are public, so reading them early
#: times nothing private.
PUBLIC_READS = {"read_group_list", "partition_digest", "multiplicity", "check_lists"}


class Killed(KeyboardInterrupt):
    """Stands for the run being killed at its first private collect."""


def _reads_a_public_list() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in PUBLIC_READS:
            return True
        frame = frame.f_back
    return False


def kill_at_first_read(monkeypatch: pytest.MonkeyPatch, observe: Callable[[], T]) -> list[T]:
    """Every collect of private data appends ``observe()`` to the returned list, then kills the run."""
    seen: list[T] = []
    originals = {"collect": pl.LazyFrame.collect, "collect_all": pl.collect_all}

    def probe(name: str) -> Callable[..., Any]:
        def collect(*args: Any, **kwargs: Any) -> Any:
            if _reads_a_public_list():
                return originals[name](*args, **kwargs)
            seen.append(observe())
            raise Killed
        return collect

    monkeypatch.setattr(pl.LazyFrame, "collect", probe("collect"))
    monkeypatch.setattr(pl, "collect_all", probe("collect_all"))
    return seen
