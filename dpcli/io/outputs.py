"""Outputs: the output format, the checks on an output path, the one number format of text outputs
(:func:`shown`), rendering and the one atomic writer.

CSV, Parquet or JSON to stdout or a file (CSV and JSON gzip-compressed for a ``.gz`` name, byte for byte the
same on every run: :func:`compressed`); a file is written to a temporary name in the same
directory and renamed (through the gate, :meth:`dpcli.access.Gate.write`), so a failed run
never leaves a partial file. A device or a pipe (``-o /dev/null``) is written in place, once the whole
result is rendered. An output path inside the state directory, naming one of the run's
inputs, or holding one of dpcli's private files is refused before anything is read
(:func:`check_output_path`, exit 73).
"""

from __future__ import annotations

import gzip
import io
import math
import os
import stat
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import IO, Literal, TypeGuard

import polars as pl

from dpcli.access import gate
from dpcli.access.walk import inside
from dpcli.access.writes import is_private_file
from dpcli.core.display import UTC_FORMAT
from dpcli.errors import (
    OutputError,
    UsageError,
)
from dpcli.state import progress
from dpcli.state.atomic import writes_in_place

OutputFormat = Literal["csv", "parquet", "json", "table"]
OUTPUT_FORMATS: tuple[str, ...] = ("csv", "parquet", "json", "table")
_OUTPUT_EXT = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".json": "json"}


#: Compressed outputs by suffix (after the format's own: ``counts.csv.gz``).
OUTPUT_COMPRESSION = {".gz": "gzip"}
#: gzip's compression level for outputs: fixed, so the same release is the same bytes on every run.
GZIP_LEVEL = 9


def output_compression(path: str | None) -> str | None:
    """``gzip`` for an ``-o`` path whose name ends in ``.gz`` (stdout and other names: None)."""
    if not path or path == "-":
        return None
    return OUTPUT_COMPRESSION.get(Path(path).suffix.lower())


def output_format_for(path: str | None, explicit: str | None) -> str:
    """The output format from ``--format``, else the ``-o`` extension (before a ``.gz``: ``x.csv.gz`` is CSV),
    else CSV (as on stdout in a pipe): for stdout, a name without an extension, and in personal mode a device
    or a pipe (``/dev/null``, ``/dev/stdout``). An extension dpcli does not write (``.txt``) is refused rather
    than guessed, and so is a compressed Parquet name (``.parquet.gz``: Parquet compresses its own pages)."""
    given, compression = path, output_compression(path)
    if compression is not None and path is not None:
        path = str(Path(path).with_suffix(""))
    if explicit:
        if explicit not in OUTPUT_FORMATS:
            raise UsageError(f"unknown output format {explicit!r} (choose from {', '.join(OUTPUT_FORMATS)})")
        fmt = explicit
    # (a service-mode analyst's path is not looked at: they write only files in their output directories,
    # and whether a path they typed is a device or a pipe is not theirs to learn before the gate refuses it)
    elif not path or path == "-" or not Path(path).suffix or (not gate().restricted and writes_in_place(path)):
        fmt = "csv"
    else:
        found = _OUTPUT_EXT.get(Path(path).suffix.lower())
        if found is None:
            raise UsageError(f"is needed: the output format of {path!r} is not clear from its extension",
                             field="format")
        fmt = found
    if compression is not None and fmt not in ("csv", "json"):
        raise UsageError(f"-o {given!r}: a {fmt} output is not written gzip-compressed (Parquet compresses its "
                         "own pages); drop .gz from the name")
    return fmt


PathLike = str | os.PathLike[str]


def _same_file(a: PathLike, b: PathLike) -> bool:
    """Do two paths name one file (after symlinks, or as one inode when both exist)?"""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _holds_private_file(path: PathLike) -> bool:
    """Is there a key, ledger or state file at ``path`` (after symlinks), e.g. a stream state kept outside
    the state directory?"""
    real = os.path.realpath(path)
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):  # a pipe or a device is never opened here
            return False
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:  # (swapped for a pipe since the stat: not read)
        return stat.S_ISREG(os.fstat(fd).st_mode) and is_private_file(fh.read(32))


def check_path_is_not_protected(
    path: PathLike, state_dir: PathLike | None, inputs: Sequence[PathLike | None] = (), what: str = "output",
    state_file: bool = False,
) -> None:
    """Refuse (exit 73) a path dpcli is about to write that lies in the state directory, is an input, or
    holds one of dpcli's private files (a stream state kept elsewhere; ``state_file``: the path is a
    ``--state`` file, which is one by design).

    ``path`` is resolved (symlinks of it and of its parent directories, ``..``) before the test, so
    a symlinked directory or a dangling symlink into the state directory is caught; an input is the
    same file when both resolve to one path or (both existing) to one inode; an input read from standard
    input (``-``) is the file or pipe on it. Missing entries are skipped.
    """
    if state_dir is not None and inside(path, state_dir):
        raise OutputError(f"{what} {str(path)!r} lies inside the state directory; write it elsewhere")
    if not state_file and _holds_private_file(path):  # (a --state file is one: it is checked as such)
        raise OutputError(f"{what} {str(path)!r} is one of dpcli's private files (a key, ledger or state); "
                          "write it elsewhere")
    for source in inputs:
        if source is not None:
            _refuse_input(path, source, what)


def _is_stdin(path: PathLike) -> bool:
    """Does ``path`` lead to the file or pipe on this process's standard input (``/dev/stdin``,
    ``/proc/self/fd/0``, or its own name)? A terminal or a device such as ``/dev/null`` is no input to
    protect."""
    try:
        target, stdin = os.stat(path), os.fstat(0)
    except OSError:
        return False
    return not stat.S_ISCHR(stdin.st_mode) and (target.st_dev, target.st_ino) == (stdin.st_dev, stdin.st_ino)


def _refuse_input(path: PathLike, source: PathLike, what: str) -> None:
    """Never write over an input file (standard input too: the file it was redirected from, or the pipe,
    whose reader is dpcli itself), or into an input dataset's directory."""
    if str(source) == "-":
        if _is_stdin(path):
            raise OutputError(f"{what} {str(path)!r} is the standard input the run reads; write it elsewhere")
        return
    if _same_file(path, source):
        raise OutputError(f"{what} {str(path)!r} is the input {str(source)!r}; write it elsewhere")
    if os.path.isdir(source) and inside(path, source):
        raise OutputError(f"{what} {str(path)!r} lies inside the input dataset {str(source)!r}; write it elsewhere")


def check_output_path(
    path: str | None, state_dir: PathLike | None = None, inputs: Sequence[PathLike | None] = ()
) -> None:
    """Fail early (before any data is read or budget spent) if ``-o PATH`` cannot or must not be written.

    Must not: inside the state directory ``state_dir`` (ledgers, keys, stream and schedule state) or
    the same file as one of ``inputs`` (data, public lists, spec, block list), see
    :func:`check_path_is_not_protected`.
    """
    if not path or path == "-":
        return
    gate().check_write(path)
    path = gate().typed(path)  # (service mode: nothing is asked of a directory the analyst's path climbs out of)
    inputs = [gate().typed(os.fspath(p)) if isinstance(p, str) else p for p in inputs]
    check_path_is_not_protected(path, state_dir, inputs)
    gate().protect(inputs)  # (checked again on the directory written, by device and inode: Gate.write)
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if writes_in_place(p):  # a device or a pipe: written through, its directory untouched
        if not os.path.exists(p):
            raise OutputError(f"output {path!r} does not exist (a device or a descriptor is written, never created)")
        if not os.access(p, os.W_OK):
            raise OutputError(f"output {path!r} is not writable")
        return
    if p.is_dir():
        raise OutputError(f"output {path!r} is a directory")
    if not parent.is_dir():
        raise OutputError(f"output directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"output directory {str(parent)!r} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"output file {path!r} is not writable")


def _decimals_of(step: float) -> int:
    """Decimals that show two significant digits of ``step`` (never negative)."""
    return max(0, 1 - math.floor(math.log10(step)))


def rounded(df: pl.DataFrame, step: float | None = None) -> pl.DataFrame:
    """Float columns rounded to what their noise and grid justify, for text outputs (CSV, JSON, tables).

    A column ``c`` with a margin column ``c_moe95`` (and the margin itself, upwards) is rounded to
    the decimal of two significant digits of its median margin: digits below it are noise. Other
    float columns (means, variances, quantiles, sums without margins) are rounded to two significant
    digits of ``step``, the grid values were snapped to, when there is one; below it nothing was
    measured. Integer columns are exact and untouched, and Parquet outputs keep every float as
    computed. Rounding is post-processing of released values: it changes no guarantee.
    """
    exprs = [e for column, dtype in df.schema.items() if dtype.is_float()
             if (e := _rounding(df, column, step)) is not None]
    return df.with_columns(exprs) if exprs else df


def shown(df: pl.DataFrame, step: float | None = None, times: Collection[str] = ()) -> pl.DataFrame:
    """A result as every text output shows it (CSV, JSON, tables; Parquet keeps the table as computed): the
    one number format of all commands (issue 39 item 8).

    * floats rounded to what their noise and grid justify (:func:`rounded`);
    * a margin of an integer column (``count_moe95`` of ``count``) whose rounded values are all whole is an
      integer column: ``1704``, never ``1704.0``, as a count is;
    * never ``-0.0``: a float that rounds to zero is ``0.0``;
    * ``times``: columns of moments dpcli computed (naive datetimes in UTC: a stream's ``window_start`` and
      ``trigger_time``) as ISO 8601 text in UTC with ``Z`` (:data:`dpcli.core.display.UTC_FORMAT`).
      Datetime columns taken from the data (a group key) keep their own type and format.

    Post-processing of released values: it changes no value and no guarantee.
    """
    df = rounded(df, step)
    exprs = [_no_negative_zero(c) for c, dtype in df.schema.items() if dtype.is_float()]
    df = df.with_columns(exprs) if exprs else df
    whole = [pl.col(c).cast(pl.Int64) for c, dtype in df.schema.items() if dtype.is_float() and _counts(df, c)]
    df = df.with_columns(whole) if whole else df
    stamps = [_utc_text(c, df.schema[c]) for c in times if c in df.columns and df.schema[c] == pl.Datetime]
    return df.with_columns(stamps) if stamps else df


def _no_negative_zero(column: str) -> pl.Expr:
    """``column`` with ``-0.0`` replaced by ``0.0`` (NaN and nulls as they are)."""
    return pl.when(pl.col(column) == 0).then(pl.lit(0.0, dtype=pl.Float64)).otherwise(pl.col(column)).alias(column)


def _counts(df: pl.DataFrame, column: str) -> bool:
    """Is float ``column`` the margin of an integer column, with every value whole (and finite)?"""
    of = column.removesuffix("_moe95")
    if of == column or of not in df.columns or not df.schema[of].is_integer():
        return False
    values = df[column].drop_nulls()
    if not values.len():
        return True
    if not (values.is_finite().all() and (values == values.round(0)).all()):
        return False
    largest = values.abs().max()
    return isinstance(largest, float | int) and largest < 2.0**53  # (beyond, a float is no exact integer)


def _utc_text(column: str, dtype: pl.DataType) -> pl.Expr:
    """A datetime column dpcli computed, as ISO 8601 text in UTC with ``Z`` (naive: already UTC)."""
    moment = pl.col(column)
    zoned = getattr(dtype, "time_zone", None) is not None
    utc = moment.dt.convert_time_zone("UTC") if zoned else moment.dt.replace_time_zone("UTC")
    return utc.dt.strftime(UTC_FORMAT).alias(column)


def _positive(x: object) -> TypeGuard[float]:
    """A positive finite number (a median of an empty or all-null column is None)."""
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _rounding(df: pl.DataFrame, column: str, step: float | None) -> pl.Expr | None:
    """How one float column is rounded: to its margin's median (a margin itself upwards), else to the
    grid's ``step``; None to keep it as it is."""
    margin_col = column if column.endswith("_moe95") else f"{column}_moe95"
    typical = df[margin_col].abs().median() if margin_col in df.columns and df.height else None
    if _positive(typical):
        decimals = _decimals_of(typical)
        if column == margin_col:  # a margin is rounded up: never shown narrower than it is (the final
            # round only drops the float residue of the division: 142 / 10 may come out as 14.200000000000001)
            return ((pl.col(column) * 10.0**decimals).ceil() / 10.0**decimals).round(decimals)
        return pl.col(column).round(decimals)
    if step is not None and math.isfinite(step) and step > 0:
        return pl.col(column).round(_decimals_of(step))
    return None


def compressed(data: bytes, compression: str | None) -> bytes:
    """``data`` as written: as it is, or gzip-compressed byte-deterministically (level :data:`GZIP_LEVEL`, a
    modification time of 0 and no file name in the header), so a replay writes the bytes the first run wrote
    and its digest is the one the ledger recorded."""
    if compression is None:
        return data
    if compression != "gzip":
        raise ValueError(f"unknown output compression {compression!r}")
    return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)


def render(df: pl.DataFrame, fmt: str, step: float | None = None, compression: str | None = None,
           times: Collection[str] = ()) -> bytes:
    """Serialise a result table (CSV and JSON as :func:`shown` shows it; Parquet as computed), compressed as
    asked."""
    return compressed(_serialised(df, fmt, step, times), compression)


def _serialised(df: pl.DataFrame, fmt: str, step: float | None, times: Collection[str]) -> bytes:
    buf = io.BytesIO()
    if fmt != "parquet":
        df = shown(df, step, times)
    if fmt == "csv":
        df.write_csv(buf)
    elif fmt == "parquet":
        df.write_parquet(buf)
    else:
        buf.write(df.write_json().encode())
        buf.write(b"\n")
    return buf.getvalue()


def write_output(df: pl.DataFrame, path: str | None, fmt: str, stdout: IO[bytes] | None = None,
                 step: float | None = None, times: Collection[str] = ()) -> None:
    """Write a result to stdout or atomically to ``path`` (``step`` and ``times``: see :func:`shown`; a ``.gz``
    name: gzip-compressed, :func:`compressed`)."""
    data = render(df, fmt, step, output_compression(path), times)
    if not path or path == "-":
        out = stdout or sys.stdout.buffer
        if fmt == "parquet" and hasattr(out, "isatty") and out.isatty():
            raise OutputError("refusing to write Parquet to a terminal; use -o FILE or --format csv")
        out.write(data)
        out.flush()
        progress.written("standard output")
        return
    gate().write(path, data)
    progress.written(path)
