"""``dpcli sql``'s sums, means and variances do not depend on the order of the rows (dpcli.tasks.sql.fixed).

The same rows in another order (a CSV re-exported, a Parquet rewritten with other row groups) must give the same
per-user partials, hence the same release under the same seed: a replay that differs would be a second, uncharged
release. Double sums did not: the rows below are chosen so that polars' own float sum of one user's values rounds
to another grid point in another order (asserted first, so the test can fail), and every output is compared bytes
for bytes over several permutations and chunkings. The partials are then checked against a reference computed
with :class:`fractions.Fraction` from the fixed-point definition (and, for values on the fixed-point lattice, from
the exact real sums and means).
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import polars as pl
import pytest

from dpcli.tasks import Frames
from dpcli.tasks.sql import Budget, SqlOptions, SqlTask, TableDecl, fixed
from dpcli.tasks.sql.run import bounded_partials, compute_totals, per_user_frame

SALT = 0x0BAD_CAFE_1234_5678_9ABC_DEF0_1357_9BDF
SEED = bytes(range(32))
#: user 1's float sum is 0.0625 ± ε (half a grid step of 0.125 for bounds [0, 1000]), user 2's mean too
TRICKY = {1: [1e8, 0.1, -1e8, 0.2, -0.3, 0.0625], 2: [0.1, 0.2, -0.3, 0.25]}
QUERIES = {
    "sum": "SELECT ANON_SUM(x, 0, 1000) AS s FROM t",
    "avg": "SELECT ANON_AVG(x, 0, 1000) AS a FROM t",
    "var": "SELECT ANON_VAR(x, 0, 1000) AS v, ANON_STDDEV(x, 0, 1000) AS sd FROM t",
    "grouped": "SELECT k, ANON_SUM(x, 0, 1000) AS s, ANON_AVG(x, 0, 1000) AS a, ANON_VAR(x, 0, 1000) AS v FROM t "
               "GROUP BY k",
}


def _task(query: str) -> SqlTask:
    return SqlTask.from_text(query, {"t": TableDecl("t", "u", ("u", "k", "x"))},
                             SqlOptions(Budget(epsilon=Fraction(20), delta=Fraction(1, 1000)), max_partitions=2))


def _table() -> pl.DataFrame:
    """The tricky users (and five copies of each, users 100 and up), and 40 more with 1 to 8 values each (some
    outside the bounds, some null)."""
    rng = np.random.default_rng(7)
    users, values = [], []
    for copy in range(6):
        for u, xs in TRICKY.items():
            users += [u + 100 * copy] * len(xs)
            values += xs
    for u in range(3, 43):
        n = int(rng.integers(1, 9))
        users += [u] * n
        values += [float(v) for v in rng.uniform(-50, 1100, n).round(int(rng.integers(0, 4)))]
    values[-3] = None  # type: ignore[call-overload]
    keys = ["a" if u % 3 else "b" for u in users]
    return pl.DataFrame({"u": users, "k": keys, "x": values}, schema={"u": pl.Int64, "k": pl.String, "x": pl.Float64})


def _orders(table: pl.DataFrame) -> list[pl.DataFrame]:
    """The table in several row orders and chunkings: as built, reversed, shuffled, and in many small chunks."""
    rng = np.random.default_rng(11)
    out = [table, table.reverse()]
    out += [table[rng.permutation(table.height).tolist()] for _ in range(4)]
    shuffled = table[rng.permutation(table.height).tolist()]
    out.append(pl.concat([shuffled[i:i + 5] for i in range(0, shuffled.height, 5)], rechunk=False))
    return out


def _frames(table: pl.DataFrame) -> Frames:
    return Frames(table.lazy(), "t", table.height, table.schema)


def test_float_sums_of_these_rows_round_differently_in_another_order():
    """The setup's premise: polars' double sum and mean of one user's rows (grouped by user on the streaming engine,
    as the per-user stage was) round to other grid points in other orders."""
    g = 0.125  # the grid of [0, 1000]: the largest power of two giving 4096 steps
    for u, kind in ((1, "sum"), (2, "mean")):
        orders = list(itertools.permutations(TRICKY[u]))
        frame = pl.LazyFrame({"u": [i for i, o in enumerate(orders) for _ in o], "x": [x for o in orders for x in o]})
        agg = pl.col("x").sum() if kind == "sum" else pl.col("x").mean()
        totals = frame.group_by("u").agg(agg).collect(engine="streaming")["x"]
        assert (totals / g).round(0).n_unique() >= 2, (u, kind)


@pytest.mark.parametrize("name", list(QUERIES))
def test_the_release_is_the_same_bytes_in_every_row_order(name):
    task = _task(QUERIES[name])
    plan = task.plan("approx", {})
    releases, totals = set(), []
    for table in _orders(_table()):
        result = task.run(_frames(table), plan, SEED, None)
        releases.add(result.table.write_csv())
        frame, layout = per_user_frame(task.query, plan, {"t": table.lazy()}, task.query.group_names)
        totals.append(compute_totals(frame, layout, plan, SALT, "t")[0])
    assert len(releases) == 1
    assert totals[0].height == (2 if name == "grouped" else 1) and result.table.height == totals[0].height
    assert all(t.equals(totals[0]) for t in totals)


def _reference(xs: list[float], m_kind: str, grid) -> int:
    """One user's partial from the fixed-point definition, in exact rationals (:mod:`dpcli.tasks.sql.fixed`)."""
    if m_kind == "n":
        return int(len(xs) > 0)
    scale = Fraction(2) ** fixed.FRACTION_BITS / Fraction(grid.granularity)
    bound = fixed.ROW_BOUND
    r = [min(max(round(Fraction(x) * scale), -bound), bound) for x in xs]  # round(Fraction): half to even
    n, one = len(r), 1 << fixed.FRACTION_BITS
    if n == 0:
        return 0
    if m_kind == "sum":
        return min(max(round(Fraction(sum(r), one)), grid.lo_units), grid.hi_units)
    if m_kind == "csum":
        return min(max(round(Fraction(sum(r), n * one)), grid.lo_units), grid.hi_units) - grid.mid_units
    limit = fixed.distance_bound(grid)
    d = [min(max(v - grid.mid_units * one, -limit), limit) for v in r]
    return min(max(round(Fraction(sum(v * v for v in d), n * one * one)), 0), max(grid.half_width_units, 1) ** 2)


def _partials(table: pl.DataFrame, query: str) -> tuple[SqlTask, object, pl.DataFrame, dict[str, str]]:
    task = _task(query)
    plan = task.plan("approx", {})
    frame, layout = per_user_frame(task.query, plan, {"t": table.lazy()}, task.query.group_names)
    partial = bounded_partials(frame, layout, plan, SALT).collect().sort(layout.unit)
    return task, plan, partial, layout.partials


@pytest.mark.parametrize("bounds", [(0, 1000), (-10, 10), (-3.5, 100.25)])
def test_the_partials_are_the_fixed_point_definition_in_exact_rationals(bounds):
    lo, hi = bounds
    query = f"SELECT ANON_SUM(x, {lo}, {hi}) s, ANON_VAR(x, {lo}, {hi}) v FROM t"
    table = _table()
    _, plan, partial, names = _partials(table, query)
    by_user = {u: [x for x in xs if x is not None]
               for u, xs in table.group_by("u").agg(pl.col("x")).iter_rows()}
    users = partial["__dp_unit"].to_list()
    for c in plan.calibrated:  # type: ignore[attr-defined]
        m = c.measure
        if m.key not in names:
            continue
        expected = [_reference(by_user[u], m.kind, m.grid if m.bounds is not None else None) for u in users]
        assert partial[names[m.key]].to_list() == expected, m.key


def test_on_the_fixed_point_lattice_the_partials_are_the_exact_real_sums_and_means():
    """Values that are multiples of 1/64 need no per-row rounding: the partials are the exact sums and means of the
    values, rounded half to even on the grid (0.125 for [0, 1000]) and clamped, with no double in between."""
    rng = np.random.default_rng(3)
    users = np.repeat(np.arange(30), 7)
    values = rng.integers(-64 * 50, 64 * 1100, users.size) / 64
    table = pl.DataFrame({"u": users, "k": ["a"] * users.size, "x": values})
    _, plan, partial, names = _partials(table, "SELECT ANON_SUM(x, 0, 1000) s, ANON_VAR(x, 0, 1000) v FROM t")
    g = Fraction(1, 8)
    for c in plan.calibrated:  # type: ignore[attr-defined]
        m = c.measure
        if m.kind not in ("sum", "csum", "csq"):
            continue
        grid = m.grid
        assert Fraction(grid.granularity) == g
        got = partial[names[m.key]].to_list()
        for u, partial_u in zip(partial["__dp_unit"].to_list(), got, strict=True):
            xs = [Fraction(x) for x in values[users == u]]
            if m.kind == "sum":
                expected = min(max(round(sum(xs) / g), grid.lo_units), grid.hi_units)
            elif m.kind == "csum":
                expected = min(max(round(sum(xs) / len(xs) / g), grid.lo_units), grid.hi_units) - grid.mid_units
            else:
                mean_square = sum((x / g - grid.mid_units) ** 2 for x in xs) / len(xs)
                expected = min(max(round(mean_square), 0), grid.half_width_units ** 2)
            assert partial_u == expected, (m.kind, u)


def test_values_beyond_every_bound_saturate_and_infinities_clamp():
    """A value whose fixed-point integer passes 2^62 counts as ±2^62 (far beyond every bound): +∞ alone clamps a sum
    to U, +∞ with −∞ cancel, and a sum of 1e300 and −1e300 with 0.5 is 0.5 in any order."""
    table = pl.DataFrame({"u": [1, 2, 2, 2, 3, 3, 3], "k": ["a"] * 7,
                          "x": [float("inf"), float("inf"), float("-inf"), 1.0, 1e300, 0.5, -1e300]})
    _, plan, partial, names = _partials(table, "SELECT ANON_SUM(x, 0, 1000) s FROM t")
    (m,) = [c.measure for c in plan.calibrated if c.measure.key in names]  # type: ignore[attr-defined]
    assert partial[names[m.key]].to_list() == [m.grid.hi_units, 8, 4]
    for order in _orders(table):
        assert _partials(order, "SELECT ANON_SUM(x, 0, 1000) s FROM t")[2].equals(partial)
