"""Inputs Spark reads: a URI (``s3a://``, ``hdfs://``, ``file://``…) listed by Spark, and paths escaped for Spark.

A URI names one file or a directory of files on storage the driver may not see (an object store,
HDFS, or, with ``--remote``, the Connect server's disks). Spark lists it (the built-in
``binaryFile`` source reads each file's path, size and modification time, never its content);
that list is the input's manifest, and exactly those files are read. A manifest does not prove the
content, so, as for every Spark release, the fingerprint ends with a fresh nonce: new noise and a
new charge on every run (see docs/spark.md, "Input identity").
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Any

import polars as pl

from dpcli.errors import DataError, InputMissingError, UsageError
from dpcli.io.tables import InputTable

#: The storage schemes ``--engine spark`` takes a URI for (Hadoop file systems Spark ships or clusters add).
SCHEMES = frozenset({"file", "hdfs", "viewfs", "s3a", "s3", "gs", "abfs", "abfss", "wasb", "wasbs", "oss"})
_SCHEME = re.compile(r"\A([A-Za-z][A-Za-z0-9+.-]*)://")
#: Characters Hadoop expands as a glob in a path Spark is given.
GLOB = frozenset("*?[]{}\\")
#: Names each format's files may have below a URI.
_SUFFIXES = {"parquet": (".parquet", ".pq"), "csv": (".csv", ".csv.gz", ".csv.bz2", ".tsv", ".tsv.gz")}


def uri_scheme(source: str) -> str | None:
    """The scheme of ``source`` if it is written as a URI (``scheme://…``), else None."""
    m = _SCHEME.match(source)
    return m.group(1).lower() if m else None


def check_uri(uri: str) -> None:
    """Refuse a URI Spark would not read as exactly the files it names (before anything is read)."""
    scheme = uri_scheme(uri)
    if scheme not in SCHEMES:
        raise UsageError(f"--engine spark reads URIs of {', '.join(sorted(SCHEMES))}, not {scheme}://")
    if GLOB & set(uri):
        raise UsageError(f"--engine spark takes a URI without glob characters (Spark would expand them into "
                         f"other files), got {uri!r}")


def escape_path(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped, so Spark reads that one file (``a[1].parquet``)."""
    return re.sub(r"([*?\[\]{}\\])", r"\\\1", path)


def open_uri(session: Any, uri: str, fmt: str, name: str | None = None) -> InputTable:
    """The files at ``uri`` (a file, or every data file below a directory) as one input.

    The returned table's frame is empty and carries the schema Spark reads (CSV: every column as
    text), for the query's column checks; ``uris`` lists the files, which Spark then reads.
    Names below ``uri`` can be data (hive partitions), so messages never quote them; ``name`` is what
    messages call the input (a catalog name: the URI itself is then never shown).
    """
    from dpcli.spark.bounding import read_input

    shown = name or uri
    try:
        listing = (session.read.format("binaryFile").option("recursiveFileLookup", "true").load(uri)
                   .select("path", "length", "modificationTime").collect())
    except Exception as exc:  # noqa: BLE001 (Spark's message names paths below the URI: withheld)
        raise InputMissingError(f"cannot list {shown!r} on Spark ({type(exc).__name__})") from None
    if not listing:
        raise InputMissingError(f"{shown!r} holds no data files")
    rows = sorted((str(r[0]), int(r[1]), r[2].isoformat()) for r in listing)
    if any(not path.lower().endswith(_SUFFIXES[fmt]) for path, _, _ in rows):
        raise UsageError(f"{shown!r} holds a file whose name does not end in {' or '.join(_SUFFIXES[fmt])}: "
                         f"give the input format with --input-format, or point at the {fmt} files only")
    digest = hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
    paths = tuple(escape_path(path) for path, _, _ in rows)
    try:
        schema = read_input(session, list(paths), fmt).schema
    except Exception as exc:  # noqa: BLE001 (Spark's reader fails in many classes; its text is withheld)
        raise DataError(f"cannot read {shown!r} as {fmt} on Spark ({type(exc).__name__})") from None
    frame = pl.LazyFrame(schema={f.name: polars_type(f.dataType) for f in schema.fields})
    return InputTable(frame=frame, fingerprint=f"manifest:{digest}; run {secrets.token_hex(16)}", name=shown,
                      format=f"spark-{fmt}", uris=paths, location=uri)


def polars_type(dtype: Any) -> Any:
    """The polars type of a Spark column (for the query's column checks; nothing is converted)."""
    from pyspark.sql import types as T

    simple = {T.StringType: pl.String, T.ByteType: pl.Int8, T.ShortType: pl.Int16, T.IntegerType: pl.Int32,
              T.LongType: pl.Int64, T.FloatType: pl.Float32, T.DoubleType: pl.Float64, T.BooleanType: pl.Boolean,
              T.DateType: pl.Date, T.BinaryType: pl.Binary}
    for spark_type, polars in simple.items():
        if isinstance(dtype, spark_type):
            return polars
    if isinstance(dtype, T.TimestampType):
        return pl.Datetime("us", "UTC")
    if isinstance(dtype, T.TimestampNTZType):
        return pl.Datetime("us")
    if isinstance(dtype, T.DecimalType):
        return pl.Decimal(dtype.precision, dtype.scale)
    return pl.Object
