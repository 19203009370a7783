"""Per group and compared column of ``dpcli diff``: the 95% margin of the difference, its p-value for "nothing
changed", and the one-sided margin of an equivalence test, for each way two releases' noises combine.

* :func:`integer_test`: two independent integer noises (counts, sums, tabulated cells, top-k counts), exact or
  bounded from above (:mod:`dpcli.core.differences`);
* :func:`mean_test`: two means, each a ratio of a noisy sum and a noisy count: a union bound over the four
  measurements' intervals (conservative: covers at least 95%);
* :func:`normal_test`: a stream's values, weighted sums of Gaussian tree nodes, some of them shared: the normal
  distribution of the exact variance of the difference, with the rounding of the two released values.

Every margin is in the column's units and includes what showing the values rounded can move a difference
(``half``: the two values' rounding, 0 for integers and Parquet). A difference of two values with the same noise
(``exact``) has margin 0 and the p-value 1 if it is 0 (0 otherwise: no noise explains it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

import numpy as np

from dpcli.core import differences as d
from dpcli.core.intervals import cover_margin
from dpcli.core.mechanisms import Noise
from dpcli.errors import DataError

#: The one-sided 95% quantile of the normal distribution (equivalence tests at 5% each side).
Z_ONE_SIDED = NormalDist().inv_cdf(0.95)
#: How each kind of margin is computed (the summary's ``margins``).
EXACT = "95% of the difference of the two noises: exact, or a bound that covers more"
UNION = ("conservative 95%: the two counts' and two centred sums' own 98.75% intervals (union bound), through "
         "the ratios and the bounds")
NORMAL = "95% of the normal distribution with the difference's exact variance (tree nodes shared), and the roundings"
SAME = "0: the two releases share their noise"


@dataclass(frozen=True)
class Tested:
    """One compared column: per group the 95% margin of its difference (in its units), a p-value for "nothing
    changed" and a one-sided 95% margin (NaN for a group released in one file only), whether the two values share
    their noise (``exact``: margin 0), and how the margin is computed."""

    column: str
    margin: np.ndarray
    p: np.ndarray
    one_sided: np.ndarray
    how: str
    exact: np.ndarray


def _exact_rows(diffs: np.ndarray, exact: np.ndarray, out: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Rows whose two values share their noise: margin 0, p 1 for no difference and 0 for any other."""
    margin, p, one = out
    margin[exact], one[exact] = 0.0, 0.0
    p[exact] = np.where(diffs[exact] == 0, 1.0, 0.0)


def _empty(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)


def integer_test(column: str, diffs: np.ndarray, old: Sequence[Noise | None], new: Sequence[Noise | None],
                 step: Fraction, half: float, exact: np.ndarray) -> Tested:
    """Each group's values carry integer noises ``old[i]`` and ``new[i]`` (None: not released) times ``step``,
    independent unless ``exact[i]`` (the same noise: the same seed)."""
    margin, p, one = out = _empty(diffs.size)
    s = float(step)
    exact = exact & ~np.isnan(diffs)
    groups: dict[tuple[int, int], tuple[Noise, Noise, list[int]]] = {}
    for i, (a, b) in enumerate(zip(old, new, strict=True)):  # rows by their noises (the same objects: by identity)
        if a is not None and b is not None and not math.isnan(diffs[i]) and not exact[i]:
            groups.setdefault((id(a), id(b)), (a, b, []))[2].append(i)
    for a, b, rows in groups.values():
        idx = np.asarray(rows)
        units = np.maximum(0, np.ceil((np.abs(diffs[idx]) - half) / s - 1e-9)).astype(np.int64)
        try:
            margin[idx], one[idx] = d.difference_margin(a, b) * s + half, d.one_sided_margin(a, b) * s + half
            seen, where = np.unique(units, return_inverse=True)  # the least noise difference each can be
            p[idx] = np.array([d.difference_p_value(a, b, int(u)) for u in seen])[where]
        except ValueError:
            raise DataError(f"{column}: a Laplace and a Gaussian noise this large cannot be combined here (releases "
                            "of two ledger modes)") from None
    _exact_rows(diffs, exact, out)
    return Tested(column, margin, p, one, EXACT, exact)


def mean_test(column: str, diffs: np.ndarray, old: d.MeanRelease, new: d.MeanRelease, exact: np.ndarray) -> Tested:
    """Means (groups released in both files; the arrays of ``old`` and ``new`` are over the same groups as
    ``diffs``, NaN where one is missing): :func:`dpcli.core.differences.mean_difference_interval` at 95% gives the
    margin around the difference shown, the same at every level its p-value, and its interval within ±D the
    equivalence test (each one-sided error at most the interval's 5%)."""
    margin, p, one = out = _empty(diffs.size)
    both = ~np.isnan(diffs)
    if both.any():
        lo, hi = d.mean_difference_interval(old, new)  # (the shown means' rounding is in their ranges)
        margin[both] = cover_margin(diffs[both], lo[both], hi[both])
        one[both] = margin[both]
        p[both] = d.mean_difference_p_values(_shrunk(old, both), _shrunk(new, both))
    _exact_rows(diffs, exact & both, out)
    return Tested(column, margin, p, one, UNION, exact & both)


def _shrunk(r: d.MeanRelease, rows: np.ndarray) -> d.MeanRelease:
    return d.MeanRelease(r.grid, r.count_noise, r.sum_noise, r.count[rows], r.mean[rows], r.half)


def normal_test(column: str, diffs: np.ndarray, variance: np.ndarray, step: float, integer: bool,
                half: float) -> Tested:
    """Values whose difference is normal with ``variance`` (output units², the roundings included; 0: the same
    noise): the margin z·√variance plus the values' rounding shown. A difference of whole counts takes whole
    values, and its normal approximation the continuity correction: P[|E| ≤ m] ≈ P[|N| ≤ m + ½], so the margin is
    the smallest whole m with z·√variance ≤ m + ½, and the p-value P[|N| ≥ |d| − ½]."""
    margin, p, one = out = _empty(diffs.size)
    live = ~np.isnan(diffs) & (variance > 0)
    sd = np.sqrt(np.where(live, variance, 0.0))
    z = NormalDist().inv_cdf(0.975)
    margin[live], one[live] = z * sd[live], Z_ONE_SIDED * sd[live]
    correction = 0.5 * step if integer else 0.0
    if integer:
        margin[live] = np.maximum(np.ceil((margin[live] - correction) / step), 0.0) * step
        one[live] = np.maximum(np.ceil((one[live] - correction) / step), 0.0) * step
    margin[live] += half
    one[live] += half
    p[live] = [d.normal_p_value(v, max(0.0, abs(x) - half - correction) if x else 0.0)
               for v, x in zip(variance[live], diffs[live], strict=True)]
    exact = ~np.isnan(diffs) & (variance <= 0)
    _exact_rows(diffs, exact, out)
    return Tested(column, margin, p, one, NORMAL, exact)
