"""``--engine``, ``--master`` and ``--spark-conf``: the bounding engine of a release (see :mod:`dpcli.spark`)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from dpcli.cli._common import Settings
from dpcli.errors import UsageError

if TYPE_CHECKING:
    from dpcli.files import InputTable
    from dpcli.release import Engine

#: Characters Spark expands in a path (polars, which hashed the file, takes it literally).
_GLOB = set("*?[]{}\\")


def check_engine(engine: str, master: str | None, conf: list[str] | None, source: str,
                 input_format: str | None) -> str | None:
    """Check the engine options before any data is read; the input's format for Spark, None for polars.

    Spark takes a CSV or Parquet file by a path without glob characters (Spark would expand them
    into other files than the one fingerprinted), never standard input.
    """
    if engine == "polars":
        if master is not None or conf:
            raise UsageError("--master and --spark-conf need --engine spark")
        return None
    if engine != "spark":
        raise UsageError(f"--engine must be polars or spark, got {engine!r}")
    if source == "-":
        raise UsageError("--engine spark reads a file, not standard input")
    _check_spark_path(source)
    from dpcli.files import input_format_for

    if Path(source).is_dir():  # a dataset directory: its Parquet files (files.open_dataset)
        return "parquet"
    fmt = input_format_for(source, input_format)
    if fmt not in ("csv", "parquet"):
        raise UsageError(f"--engine spark reads CSV or Parquet, not {fmt}")
    return fmt


def bounding_engine(s: Settings, fmt: str | None, master: str | None, conf: list[str] | None, table: InputTable,
                    delimiter: str) -> Engine | None:
    """None for polars (``fmt`` None); for Spark, a session on ``master`` reading the files of ``table``
    (the opened input: one file, or the exact list of a dataset's files that its manifest covers)."""
    if fmt is None:
        return None
    import pyspark

    from dpcli.files import csv_delimiter
    from dpcli.release import Engine
    from dpcli.spark.bounding import bounded_totals, read_input
    from dpcli.spark.session import spark_session

    session = spark_session(master or "local[*]", conf or [], s.state_dir)
    # By absolute file: paths (no scheme, glob or escape left to Spark); a dataset is given as its
    # list of files, so Spark adds no partition columns and reads no file the manifest lacks.
    files = table.files or (Path(table.name),)
    for f in files:
        _check_spark_path(str(f))
    frame = read_input(session, ["file://" + str(f.resolve()) for f in files], fmt, csv_delimiter(delimiter))
    # Never a free replay: Spark reads the path again after the driver hashed it (a symlink or a
    # parent directory swapped meanwhile is not seen by the hashed file), and its results depend on
    # a cluster's versions and defaults dpcli cannot see. The same seed over other values would
    # publish their exact difference, so every Spark release draws a fresh nonce: new noise, new charge.
    tag = f"spark {pyspark.__version__}; run {secrets.token_hex(16)}"
    return Engine(lambda spec, salt: bounded_totals(frame, spec, salt), tag)


def _check_spark_path(path: str) -> None:
    if _GLOB & set(path) or set(":%") & set(str(Path(path).resolve())):
        raise UsageError("--engine spark takes paths without glob characters, ':' or '%' "
                         f"(Spark would read other files than the ones fingerprinted), got {path!r}")
