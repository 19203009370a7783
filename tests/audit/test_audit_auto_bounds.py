"""Privacy audits of the automatic choices (issue 33): first_reaching (AboveThreshold), choose_bounds end to end,
the bias report's unit counts, first_within (the bias–variance walk) and noisy_groups (its noisy count of groups).

Three kinds of evidence, as elsewhere in tests/audit:

* **differential**: the exact output distribution of first_reaching, computed by brute force from the discrete
  Laplace pmf (:mod:`abovethreshold_exact`), against the sampler; each cell's frequency must fall within its
  Clopper–Pearson interval at 1 − 10⁻⁶/cells (Bonferroni), and the same check must reject the distribution of
  a mis-scaled AboveThreshold (power);
* **exact privacy loss**: on neighbouring inputs (the at_most vector shifts by one from some index on and n by
  one), max |ln P/P'| over the outputs, which ε-DP bounds by ε, and max_α D_α/α, which the ledger's ρ must bound
  (ε²/2 for an ε-DP choice under ρ); end to end, the loss of (K, C, lo, hi) from the same exact pmfs, the
  vectors read from choose_bounds itself at each forced earlier choice;
* **DP-Sniper-style** (auditstats): an ε lower bound from samples on neighbours, which must stay ≤ ε, and
  must exceed ε for a broken variant.

All at fixed keys: a pass is deterministic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from abovethreshold_exact import FLOOR, first_reaching_pmf, first_within_pmf, losses, neighbour, tail, zcdp
from auditstats import clopper_pearson, threshold_epsilon_bound, two_sample_violations

from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.tasks import auto_bounds as ab
from dpcli.tasks.auto_bounds import choose

pytestmark = pytest.mark.audit

KEY = b"\x21" * 32
LEVEL = Fraction(9, 10)
ALPHAS = np.concatenate([np.linspace(1.02, 3, 25), np.linspace(3.5, 60, 40)])


def sample(at_most: np.ndarray, level: Fraction, eps: Fraction, n: int, label: str) -> np.ndarray:
    root = KeyedStream(KEY, label)
    return np.array([ab.first_reaching(at_most, level, eps, root.child(str(i))) for i in range(n)])


def fits(draws: np.ndarray, pmf: np.ndarray, alpha: float = 1e-6) -> list[int]:
    """The cells whose frequency falls outside the Clopper–Pearson interval of their exact probability."""
    conf = 1 - alpha / (2 * pmf.size)
    counts = np.bincount(draws, minlength=pmf.size)
    return [k for k in range(pmf.size)
            if not clopper_pearson(int(counts[k]), draws.size, "lower", conf) <= pmf[k]
            <= clopper_pearson(int(counts[k]), draws.size, "upper", conf)]


# ---- first_reaching: differential ------------------------------------------------------------------


@pytest.mark.parametrize(("at_most", "level", "eps"), [
    ([3, 5, 8, 9, 10, 10], Fraction(9, 10), Fraction(1)),
    ([0, 0, 1, 2, 2, 2, 3], Fraction(99, 100), Fraction(1, 2)),
    ([0, 0, 0, 0], Fraction(9, 10), Fraction(2)),
])
def test_first_reaching_sampler_matches_its_exact_distribution(at_most, level, eps):
    """40,000 draws against the brute-force pmf; the pmf of AboveThreshold with its query noise at half the
    scale (2b/ε, the mistake of reading ε₂ as ε) must be rejected by the same check on the first case."""
    at_most = np.array(at_most)
    exact = first_reaching_pmf(at_most, level, eps)
    assert abs(exact.sum() - 1) < 1e-12
    draws = sample(at_most, level, eps, 40_000, f"diff/{at_most.tolist()}")
    assert fits(draws, exact) == []
    if at_most[-1] == 10:
        wrong = first_reaching_pmf(at_most, level, 2 * eps)  # every scale halved
        assert fits(draws, wrong) != []


# ---- first_reaching: exact privacy loss ------------------------------------------------------------


def pairs(rng: np.random.Generator, count: int, level: Fraction) -> list[tuple[np.ndarray, int]]:
    """Neighbouring inputs: random small count vectors with the added entry in a random bin, and adversarial
    ones (all entries in one place, the added one at either end or in the middle)."""
    out: list[tuple[np.ndarray, int]] = []
    for _ in range(count):
        size, n = int(rng.integers(2, 7)), int(rng.integers(0, 50 if level.denominator == 10 else 400))
        out.append((np.append(np.sort(rng.integers(0, n + 1, size)), n), int(rng.integers(0, size + 1))))
    for n in (0, 1, 9, 10, 60):
        for at_most in ([0, 0, 0, 0, n], [n, n, n, n, n], [0, 0, n, n, n], [0, n - n // 10, n, n, n]):
            out += [(np.array(at_most), j) for j in range(5)]
    return out


@pytest.mark.parametrize("level", [Fraction(9, 10), Fraction(99, 100)])
def test_first_reaching_exact_loss_is_within_epsilon_and_its_zcdp_within_half_epsilon_squared(level):
    """ε = 1. Measured (this key-free exact computation): max |loss| ≈ 0.43ε and max_α D_α/α ≈ 0.021 (level 9/10),
    far inside ε and ε²/2 = 0.5, and also inside ε²/8 = 0.125 on these pairs, though no proof of the latter
    is known for AboveThreshold."""
    eps = Fraction(1)
    worst_loss = worst_rho = 0.0
    for at_most, j in pairs(np.random.default_rng(33), 120, level):
        p, q = first_reaching_pmf(at_most, level, eps), first_reaching_pmf(neighbour(at_most, j), level, eps)
        worst_loss = max(worst_loss, float(np.abs(losses(p, q)).max()))
        worst_rho = max(worst_rho, zcdp(p, q, ALPHAS))
    print(f"level {level}: max |loss| {worst_loss:.4f} (ε = 1), max D_α/α {worst_rho:.4f} (ε²/2 = 0.5)")
    assert worst_loss <= float(eps) + 1e-9
    assert worst_rho <= float(eps) ** 2 / 2


# ---- first_reaching: DP-Sniper ----------------------------------------------------------------------


def visible_loss(p: np.ndarray, q: np.ndarray, mass: float = 0.02) -> float:
    """The largest exact ln P[X ≥ t]/Q[X ≥ t] (or of X ≤ t, either way round) over tails of mass ≥ ``mass``:
    the loss a tail-event audit can see with 10⁵ samples."""
    best = 0.0
    for x, y in ((p, q), (q, p)):
        for xx, yy in ((x, y), (x[::-1], y[::-1])):
            tx, ty = np.cumsum(xx[::-1])[::-1], np.cumsum(yy[::-1])[::-1]
            ok = tx >= mass
            best = max(best, float(np.log(tx[ok] / ty[ok]).max()))
    return best


def worst_pair(level: Fraction, eps: Fraction) -> tuple[np.ndarray, np.ndarray, float]:
    """The neighbouring pair (of :func:`pairs`) whose loss a tail-event audit can see best, and that loss."""
    best, pair = -1.0, (np.zeros(1), np.zeros(1))
    for at_most, j in pairs(np.random.default_rng(7), 60, level):
        other = neighbour(at_most, j)
        loss = visible_loss(first_reaching_pmf(at_most, level, eps), first_reaching_pmf(other, level, eps))
        if loss > best:
            best, pair = loss, (at_most, other)
    return pair[0], pair[1], best


def sniper(x0: np.ndarray, x1: np.ndarray) -> float:
    return max(threshold_epsilon_bound(x0, x1), threshold_epsilon_bound(-x0, -x1),
               threshold_epsilon_bound(x1, x0), threshold_epsilon_bound(-x1, -x0))


def test_first_reaching_dp_sniper_stays_within_epsilon_and_catches_a_broken_one():
    """On the pair whose exact tail loss is largest (0.37 at ε = 1), 100,000 draws per side: the tail-event
    bound and the two-sample test at ε = 1 stay quiet. The same search at 4× less noise (a true ε of 4) finds a
    pair with a visible tail loss of 1.58, and the bound from its samples must exceed 1."""
    eps, n = Fraction(1), 100_000
    a, b, exact = worst_pair(LEVEL, eps)
    x0, x1 = sample(a, LEVEL, eps, n, "sn/0"), sample(b, LEVEL, eps, n, "sn/1")
    est = sniper(x0, x1)
    print(f"first_reaching DP-Sniper lower bound {est:.3f} (exact visible loss {exact:.3f}) ≤ ε = 1")
    assert est <= float(eps)
    assert two_sample_violations(x0, x1, float(eps)) == []
    a, b, exact = worst_pair(LEVEL, 4 * eps)
    broken = sniper(sample(a, LEVEL, 4 * eps, n, "snb/0"), sample(b, LEVEL, 4 * eps, n, "snb/1"))
    print(f"broken (noise / 4) lower bound {broken:.3f} (exact visible loss {exact:.3f})")
    assert broken > float(eps)


# ---- choose_bounds end to end ------------------------------------------------------------------------

SHAPE = ab.DataShape("user", ("g",), "x")
ALL = ab.AutoBounds(partitions=True, contributions=True, values=True)
GIVEN = ab.ChosenBounds(None, 1, None)
SALT = 4242
BASE = pl.DataFrame({"user": [1, 1, 2, 3, 3, 3, 4, 5, 6, 6, 7, 8, 8, 8],
                     "g": ["a", "b", "a", "a", "a", "c", "b", "a", "a", "b", "c", "a", "b", "c"],
                     "x": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 0.5, 2.5, 3.5, 4.5]})
#: The added unit: 12 groups × 10 rows, values at ±1e12 (beyond every ordinary limit).
GIANT = pl.DataFrame({"user": [99] * 120, "g": [f"h{i % 12}" for i in range(120)],
                      "x": [1e12 if i % 2 else -1e12 for i in range(120)]})
NEIGHBOUR = pl.concat([BASE, GIANT])
#: The forced K and C to read the later vectors at: the candidates up to the first that bounds nothing.
K_FORCED = tuple(c for c in ab.COUNT_CANDIDATES if c <= 13)
C_FORCED = tuple(c for c in ab.COUNT_CANDIDATES if c <= 11)


def vectors(frame: pl.DataFrame, k: int, c: int) -> dict[str, np.ndarray]:
    """The at_most vectors choose_bounds passes to each choice when the partition choice returns k and the
    row choice c (first_reaching replaced by a recorder that forces those two)."""
    seen: dict[str, np.ndarray] = {}
    forced = {"partitions": ab.COUNT_CANDIDATES.index(k), "contributions": ab.COUNT_CANDIDATES.index(c)}

    def record(at_most: np.ndarray, level: Fraction, epsilon: Fraction, stream: KeyedStream) -> int:
        name = stream.label.rsplit("/", 1)[-1]
        seen[name] = np.asarray(at_most).copy()
        return forced.get(name, 0)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(choose, "first_reaching", record)
        ab.choose_bounds(frame.lazy(), SHAPE, ALL, GIVEN, Fraction(1), KeyedStream(KEY, "v"), SALT)
    return seen


LEVELS = {"partitions": ab.PARTITIONS_LEVEL, "contributions": ab.CONTRIBUTIONS_LEVEL, "high": ab.VALUE_LEVELS[1],
          "low": 1 - ab.VALUE_LEVELS[0]}
#: ε of each choice in the end-to-end audits (four choices: (K, C, lo, hi) is 2-DP).
EPS = Fraction(1, 2)
Model = dict[tuple[int, int], dict[str, np.ndarray]]


@functools.cache
def _pmf(name: str, at_most: tuple[int, ...]) -> np.ndarray:
    return first_reaching_pmf(np.array(at_most), LEVELS[name], EPS)


@functools.cache
def model(which: str) -> Model:
    """For each forced (K, C): P[K], P[C | K], P[hi | K, C], P[lo | K, C] (as first_reaching indices)."""
    frame = BASE if which == "base" else NEIGHBOUR
    out: Model = {}
    for k in K_FORCED:
        for c in C_FORCED:
            v = vectors(frame, k, c)
            out[(k, c)] = {name: _pmf(name, tuple(int(x) for x in v[name])) for name in LEVELS}
    return out


def forced(candidate: int, grid: tuple[int, ...]) -> int:
    """The forced value whose vectors hold for ``candidate`` (beyond the grid nothing more is bounded)."""
    return candidate if candidate in grid else grid[-1]


def loss_range(mp: Model, mq: Model, pick: Callable[..., float]) -> float:
    """max (pick = max) or min (pick = min) over (K, C, hi, lo) of ln P/P' = the sum of the four conditional
    losses (hi and lo independent given K and C, so their extremes are met together; the LO < HI repair after
    them is post-processing and cannot add loss)."""
    pk, qk = mp[(K_FORCED[0], C_FORCED[0])]["partitions"], mq[(K_FORCED[0], C_FORCED[0])]["partitions"]
    best = []
    for ki, k in enumerate(ab.COUNT_CANDIDATES):
        if min(pk[ki], qk[ki]) <= FLOOR:
            continue
        lk = float(np.log(pk[ki] / qk[ki]))
        key = (forced(k, K_FORCED), C_FORCED[0])
        for ci, c in enumerate(ab.COUNT_CANDIDATES):
            pc, qc = mp[key]["contributions"][ci], mq[key]["contributions"][ci]
            if min(pc, qc) <= FLOOR:
                continue
            a, b = mp[(forced(k, K_FORCED), forced(c, C_FORCED))], mq[(forced(k, K_FORCED), forced(c, C_FORCED))]
            lc = float(np.log(pc / qc))
            best.append(lk + lc + pick(losses(a["high"], b["high"])) + pick(losses(a["low"], b["low"])))
    return float(pick(best))


def test_choose_bounds_exact_loss_end_to_end():
    """ε = 1/2 per choice, four choices: (K, C, lo, hi) must be 2-DP. The unit added holds 12 groups of 10 rows
    at ±1e12. The loss is exact (the pmf of each choice at the vectors choose_bounds computes for each earlier
    choice) on every output of probability above FLOOR on both sides."""
    p, q = model("base"), model("neighbour")
    hi, lo = loss_range(p, q, max), loss_range(p, q, min)
    print(f"choose_bounds end to end: ln P/P' in [{lo:.4f}, {hi:.4f}], ε = {float(4 * EPS)}")
    assert max(hi, -lo) <= float(4 * EPS) + 1e-9
    worst = max(float(np.abs(losses(p[key][name], q[key][name])).max()) for key in p for name in LEVELS)
    print(f"  largest loss of one choice: {worst:.4f}, ε = {float(EPS)}")
    assert worst <= float(EPS) + 1e-9


def test_choose_bounds_samples_match_the_model():
    """300 runs of the real choose_bounds on the neighbour: the chosen K and C fit the model's marginals (the
    streams are independent as the model assumes), within Clopper–Pearson intervals at 1 − 10⁻⁶/cells."""
    m = model("neighbour")
    p_k = m[(K_FORCED[0], C_FORCED[0])]["partitions"]
    p_c = sum(p_k[ki] * m[(forced(k, K_FORCED), C_FORCED[0])]["contributions"]
              for ki, k in enumerate(ab.COUNT_CANDIDATES))
    root = KeyedStream(KEY, "e2e")
    runs = [ab.choose_bounds(NEIGHBOUR.lazy(), SHAPE, ALL, GIVEN, EPS, root.child(str(i)), SALT) for i in range(300)]
    ks = np.array([ab.COUNT_CANDIDATES.index(r.max_partitions or 0) for r in runs])
    cs = np.array([ab.COUNT_CANDIDATES.index(r.max_contributions) for r in runs])
    assert fits(ks, p_k) == []
    assert fits(cs, np.asarray(p_c)) == []
    assert all(r.bounds is not None and r.bounds[0] < r.bounds[1] for r in runs)


# ---- report_bias --------------------------------------------------------------------------------------


def test_report_bias_is_a_sensitivity_one_count():
    """The report's sums (``bias_report._true_sums``: each unit's shares scaled by SCALE) move by at most 2·SCALE when
    the giant unit (over every bound) is added, which is the sensitivity its noise is calibrated to
    (``bias_report.bias_noise``: scale 2·SCALE/ε); at ε = 1 per coordinate, 2,500 noisy reports per side keep each
    coordinate's DP-Sniper bound ≤ 1 and the two-sample test at ε = 1 quiet (the shares printed are
    post-processing of these sums)."""
    from dpcli.tasks import bias_report as br

    bounds = ab.ChosenBounds(2, 2, (0.0, 10.0))
    parts = br.bias_parts(SHAPE, bounds)
    sums = [br._true_sums(frame.lazy(), SHAPE, bounds, parts, SALT, "audit") for frame in (BASE, NEIGHBOUR)]
    for p in [*parts, "units"]:
        assert abs(int(sums[1][p]) - int(sums[0][p])) <= 2 * br.SCALE, p
    noise = br.bias_noise(Fraction(1), None, Fraction(1))  # ε = 1 for each coordinate
    n = 2_500
    for p in [*parts, "units"]:
        x0 = np.array([int(sums[0][p]) + int(noise.sample(KeyedStream(KEY, f"b0/{p}").child(str(i)), 1)[0])
                       for i in range(n)])
        x1 = np.array([int(sums[1][p]) + int(noise.sample(KeyedStream(KEY, f"b1/{p}").child(str(i)), 1)[0])
                       for i in range(n)])
        est = max(threshold_epsilon_bound(x0, x1), threshold_epsilon_bound(-x0, -x1))
        print(f"report_bias {p}: DP-Sniper lower bound {est:.3f} ≤ ε = 1")
        assert est <= 1.0
        assert two_sample_violations(x0, x1, 1.0) == []


# ---- first_within (the bias–variance walk of histogram's auto bounds) ----------------------------------


def within_pairs(rng: np.random.Generator, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Neighbouring ``above`` vectors: one unit more, whose entry lies beyond the first j candidates (above[i]
    + 1 for i < j); random small vectors and adversarial ones (every entry beyond or none)."""
    out = []
    for _ in range(count):
        size = int(rng.integers(2, 8))
        above = np.sort(rng.integers(0, 40, size))[::-1]
        j = int(rng.integers(0, size + 1))
        out.append((above, above + (np.arange(size) < j)))
    for n in (0, 3, 12, 40):
        for above in ([n] * 5, [n, n, 0, 0, 0], [0] * 5):
            for j in range(6):
                a = np.array(above)
                out.append((a, a + (np.arange(5) < j)))
    return out


@pytest.mark.parametrize(("slack", "share"), [(ab.COUNT_SLACK, ab.COUNT_THRESHOLD_SHARE),
                                               (ab.VALUE_SLACK, Fraction(1, 2))])
@pytest.mark.parametrize("allowed", [0, 5, 30])
def test_first_within_exact_loss_is_within_epsilon(allowed, slack, share):
    """The monotone sparse vector (threshold and queries both at scale 2Δ/ε) on neighbours that move every
    query the same way: max |ln P/P'| ≤ ε exactly, and max_α D_α/α ≤ ε²/2 (what a ρ ledger is charged), at the
    slack and threshold share of the count walks (ε₁ = 2ε/3 on the threshold, ε/3 on the queries) and of the value
    walks (ε/2 each)."""
    eps = Fraction(1)
    worst_loss = worst_rho = 0.0
    for above, other in within_pairs(np.random.default_rng(11), 80):
        p = first_within_pmf(above, allowed, 1, eps, slack, share)
        q = first_within_pmf(other, allowed, 1, eps, slack, share)
        assert abs(p.sum() - 1) < 1e-9
        worst_loss = max(worst_loss, float(np.abs(losses(p, q)).max()))
        worst_rho = max(worst_rho, zcdp(p, q, ALPHAS))
    print(f"allowed {allowed}, slack {slack}: max |loss| {worst_loss:.4f} (ε = 1), "
          f"max D_α/α {worst_rho:.4f} (ε²/2 = 0.5)")
    assert worst_loss <= float(eps) + 1e-9
    assert worst_rho <= float(eps) ** 2 / 2


def test_first_within_sampler_matches_its_exact_distribution():
    """40,000 draws against the brute-force pmf; the pmf at twice the ε (every scale halved) must be rejected."""
    above, allowed, eps = np.array([30, 12, 4, 1, 0, 0]), 3, Fraction(1, 2)
    exact = first_within_pmf(above, allowed, 1, eps)
    root = KeyedStream(KEY, "within")
    draws = np.array([ab.first_within(above, allowed, 1, eps, root.child(str(i))) for i in range(40_000)])
    assert fits(draws, exact) == []
    assert fits(draws, first_within_pmf(above, allowed, 1, 2 * eps)) != []


def test_first_within_count_slack_sampler_matches_its_exact_distribution():
    """The count walks' slack and threshold share: 40,000 draws fit the exact pmf at them, and the pmf at the
    value walks' (slack 3, equal shares) is rejected (power: the walk really is the one the pmf says)."""
    above, allowed, eps = np.array([30, 12, 4, 1, 0, 0]), 3, Fraction(1, 2)
    root = KeyedStream(KEY, "within-count")
    share = ab.COUNT_THRESHOLD_SHARE
    draws = np.array([ab.first_within(above, allowed, 1, eps, root.child(str(i)), ab.COUNT_SLACK, share)
                      for i in range(40_000)])
    assert fits(draws, first_within_pmf(above, allowed, 1, eps, ab.COUNT_SLACK, share)) == []
    assert fits(draws, first_within_pmf(above, allowed, 1, eps, ab.VALUE_SLACK)) != []


# ---- one_row_each (histogram's caps of 1 for data of one row per unit) ------------------------------------


def one_row_probability(true: int, allowed: int, eps: Fraction) -> float:
    """P[one_row_each says yes] = P[true + Z ≤ allowed + ⌈3/ε⌉], Z discrete Laplace of scale 1/ε (the sampler's
    scale: mech.laplace rounds it as the check draws it)."""
    scale = float(mech.laplace(1, eps).param)
    return 1.0 - float(tail(np.array([allowed + math.ceil(3 / eps) - true + 1]), scale)[0])


def test_one_row_each_is_a_sensitivity_one_count_against_a_public_threshold():
    """BASE against BASE + the giant unit (120 rows): the units with more than one row move by exactly one, so
    both answers' exact probabilities differ by at most e^ε (over allowed values that put the threshold around
    the true count: the worst case); 4,000 draws of the real check on each side fit the exact probability within
    4.5 binomial standard deviations (a false failure about 1 in 150,000). The exact half is of the model; the
    draws are what tie it to the real check (a check at another noise scale or threshold fails them)."""
    eps, n = Fraction(1, 2), 4_000
    lf0, lf1 = BASE.lazy(), NEIGHBOUR.lazy()
    over = [int(f.group_by("user").len().filter(pl.col("len") > 1).height) for f in (BASE, NEIGHBOUR)]
    assert over[1] == over[0] + 1
    worst = 0.0
    for allowed in range(12):
        p, q = (one_row_probability(t, allowed, eps) for t in over)
        worst = max(worst, abs(math.log(p / q)), abs(math.log((1 - p) / (1 - q))))
    print(f"one_row_each: exact loss {worst:.4f} (ε = 0.5)")
    assert worst <= float(eps) + 1e-9
    allowed = 0  # the threshold ⌈3/ε⌉ = 6 against true counts 4 and 5: both answers likely
    for label, lf, t in (("r0", lf0, over[0]), ("r1", lf1, over[1])):
        root = KeyedStream(KEY, label)
        yes = sum(ab.one_row_each(lf, SHAPE, allowed, eps, root.child(str(i))) for i in range(n))
        p = one_row_probability(t, allowed, eps)
        assert abs(yes - n * p) <= 4.5 * math.sqrt(n * p * (1 - p)), (label, yes, n * p)


# ---- noisy_groups (histogram's bias–variance rule without --keys) --------------------------------------------


def groups_pmf(true: int, eps: Fraction, top: int) -> np.ndarray:
    """The exact pmf of max(1, true + Z) over 0 … top, Z discrete Laplace of scale 1/ε (P[Z = z] ∝ e^−ε|z|)."""
    r = float(np.exp(-float(eps)))
    z = np.arange(-top - true - 200, top + 200)
    pz = (1 - r) / (1 + r) * r ** np.abs(z)
    out = np.zeros(top + 1)
    for zi, p in zip(z, pz, strict=True):
        y = max(1, true + int(zi))
        if y <= top:
            out[y] += p
    return out


def test_noisy_groups_is_a_sensitivity_one_count():
    """ε = 1/2; BASE against BASE + the giant unit (12 new groups, 10 rows each): one unit is counted in one group,
    so the true count moves by exactly one (the worst case). 3,000 draws per side fit the exact pmf of the clipped
    discrete Laplace (the pmf at 2ε is rejected: power), the exact loss between the two pmfs is ≤ ε, the DP-Sniper
    bound from the draws stays ≤ ε and the two-sample test at ε is quiet."""
    eps, n, top = Fraction(1, 2), 3_000, 60
    draws, truth = [], []
    for label, frame in (("g0", BASE), ("g1", NEIGHBOUR)):
        lf = frame.lazy()
        truth.append(ab.noisy_groups(lf, SHAPE, 1, Fraction(10**6), KeyedStream(KEY, "exact"), SALT))
        root = KeyedStream(KEY, label)
        draws.append(np.array([ab.noisy_groups(lf, SHAPE, 1, eps, root.child(str(i)), SALT) for i in range(n)]))
    assert truth[1] == truth[0] + 1
    pmfs = [groups_pmf(t, eps, top) for t in truth]
    for x, pmf, t in zip(draws, pmfs, truth, strict=True):
        assert x.max() <= top and fits(x, pmf) == []
        assert fits(x, groups_pmf(t, 2 * eps, top)) != []
    live = (pmfs[0] > FLOOR) & (pmfs[1] > FLOOR)
    loss = float(np.abs(np.log(pmfs[0][live] / pmfs[1][live])).max())
    est = max(threshold_epsilon_bound(draws[0], draws[1]), threshold_epsilon_bound(-draws[0], -draws[1]))
    print(f"noisy_groups: exact loss {loss:.4f}, DP-Sniper lower bound {est:.3f} (ε = 0.5)")
    assert loss <= float(eps) + 1e-9 and est <= float(eps)
    assert two_sample_violations(draws[0], draws[1], float(eps)) == []
