"""``dpcli diff`` of two stream-replay releases: per window and key, the values at each release's last trigger.

A value released at trigger t is the Honaker prefix estimate of its key's perturbation tree after t − s + 1
leaves, where s is the key's first release in the window (the tree starts there). Two releases of one stream (the
same stream seed: a ``--state`` stream's runs, or replays of one file through later triggers) read the same tree:
their difference's noise is a weighted sum of the tree's node noises, with the nodes both prefixes weigh alike
cancelling, and its variance is computed exactly from the tree (:func:`dpcli.core.differences.shared_tree_variance`;
the same trigger twice: exactly 0). Two independent streams add their two prefix variances.

s is the key's first trigger in the window. A one-shot replay's file holds every release up to its last trigger,
so s is the first trigger the key shows there; a ``--state`` run's file holds its own triggers only, so s may lie
earlier, and the variance is the largest over every s up to the first one shown (conservative).

Values are rounded to whole counts (sums to their grid), so the difference is normal with that variance plus the
two roundings' (:data:`dpcli.core.differences.ROUNDING_VARIANCE`), as the stream's own margins are normal.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import polars as pl

from dpcli.core import differences as d
from dpcli.core import tree
from dpcli.core.display import UTC_FORMAT
from dpcli.errors import DataError
from dpcli.plot import diff_reports as rep
from dpcli.plot.diff_pairs import Pairing, diffs_of, display_half, join
from dpcli.plot.diff_tests import normal_test
from dpcli.plot.release_view import ReleaseView

#: The columns beside the keys: each release's trigger of the values compared.
TRIGGERS = ("trigger_old", "trigger_new")


def _latest(view: ReleaseView) -> pl.DataFrame:
    """Per window and key, the values at its last trigger in the file, that trigger and its first."""
    t = view.table
    if t.schema.get("window_start") == pl.Datetime:
        t = t.with_columns(pl.col("window_start").dt.replace_time_zone("UTC").dt.strftime(UTC_FORMAT))
    t = t.with_columns(pl.col("window_start").cast(pl.String), pl.col("trigger").cast(pl.Int64))
    return t.group_by(["window_start", *view.keys], maintain_order=True).agg(
        pl.col("trigger").max().alias("trigger"), pl.col("trigger").min().alias("first"),
        *[pl.col(c).sort_by("trigger").last() for c in view.values])


@lru_cache(maxsize=4096)
def _unknown_start(t1: int, t2: int, first: int) -> float:
    """The largest unit variance of a difference of one tree's values at triggers t1 and t2, over every start of
    the tree up to ``first``."""
    return max(d.shared_tree_variance(1.0, t1 - s + 1, t2 - s + 1) for s in range(1, first + 1))


def _one_tree(t: int, first: int, known: bool) -> float:
    """The unit variance of one tree's value at trigger t: after t − s + 1 leaves, s = ``first`` if ``known``, else
    the largest over every start up to it."""
    lam = tree.prefix_variances(1.0, t)
    return float(lam[t - first]) if known else float(lam[t - first:].max())


def _unit_variances(table: pl.DataFrame, old: ReleaseView, new: ReleaseView, shared: bool) -> tuple[np.ndarray,
                                                                                                 np.ndarray]:
    """Per group, the unit variance (node noise of variance 1) the old and the new value's noise contribute:
    with one tree, all of it as the first (the second 0); with two, each tree's own."""
    known = not (rep.from_state_file(old.summary) or rep.from_state_file(new.summary))
    rows = table.select("trigger_old", "trigger_new", "first_old", "first_new").rows()
    first_of, second = np.full(len(rows), np.nan), np.zeros(len(rows))
    for i, (t1, t2, f1, f2) in enumerate(rows):
        if None in (t1, t2):
            continue
        if shared:
            s = min(f1, f2)
            first_of[i] = (d.shared_tree_variance(1.0, t1 - s + 1, t2 - s + 1) if known
                           else _unknown_start(t1, t2, s))
        else:
            first_of[i], second[i] = (_one_tree(t1, f1, not rep.from_state_file(old.summary)),
                                      _one_tree(t2, f2, not rep.from_state_file(new.summary)))
    return first_of, second


def stream_pairing(old: ReleaseView, new: ReleaseView) -> Pairing:
    """Two stream-replay releases (see the module docstring)."""
    noises = []
    for view in (old, new):
        if not view.summary:
            raise DataError(f"{view.name!r} has no summary: give it with --old-summary/--new-summary FILE, or a file "
                            "written with -o whose entry in your ledger records it")
        n = rep.released_rows(view.summary, view.kind)
        if n is not None and n != view.table.height:
            raise DataError(f"{view.name!r} holds {view.table.height} rows, its summary {n}: not its summary")
        noises.append(rep.stream_noise(view.name, view.summary))
    a, b = noises
    columns = list(old.values)
    if any(c != "count" for c in columns) and (a.sum_sigma2 is None or b.sum_sigma2 is None):
        raise DataError(f"{old.name!r} / {new.name!r}: a summary gives no noise of the stream's sums")
    lo, ln = _latest(old), _latest(new)
    keys = ["window_start", *old.keys]
    table = join(lo, ln, keys, [*columns, "trigger", "first"]).drop("trigger_diff", "first_diff")
    sid = rep.stream_id(old.summary)
    shared = sid is not None and sid == rep.stream_id(new.summary)
    unit_a, unit_b = _unit_variances(table, old, new, shared)
    tested = []
    for c in columns:
        integer = c == "count"
        s2a, s2b = (a.count_sigma2, b.count_sigma2) if integer else (a.sum_sigma2 or 0.0, b.sum_sigma2 or 0.0)
        step = 1.0 if integer else max(a.sum_step or 0.0, b.sum_step or 0.0)
        noise_var = s2a * unit_a + s2b * unit_b
        variance = np.where(noise_var > 0, noise_var + d.ROUNDING_VARIANCE * step * step, 0.0)
        half = display_half(old, c, None) + display_half(new, c, None)
        tested.append(normal_test(c, diffs_of(table, c), variance, step, integer, half))
    table = table.drop("first_old", "first_new")
    noise = {"count": {"old": {"sigma2": f"{a.count_sigma2:.6g}"}, "new": {"sigma2": f"{b.count_sigma2:.6g}"}}}
    return Pairing(table, tuple(keys), TRIGGERS, tuple(tested), {}, "stream" if shared else "none", noise)
