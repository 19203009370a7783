"""Privacy loss distributions for ``pld`` ledgers: a dominating PLD for each event, and the (ε, δ) of a block.

A pld ledger charges *blocks* (docs/accounting.md, "The pld mode"): one release, whose events are fixed before
it reads a record, or a *series*, N releases of one cost reserved in advance. A block's PLD is the composition of
its events' PLDs (N-fold for a series): the tight composition of mechanisms whose dominating pairs are fixed in
advance, valid however each release's query is chosen from earlier outputs (Dong, Roth & Su 2022, Thm 3.2; Zhu,
Dong & Wang 2022, for dominating pairs). Its cost is the ε of that PLD at the block's δ, never more than basic
composition of the same events. Across blocks the ledger composes basically, the one rule here that is a privacy
filter under full adaptivity (:class:`dpcli.core.accounting.accountants.PldAccountant`).

Each event's PLD dominates the mechanism as dpcli implements it:

* ``pure`` ε (discrete Laplace counts, tabulate's geometric, exponential-mechanism and Gumbel selections,
  AboveThreshold in ``auto``): randomized response at ε, the pair that dominates every ε-DP mechanism (Kairouz,
  Oh & Viswanath 2015). It *is* the discrete Laplace's own pair on a sensitivity-1 query: the privacy
  loss of DLap(0) against DLap(1) is +ε with probability 1/(1 + e^-ε) and −ε otherwise.
* ``approx`` (ε, δ) (thresholded selections, the threshold's δ with ε = 0, stream tree nodes): the pair that
  dominates every (ε, δ)-DP mechanism, mass δ at +∞ (same theorem; dp_accounting's ``from_privacy_parameters``).
* ``br`` units × ε_per-bounded-range (no δ): randomized response at ε_per per unit (bounded range ⇒ ε_per-DP);
  with a δ, the (units·ε_per, δ) pair.
* ``zcdp`` marked ``rdp_curve="discrete_gaussian"`` (a discrete Gaussian on a sensitivity-1 count): the pair
  (N_Z(0, σ²), N_Z(1, σ²)) itself at the σ² the sampler uses (Canonne, Kamath & Steinke 2020), its
  noise truncated beyond a tail of 10⁻³⁰ (10⁻²⁴ added to δ per draw). Any other ρ-zCDP event, of which only
  ρ is known, is taken as its (ε, δ) at its own δ (the optimal conversion), never as a Gaussian: a ρ-zCDP
  mechanism need not be dominated by the Gaussian of that ρ.

PLDs are dp_accounting's pessimistic discretisations (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022):
losses rounded up to a grid, truncated tails moved to +∞, so every δ(ε) they give is an upper bound. The grid
is the block's own lattice when its losses have one (a series of one ε: nothing is rounded), else a thousandth
of its mean ε (:func:`_grid`). dp_accounting (the ``pld``
extra) is imported only here, and only when a block needs a PLD.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dpcli.core.accounting import composition as acc
from dpcli.core.accounting.budget import ChargeRefused
from dpcli.core.display import parameter_text
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import float_up, fraction_at_least, fraction_text

#: The version of the rules above (which PLD an event gets, the grid, the rounding); part of every cost's
#: accounting, with the versions of the libraries that compute it.
RULES = "pld/2"

#: What a pld ledger says when dp_accounting is missing (one line; exit 77 where a charge needs it).
MISSING = "pld accounting needs the optional dp_accounting package: pip install 'dpcli[pld]'"

#: The largest series a block composes (``budget plan``'s own cap on counts).
MAX_COUNT = 100_000

#: What a discrete Gaussian's truncation can hide, per draw, added to the block's δ: dp_accounting drops noise
#: beyond a tail of 10⁻³⁰ (its default bound), which moves a hockey-stick divergence by at most (1 + e^ε)·10⁻³⁰,
#: below 10⁻²⁴ for any ε ≤ 13.
_GAUSS_TAIL = 1e-24

#: Tail mass each composition may cut (moved to +∞: pessimistic).
_TRUNCATION = 1e-15

#: The rounding of a block's ε up to a decimal (a float's last bits never decide a charge).
_DIGITS = 10

#: The largest privacy loss a PLD is built with: beyond, randomized response's e^ε overflows a float (709.78), and
#: the block is charged by basic composition alone (an upper bound; at such losses a PLD gains next to nothing).
_MAX_LOSS = 700.0

#: The most grid points a block's composed PLD may be expected to span (about 400 MB of float64 and its FFT):
#: beyond, basic composition alone (a tiny σ or a huge ε on a fine grid would otherwise exhaust the machine).
_MAX_STEPS = 5 * 10**7

#: Relative slack added to a PLD's ε before that rounding: far above the float error of the composition's
#: sums (the lattice's spacing and the FFT), far below any figure shown.
_FLOAT_PAD = 1e-9


class PldUnavailable(ChargeRefused):
    """dp_accounting is not installed: a pld ledger cannot cost a new charge."""

    def __init__(self) -> None:
        super().__init__(MISSING)


@functools.cache  # (read once per process: a charge asks at every write)
def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def available() -> bool:
    """Whether dp_accounting is installed (read from its metadata: nothing is imported)."""
    return _version("dp-accounting") is not None


def accounting_version() -> str:
    """What a cost is computed with: these rules and the versions of dp_accounting, scipy and numpy.

    A ledger records it with every cost; another version recomputes (:mod:`dpcli.state.ledger.costs`).
    """
    if not available():
        raise PldUnavailable()
    versions = {name: _version(name) for name in ("dp-accounting", "scipy", "numpy")}
    return RULES + "".join(f" {name}/{v}" for name, v in versions.items())


def block_cost(events: Sequence[PrivacyEvent], count: int = 1, delta: Fraction | None = None) -> tuple[Fraction,
                                                                                                       Fraction]:
    """(ε, δ) of a block: ``events`` (one release) composed, ``count`` times (a series), stated at ``delta``
    (default: the events' own δ, times ``count``). ε is rounded up, and never above basic composition.

    Raises :class:`ChargeRefused` for events no (ε, δ) at that δ covers (a zCDP part with no δ to convert at, a
    Gaussian with δ = 0), :class:`PldUnavailable` when a PLD is needed and dp_accounting is missing.
    """
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"a block repeats 1 to {MAX_COUNT:,} times")
    key = (tuple(json.dumps(ev.to_json(), sort_keys=True) for ev in events), count, delta)
    return _cached_cost(key)


@functools.lru_cache(maxsize=4096)
def _cached_cost(key: tuple[tuple[str, ...], int, Fraction | None]) -> tuple[Fraction, Fraction]:
    texts, count, delta = key
    events = [PrivacyEvent.from_json(json.loads(t)) for t in texts]
    own = sum((ev.delta for ev in events), Fraction(0)) * count
    target = own if delta is None else Fraction(delta)
    if not 0 <= target < 1:
        raise ValueError("a block's δ must be in [0, 1)")
    basic = _basic(events, count)
    if basic is not None and target == 0 and basic[1] == 0:
        return basic[0], Fraction(0)  # pure events at δ = 0: the sum is exact (a PLD would only round it up)
    candidates = [basic[0]] if basic is not None and basic[1] <= target else []
    if target > 0 and events:
        eps = _pld_epsilon(events, count, float(target))
        if math.isfinite(eps):
            candidates.append(fraction_at_least(eps, _DIGITS))
    if not events:
        return Fraction(0), target
    if not candidates:
        names = ", ".join(sorted({ev.mechanism for ev in events}))
        if target == 0 or delta is None:
            raise ChargeRefused(f"{names} needs a δ > 0 to be charged as (ε, δ) in a pld ledger: give --delta")
        raise ChargeRefused(f"{count:,} runs of {names} need more δ than the series' {parameter_text(target, 'down')} "
                            f"(their thresholds' δ alone is {parameter_text(own, 'up')})")
    return min(candidates), target


def _basic(events: Sequence[PrivacyEvent], count: int) -> tuple[Fraction, Fraction] | None:
    """Basic composition of the events as an approx ledger charges them (zCDP at its own δ), or None when a zCDP
    event has no δ to convert at."""
    eps, delta = Fraction(0), Fraction(0)
    for ev in events:
        if ev.kind == "zcdp":
            if ev.delta == 0:
                return None
            eps += fraction_at_least(acc.zcdp_to_approx(float(ev.rho), float(ev.delta)))
        elif ev.kind == "br":
            eps += ev.epsilon * ev.units
        else:
            eps += ev.epsilon
        delta += ev.delta
    return eps * count, delta * count


def _loss_unit(ev: PrivacyEvent) -> Fraction | None:
    """The spacing of an event's privacy losses as dpcli places them, exactly (0: none; None: rounded to a grid).

    A discrete Gaussian's losses (1 − 2x)/(2σ²) are a lattice too, but dp_accounting computes them in floats and
    rounds each up a whole step when it lands a hair above a point: it keeps the thousandth rule."""
    if ev.kind == "zcdp":
        return Fraction(0) if ev.rho == 0 else None
    if ev.kind == "br":
        return ev.epsilon if ev.delta == 0 else ev.epsilon * ev.units
    return ev.epsilon


def _grid(events: Sequence[PrivacyEvent]) -> tuple[float, Fraction | None]:
    """The loss grid of a block, and the exact lattice it is (None: losses are rounded up to it).

    When every event's losses lie on one lattice no finer than a thousandth of the largest (ε = 0.05 and 0.0025
    on multiples of 0.0025; a lone ε on itself), that lattice: nothing is rounded. Otherwise a thousandth of
    the events' mean ε (or 1/σ), a power of ten in [10⁻⁶, 10⁻⁴]: each loss rounds up by less than that.
    """
    units = [_loss_unit(ev) for ev in events]
    exact = [u for u in units if u]
    if exact and None not in units:
        lattice = functools.reduce(_gcd, exact)
        if max(exact) / lattice <= 1000:
            return float_up(lattice), lattice
    scales = [float(ev.epsilon * max(ev.units, 1)) for ev in events if ev.kind != "zcdp" and ev.epsilon > 0]
    scales += [math.sqrt(2.0 * float(ev.rho)) for ev in events if ev.kind == "zcdp" and ev.rho > 0]
    mean = sum(scales) / len(scales) if scales else 1.0
    exponent = math.floor(math.log10(mean)) - 3
    return 10.0 ** min(-4, max(-6, exponent)), None


def _gcd(a: Fraction, b: Fraction) -> Fraction:
    """The largest rational of which both are integer multiples."""
    return Fraction(math.gcd(a.numerator * b.denominator, b.numerator * a.denominator), a.denominator * b.denominator)


def _pld_epsilon(events: Sequence[PrivacyEvent], count: int, target: float) -> float:
    """The ε at δ = ``target`` of the events' PLDs composed (``count``-fold), or ∞."""
    grid, lattice = _grid(events)
    slack = _GAUSS_TAIL * count if any(_is_gaussian(ev) for ev in events) else 0.0
    if target <= slack or not _tractable(events, count, grid):
        return math.inf
    composed: Any = None
    for ev in events:
        one = event_pld(ev, grid, lattice)
        if one is None:
            continue
        composed = one if composed is None else composed.compose(one, tail_mass_truncation=_TRUNCATION)
    if composed is None:
        return 0.0
    if count > 1:
        composed = composed.self_compose(count, tail_mass_truncation=_TRUNCATION)
    eps = epsilon_for_delta(composed, target - slack)
    return eps * (1 + _FLOAT_PAD) if math.isfinite(eps) else eps


def _loss_span(ev: PrivacyEvent) -> float:
    """The largest |privacy loss| of an event's PLD (:func:`event_pld`): ε (units·ε for br), a converted zCDP ρ's
    ε, a discrete Gaussian's (2T + 1)/(2σ²) at its truncation bound T = ⌈11.6σ⌉ (dp_accounting's)."""
    if ev.kind == "zcdp":
        if ev.rho == 0:
            return 0.0
        if _is_gaussian(ev):
            sigma2 = float(gaussian_sigma2(ev.rho))
            return (2 * math.ceil(11.6 * math.sqrt(sigma2)) + 1) / (2 * sigma2)
        return acc.zcdp_to_approx(float(ev.rho), float(ev.delta)) if ev.delta else 0.0
    return float(ev.epsilon * max(ev.units, 1)) if ev.kind == "br" else float(ev.epsilon)


def _tractable(events: Sequence[PrivacyEvent], count: int, grid: float) -> bool:
    """Whether a block's PLD stays within :data:`_MAX_LOSS` and :data:`_MAX_STEPS` (the N-fold composition's span
    estimated as its truncated window: at most 2 + 16√N times one run's, and never more than N times)."""
    spans = [_loss_span(ev) for ev in events]
    if not spans or max(spans) > _MAX_LOSS:
        return not spans
    return sum(spans) / grid * min(count, 2 + 16 * math.sqrt(count)) <= _MAX_STEPS


def epsilon_for_delta(composed: Any, delta: float) -> float:
    """The smallest ε whose hockey-stick divergence in the PLD ``composed`` is at most ``delta`` (∞ if none).

    dp_accounting's ``get_epsilon_for_delta`` in one vectorised pass instead of its Python loop (the same
    formula; a series of 365 runs is about a million grid points): on the grid losses l_0 < l_1 < …, δ at
    ε = l_i is m_∞ + Σ_{j>i} p_j (1 − e^{l_i − l_j}); between two losses δ(ε) = m_∞ + U − e^ε·L solves exactly.
    The weighted tails Σ_{j≥i} p_j e^{−(j−i)h} come from one first-order filter, stable for any range of losses.
    """
    from scipy.signal import lfilter

    try:  # dp_accounting 0.6's PMFs (pinned, and tested against its own loop); another layout: its own loop
        pmfs = [composed._pmf_remove] if composed._symmetric else [composed._pmf_remove, composed._pmf_add]
        return max(_epsilon_of_pmf(pmf.to_dense_pmf(), delta, lfilter) for pmf in pmfs)
    except AttributeError:
        return float(composed.get_epsilon_for_delta(delta))


def _epsilon_of_pmf(dense: Any, delta: float, lfilter: Any) -> float:
    import numpy as np

    inf_mass = float(dense._infinity_mass)
    if inf_mass > delta:
        return math.inf
    probs = np.maximum(np.asarray(dense._probs, dtype=float), 0.0)  # FFT round-off can leave -1e-18s
    step = float(dense._discretization)
    lowest = int(dense._lower_loss)
    upper = inf_mass + np.cumsum(probs[::-1])[::-1]  # U_i = m_∞ + Σ_{j≥i} p_j
    tails = lfilter([1.0], [1.0, -math.exp(-step)], probs[::-1])[::-1]  # T_i = Σ_{j≥i} p_j e^{-(j-i)h}
    # δ(l_i) = U_{i+1} − e^{-h}·T_{i+1} (losses strictly above l_i), and m_∞ at the top loss
    at_loss = np.append(upper[1:] - math.exp(-step) * tails[1:], inf_mass)
    i = int(np.argmax(at_loss <= delta))  # the first grid loss where δ is small enough (δ decreases)
    if i == 0 and upper[0] - tails[0] * math.exp(-lowest * step) <= delta:
        return 0.0  # δ(0) ≤ target already (the lowest loss is ≥ 0, or the mass above 0 is small)
    loss_i = (lowest + i) * step
    # in [l_{i-1}, l_i]: δ(ε) = U_i − e^{ε − l_i}·T_i
    if tails[i] <= 0:
        return max(loss_i, 0.0)
    eps = loss_i + math.log(max(upper[i] - delta, 0.0) / tails[i]) if upper[i] > delta else loss_i - 1.0
    return max(min(eps, loss_i), (lowest + i - 1) * step, 0.0)


def _is_gaussian(ev: PrivacyEvent) -> bool:
    return ev.kind == "zcdp" and ev.rdp_curve == "discrete_gaussian"


def _library() -> Any:
    """dp_accounting's PLD module and its parameter class (imported on first use: about a second)."""
    if not available():
        raise PldUnavailable()
    try:
        from dp_accounting.pld import common, privacy_loss_distribution
    except ImportError:  # installed but broken (a missing scipy): the same one line
        raise PldUnavailable() from None
    return privacy_loss_distribution, common


def event_pld(ev: PrivacyEvent, grid: float, lattice: Fraction | None = None) -> Any:
    """The dominating PLD of one event on a loss grid (None: an event that costs nothing). On an exact
    ``lattice`` (the grid as a fraction), randomized response's losses ±ε are placed on it exactly."""
    lib, common = _library()

    def rr(epsilon: Fraction, delta: Fraction = Fraction(0)) -> Any:
        if lattice is None:
            params = common.DifferentialPrivacyParameters(float(epsilon), float(delta))
            return lib.from_privacy_parameters(params, value_discretization_interval=grid)
        k, e, d = int(epsilon / lattice), float(epsilon), float(delta)
        masses = {k: (1 - d) / (1 + math.exp(-e))}
        masses[-k] = masses.get(-k, 0.0) + (1 - d) / (1 + math.exp(e))
        return lib.PrivacyLossDistribution.create_from_rounded_probability(masses, d, grid)

    if ev.kind == "zcdp":
        if ev.rho == 0:
            return None
        if _is_gaussian(ev):
            return lib.from_discrete_gaussian_mechanism(gaussian_sigma(ev.rho), sensitivity=1,
                                                        value_discretization_interval=grid)
        if ev.delta == 0:
            raise ChargeRefused(f"{ev.mechanism} is zCDP: give --delta so it can be charged as (ε, δ) in a pld "
                                "ledger")
        return rr(fraction_at_least(acc.zcdp_to_approx(float(ev.rho), float(ev.delta))), ev.delta)
    if ev.kind == "br":
        if ev.delta == 0:
            return rr(ev.epsilon).self_compose(ev.units) if ev.units and ev.epsilon else None
        return rr(ev.epsilon * ev.units, ev.delta)
    if ev.epsilon == 0 and ev.delta == 0:
        return None
    return rr(ev.epsilon, ev.delta)


def gaussian_sigma2(rho: Fraction) -> Fraction:
    """σ² of the discrete Gaussian a ``discrete_gaussian`` event's sampler draws from: 1/(2ρ), rounded up as the
    sampler rounds it (:func:`dpcli.core.samplers.effective_sigma2`)."""
    from dpcli.core.samplers import effective_sigma2

    return effective_sigma2(Fraction(1) / (2 * Fraction(rho)))


def gaussian_sigma(rho: Fraction) -> float:
    """σ of that discrete Gaussian (:func:`gaussian_sigma2`)."""
    return math.sqrt(float(gaussian_sigma2(rho)))


def cost_json(epsilon: Fraction, delta: Fraction, accounting: str) -> dict[str, str]:
    """A block's cost as a ledger entry records it."""
    return {"epsilon": fraction_text(epsilon), "delta": fraction_text(delta), "accounting": accounting}
