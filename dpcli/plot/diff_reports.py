"""What ``dpcli diff`` reads of a release's public report: the one module that knows the report's field names.

A report is the release's ``--json`` summary, or for a file written with ``-o`` the copy its ledger entry keeps
(:func:`report_of_entry`). Everything here is public: noise families and scales, the value grid and bounds, the
seed's id, counts of released rows. A report that does not say what diff needs is refused (exit 65,
:class:`dpcli.errors.DataError`), never guessed at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpcli.core import mechanisms as mech
from dpcli.core.differences import MeanGrid
from dpcli.core.mechanisms import Noise
from dpcli.errors import DataError

#: A report gives scales to 6 significant digits: each is taken one part in 10⁵ larger, so a margin never uses a
#: scale below the one the noise was drawn with.
SCALE_SLACK = Fraction(100001, 100000)
#: The histogram measurements and the column each one's noise is added to (``sum`` → ``sum_<value>``).
HISTOGRAM_COLUMNS = {"rows": "count", "units": "count_units", "sum": "sum_"}
#: What a release chose to bound contributions with (when two releases differ here, so do their bounded truths).
BOUNDS_FIELDS = ("max_partitions", "max_contributions", "bounds", "auto")
#: The same for an sql release (its value bounds are the query's, the same in both).
SQL_BOUNDS_FIELDS = ("max_partitions", "max_rows_per_table", "auto")


def command(report: dict[str, Any]) -> str | None:
    """The command that wrote the release."""
    c = report.get("command")
    return c if isinstance(c, str) else None


def seed_id(report: dict[str, Any]) -> str | None:
    """The release's seed id: two releases with the same one drew the same noise."""
    s = report.get("seed_id")
    return s if isinstance(s, str) and s else None


def stream_id(report: dict[str, Any]) -> str | None:
    """A stream's own seed id (a ``--state`` run's seed id is the stream's, ``/`` and the end of its last trigger):
    two stream releases with the same one share every tree."""
    s = seed_id(report)
    return s.split("/", 1)[0] if s else None


def from_state_file(report: dict[str, Any]) -> bool:
    """A run of a ``--state`` stream (its file holds that run's triggers only, not the window's earlier ones)."""
    return bool(report.get("state"))


def released_rows(report: dict[str, Any], kind: str) -> int | None:
    """How many rows (histogram: groups) the report says its release holds, if it says."""
    field = {"histogram": "groups", "sql": "groups", "tabulate": "rows", "stream-replay": "releases"}.get(kind)
    n = report.get(field) if field else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def bounds_in_force(report: dict[str, Any], kind: str) -> dict[str, Any]:
    """The contribution and value bounds a release of ``kind`` was computed under ({} for a kind whose are fixed by
    its spec or state: tabulate, stream-replay)."""
    fields = SQL_BOUNDS_FIELDS if kind == "sql" else BOUNDS_FIELDS if kind in ("histogram", "topk") else ()
    found = {k: report.get(k) for k in fields}
    auto = found.get("auto")
    if isinstance(auto, dict):  # what was chosen, not the budget that chose it (the same caps at two ε are the same)
        found["auto"] = {k: v for k, v in auto.items() if k not in ("epsilon", "rho")}
    return found


def thresholded(report: dict[str, Any]) -> bool:
    """Groups selected by a threshold on a noisy count (their margins given selection vary by group)."""
    return report.get("threshold") is not None


def noise(name: str, m: Any) -> Noise:
    """A measurement's noise from its description (``discrete_laplace`` with ``scale``, ``discrete_gaussian`` with
    ``sigma``), taken :data:`SCALE_SLACK` larger."""
    try:
        if m.get("noise") == "discrete_laplace":
            return Noise("laplace", Fraction(str(m["scale"])) * SCALE_SLACK)
        if m.get("noise") == "discrete_gaussian":
            return Noise("gaussian", (Fraction(str(m["sigma"])) * SCALE_SLACK) ** 2)
    except (AttributeError, KeyError, ValueError, ZeroDivisionError):
        pass
    raise DataError(f"{name!r}: its summary's noise is not one dpcli diff can combine "
                    f"({m.get('noise') if isinstance(m, dict) else m!r})")


def unslacked(n: Noise) -> Noise:
    """The noise as the report states it (:data:`SCALE_SLACK` taken back off): the margins a file shows."""
    return Noise(n.kind, n.param / (SCALE_SLACK if n.kind == "laplace" else SCALE_SLACK**2))


def histogram_measurements(name: str, report: dict[str, Any]) -> dict[str, Noise]:
    """A histogram's (or topk's) measurements that carry discrete noise, by name (``rows``, ``units``, ``sum``,
    ``csum``, …); a topk release's one count noise as ``rows``."""
    if command(report) == "topk":
        return {"rows": noise(name, report.get("count_noise"))}
    measurements = report.get("measurements")
    if not isinstance(measurements, dict):
        raise DataError(f"{name!r}: its summary has no measurements (give the release's --json summary)")
    return {k: noise(name, m) for k, m in measurements.items()
            if isinstance(m, dict) and str(m.get("noise", "")).startswith("discrete_")}


def granularity(report: dict[str, Any]) -> Fraction:
    """The step of the value grid (sums and means are multiples of it in grid units; 1 without one)."""
    try:
        return Fraction(str(report.get("granularity") or 1))
    except (ValueError, ZeroDivisionError):
        raise DataError("a summary's granularity is not a number") from None


def mean_grid(report: dict[str, Any]) -> MeanGrid | None:
    """The value bounds and grid a histogram's means were computed on (None when the report does not say)."""
    bounds = report.get("bounds")
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, int | float) for b in bounds)):
        return None
    lo, hi = float(bounds[0]), float(bounds[1])
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        return None
    return MeanGrid(lo, hi, granularity(report))


@dataclass(frozen=True)
class LevelNoise:
    """A tabulate level's noise: of its Sex × Age cells and the totals of groups that chose the total (``cells``),
    and of TotalOnly groups' totals (``total_only``); ``totals``: which a ``total`` row carries (the larger when the
    level has both kinds: the report does not say which group is which)."""

    cells: Noise
    total_only: Noise
    totals: Noise


def tabulate_levels(name: str, report: dict[str, Any]) -> dict[str, LevelNoise]:
    """Every level of a tabulation and its noises (from ``levels``: the cells' noise, the per-group budget, how
    many groups took each branch)."""
    family = report.get("noise")
    levels = report.get("levels")
    if family not in ("geometric", "discrete-gaussian") or not isinstance(levels, list):
        raise DataError(f"{name!r}: its summary does not give the tabulation's levels and noise")
    out: dict[str, LevelNoise] = {}
    for lv in levels:
        try:
            per_group = Fraction(str(lv["per_group"]))
            whole = mech.laplace(1, per_group) if family == "geometric" else mech.gaussian(1, per_group)
            branches = lv.get("branches") or {}
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            raise DataError(f"{name!r}: a level of its summary has no per-group budget") from None
        total_only = Noise(whole.kind, whole.param * (SCALE_SLACK if whole.kind == "laplace" else SCALE_SLACK**2))
        cells = noise(name, lv.get("noise"))
        if not branches.get("total_only"):
            totals = cells
        elif not branches.get("total"):
            totals = total_only
        else:
            totals = max(cells, total_only, key=lambda n: n.param)
        out[str(lv.get("level"))] = LevelNoise(cells, total_only, totals)
    return out


@dataclass(frozen=True)
class StreamNoise:
    """A stream's perturbation trees: each node's noise variance for counts and (in the sum's own units) sums, and
    a bound on the sums' grid step (for the rounding of the released sums)."""

    count_sigma2: float
    sum_sigma2: float | None
    sum_step: float | None


def stream_noise(name: str, report: dict[str, Any]) -> StreamNoise:
    """A stream-replay release's tree calibration, from ``perturbation`` (σ of the count and of the sum).

    The sum's grid step g is not in the report; it is bounded from it: a stream's grid is the largest power of two
    with at least 2¹⁰ steps in [−L, L] (g ≤ 2L/1024), and σ_sum/σ_count = ⌊L/g⌋·g > L − g, so g < 2·σ_sum/σ_count
    /1022. Only the rounding term uses it, and a larger g only widens the margin."""
    p = report.get("perturbation")
    try:
        count = float(p["sigma_count"])  # type: ignore[index]
        total = p.get("sigma_sum")  # type: ignore[union-attr]
        summed = float(total) if total is not None else None
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{name!r}: its summary does not give the stream's noise (perturbation)") from None
    if not (math.isfinite(count) and count > 0) or (summed is not None and not (math.isfinite(summed) and summed > 0)):
        raise DataError(f"{name!r}: its summary's stream noise is not a positive number")
    slack = float(SCALE_SLACK**2)
    return StreamNoise(count * count * slack, summed * summed * slack if summed is not None else None,
                       2.0 * summed / count / 1022 if summed is not None else None)


def report_of_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """The report a ledger entry keeps for the file it wrote, with the entry's seed id ({} for an entry without
    one: written before dpcli kept them)."""
    report = entry.get("report")
    if not isinstance(report, dict):
        return {}
    return {**report, "seed_id": entry.get("seed_id")}
