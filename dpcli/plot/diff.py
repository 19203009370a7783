"""Noise-aware differences of two releases of one query (``dpcli diff``): pure post-processing of released values.

Each release is read with its public report (its ``--json`` summary, or the copy the ledger entry that wrote the
file keeps: :mod:`dpcli.plot.diff_reports`), which gives the noise of every released value. The two are lined up
group by group (:mod:`dpcli.plot.diff_pairs`: histogram and topk groups, tabulate cells; :mod:`dpcli.plot.diff_stream`:
a stream's windows and keys at each release's last trigger), and each compared column's difference gets a 95%
margin, a p-value for "nothing changed" and a one-sided margin (:mod:`dpcli.plot.diff_tests`): exact for two
independent integer noises (or a bound that covers more), a union bound for means, the normal distribution of the
exact variance for a stream's trees, 0 for two releases that share their noise (the same seed: a free replay, a
schedule's epoch released again, a stream's trigger released twice).

The groups flagged "changed" are those Benjamini–Hochberg selects over every group and column at the
false-discovery rate asked (default 5%: 1,458 airports would otherwise flag about 73 a night by chance). With
``at_least`` D, a group whose every difference is within ±D by two one-sided tests at 5% (TOST) is "unchanged".
Groups released in one file only (a threshold crossed by the noisy count) are listed as such: that says the noisy
count crossed the threshold, not that the group is new or gone. The margins are the unconditional noises' (for a
group far above a threshold, the same as given its release). When the two releases bounded contributions
differently (caps or value bounds chosen from the data each time), their bounded truths differ too: the summary's
``bounds_differ`` names those bounds, and a difference may be theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import polars as pl

from dpcli.core.differences import benjamini_hochberg
from dpcli.errors import DataError
from dpcli.plot import diff_reports as rep
from dpcli.plot.diff_pairs import Pairing, histogram_pairing, same_shape, tabulate_pairing
from dpcli.plot.diff_stream import stream_pairing
from dpcli.plot.diff_tests import SAME, Tested
from dpcli.plot.release_view import ReleaseView

#: The verdicts of the ``changed`` column.
VERDICTS = ("changed", "not shown to change", "unchanged", "released in new only", "released in old only")


class DiffSummary(TypedDict):
    """What ``dpcli diff`` says of the comparison (its ``--json`` summary; :mod:`dpcli.cli.diff` reads it by name):
    the releases and their kind, whether they share their noise (the same seed) or a stream's trees, the false
    discovery rate, the bounds that differ between them, ``--at-least``, the columns tested with each one's margin
    of the difference (None where it varies by group) and how it was computed, those not compared and why, the groups
    by verdict and the noise each release had."""

    command: str
    kind: str
    old: str
    new: str
    shared_noise: bool
    shared_trees: bool
    fdr: float
    bounds_differ: list[str]
    at_least: float | None
    columns: list[str]
    not_compared: list[str]
    not_compared_why: dict[str, str]
    diff_moe95: dict[str, float | int | None]
    margins: dict[str, str]
    groups: dict[str, int]
    noise: dict[str, Any]


@dataclass(frozen=True)
class Diff:
    """The per-group table of differences and what a reader needs to interpret it (public: released values,
    the reports' calibrations and the options)."""

    table: pl.DataFrame
    summary: DiffSummary


def pairing_of(old: ReleaseView, new: ReleaseView) -> Pairing:
    """The two releases lined up, each compared column tested (refused, exit 65, unless they are of one query)."""
    kind = same_shape(old, new)
    if kind == "stream-replay":
        return stream_pairing(old, new)
    if kind == "tabulate":
        return tabulate_pairing(old, new)
    if kind == "sql":
        from dpcli.plot.diff_sql import sql_pairing

        return sql_pairing(old, new)
    return histogram_pairing(old, new)


def diff(old: ReleaseView, new: ReleaseView, fdr: float = 0.05, at_least: float | None = None) -> Diff:
    """The differences of ``new`` from ``old`` per group (see the module docstring). Releases or summaries no dpcli
    wrote (values out of any range, a noise scale of 0 or below, a column of records): refused (exit 65) naming
    the failure's type, never an internal error, and no library's warning reaches stderr."""
    import warnings

    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return _diff(old, new, fdr, at_least)
    except (ArithmeticError, ValueError, TypeError, pl.exceptions.PolarsError) as exc:
        raise DataError(f"cannot compare {old.name!r} and {new.name!r}: their values or summaries are not ones "
                        f"dpcli releases ({type(exc).__name__})") from None


def _diff(old: ReleaseView, new: ReleaseView, fdr: float, at_least: float | None) -> Diff:
    pairing = pairing_of(old, new)
    t, tested = pairing.table, pairing.tested
    p = np.column_stack([x.p for x in tested]) if tested else np.full((t.height, 0), np.nan)
    live = ~np.isnan(p)
    flags = np.zeros(p.shape, dtype=bool)
    flags[live] = benjamini_hochberg(p[live].tolist(), fdr)
    exact = np.column_stack([x.exact for x in tested]) if tested else np.zeros(p.shape, dtype=bool)
    unchanged = live.all(axis=1) & live.any(axis=1) & (exact & (p == 1.0)).all(axis=1)
    if at_least is not None and tested:
        within = np.column_stack([np.abs(_diffs(t, x.column)) + x.one_sided < at_least for x in tested])
        unchanged |= live.all(axis=1) & within.all(axis=1)
    changed = [_verdict(t, tested, i, bool(flags[i].any()), bool(unchanged[i])) for i in range(t.height)]
    smallest = [float(row[~np.isnan(row)].min()) if (~np.isnan(row)).any() else None for row in p]
    columns = [x.column for x in tested]
    out = t.with_columns(*(_margin_series(t, x) for x in tested), pl.Series("p", smallest, dtype=pl.Float64).round(6),
                         pl.Series("changed", changed, dtype=pl.String))
    ordered = [*pairing.keys, *pairing.extra,
               *[f"{c}{s}" for c in columns for s in ("_old", "_new", "_diff", "_diff_moe95")], "p", "changed"]
    table = out.select(ordered).sort(list(pairing.keys), nulls_last=True)
    return Diff(table, _summary(old, new, table, pairing, fdr, at_least))


def _diffs(t: pl.DataFrame, column: str) -> np.ndarray:
    return t[f"{column}_diff"].cast(pl.Float64).fill_null(float("nan")).to_numpy()


def _margin_series(t: pl.DataFrame, x: Tested) -> pl.Series:
    """A column's margins, as the column's type: whole numbers for counts (null for a group in one file only)."""
    m = x.margin
    name = f"{x.column}_diff_moe95"
    finite = m[~np.isnan(m)]
    if t[f"{x.column}_old"].dtype.is_integer() and np.all(finite == np.round(finite)):
        return pl.Series(name, [None if np.isnan(v) else int(v) for v in m], dtype=pl.Int64)
    return pl.Series(name, m, dtype=pl.Float64).fill_nan(None)


def _verdict(t: pl.DataFrame, tested: tuple[Tested, ...], i: int, flagged: bool, unchanged: bool) -> str:
    row = t.row(i, named=True)
    old_missing = all(row[f"{x.column}_old"] is None for x in tested)
    new_missing = all(row[f"{x.column}_new"] is None for x in tested)
    if old_missing and not new_missing:
        return "released in new only"
    if new_missing and not old_missing:
        return "released in old only"
    if flagged:
        return "changed"
    return "unchanged" if unchanged else "not shown to change"


def _uniform(margins: np.ndarray) -> float | int | None:
    """A column's margin when every group's is the same (None when they vary: by group, level or trigger)."""
    finite = margins[~np.isnan(margins)]
    if not finite.size or not np.all(finite == finite[0]):
        return None
    first = float(finite[0])
    return int(first) if first.is_integer() else first


def _summary(old: ReleaseView, new: ReleaseView, table: pl.DataFrame, pairing: Pairing, fdr: float,
             at_least: float | None) -> DiffSummary:
    verdicts = table["changed"].value_counts().to_dicts() if table.height else []
    a, b = rep.bounds_in_force(old.summary, old.kind), rep.bounds_in_force(new.summary, new.kind)
    return {
        "command": "diff", "kind": old.kind, "old": old.name, "new": new.name,
        "shared_noise": pairing.shared == "seed", "shared_trees": pairing.shared == "stream", "fdr": fdr,
        "bounds_differ": [k for k in a if a[k] != b.get(k)],
        "at_least": at_least, "columns": [x.column for x in pairing.tested],
        "not_compared": list(pairing.not_compared), "not_compared_why": pairing.not_compared,
        "diff_moe95": {x.column: _uniform(x.margin) for x in pairing.tested},
        "margins": {x.column: SAME if pairing.shared == "seed" else x.how for x in pairing.tested},
        "groups": {v["changed"]: v["count"] for v in verdicts}, "noise": pairing.noise,
    }
