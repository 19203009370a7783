"""Noise-aware differences of two releases of one query (``dpcli diff``): pure post-processing of released values.

Each release is read with its ``--json`` summary (:func:`dpcli.plot.release_view.read_release`), whose
``measurements`` give the noise of each released count and sum (``rows`` → ``count``, ``units`` →
``count_units``, ``sum`` → ``sum_<value>``, in grid units of the summary's ``granularity``). Per group and
measured column the difference gets a 95% margin for the difference of the two noises
(:func:`dpcli.core.differences.difference_margin`), and a p-value for "nothing changed"; the groups flagged
"changed" are those Benjamini–Hochberg selects over every group and column at the false-discovery rate asked
(default 5%: 1,458 airports would otherwise flag about 73 a night by chance). With ``at_least`` D, a group
whose every difference is within ±D by two one-sided tests at 5% (TOST) is "unchanged". Two releases with the
same seed share their noise (a free replay, a schedule's repeated epoch): their difference is exact, with a
margin of 0. Groups released in one file only (a threshold crossed by the noisy count) are listed as such:
that says the noisy count crossed the threshold, not that the group is new or gone. The margins are the
unconditional noises' (for a group far above a threshold, the same as given its release). When the two releases
bounded contributions differently (caps or value bounds chosen from the data each time), their bounded truths
differ too: the summary's ``bounds_differ`` names those bounds, and a difference may be theirs.

Means, variances and quantiles are not compared (their margins are not noise of one integer measurement), nor
are stream triggers (their noises share tree nodes) or top-k ranks; such columns are left out and said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import polars as pl

from dpcli.core.differences import benjamini_hochberg, difference_margin, difference_p_value, one_sided_margin
from dpcli.core.mechanisms import Noise
from dpcli.errors import DataError
from dpcli.plot.release_view import ReleaseView

#: The measurements a histogram's summary names, and the column each one's noise is added to.
MEASURED = {"rows": "count", "units": "count_units", "sum": "sum_"}
#: A summary gives scales to 6 significant digits: each is taken one part in 10⁵ larger, so a margin never uses a
#: scale below the one the noise was drawn with.
SCALE_SLACK = Fraction(100001, 100000)


@dataclass(frozen=True)
class Calibrated:
    """A released column and its noise: integer noise ``noise`` times ``step`` (the grid) in output units."""

    column: str
    noise: Noise
    step: Fraction


@dataclass(frozen=True)
class Diff:
    """The per-group table of differences and what a reader needs to interpret it (public: released values,
    the summaries' calibrations and the options)."""

    table: pl.DataFrame
    summary: dict[str, Any]


def calibration(view: ReleaseView) -> dict[str, Calibrated]:
    """Each compared column of a histogram release and its noise, from its summary (refused, exit 65, when the
    summary does not say)."""
    s = view.summary
    if not s:
        raise DataError(f"{view.name!r} has no summary: give it with --old-summary/--new-summary FILE (the --json "
                        "output of the run that wrote it), or diff the runs' --json documents")
    if view.kind != "histogram" or s.get("command") != "histogram":
        raise DataError(f"{view.name!r}: dpcli diff compares histogram releases; its summary is of "
                        f"{s.get('command')!r}")
    measurements = s.get("measurements")
    if not isinstance(measurements, dict):
        raise DataError(f"{view.name!r}: its summary has no measurements (give the release's --json summary)")
    grid = Fraction(str(s.get("granularity") or 1))
    out: dict[str, Calibrated] = {}
    for name, m in measurements.items():
        column = _column(view, name)
        if column is not None:
            out[column] = Calibrated(column, _noise(view.name, m), grid if name == "sum" else Fraction(1))
    _check_margins(view, out)
    return out


def _check_margins(view: ReleaseView, calibrated: dict[str, Calibrated]) -> None:
    """A file written with --with-error carries each column's margin: it must be the one its summary's noise gives
    (a summary of another run is refused, exit 65), and the summary's group count the file's."""
    groups = view.summary.get("groups")
    if isinstance(groups, int) and groups != view.table.height:
        raise DataError(f"{view.name!r} holds {view.table.height} groups, its summary {groups}: not its summary")
    if view.summary.get("threshold") is not None:
        return  # a thresholded release's margins are given its selection: they vary by group
    for column, c in calibrated.items():
        shown = f"{column}_moe95"
        if shown in view.table.columns and view.table.height:
            stated = view.table[shown].drop_nulls().cast(pl.Float64)
            unslacked = c.noise.param / (SCALE_SLACK if c.noise.kind == "laplace" else SCALE_SLACK**2)
            expected = float(Noise(c.noise.kind, unslacked).margin95() * c.step)
            off = (stated - expected).abs().max()
            slack = max(1.0, 0.005 * expected) + float(c.step)  # the scale's 6 digits, the file's rounding
            if stated.len() and isinstance(off, float) and off > slack:
                raise DataError(f"{view.name!r}: its {shown} ({stated[0]:g}) is not the margin its summary's noise "
                                f"gives ({expected:g}): not its summary")


def _column(view: ReleaseView, measurement: str) -> str | None:
    wanted = MEASURED.get(measurement)
    if wanted is None:
        return None
    if wanted.endswith("_"):
        sums = [c for c in view.values if c.startswith(wanted)]
        return sums[0] if len(sums) == 1 else None
    return wanted if wanted in view.values else None


def _noise(name: str, m: dict[str, Any]) -> Noise:
    try:
        if m.get("noise") == "discrete_laplace":
            return Noise("laplace", Fraction(str(m["scale"])) * SCALE_SLACK)
        if m.get("noise") == "discrete_gaussian":
            return Noise("gaussian", (Fraction(str(m["sigma"])) * SCALE_SLACK) ** 2)
    except (KeyError, ValueError, ZeroDivisionError):
        pass
    raise DataError(f"{name!r}: its summary's noise is not one dpcli diff can combine ({m.get('noise')!r})")


def diff(old: ReleaseView, new: ReleaseView, fdr: float = 0.05, at_least: float | None = None) -> Diff:
    """The differences of ``new`` from ``old`` per group (see the module docstring)."""
    a, b = calibration(old), calibration(new)
    if old.keys != new.keys or sorted(a) != sorted(b):
        raise DataError(f"{old.name!r} and {new.name!r} are not releases of one query shape (groups "
                        f"{list(old.keys)} / {list(new.keys)}, columns {sorted(a)} / {sorted(b)})")
    if any(a[c].step != b[c].step for c in a):
        raise DataError(f"{old.name!r} and {new.name!r} released their sums on different grids (--granularity)")
    shared = bool(old.summary.get("seed_id")) and old.summary.get("seed_id") == new.summary.get("seed_id")
    keys = list(old.keys)
    columns = sorted(a)
    joined = old.table.select(*keys, *columns).join(new.table.select(*keys, *columns), on=keys, how="full",
                                                    suffix="_new", coalesce=True, nulls_equal=True)
    joined = joined.rename({c: f"{c}_old" for c in columns})
    out = joined.with_columns(*(pl.col(f"{c}_new").sub(pl.col(f"{c}_old")).alias(f"{c}_diff") for c in columns))
    margins = {c: _margin(a[c], b[c], shared) for c in columns}
    p_values, tost = _tests(out, columns, a, b, shared, at_least)
    flagged = iter(benjamini_hochberg([p for row in p_values for p in row], fdr))
    changed = []
    for i, row in enumerate(p_values):
        hits = [next(flagged) for _ in row]
        exact_zero = shared and bool(row) and all(r == 1.0 for r in row)  # the same noise, the same values
        changed.append(_verdict(out, columns, i, any(hits), exact_zero or (tost[i] if tost else False)))
    smallest = [min(row) if row else None for row in p_values]
    table = out.with_columns(*(_margin_column(margins[c], a[c]).alias(f"{c}_diff_moe95") for c in columns),
                             pl.Series("p", smallest, dtype=pl.Float64).round(6),
                             pl.Series("changed", changed, dtype=pl.String))
    ordered = [*keys, *[f"{c}{s}" for c in columns for s in ("_old", "_new", "_diff", "_diff_moe95")], "p", "changed"]
    table = table.select(ordered).sort(keys, nulls_last=True)
    return Diff(table, _summary(old, new, table, columns, margins, shared, fdr, at_least, a, b))


def _margin_column(margin: float, c: Calibrated) -> pl.Expr:
    """A margin as the released column's type: an integer for counts (and integer grids)."""
    return pl.lit(int(margin)) if c.step.denominator == 1 else pl.lit(margin)


def _margin(a: Calibrated, b: Calibrated, shared: bool) -> float:
    """The difference's 95% margin in output units (0 when the two share their noise)."""
    return 0.0 if shared else float(difference_margin(a.noise, b.noise) * a.step)


def _tests(out: pl.DataFrame, columns: list[str], a: dict[str, Calibrated], b: dict[str, Calibrated],
           shared: bool, at_least: float | None) -> tuple[list[list[float]], list[bool]]:
    """Per group, the p-value of each column's difference (groups released in one file only: none), and whether
    every difference is within ±``at_least`` by TOST."""
    p_values: list[list[float]] = []
    tost: list[bool] = []
    one_sided = {c: 0.0 if shared else float(one_sided_margin(a[c].noise, b[c].noise) * a[c].step) for c in columns}
    for row in out.iter_rows(named=True):
        diffs = {c: row[f"{c}_diff"] for c in columns}
        if any(d is None for d in diffs.values()):
            p_values.append([])
            tost.append(False)
            continue
        p_values.append([1.0 if shared else
                         difference_p_value(a[c].noise, b[c].noise, round(diffs[c] / float(a[c].step)))
                         for c in columns])
        tost.append(at_least is not None and all(abs(diffs[c]) + one_sided[c] < at_least for c in columns))
    return p_values, (tost if at_least is not None else [])


def _verdict(out: pl.DataFrame, columns: list[str], i: int, flagged: bool, unchanged: bool) -> str:
    row = out.row(i, named=True)
    old_missing = all(row[f"{c}_old"] is None for c in columns)
    new_missing = all(row[f"{c}_new"] is None for c in columns)
    if old_missing and not new_missing:
        return "released in new only"
    if new_missing and not old_missing:
        return "released in old only"
    if flagged:
        return "changed"
    return "unchanged" if unchanged else "not shown to change"


def _summary(old: ReleaseView, new: ReleaseView, table: pl.DataFrame, columns: list[str], margins: dict[str, float],
             shared: bool, fdr: float, at_least: float | None, a: dict[str, Calibrated],
             b: dict[str, Calibrated]) -> dict[str, Any]:
    verdicts = table["changed"].value_counts().to_dicts() if table.height else []
    compared = [c for c in (*old.values,) if c not in columns]
    bounds = ("max_partitions", "max_contributions", "bounds", "auto")
    differ = [k for k in bounds if old.summary.get(k) != new.summary.get(k)]
    return {
        "command": "diff", "old": old.name, "new": new.name, "shared_noise": shared, "fdr": fdr,
        "bounds_differ": differ,
        "at_least": at_least, "columns": columns, "not_compared": compared,
        "diff_moe95": margins, "groups": {v["changed"]: v["count"] for v in verdicts},
        "noise": {c: {"old": _noise_json(a[c]), "new": _noise_json(b[c])} for c in columns},
    }


def _noise_json(c: Calibrated) -> dict[str, str]:
    key = "scale" if c.noise.kind == "laplace" else "sigma2"
    return {"noise": f"discrete_{c.noise.kind}", key: f"{float(c.noise.param):.6g}", "step": str(c.step)}
