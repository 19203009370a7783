"""``--engine spark``: the options checked before any data is read, the session, and the bounding engine a
release's task hands its data pass to (:class:`dpcli.tasks.Engine`)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpcli.errors import SparkStopped, UsageError

if TYPE_CHECKING:
    from dpcli.access import Source
    from dpcli.io.tables import InputTable
    from dpcli.tasks import Engine


@dataclass(frozen=True)
class EngineRequest:
    """The engine options as given: ``--engine``, ``--master``, ``--remote``, ``--spark-conf``."""

    engine: str = "polars"
    master: str | None = None
    remote: str | None = None
    conf: tuple[str, ...] = ()


@dataclass(frozen=True)
class SparkChoice:
    """``--engine spark`` and where: checked before any data is read."""

    fmt: str  # csv or parquet
    master: str | None  # a classic session (default local[*]) ...
    remote: str | None  # ... or a Spark Connect server (sc://HOST:PORT)
    conf: tuple[str, ...]
    uri: bool  # the input is a URI Spark lists and reads (no local file)


def check_engine(request: EngineRequest, data: Source) -> SparkChoice | None:
    """Check the engine options before any data is read: None for polars, else where Spark runs.

    Spark takes a local CSV or Parquet file or dataset directory (by a path without ``:``), or a
    storage URI (:data:`dpcli.spark.inputs.SCHEMES`, without glob characters), never standard input.
    In service mode the endpoint is the catalog's (:meth:`dpcli.access.Gate.spark`).
    """
    from dpcli.access import gate
    from dpcli.spark.inputs import uri_scheme

    engine, master, remote = request.engine, request.master, request.remote
    conf: list[str] | None = list(request.conf)
    if engine == "spark":
        master, remote, conf = gate().spark(master, remote, conf)
    scheme = uri_scheme(data.location)
    if engine == "polars":
        if master is not None or remote is not None or conf:
            raise UsageError("--master, --remote and --spark-conf need --engine spark")
        if scheme is not None:
            raise UsageError(f"a {scheme}:// URI is read by --engine spark; polars reads local files")
        return None
    if engine != "spark":
        raise UsageError(f"--engine must be polars or spark, got {engine!r}")
    _check_installed(remote)
    _check_remote(master, remote, conf)
    fmt = _spark_format(data, scheme)
    if scheme is None:
        _check_local_path(data.location, data.name)
    return SparkChoice(fmt, master, remote, tuple(conf or ()), scheme is not None)


def _check_installed(remote: str | None) -> None:
    """``--engine spark`` without pyspark installed: the session's own refusal, before anything is read or charged
    (it was an internal error, a ModuleNotFoundError where the release first imported pyspark)."""
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        extra = "dpcli[spark-connect]" if remote is not None else "dpcli[spark]"
        raise UsageError(f"--engine spark needs pyspark: pip install '{extra}'")


def _check_remote(master: str | None, remote: str | None, conf: list[str] | None) -> None:
    """A Spark Connect server (``sc://HOST:PORT``) comes with its own master and settings."""
    if remote is not None and (master is not None or conf):
        raise UsageError("--remote connects to a Spark Connect server, whose master and settings are its own: "
                         "drop --master and --spark-conf")
    if remote is not None and (not remote.startswith("sc://") or len(remote) == len("sc://")):
        raise UsageError(f"must look like sc://HOST:PORT, got {remote!r}", field="remote")


def _spark_format(data: Source, scheme: str | None) -> str:
    """What Spark reads the input as: CSV or Parquet (a URI without a suffix, or a dataset directory:
    Parquet); never standard input."""
    from dpcli.io.inputs import input_format_for
    from dpcli.spark.inputs import check_uri

    source, input_format = data.location, data.format
    if source == "-":
        raise UsageError("--engine spark reads a file, not standard input")
    if scheme is not None:
        check_uri(source)
        name = source.rstrip("/").rsplit("/", 1)[-1]
        fmt = input_format_for(source, input_format, data.name) if input_format or "." in name else "parquet"
    elif Path(source).is_dir():  # a dataset directory: its Parquet files (dpcli.io.datasets.open_dataset)
        fmt = "parquet"
    else:
        fmt = input_format_for(source, input_format, data.name)
    if fmt not in ("csv", "parquet"):
        raise UsageError(f"--engine spark reads CSV or Parquet, not {fmt}")
    return fmt


def spark_session(state_dir: Path, choice: SparkChoice) -> Any:
    """The Spark session of ``choice`` (started once per process; a Connect client needs no JVM)."""
    from dpcli.spark.session import connect_session, spark_session

    if choice.remote is not None:
        return connect_session(choice.remote)
    return spark_session(choice.master or "local[*]", list(choice.conf), state_dir)


def open_spark_input(state_dir: Path, choice: SparkChoice | None, data: Source) -> InputTable | None:
    """For a URI input, the table Spark lists (its manifest and schema); None for local files,
    which are opened and fingerprinted on this machine as for polars."""
    if choice is None or not choice.uri:
        return None
    from dpcli.access import gate
    from dpcli.spark.inputs import open_uri

    gate().check_read(data, "input")
    return open_uri(spark_session(state_dir, choice), data.location, choice.fmt, data.name)


def bounding_engine(state_dir: Path, choice: SparkChoice | None, table: InputTable, delimiter: str,
                    others: Mapping[str, InputTable] | None = None) -> Engine | None:
    """None for polars; for Spark, bounding on the files of ``table`` (the opened input: one file,
    the exact list of a dataset's files that its manifest covers, or the files a URI listed);
    ``others``: the release's other inputs by role (``dpcli sql``'s other tables are read by Spark too)."""
    if choice is None:
        return None
    import pyspark

    from dpcli.io.inputs import csv_delimiter
    from dpcli.spark.bounding import bounded_totals, quantile_counts, read_input
    from dpcli.spark.sql import sql_engine
    from dpcli.spark.stream import events_engine
    from dpcli.spark.tabulate import level_counts
    from dpcli.tasks import Engine

    session = spark_session(state_dir, choice)
    frame = read_input(session, spark_paths(table), choice.fmt, csv_delimiter(delimiter))
    tables = {role: (spark_paths(t), t) for role, t in (others or {}).items() if role.startswith("table:")}
    # Never a free replay: Spark reads the path again after the driver hashed it (a symlink or a
    # parent directory swapped meanwhile is not seen by the hashed file), and its results depend on
    # a cluster's versions and defaults dpcli cannot see. The same seed over other values would
    # publish their exact difference, so every Spark release draws a fresh nonce: new noise, new charge.
    tag = f"spark {pyspark.__version__}; run {secrets.token_hex(16)}"
    return Engine(totals=_guarded(lambda spec, salt: bounded_totals(frame, spec, salt)), seed_tag=tag,
                  quantile_counts=_guarded(lambda spec, salt: quantile_counts(frame, spec, salt)),
                  tabulate_counts=_guarded(level_counts(frame, session)),
                  stream_events=_guarded(events_engine(frame, session)),
                  sql_totals=_guarded(sql_engine(session, frame, tables)),
                  precheck=_guarded(_precheck(frame)))


def _precheck(frame: Any) -> Any:
    """What Spark refuses from the schema alone, before the debit: a stream's time column as text."""

    def check(task: Any) -> None:
        from dpcli.spark.stream import time_seconds
        from dpcli.tasks.stream.task import StreamTask

        if isinstance(task, StreamTask):
            time_seconds(task.query.time, frame.schema[task.query.time].dataType)

    return check


def spark_paths(table: InputTable) -> list[str]:
    """The files Spark reads for an opened input: the URIs it listed, else absolute, glob-escaped
    ``file:`` paths (no scheme or glob left to Spark); a dataset is given as its list of files, so
    Spark adds no partition columns and reads no file the manifest lacks."""
    from dpcli.spark.inputs import escape_path

    if table.uris:
        return list(table.uris)
    files = table.files or (Path(table.where),)
    if any(":" in str(f.resolve()) for f in files):  # names below a dataset are never quoted
        raise UsageError(f"{table.name!r} holds a file with ':' in its path, which Spark cannot read: "
                         "rename it, or use --engine polars")
    return ["file://" + escape_path(str(f.resolve())) for f in files]


def _guarded(compute: Callable[..., Any]) -> Callable[..., Any]:
    """``compute``, with a Spark driver that went away (it exits when out of heap: see
    :data:`dpcli.spark.session.FORCED_SETTINGS`) reported as one line instead of a py4j traceback."""
    try:
        from py4j.protocol import Py4JNetworkError
    except ImportError:  # a Connect-only client has no py4j
        Py4JNetworkError = ConnectionError

    def run(*args: Any) -> Any:
        try:
            result = compute(*args)
        except (Py4JNetworkError, ConnectionError, EOFError):
            raise SparkStopped("the Spark driver stopped during the run (out of memory? give it more with "
                               "--spark-conf spark.driver.memory=8g); nothing was charged") from None
        return _guarded(result) if callable(result) else result  # tabulate's engine returns a function

    return run


def _check_local_path(path: str, name: str) -> None:
    if ":" in str(Path(path).resolve()):
        raise UsageError(f"--engine spark cannot read a local path with ':' in it (Hadoop takes it for a URI "
                         f"scheme), got {name!r}: rename it or use --engine polars")
