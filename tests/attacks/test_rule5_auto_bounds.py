"""Rule 5, sensitivity holds: the choices of ``auto`` bounds (dpcli/tasks/auto_bounds.py) and their charge.

Each choice is AboveThreshold over ``b·at_most[i] − a·n``, calibrated for one entry per unit. Gray box: the counts
each choice feeds AboveThreshold are recorded on D and on D′ = D plus one adversarial unit (a giant unit in every
group with thousands of equal rows, extreme values ±inf, 1e308 and a subnormal, null groups, only null values,
text values), with the bounds the choice runs on held equal; every ``at_most[i]`` and ``n`` may move by one at most.

Found: (1) under ``--rho`` the choice's ε was converted as the exponential mechanism's (ε²/8-zCDP, bounded range);
AboveThreshold is ε-DP, which gives ε²/2-zCDP only, so each choice spent up to 4 times the ρ charged. (2) The
value choice took one record per unit from the keyed order of groups, which drops tied records; a unit whose
first record had an equal twin (two equal values in a group) gave no entry: with C ≥ 2 and repeated values the
choice could run on no entry at all (pure noise). The records are now made distinct first.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from dptest import stream

from dpcli.tasks import auto_bounds as ab
from dpcli.tasks.auto_bounds import choose

BASE = pl.DataFrame({"u": [f"u{i}" for i in range(200) for _ in range(3)],
                     "g": [f"g{(i + j) % 5}" for i in range(200) for j in range(3)],
                     "v": [float((i * 7 + j) % 50) for i in range(200) for j in range(3)]})


def _giant(n: int = 3000) -> pl.DataFrame:
    return pl.DataFrame({"u": ["giant"] * n, "g": [f"g{i % 7}" for i in range(n)], "v": [5.0] * n})


def _one(rows: list[tuple[str | None, str | None, float | None]]) -> pl.DataFrame:
    return pl.DataFrame({"u": ["x"] * len(rows), "g": [r[1] for r in rows], "v": [r[2] for r in rows]},
                        schema={"u": pl.String, "g": pl.String, "v": pl.Float64})


NEIGHBOURS = {
    "giant": _giant(),
    "extremes": _one([(None, "g1", float("inf")), (None, "g1", float("-inf")), (None, "g2", 1e308),
                      (None, "g3", 5e-324), (None, "g4", -1e308)]),
    "null groups": _one([(None, None, 1.0), (None, None, 2.0), (None, "g1", 3.0)]),
    "null values": _one([(None, "g1", None), (None, "g2", float("nan"))]),
}

FIRST_REACHING = ab.first_reaching
REQUESTS = {
    "partitions": (ab.AutoBounds(partitions=True), ab.ChosenBounds(1, 1, None)),
    "contributions": (ab.AutoBounds(contributions=True), ab.ChosenBounds(3, 1, None)),
    "values": (ab.AutoBounds(values=True), ab.ChosenBounds(3, 4, None)),
}


def _fed(frame: pl.DataFrame, request: ab.AutoBounds, given: ab.ChosenBounds, monkeypatch) -> list[np.ndarray]:
    """The ``at_most`` arrays the choice feeds AboveThreshold (the given bounds held fixed)."""
    seen: list[np.ndarray] = []

    def record(at_most: np.ndarray, level: Fraction, epsilon: Fraction, s: object) -> int:
        seen.append(np.asarray(at_most, dtype=np.int64).copy())
        return FIRST_REACHING(at_most, level, epsilon, s)  # type: ignore[arg-type]

    monkeypatch.setattr(choose, "first_reaching", record)
    ab.choose_bounds(frame.lazy(), ab.DataShape("u", ("g",), "v"), request, given, Fraction(1), stream(0), 12345)
    return seen


@pytest.mark.parametrize("choice", sorted(REQUESTS))
@pytest.mark.parametrize("neighbour", sorted(NEIGHBOURS))
def test_one_unit_moves_each_count_of_a_choice_by_one_at_most(choice, neighbour, monkeypatch):
    request, given = REQUESTS[choice]
    d = _fed(BASE, request, given, monkeypatch)
    d2 = _fed(pl.concat([BASE, NEIGHBOURS[neighbour]]), request, given, monkeypatch)
    assert len(d) == len(d2) == request.choices
    for a, b in zip(d, d2, strict=True):
        assert np.all(np.abs(b - a) <= 1), (choice, neighbour)


def test_text_values_are_parsed_record_by_record_and_still_one_entry_per_unit(monkeypatch):
    text = BASE.with_columns(pl.col("v").cast(pl.String))
    odd = pl.DataFrame({"u": ["x"] * 4, "g": ["g1"] * 4, "v": ["inf", "1e999", "word", " 3 "]})
    request, given = REQUESTS["values"]
    d = _fed(text, request, given, monkeypatch)
    d2 = _fed(pl.concat([text, odd]), request, given, monkeypatch)
    assert d[0][-1] == 200 and d2[0][-1] == 201  # n: one entry per unit
    for a, b in zip(d, d2, strict=True):
        assert np.all(np.abs(b - a) <= 1)


def test_a_unit_with_repeated_values_still_gives_its_entry(monkeypatch):
    """Every unit has 3 equal values in its one group, C = 3: every unit gives one entry (before: none)."""
    same = pl.DataFrame({"u": [f"u{i}" for i in range(100) for _ in range(3)], "g": ["g"] * 300,
                         "v": [float(i % 10) for i in range(100) for _ in range(3)]})
    request, given = REQUESTS["values"]
    fed = _fed(same, request, given, monkeypatch)
    assert [int(a[-1]) for a in fed] == [100, 100]


@pytest.mark.parametrize("rho", [Fraction(1), Fraction(1, 3), Fraction(1, 10**6), Fraction(50)])
@pytest.mark.parametrize("parts", [1, 2, 4])
def test_under_rho_each_choice_spends_no_more_than_its_share(rho, parts):
    # AboveThreshold is ε-DP; an ε-DP mechanism is ε²/2-zCDP (Bun and Steinke 2016, Prop. 1.4), and no tighter
    # bound is known for it (the ε²/8 of the bounded-range exponential mechanism does not apply).
    share = Fraction(1, 10)
    eps = ab.pure_epsilon(None, rho, share, parts)
    assert eps > 0 and eps * eps / 2 <= rho * share / parts
    assert (eps + Fraction(2, 10**9)) ** 2 / 2 > rho * share / parts  # and not needlessly less


# ---- histogram's bias–variance rule (choose_bounds with a model; noisy_groups) --------------------------------
# Gray box, as above: on D and D′ = D plus one adversarial unit (bounds held equal), every input the choice reads
# is recorded: each walk's ``above`` vector (first_within: Δ = 1, monotone: every query moves the same way), each
# noisy size's true count with the sensitivity it is noised at (units: 1, pairs: K, rows: K·C), and noisy_groups'
# true count (1). And the choice runs exactly model_parts(…) mechanisms, each at the ε it is given.

FIRST_WITHIN = ab.first_within
MODEL = ab.ErrorModel(groups=5, noise=2.0)
SPREAD = pl.DataFrame({"u": ["x"] * 40, "g": [f"g{i % 8}" for i in range(40)], "v": [float(i) for i in range(40)]})


SPENT: list[Fraction] = []  # the ε of every mechanism the last _model_fed ran, in parts (ε_part = 1)
CHECKED: list[int] = []  # the true count the one-row check read
GROUP_CHECKED: list[int] = []  # the true count the one-group check read (units in more than one group)


def _model_fed(frame: pl.DataFrame, request: ab.AutoBounds, given: ab.ChosenBounds,
               monkeypatch) -> tuple[list[tuple[np.ndarray, int]], list[tuple[str, int, int]]]:
    walks: list[tuple[np.ndarray, int]] = []
    sizes: list[tuple[str, int, int]] = []
    SPENT.clear()
    CHECKED.clear()
    GROUP_CHECKED.clear()

    def walk(above: np.ndarray, allowed: int, sensitivity: int, epsilon: Fraction, s: object, *how: object) -> int:
        walks.append((np.asarray(above, dtype=np.int64).copy(), sensitivity))
        assert epsilon in (ab.WALK_WEIGHT, ab.CONTRIBUTIONS_WEIGHT, ab.VALUE_WEIGHT)  # a walk's weight of parts
        SPENT.append(epsilon)
        return FIRST_WITHIN(above, allowed, sensitivity, epsilon, s, *how)  # type: ignore[arg-type]

    def size(frame: pl.LazyFrame, sensitivity: int, epsilon: Fraction, s: object, name: str) -> int:
        true = choose._count(frame, name)
        sizes.append(("units" if not sizes else "pairs" if request.contributions else "rows", true, sensitivity))
        assert epsilon == Fraction(1)
        SPENT.append(epsilon)
        return max(1, true)  # no noise: the choice that follows reads the same allowance on D and D′ when it can

    def check(lf: pl.LazyFrame, shape: ab.DataShape, allowed: int, epsilon: Fraction, s: object,
              name: str = "") -> bool:
        """The one-row check's input (units with more than one row: sensitivity 1), answered "no" on D and D′ alike
        so that the walks run on both."""
        CHECKED.append(choose._count(lf.group_by(shape.unit).len().filter(pl.col("len") > 1), name))
        SPENT.append(epsilon)
        assert epsilon == ab.CHECK_WEIGHT
        return False

    def group_check(lf: pl.LazyFrame, shape: ab.DataShape, allowed: int, epsilon: Fraction, s: object,
                    name: str = "") -> bool:
        """The one-group check's input (units in more than one group: sensitivity 1), answered "no" alike."""
        per_unit = lf.group_by(shape.unit).agg(pl.struct(list(shape.by)).n_unique().alias("d"))
        GROUP_CHECKED.append(choose._count(per_unit.filter(pl.col("d") > 1), name))
        SPENT.append(epsilon)
        assert epsilon == ab.GROUP_CHECK_WEIGHT
        return False

    monkeypatch.setattr(choose, "first_within", walk)
    monkeypatch.setattr(choose, "_noisy_count", size)
    monkeypatch.setattr(choose, "one_row_each", check)
    monkeypatch.setattr(choose, "one_group_each", group_check)
    ab.choose_bounds(frame.lazy(), ab.DataShape("u", ("g",), "v"), request, given, Fraction(1), stream(0), 12345,
                     model=MODEL)
    return walks, sizes


@pytest.mark.parametrize("choice", sorted(REQUESTS))
@pytest.mark.parametrize("neighbour", [*sorted(NEIGHBOURS), "spread"])
def test_one_unit_moves_each_input_of_the_bias_variance_choice_within_its_sensitivity(choice, neighbour, monkeypatch):
    request, given = REQUESTS[choice]
    other = pl.concat([BASE, SPREAD if neighbour == "spread" else NEIGHBOURS[neighbour]])
    walks, sizes = _model_fed(BASE, request, given, monkeypatch)
    spent, checked, group_checked = sum(SPENT), list(CHECKED), list(GROUP_CHECKED)
    walks2, sizes2 = _model_fed(other, request, given, monkeypatch)
    assert len(checked) == len(CHECKED) == int(request.partitions or request.contributions)
    assert all(0 <= b - a <= 1 for a, b in zip(checked, CHECKED, strict=True)), (checked, CHECKED)  # Δ = 1
    assert len(group_checked) == len(GROUP_CHECKED) == int(request.partitions)
    assert all(0 <= b - a <= 1 for a, b in zip(group_checked, GROUP_CHECKED, strict=True)), group_checked  # Δ = 1
    assert len(walks) == len(walks2) == request.choices
    for (a, da), (b, db) in zip(walks, walks2, strict=True):
        assert da == db == 1
        step = b - a
        assert np.all((step >= 0) & (step <= 1)), (choice, neighbour, step)  # monotone, Δ = 1
    k, c = given.max_partitions or 1, given.max_contributions
    claimed = {"units": 1, "pairs": k, "rows": k * c}
    assert [s[0] for s in sizes] == [s[0] for s in sizes2]
    for (kind, x, dx), (_, y, dy) in zip(sizes, sizes2, strict=True):
        assert dx == dy == claimed[kind] and 0 <= y - x <= claimed[kind], (choice, neighbour, kind, x, y)
    # the mechanisms the choice runs spend exactly model_parts' parts (the groups' count runs in histogram)
    assert spent == sum(SPENT) == ab.model_parts(request, listed=True)


@pytest.mark.parametrize("at_least", [1, 40, 41, 60])
@pytest.mark.parametrize("neighbour", [*sorted(NEIGHBOURS), "spread"])
def test_noisy_groups_counts_each_unit_in_one_group(at_least, neighbour, monkeypatch):
    """BASE has 200 units over 5 groups (about 40 each with one group per unit): one unit more, however many groups
    it is in, crosses the threshold in one group at most."""
    seen: list[int] = []
    count = choose._count

    def record(frame: pl.LazyFrame, name: str) -> int:
        seen.append(count(frame, name))
        return seen[-1]

    monkeypatch.setattr(choose, "_count", record)
    other = pl.concat([BASE, SPREAD if neighbour == "spread" else NEIGHBOURS[neighbour]])
    for frame in (BASE, other):
        ab.noisy_groups(frame.lazy(), ab.DataShape("u", ("g",), "v"), at_least, Fraction(1), stream(0), 12345)
    assert len(seen) == 2 and 0 <= seen[1] - seen[0] <= 1, (at_least, neighbour, seen)
