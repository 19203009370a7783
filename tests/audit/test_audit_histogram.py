"""Audit of ``dpcli histogram`` end to end: count and sum of one group, at the unit's maximal contribution.

A unit with C = 3 rows at the upper bound joins a group of 2 light units
(K = 1 group per unit, bounds [0, 10], ε = 1 split equally: ε/2 for the row
count, ε/2 for the sum). For the event

    E = "count ≥ x + C + 1 and sum ≥ s + C·10 + one grid step"

the discrete Laplace tails give P[E | D'] / P[E | D] = e^{ε/2}·e^{ε/2} = e^ε (both
thresholds sit a full sensitivity above D's values, where the tails are exactly
geometric), so E is as informative as any event.

Trials run in parallel: the groups are public (``--domain keys``), each with its
own noise, and no unit touches two groups, so one run over N groups gives N
samples of one group's release; the neighbour run adds the heavy unit to every
group. Clopper–Pearson 99.5% per side (:mod:`auditstats`); noise calibrated for
1.2·ε must be caught.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from auditstats import event_epsilon_bound, two_sample_violations

from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.tasks import histogram as hist

C, HI = 3, 10.0


def _run(groups: int, heavy: bool, label: str) -> pl.DataFrame:
    g = np.arange(groups)
    light = pl.DataFrame({"user": np.concatenate([2 * g, 2 * g + 1]), "g": np.concatenate([g, g]), "x": 5.0})
    parts = [light]
    if heavy:
        parts.append(pl.DataFrame({"user": np.repeat(2 * groups + g, C), "g": np.repeat(g, C), "x": HI}))
    df = pl.concat(parts, how="vertical_relaxed")
    q = hist.HistogramQuery(by=("g",), unit="user", aggregations=("count", "sum"), value="x", bounds=(0.0, HI),
                            max_partitions=1, max_contributions=C, epsilon=Fraction(1), domain="keys")
    plan = hist.plan_histogram(q, "pure", {})
    table = df.lazy()
    return hist.run_histogram(table, q, plan, KeyedStream(label.encode().ljust(32, b"."), "histogram"),
                              pl.DataFrame({"g": g})).table.sort("g")


@pytest.mark.parametrize("groups", [pytest.param(50_000, id="fast"), pytest.param(400_000, marks=pytest.mark.audit, id="full")])
def test_histogram_never_beats_its_epsilon_and_a_broken_one_is_caught(monkeypatch, groups):
    def audit(label: str) -> tuple[float, list]:
        d, d1 = _run(groups, False, f"{label}/D"), _run(groups, True, f"{label}/D'")

        def in_e(out: pl.DataFrame) -> int:
            return int(((out["count"] >= 2 + C + 1) & (out["sum_x"] > 10.0 + C * HI)).sum())

        # two-sample test on the count alone (integers, clipped to a window around both means)
        return (event_epsilon_bound(in_e(d1), groups, in_e(d), groups),
                two_sample_violations(d["count"].clip(-6, 12).to_numpy(), d1["count"].clip(-6, 12).to_numpy(), 0.5))

    ok, ok_violations = audit("ok")
    laplace = mech.laplace
    monkeypatch.setattr(mech, "laplace", lambda sensitivity, eps: laplace(sensitivity, eps * Fraction(6, 5)))
    bad, bad_violations = audit("bad")
    print(f"ε lower bound {ok:.3f} (claim 1), broken {bad:.3f}; two-sample violations of the count at ε/2: "
          f"{len(ok_violations)} (broken: {len(bad_violations)})")
    assert ok <= 1.0 < bad
    assert ok_violations == []
