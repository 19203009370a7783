"""Which groups and columns of two ``dpcli sql`` releases ``dpcli diff`` compares, and with which noise.

An sql release's columns are the query's own names; its report says which are aggregates and, for a count or a
sum, which noisy measurement each one is (``columns``: ``aggregate``, ``measurement``, a sum's ``granularity``;
:func:`dpcli.tasks.sql.describe.released_columns`). Those are compared per group (the query's other columns) as
two independent integer noises (counts in units of 1, sums in grid units), exactly as ``histogram``'s; a
threshold's selected groups keep margins that vary by group, so their files' margins are not checked. ``ANON_AVG``,
``ANON_VAR`` and ``ANON_STDDEV`` are not compared: each is a ratio over a noisy count of units that the release does
not show (histogram's means are compared because the count beside them is that n); NTILEs and medians come from the
exponential mechanism, with no noise to difference.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from dpcli.core.mechanisms import Noise
from dpcli.errors import DataError
from dpcli.plot import diff_reports as rep
from dpcli.plot.diff_pairs import (
    Pairing,
    check_margin,
    check_rows,
    diffs_of,
    display_half,
    join,
    noise_json,
    require_report,
    shared_seed,
)
from dpcli.plot.diff_tests import integer_test
from dpcli.plot.release_view import ReleaseView

#: Why an sql aggregate is not compared, by its aggregate.
NOT_COMPARED = {
    "avg": "a per-unit mean over a noisy count of units the release does not show: its difference is not combined",
    "var": "a variance's margin is a union bound over three measurements, not combined here",
    "stddev": "a standard deviation's margin is a union bound over three measurements, not combined here",
    "ntile": "a quantile is chosen by the exponential mechanism, with no noise of its own to difference",
}
#: The aggregates compared: one noisy measurement each.
COMPARED = ("count", "count_units", "sum")


def _columns(view: ReleaseView) -> tuple[dict[str, tuple[Noise, Fraction]], dict[str, str], dict[str, str]]:
    """(compared column → its noise and grid step, left-out column → why, column → its aggregate)."""
    named = view.summary.get("columns")
    measurements = view.summary.get("measurements")
    if not isinstance(named, dict) or not isinstance(measurements, dict):
        raise DataError(f"{view.name!r}: its summary does not name its columns' measurements")
    compared: dict[str, tuple[Noise, Fraction]] = {}
    left_out: dict[str, str] = {}
    aggregates: dict[str, str] = {}
    for column in view.values:
        entry = named.get(column)
        if not isinstance(entry, dict):
            raise DataError(f"{view.name!r}: its summary does not describe column {column!r}")
        aggregate = str(entry.get("aggregate"))
        aggregates[column] = aggregate
        if aggregate not in COMPARED:
            left_out[column] = NOT_COMPARED.get(aggregate, "not a noisy count or sum")
            continue
        compared[column] = (rep.noise(view.name, measurements.get(str(entry.get("measurement")))),
                            _step(view, entry) if aggregate == "sum" else Fraction(1))
    return compared, left_out, aggregates


def _step(view: ReleaseView, entry: dict[str, Any]) -> Fraction:
    try:
        return Fraction(str(entry["granularity"]))
    except (KeyError, ValueError, ZeroDivisionError):
        raise DataError(f"{view.name!r}: its summary does not give a sum's grid step") from None


def sql_pairing(old: ReleaseView, new: ReleaseView) -> Pairing:
    """Two sql releases (see the module docstring)."""
    sides = []
    for view in (old, new):
        require_report(view)
        check_rows(view)
        compared, left_out, aggregates = _columns(view)
        if not rep.thresholded(view.summary):  # a threshold's selected groups: margins given selection vary
            for column, (n, step) in compared.items():
                check_margin(view, column, {float(rep.unslacked(n).margin95() * step)}, step)
        sides.append((compared, left_out, aggregates))
    (a, left_out, agg_a), (b, _, agg_b) = sides
    if agg_a != agg_b:
        raise DataError(f"{old.name!r} and {new.name!r} are not releases of one query (their columns aggregate "
                        "differently)")
    if any(a[c][1] != b[c][1] for c in a):
        raise DataError(f"{old.name!r} and {new.name!r} released their sums on different grids (bounds or "
                        "granularity)")
    columns = [c for c in old.values if c in a]
    table = join(old.table, new.table, list(old.keys), columns)
    exact = np.full(table.height, shared_seed(old, new))
    tested = tuple(integer_test(c, diffs_of(table, c), [a[c][0]] * table.height, [b[c][0]] * table.height, a[c][1],
                                display_half(old, c, None) + display_half(new, c, None), exact) for c in columns)
    noise = {c: {"old": noise_json(*a[c]), "new": noise_json(*b[c])} for c in columns}
    return Pairing(table, old.keys, (), tested, left_out, "seed" if exact.any() else "none", noise)
