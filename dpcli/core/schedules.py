"""Privacy schedules for re-running a release on a growing database (paper 004).

* **BBScheduler** (Alg. 1): epoch i starts when the database reaches
  t_i = (1 + γ)^i · n (n: the size at the first run); epoch i's release uses
  ε_i and is reused until the next epoch.
  - δ = 0: ε_i = γ²(i + 1)/(1 + γ)^{i+2} · ε; Σ_{i≥0} ε_i = ε exactly
    (basic composition, Theorem 3).
  - δ > 0: ε_i = γ^{1.5}(i + 1)/(1 + γ)^{i+1.5} · ε/(3√ln(1/δ)); by CDP
    composition (Theorem 4) the total loss is ≤ ε²/(9 ln(1/δ)) + 2ε/3, which
    is ≤ ε whenever ε ≤ 3 ln(1/δ) (the paper states the sufficient ε < 1).
  - γ = g^{1/(2p+1)}·(ln(1/β)/(εn))^{p/(2p+1)} (δ = 0) or with exponents
    1/(1.5p+1), p/(1.5p+1) (δ > 0); a noisy-count histogram is a
    (p = 1, g = 1) black box for counts normalised by n.
* **BBImprover** (Alg. 2): a run at every size t ≥ n with
  ε_t = √c/(3√ln(1/δ)) · ε / t^{1/2 + c}; Σ_t ε_t² ≤ ε²/(9 ln(1/δ)), so the
  same CDP bound applies. Theorem 13's error bound falls as t^{−(1/2 − 2c)},
  so only 0 < c < 1/4 improves with growth.
  - index ``rows`` (the paper's): the run's t is the snapshot's row count.
    From a daily cron most t never get a run, and the runs that do happen
    use a vanishing part of the total (bench/growing_schedules.md). Since
    issue 29 it is refused for new schedules (t, printed through ε_t, would be
    an exact row count); one made with it counts runs from its next run.
  - index ``runs`` (for cron): the same formula with t = k, the number of the
    run (1, 2, 3, …). Σ_{k≥1} k^{−(1+2c)} ≤ 1 + 1/(2c), so
    Σ_k ε_k² ≤ c(1 + 1/(2c)) · ε²/(9 ln(1/δ)) = (c + 1/2) · ε²/(9 ln(1/δ)),
    which is ≤ ε²/(9 ln(1/δ)) for every c ≤ 1/2: Theorem 4 gives the same
    (ε, δ) for any number of runs, whenever they happen. The per-run ε no
    longer depends on the data's size, so the error still improves with growth
    (as 1/(ε_k·n_k)) while the schedule spends its budget on the runs that
    actually happen.
* **fixed**: the naive baseline, a constant ε per run until the total is spent.

**Sizes are estimated with noise** (issue 29: a snapshot's size is never public). The size is the
number of distinct privacy units (one unit moves it by at most 1). A bbscheduler schedule spends
``SIZE_SHARE`` = 1/10 of its ε on sizes and gives its releases the rest, ε_rel = 9ε/10 (ε_i, γ and
α_i above are computed with ε_rel):

* the first run estimates n with discrete Laplace noise of scale 1/ε_start, ε_start = ε/50;
* epoch k ≥ 1 begins when a *crossing test* (an above-threshold test, paper 004 App. C, ATG/NATG)
  says the snapshot reached t_k = ⌈(1 + γ)^k·ñ⌉ units. The test of epoch k has
  ε_k^test = (2ε/25)·γ/(1 + γ)^k: 4/5 of it for the test (threshold noise of scale 5/(2ε_k^test),
  drawn once when the test starts; noise of scale 5/ε_k^test on each snapshot it is asked about)
  and 1/5 for a noisy count (scale 5/ε_k^test) when it passes, which picks the epoch. A test is
  ε_k^test-DP however many runs it answers; it passes once, and the next test (of a later epoch)
  starts. Σ_{k≥1} ε_k^test = 2ε/25, so sizes cost at most ε/50 + 2ε/25 = ε/10, forever.

Per-run ε values are rounded *down* to 15 decimals (never more budget than
the formula gives), so any number of epochs stays within the total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, TypedDict

from dpcli.core.exact import floor_fraction, fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.core.ranges import POSITIVE_RANGES, PROBABILITY_RANGE
from dpcli.core.samplers import discrete_laplace
from dpcli.errors import UsageError

SCHEDULERS = ("bbscheduler", "bbimprover", "fixed")
#: What BBImprover's t counts: the run's number (``runs``) or the snapshot's rows (``rows``, Algorithm 2
#: as printed: refused for new schedules; schedules made with it count runs from their next run).
IMPROVER_INDEXES = ("runs", "rows")
#: Default c of new BBImprover schedules: inside (0, 1/4), where Theorem 13's bound improves with t,
#: and near the best k^c/√c (per-run ε against the exponent) for 30 to 3,000 runs, c = 1/(2 ln k).
DEFAULT_IMPROVER_C = 0.1
_QUANTUM = 10**15


def default_gamma(epsilon: float, n: int, delta: float, beta: float = 0.05, p: float = 1.0, g: float = 1.0) -> Fraction:
    """γ of Algorithm 1 for a (p, g) black box, as a decimal fraction in (0, 1)."""
    if not (0 < beta < 1) or n < 1 or epsilon <= 0:
        raise ValueError("need 0 < β < 1, n ≥ 1, ε > 0")
    base = math.log(1.0 / beta) / (epsilon * n)
    if delta == 0:
        gamma = g ** (1.0 / (2 * p + 1)) * base ** (p / (2 * p + 1))
    else:
        gamma = g ** (1.0 / (1.5 * p + 1)) * base ** (p / (1.5 * p + 1))
    gamma = min(max(gamma, 1e-6), 0.999)
    return Fraction(round(gamma * 10**9), 10**9)


def check_cdp_total(epsilon: float, delta: float) -> None:
    """The δ > 0 schedules need ε ≤ 3·ln(1/δ) for their CDP bound to come out at ≤ ε."""
    if not 0 < delta < 1:
        raise ValueError("δ must be in (0, 1)")
    if epsilon > 3 * math.log(1.0 / delta):
        raise ValueError(f"with δ = {delta:g} the schedule's total ε must be ≤ 3·ln(1/δ) = "
                         f"{3 * math.log(1 / delta):.4g}")


def epoch_start(i: int, n0: int, gamma: Fraction) -> Fraction:
    """t_i = (1 + γ)^i · n0, exactly."""
    return n0 * (1 + gamma) ** i


def epoch_of(size: int, n0: int, gamma: Fraction) -> int:
    """The epoch a database of ``size`` rows is in: the largest i with t_i ≤ size (exact)."""
    if size < n0:
        raise ValueError("the database is smaller than at the schedule's first run")
    # A float estimate, then exact corrections: a few exact powers instead of one product per epoch
    # (a loop of ln(size/n0)/γ exact multiplications never ends for small γ).
    i = max(0, int(math.log(size / n0) / math.log1p(float(gamma))))
    while i > 0 and epoch_start(i, n0, gamma) > size:
        i -= 1
    while epoch_start(i + 1, n0, gamma) <= size:
        i += 1
    return i


def bbscheduler_epsilon(i: int, gamma: Fraction, total: Fraction, delta: float) -> Fraction:
    """ε_i of Algorithm 1 for epoch i (rounded down)."""
    if i < 0:
        raise ValueError("epochs start at 0")
    if delta == 0:
        return floor_fraction(gamma**2 * (i + 1) / (1 + gamma) ** (i + 2) * total, _QUANTUM)
    # Computed in log space: (1+γ)^{i+1.5} overflows floats for large i.
    g = float(gamma)
    log_eps = 1.5 * math.log(g) + math.log(i + 1) - (i + 1.5) * math.log1p(g) + math.log(float(total))
    log_eps -= math.log(3.0 * math.sqrt(math.log(1.0 / delta)))
    return floor_fraction(math.exp(log_eps), _QUANTUM) if log_eps > -700 else Fraction(0)


def bbscheduler_accuracy(i: int, epsilon_i: Fraction, gamma: Fraction, n0: int, beta: float) -> tuple[float, float]:
    """(α_i, β_i) of Algorithm 1 for a (p = 1, g = 1) black box: β_i = (β/(1+β))^{i+1} and
    α_i = ln(1/β_i) / (ε_i·(1+γ)^i·n): epoch i's error bound on normalised counts, w.p. 1 − β_i."""
    beta_i = (beta / (1.0 + beta)) ** (i + 1)
    if epsilon_i <= 0:
        return math.inf, beta_i
    alpha_i = math.log(1.0 / beta_i) / (float(epsilon_i) * float(epoch_start(i, n0, gamma)))
    return alpha_i, beta_i


def bbimprover_epsilon(t: int, total: Fraction, delta: float, c: float) -> Fraction:
    """ε_t of Algorithm 2 (rounded down): t is the snapshot's size (index ``rows``) or the run's
    number k = 1, 2, … (index ``runs``); the same formula and, for c ≤ 1/2, the same bound."""
    if t < 1 or not 0 < c <= 0.5:
        raise ValueError("need t ≥ 1 and 0 < c ≤ 1/2")
    value = math.sqrt(c) / (3.0 * math.sqrt(math.log(1.0 / delta))) * float(total) / t ** (0.5 + c)
    return floor_fraction(value, _QUANTUM)


def cdp_total(epsilons: list[Fraction], delta: float) -> float:
    """Theorem 4: ½Σε_i² + √(2 Σε_i² · ln(1/δ)), the (ε, δ) loss of composing ε_i-DP runs."""
    s2 = sum(float(e) ** 2 for e in epsilons)
    return 0.5 * s2 + math.sqrt(2.0 * s2 * math.log(1.0 / delta))


def bbimprover_runs_square_sum_bound(c: float) -> float:
    """Σ_{k≥1} ε_k² / (ε²/(9 ln(1/δ))) for the ``runs`` index is at most c·(1 + 1/(2c)) = c + 1/2."""
    if not 0 < c <= 0.5:
        raise ValueError("need 0 < c ≤ 1/2")
    return c + 0.5


# ---- bbscheduler's sizes, estimated with noise ------------------------------------------------

#: The share of a bbscheduler schedule's ε that estimates sizes; the releases get the rest.
SIZE_SHARE = Fraction(1, 10)
#: Of that share, what the first run's estimate of n takes; the crossing tests share the rest.
START_SHARE = Fraction(1, 5)
#: A crossing test below this ε would need noise beyond the sampler's range: the schedule has no more epochs.
MIN_TEST_EPSILON = Fraction(1, 10**10)
#: A float computed in log space is within this relative error of the truth; removed before flooring.
_FLOAT_MARGIN = 1e-9


def release_total(total: Fraction) -> Fraction:
    """ε_rel = (1 − SIZE_SHARE)·ε: what the releases of a bbscheduler schedule share."""
    return (1 - SIZE_SHARE) * total


def start_epsilon(total: Fraction) -> Fraction:
    """ε of the first run's estimate of n: SIZE_SHARE·START_SHARE·ε (ε/50)."""
    return SIZE_SHARE * START_SHARE * total


def crossing_share(total: Fraction) -> Fraction:
    """What all crossing tests of a schedule share: SIZE_SHARE·(1 − START_SHARE)·ε (2ε/25)."""
    return SIZE_SHARE * (1 - START_SHARE) * total


def crossing_epsilon(k: int, gamma: Fraction, total: Fraction) -> Fraction:
    """ε_k^test = crossing_share·γ/(1 + γ)^k of epoch k's crossing test (k ≥ 1), rounded down.

    Σ_{k≥1} γ/(1 + γ)^k = 1, so all tests together cost at most :func:`crossing_share`; the noise of
    every test is the same fraction of the gap t_k − t_{k−1}, whatever k. Computed in log space
    (exact powers of 1 + γ grow without bound), less a relative 10^-9 that covers its rounding.
    """
    if k < 1:
        raise ValueError("crossing tests start at epoch 1")
    g = float(gamma)
    log_eps = math.log(g) - k * math.log1p(g) + math.log(float(crossing_share(total)))
    if log_eps < -700:
        return Fraction(0)
    return floor_fraction(math.exp(log_eps) * (1.0 - _FLOAT_MARGIN), _QUANTUM)


def epoch_threshold(k: int, start: int, gamma: Fraction) -> int:
    """t_k = ⌈(1 + γ)^k·ñ⌉ units, exactly: where epoch k begins, from the noisy start ñ."""
    return math.ceil(epoch_start(k, start, gamma))


def noisy_start(stream: KeyedStream, units: int, total: Fraction) -> int:
    """ñ = units + discrete Laplace noise of scale 1/ε_start, at least 1 (units has sensitivity 1)."""
    noise = int(discrete_laplace(stream, 1 / start_epsilon(total), 1)[0])
    return max(1, units + noise)


def threshold_noise(stream: KeyedStream, epsilon: Fraction) -> int:
    """The noise on a crossing test's threshold, drawn once when the test starts: scale 5/(2ε)."""
    return int(discrete_laplace(stream, Fraction(5, 2) / epsilon, 1)[0])


def crossed(stream: KeyedStream, units: int, threshold: int, noise: int, epsilon: Fraction) -> bool:
    """Does the snapshot pass the crossing test? units + ν ≥ threshold + noise, ν of scale 5/ε.

    With the threshold noise of :func:`threshold_noise` this is AboveThreshold on integers with
    4ε/5 (noise 2/(4ε/5) on the threshold, 4/(4ε/5) on each answer): shifting the threshold noise
    by 1 and ν by 2 maps every outcome on one dataset to the same outcome on a neighbour.
    """
    nu = int(discrete_laplace(stream, 5 / epsilon, 1)[0])
    return units + nu >= threshold + noise


def crossing_count(stream: KeyedStream, units: int, epsilon: Fraction) -> int:
    """The count a passed test releases (NATG): units + noise of scale 5/ε, i.e. ε/5-DP."""
    return units + int(discrete_laplace(stream, 5 / epsilon, 1)[0])


# ---- the next runs, planned at stated sizes (``--dry-run --schedule``) ---------------------------


@dataclass(frozen=True)
class PlannedRun:
    """One of a schedule's next runs, as planned: ``epsilon`` is its new release's ε, or None when it returns
    an earlier release (bbscheduler inside an epoch) or is ``refused`` (the reason, in words)."""

    run: int  # its number in the schedule (1, 2, …)
    size: int | None  # the size stated for it (never read from the data)
    epoch: int | None = None  # bbscheduler: the epoch of its new release
    epsilon: Fraction | None = None
    refused: str | None = None
    size_epsilon: Fraction = Fraction(0)  # ε this run commits to size estimates (bbscheduler)


@dataclass(frozen=True)
class Progress:
    """Where a schedule stands before the planned runs: nothing for a new one, else what its state records
    (its releases' ε, the ε committed to sizes, and for bbscheduler the noisy start ñ, γ, its last epoch
    and the epoch of its open crossing test, None when none is open)."""

    runs: int = 0
    releases: tuple[Fraction, ...] = ()
    sizes: Fraction = Fraction(0)
    start: int | None = None
    gamma: Fraction | None = None
    epoch: int = -1
    test: int | None = 1


def plan_fixed(progress: Progress, run_epsilon: Fraction, total: Fraction, sizes: list[int | None]) -> list[PlannedRun]:
    """``fixed``: ``run_epsilon`` per run while the total allows it, then refused (exit 77)."""
    spent = sum(progress.releases, Fraction(0))
    out = []
    for j, size in enumerate(sizes, progress.runs + 1):
        if spent + run_epsilon > total:
            out.append(PlannedRun(j, size, refused="the schedule is spent (exit 77)"))
            continue
        spent += run_epsilon
        out.append(PlannedRun(j, size, epsilon=run_epsilon))
    return out


def plan_improver(progress: Progress, total: Fraction, delta: float, c: float,
                  sizes: list[int | None]) -> list[PlannedRun]:
    """``bbimprover`` counting runs: run k at ε_k, whatever its size."""
    return [PlannedRun(k, size, epsilon=bbimprover_epsilon(k, total, delta, c))
            for k, size in enumerate(sizes, progress.runs + 1)]


def start_progress(total: Fraction, delta: float, beta: float, gamma: Fraction | None, start: int) -> Progress:
    """A new bbscheduler's standing before its first run, with ñ taken as the stated ``start`` (noise aside)."""
    if gamma is None:
        gamma = default_gamma(float(release_total(total)), start, delta, beta)
    return Progress(start=start, gamma=gamma)


def plan_bbscheduler(progress: Progress, total: Fraction, delta: float, sizes: list[int]) -> list[PlannedRun]:
    """``bbscheduler`` at stated sizes, noise aside: a new epoch when a size reaches the open test's threshold
    (the one the size falls in, as a passed test's count picks it), else the epoch's release again.

    ``progress`` holds ñ and γ (:func:`start_progress` for a new schedule). Epoch 0 is the first run of a
    new schedule; each new epoch commits the ε of its successor's crossing test."""
    assert progress.start is not None and progress.gamma is not None
    start, gamma, epoch, test = progress.start, progress.gamma, progress.epoch, progress.test
    rel = release_total(total)
    out = []
    for j, size in enumerate(sizes, progress.runs + 1):
        if epoch < 0:
            new: int | None = 0
        elif test is None:
            out.append(PlannedRun(j, size, refused="no budget left for a new epoch (exit 77)"))
            continue
        else:
            new = max(test, epoch_of(size, start, gamma)) if size >= epoch_threshold(test, start, gamma) else None
        if new is None:
            out.append(PlannedRun(j, size))
            continue
        committed = start_epsilon(total) if new == 0 else Fraction(0)
        nxt = crossing_epsilon(new + 1, gamma, total)
        epoch, test = new, (new + 1 if nxt >= MIN_TEST_EPSILON else None)
        out.append(PlannedRun(j, size, new, bbscheduler_epsilon(new, gamma, rel, delta),
                              size_epsilon=committed + (nxt if test is not None else 0)))
    return out


class Used:
    """The ε a schedule's runs use of its reservation, kept as runs are added: its releases composed (their
    sum; with δ > 0 the smaller of the sum and Theorem 4's CDP bound, both valid within (ε, δ)) plus the ε
    committed to size estimates (bbscheduler), which counts in full from the run that commits it."""

    def __init__(self, delta: float) -> None:
        self.delta, self.plain, self.squares, self.sizes = delta, 0.0, 0.0, 0.0

    def add(self, epsilon: Fraction | None, sizes: Fraction = Fraction(0)) -> None:
        if epsilon is not None:
            self.plain += float(epsilon)
            self.squares += float(epsilon) ** 2
        self.sizes += float(sizes)

    @property
    def releases(self) -> float:
        if self.delta > 0 and self.squares > 0:
            s2 = self.squares
            return min(self.plain, 0.5 * s2 + math.sqrt(2.0 * s2 * math.log(1.0 / self.delta)))
        return self.plain

    @property
    def total(self) -> float:
        return self.releases + self.sizes


def check_scheduler(name: str) -> None:
    """A scheduler dpcli has (the first rule of :class:`ScheduleSpec`, which the CLI meets before the others)."""
    if name not in SCHEDULERS:
        raise UsageError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {name!r}")


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule's fixed parameters. It refuses (:class:`dpcli.errors.UsageError`, exit 2) what no schedule can
    be, in the words the CLI's refusals use, so a library caller of :func:`dpcli.release.run` meets the same rules
    as ``--schedule`` (:meth:`check`); the CLI only turns its options into these values."""

    name: str
    scheduler: str
    total_epsilon: Fraction
    total_delta: Fraction
    gamma: Fraction | None
    beta: float
    c: float
    run_epsilon: Fraction | None  # fixed only
    index: str = "runs"  # bbimprover: what t counts (runs or rows)
    #: Options left at their defaults, which an existing schedule replaces by its own (c, index): by default both
    #: (a caller that gives c or the index says so by leaving it out of this set, as the CLI does).
    defaulted: frozenset[str] = frozenset({"c", "index"})

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Each rule, in the order the CLI met them: the scheduler's name; the totals (ε, and δ: 0 for pure) in the
        ranges of :mod:`dpcli.core.ranges`, γ and β in theirs; bbimprover's c in (0, 1/4) (Theorem 13; up to 1/2
        kept from a dpcli 0.2 state) and its index, neither given to another scheduler; fixed spends ``run_epsilon``
        per pure run, the others set each run's ε, and bbimprover composes with CDP (a δ); with a δ, the total
        ε within what CDP allows (:func:`check_cdp_total`)."""
        check_scheduler(self.scheduler)
        self._check_values()
        self._check_improver()
        self._check_scheduler_budget()

    def _check_values(self) -> None:
        total = self.total_epsilon
        POSITIVE_RANGES["--total-epsilon"].check("--total-epsilon", total, fraction_text(total))
        PROBABILITY_RANGE.check("--total-delta", self.total_delta, fraction_text(self.total_delta), zero_ok=True)
        if self.gamma is not None:
            POSITIVE_RANGES["--gamma"].check("--gamma", self.gamma, fraction_text(self.gamma))
        PROBABILITY_RANGE.check("--beta", Fraction(self.beta), repr(self.beta))

    def _check_improver(self) -> None:
        # A c given must be below 1/4; dpcli 0.2 made bbimprovers with c in (0, 1/2] (its default 1/4), and their
        # states keep it (``as_in`` takes a defaulted c from the state: the run notes Theorem 13's bound)
        if not 0 < self.c < 0.25 and ("c" not in self.defaulted or not 0 < self.c <= 0.5):  # 0.2499…9 is 0.25
            raise UsageError("--improver-c must be in (0, 1/4): from c = 1/4 on, Theorem 13's error bound "
                             "no longer improves as the data grows")
        if self.index not in IMPROVER_INDEXES:
            raise UsageError(f"--improver-index must be runs or rows, got {self.index!r}")
        if self.scheduler != "bbimprover" and {"c", "index"} - self.defaulted:  # given, not stored (``as_in``)
            raise UsageError("--improver-c and --improver-index apply to --scheduler bbimprover")

    def _check_scheduler_budget(self) -> None:
        if self.scheduler == "fixed":
            if self.run_epsilon is None:
                raise UsageError("--scheduler fixed spends --epsilon per run; give --epsilon")
            if self.total_delta:
                raise UsageError("--scheduler fixed composes pure runs: drop --total-delta")
        elif self.run_epsilon is not None:
            raise UsageError(f"--scheduler {self.scheduler} sets each run's ε itself; drop --epsilon")
        if self.scheduler == "bbimprover" and not self.total_delta:
            raise UsageError("--scheduler bbimprover composes with CDP: give --total-delta in (0, 1)")
        if self.total_delta:
            try:
                check_cdp_total(float(self.total_epsilon), float(self.total_delta))
            except ValueError as exc:
                raise UsageError(str(exc)) from None

    def to_json(self) -> dict[str, Any]:
        doc = {
            "name": self.name,
            "scheduler": self.scheduler,
            "total_epsilon": fraction_text(self.total_epsilon),
            "total_delta": fraction_text(self.total_delta),
            "gamma": fraction_text(self.gamma) if self.gamma is not None else None,
            "beta": self.beta,
            "c": self.c,
            "run_epsilon": fraction_text(self.run_epsilon) if self.run_epsilon is not None else None,
        }
        if self.scheduler == "bbimprover":
            doc["index"] = self.index
        return doc

    def as_in(self, stored: dict[str, Any]) -> ScheduleSpec:
        """This spec with the defaulted options replaced by an existing schedule's values.

        The migration rule: a schedule keeps the c and index it was made with. A state written
        before the ``runs`` index existed has no ``index``: it counts rows. Options given on the
        command line are kept, and must match the stored ones (else "other settings", exit 2).
        """
        spec = self
        if "c" in self.defaulted and "c" in stored:
            spec = replace(spec, c=float(stored["c"]))
        if "index" in self.defaulted and self.scheduler == "bbimprover" and stored.get("scheduler") == "bbimprover":
            spec = replace(spec, index=stored.get("index", "rows"))
        return spec


def stored_spec(stored: dict[str, Any]) -> dict[str, Any]:
    """A state's spec as :meth:`ScheduleSpec.to_json` writes it today (a pre-0.3 bbimprover counts rows)."""
    if stored.get("scheduler") == "bbimprover" and "index" not in stored:
        return {**stored, "index": "rows"}
    return stored


class ScheduleLabel(TypedDict, total=False):
    """The ``schedule`` part of a scheduled run's report (``--json``'s ``schedule``), as the release path, the notes
    and the renderer read it by name: public parameters and noisy estimates only."""

    name: str
    scheduler: str
    cached: bool  # the call was answered with a release the schedule made before (free)
    run_epsilon: str  # the ε of the release, exact (a fraction's text)
    runs: int  # runs the schedule has made
    epsilon_spent: str
    epsilon_reserved: str
    run: int  # fixed and bbimprover: the run's number
    index: str  # bbimprover: what t counts (runs)
    c: float  # bbimprover's c
    made_with_index: str  # a bbimprover made counting rows (it counts runs now)
    epoch: int  # bbscheduler's epoch
    gamma: str
    units_noisy: int  # the noisy count of distinct units the epoch was decided on
    size_epsilon_spent: str
    alpha: float  # bbscheduler's (α_i, β_i) accuracy from the noisy start
    beta: float
    replay_of_run: int  # the same input as an earlier call: that run's release
    in_force_through: str | None  # a backfill: the moment asked, answered by the release in force then
    made_through: str | None
