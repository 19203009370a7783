"""Which groups and columns of two releases ``dpcli diff`` compares, and with which noise (a :class:`Pairing`).

* ``histogram`` and ``topk``: per group (the keys), ``count``, ``count_units`` and ``sum_<value>`` with the noise of
  their measurement (``rows``, ``units``, ``sum``; topk's count noise), and ``mean_<value>`` from the count and
  centred sum it is the ratio of (it needs the count released beside it: the n of the mean);
* ``tabulate``: per cell (level, geo_id, iteration, sex, age), ``count`` with its level's noise: the cells' and
  chosen totals' own, or a TotalOnly group's;
* ``stream-replay``: per window and key, the values at each release's last trigger (:mod:`dpcli.plot.diff_stream`);
* ``sql``: per group, the counts and sums the report names (:mod:`dpcli.plot.diff_sql`).

A release is checked against its report where the file can tell (its number of rows; the margins a file written
with ``--with-error`` shows, which must be the ones its noise gives): a report of another run is refused (exit 65).
Two releases with the same seed share their noise, and their differences are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import polars as pl

from dpcli.core.differences import MeanRelease
from dpcli.core.mechanisms import Noise
from dpcli.errors import DataError
from dpcli.plot import diff_reports as rep
from dpcli.plot.diff_tests import Tested, integer_test, mean_test
from dpcli.plot.release_view import ReleaseView

#: A tabulation's cells: the group columns of every row.
TABULATE_KEYS = ("level", "geo_id", "iteration", "sex", "age")
#: The commands whose releases diff compares.
COMPARED_COMMANDS = ("histogram", "topk", "tabulate", "stream-replay", "sql")
#: Why a released column is not compared.
NOT_COMPARED = {
    "variance": "a variance's margin is a union bound over three measurements, not combined here",
    "quantile": "a quantile is chosen by the exponential mechanism, with no noise of its own to difference",
    "rank": "ranks are an order chosen with noise, not a noisy value",
}


@dataclass(frozen=True)
class Pairing:
    """Two releases lined up: per group (``keys``, then ``extra`` columns such as a stream's triggers) each compared
    column's old, new and difference (``c_old``, ``c_new``, ``c_diff``), the tests of those differences, the
    columns left out (and why), whether the two share their noise (``"none"``, ``"seed"``, ``"stream"``) and the
    noises as the summary describes them."""

    table: pl.DataFrame
    keys: tuple[str, ...]
    extra: tuple[str, ...]
    tested: tuple[Tested, ...]
    not_compared: dict[str, str]
    shared: str
    noise: dict[str, Any]


def join(old: pl.DataFrame, new: pl.DataFrame, keys: list[str], columns: list[str]) -> pl.DataFrame:
    """The two tables' groups side by side (a group in one only: nulls in the other), and the differences."""
    for t in (old, new):
        if keys and t.select(keys).is_duplicated().any():
            raise DataError(f"a release holds a group twice ({', '.join(keys)}): not a dpcli release")
    differ = [k for k in keys if old.schema[k] != new.schema[k]]  # (a CSV's and a Parquet file's types)
    old, new = old.with_columns(pl.col(differ).cast(pl.String)), new.with_columns(pl.col(differ).cast(pl.String))
    joined = old.select(*keys, *columns).join(new.select(*keys, *columns), on=keys, how="full", suffix="_new",
                                              coalesce=True, nulls_equal=True)
    joined = joined.rename({c: f"{c}_old" for c in columns})
    return joined.with_columns(*(pl.col(f"{c}_new").sub(pl.col(f"{c}_old")).alias(f"{c}_diff") for c in columns))


def diffs_of(table: pl.DataFrame, column: str) -> np.ndarray:
    """A difference column as floats (NaN where a group is in one release only)."""
    return table[f"{column}_diff"].cast(pl.Float64).fill_null(float("nan")).to_numpy()


def display_half(view: ReleaseView, column: str, step: float | None) -> float:
    """How far a value of ``column`` may lie from the one released, as the file shows it: text outputs round a
    float to two significant digits of its column's median margin, else of the grid's step
    (:func:`dpcli.io.outputs.rounded`); integers and Parquet are exact. A margin shown rounded up gives a coarser
    digit, never a finer one, so this is never too small."""
    t = view.table
    if not view.shown or column not in t.columns or t[column].dtype.is_integer() or not t.height:
        return 0.0
    margin = view.margin_of(column)
    typical = t[margin].cast(pl.Float64).abs().median() if margin and margin.startswith(column) else None
    unit = typical if isinstance(typical, float) and math.isfinite(typical) and typical > 0 else step
    if unit is None or not (math.isfinite(unit) and unit > 0):
        return 0.0
    return 0.5 * 10.0 ** -max(0, 1 - math.floor(math.log10(unit)))


def same_shape(old: ReleaseView, new: ReleaseView) -> str:
    """The two releases' kind, refused (65) unless both are releases of one query shape by one command."""
    for v in (old, new):
        command = rep.command(v.summary)
        if command is not None and command not in COMPARED_COMMANDS:
            raise DataError(f"{v.name!r} is a {command} release: dpcli diff compares {', '.join(COMPARED_COMMANDS)} "
                            "releases")
    kinds = {rep.command(v.summary) or v.kind for v in (old, new)}
    if len(kinds) > 1 or old.kind != new.kind or kinds != {old.kind}:
        raise DataError(f"{old.name!r} and {new.name!r} are not releases of one command ({old.kind} / {new.kind})")
    if old.kind == "diff":
        raise DataError(f"{old.name!r} is a diff's output, not a release")
    if old.keys != new.keys or sorted(old.values) != sorted(new.values):
        raise DataError(f"{old.name!r} and {new.name!r} are not releases of one query shape (groups "
                        f"{list(old.keys)} / {list(new.keys)}, columns {sorted(old.values)} / {sorted(new.values)})")
    return old.kind


def shared_seed(old: ReleaseView, new: ReleaseView) -> bool:
    """The two releases drew the same noise (the same seed: a replay, a schedule's epoch released again)."""
    s = rep.seed_id(old.summary)
    return s is not None and s == rep.seed_id(new.summary)


def check_rows(view: ReleaseView) -> None:
    """The report's count of released rows must be the file's (else it is another run's report)."""
    n = rep.released_rows(view.summary, view.kind)
    if n is not None and n != view.table.height:
        raise DataError(f"{view.name!r} holds {view.table.height} rows, its summary {n}: not its summary")


def check_margin(view: ReleaseView, column: str, margins: set[float], step: Fraction) -> None:
    """A file written with ``--with-error`` shows ``column``'s margins: each must be one the report's noise gives
    (to the report's 6 digits and the file's rounding)."""
    shown = view.margin_of(column)
    if shown is None or not view.table.height or not margins:
        return
    stated = view.table[shown].drop_nulls().cast(pl.Float64).to_numpy()
    off = np.min(np.abs(stated[:, None] - np.array(sorted(margins))[None, :]), axis=1)
    slack = np.maximum(1.0, 0.005 * stated) + float(step)
    if off.size and np.any(off > slack):
        raise DataError(f"{view.name!r}: its {shown} ({stated[int(np.argmax(off > slack))]:g}) is not a margin its "
                        "summary's noise gives: not its summary")


def noise_json(n: Noise, step: Fraction) -> dict[str, str]:
    key = "scale" if n.kind == "laplace" else "sigma2"
    return {"noise": f"discrete_{n.kind}", key: f"{float(n.param):.6g}", "step": str(step)}


def require_report(view: ReleaseView) -> None:
    if not view.summary:
        raise DataError(f"{view.name!r} has no summary: give it with --old-summary/--new-summary FILE (the --json "
                        "output of the run that wrote it), diff the runs' --json documents, or a file written with -o "
                        "whose entry in your ledger records it")


# -- histogram and topk -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Columns:
    """One release's compared columns: integer ones with their noise and grid step, means with theirs."""

    integer: dict[str, tuple[Noise, Fraction]]
    means: dict[str, tuple[Noise, Noise]]
    left_out: dict[str, str]


def _histogram_columns(view: ReleaseView) -> _Columns:
    noises = rep.histogram_measurements(view.name, view.summary)
    step = rep.granularity(view.summary)
    integer: dict[str, tuple[Noise, Fraction]] = {}
    means: dict[str, tuple[Noise, Noise]] = {}
    left_out: dict[str, str] = {}
    for column in view.values:
        measurement = _measurement_of(column)
        if measurement in noises:
            integer[column] = (noises[measurement], step if measurement == "sum" else Fraction(1))
        elif column.startswith("mean_"):
            reason = _mean_reason(view, noises)
            if reason is None:
                means[column] = (noises["rows"], noises["csum"])
            else:
                left_out[column] = reason
        else:
            left_out[column] = NOT_COMPARED["variance" if column.startswith("variance_") else "quantile"]
    if view.kind == "topk":
        left_out["rank"] = NOT_COMPARED["rank"]
    return _Columns(integer, means, left_out)


def _measurement_of(column: str) -> str | None:
    return next((m for m, c in rep.HISTOGRAM_COLUMNS.items() if column == c or (c.endswith("_") and
                                                                                 column.startswith(c))), None)


def _mean_reason(view: ReleaseView, noises: dict[str, Noise]) -> str | None:
    """Why a release's mean cannot be compared (None: it can)."""
    if "count" not in view.values:
        return "its release has no count (the n of the mean): release --agg count with it"
    if not {"rows", "csum"} <= set(noises) or rep.mean_grid(view.summary) is None:
        return "its summary does not give the mean's noises and value bounds"
    return None


def _histogram_margins(view: ReleaseView, cols: _Columns) -> None:
    check_rows(view)
    if view.kind == "histogram" and rep.thresholded(view.summary):
        return  # a thresholded release's margins are given its selection: they vary by group
    for column, (n, step) in cols.integer.items():
        check_margin(view, column, {float(rep.unslacked(n).margin95() * step)}, step)


def histogram_pairing(old: ReleaseView, new: ReleaseView) -> Pairing:
    """Histogram and topk releases (see the module docstring)."""
    for v in (old, new):
        require_report(v)
    a, b = _histogram_columns(old), _histogram_columns(new)
    for view, cols in ((old, a), (new, b)):
        _histogram_margins(view, cols)
    if sorted(a.integer) != sorted(b.integer) or sorted(a.means) != sorted(b.means):
        raise DataError(f"{old.name!r} and {new.name!r} do not release the same measured columns")
    if any(a.integer[c][1] != b.integer[c][1] for c in a.integer):
        raise DataError(f"{old.name!r} and {new.name!r} released their sums on different grids (--granularity)")
    columns = [c for c in old.values if c in a.integer or c in a.means]
    table = join(old.table, new.table, list(old.keys), columns)  # (a mean's count is among them: _mean_reason)
    exact = np.full(table.height, shared_seed(old, new))
    tested = [integer_test(c, diffs_of(table, c), [a.integer[c][0]] * table.height, [b.integer[c][0]] * table.height,
                           a.integer[c][1], display_half(old, c, None) + display_half(new, c, None), exact)
              for c in columns if c in a.integer]
    tested += [_mean(c, table, old, new, a.means[c], b.means[c], exact) for c in columns if c in a.means]
    noise = {c: {"old": noise_json(*a.integer[c]), "new": noise_json(*b.integer[c])} for c in a.integer}
    return Pairing(table, old.keys, (), tuple(sorted(tested, key=lambda t: columns.index(t.column))), a.left_out,
                   "seed" if exact.any() else "none", noise)


def _mean(column: str, table: pl.DataFrame, old: ReleaseView, new: ReleaseView, a: tuple[Noise, Noise],
          b: tuple[Noise, Noise], exact: np.ndarray) -> Tested:
    def release(view: ReleaseView, noises: tuple[Noise, Noise], suffix: str) -> MeanRelease:
        grid = rep.mean_grid(view.summary)
        assert grid is not None  # (checked by _mean_reason)
        values = [table[f"{c}_{suffix}"].cast(pl.Float64).fill_null(float("nan")).to_numpy() for c in ("count", column)]
        return MeanRelease(grid, noises[0], noises[1], values[0], values[1],
                           display_half(view, column, float(grid.step)))

    return mean_test(column, diffs_of(table, column), release(old, a, "old"), release(new, b, "new"), exact)


# -- tabulate -----------------------------------------------------------------------------------------------------

def _row_noises(view: ReleaseView, levels: dict[str, rep.LevelNoise], table: pl.DataFrame, suffix: str
                ) -> list[Noise | None]:
    """Each joined row's noise in ``view`` (None where the cell is not in it)."""
    present = table["count_" + suffix].is_not_null().to_list()
    out: list[Noise | None] = []
    for level, age, here in zip(table["level"].cast(pl.String).to_list(), table["age"].cast(pl.String).to_list(),
                                present, strict=True):
        if not here:
            out.append(None)
            continue
        lv = levels.get(str(level))
        if lv is None:
            raise DataError(f"{view.name!r}: level {level!r} is not in its summary: not its summary")
        out.append(lv.totals if age == "total" else lv.cells)
    return out


def tabulate_pairing(old: ReleaseView, new: ReleaseView) -> Pairing:
    """Tabulations (see the module docstring)."""
    levels = []
    for view in (old, new):
        require_report(view)
        check_rows(view)
        lv = rep.tabulate_levels(view.name, view.summary)
        check_margin(view, "count", {float(rep.unslacked(n).margin95()) for x in lv.values()
                                     for n in (x.cells, x.total_only)}, Fraction(1))
        levels.append(lv)
    table = join(old.table, new.table, list(TABULATE_KEYS), ["count"])
    exact = np.full(table.height, shared_seed(old, new))
    tested = integer_test("count", diffs_of(table, "count"), _row_noises(old, levels[0], table, "old"),
                          _row_noises(new, levels[1], table, "new"), Fraction(1), 0.0, exact)
    noise = {"count": {side: {name: {"cells": noise_json(x.cells, Fraction(1)),
                                     "total_only": noise_json(x.total_only, Fraction(1))} for name, x in lv.items()}
                       for side, lv in zip(("old", "new"), levels, strict=True)}}
    return Pairing(table, TABULATE_KEYS, (), (tested,), {}, "seed" if exact.any() else "none", noise)
