"""Collecting lazy frames: the streaming engine, with polars' errors turned into one-line data errors
(their text withheld: it may quote records)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from dpcli.errors import (
    DataError,
    withheld,
)

if TYPE_CHECKING:
    from dpcli.io.tables import InputTable


def collect(frame: pl.LazyFrame, what: str, streaming: bool = True) -> pl.DataFrame:
    """Collect a lazy frame (streaming engine), turning polars errors into one-line DataErrors."""
    try:
        return frame.collect(engine="streaming" if streaming else "auto")
    except pl.exceptions.PolarsError as exc:
        raise DataError(f"{what}: {withheld(exc)}") from None


def cheap_row_count(table: InputTable) -> int | None:
    """The row count of a Parquet input (from its metadata: no pass over the data), else None."""
    if table.format != "parquet":
        return None
    return int(collect(table.frame.select(pl.len()), f"cannot read {table.name}").item())
