"""Binary-tree aggregation with bottom-up Honaker estimates (DP-SQLP, paper 001, Alg. 1, eq. 1-2).

A tree over n leaves (one per trigger since the tree started) holds one noisy
value per *complete* node: the true sum of the node's leaves plus independent
discrete Gaussian noise N_Z(0, σ²). A leaf's value reaches one node per level
that can complete, ``levels(n) = ⌊log2 n⌋ + 1``, so a unit changing one leaf by
at most Δ gives ρ = Δ²·levels/(2σ²)-zCDP (Theorem 2.3).

Estimates (post-processing of the noisy nodes, so real-valued is fine):

* bottom-up Honaker: a node's estimate combines its own noisy value with its
  children's estimates by inverse-variance weighting; a node with κ levels
  below and including it then has variance σ²/(2(1 − 2^{−κ})) (eq. 1);
* the prefix sum after leaf i is the sum of the estimates of the dyadic
  decomposition of [1, i] (eq. 2), with variance λ²(i) = Σ of those variances.

All node noise of a tree is drawn when the tree is created (the trees created
together are drawn in one vectorised call, :func:`noise_prefixes`), so a
tree's estimates are a deterministic function of (seed, data).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpcli.core.prf import KeyedStream
from dpcli.core.samplers import discrete_gaussian


def levels(n: int) -> int:
    """Levels of a tree over n leaves that contain complete nodes: ⌊log2 n⌋ + 1."""
    if n < 1:
        raise ValueError("a tree needs at least one leaf")
    return n.bit_length()


def node_variances(sigma2: float, n: int) -> np.ndarray:
    """V_ℓ for ℓ = 0 … levels(n) − 1: V_0 = σ², V_ℓ = 1/(1/σ² + 1/(2V_{ℓ−1})) = σ²/(2(1 − 2^{−(ℓ+1)}))."""
    ell = np.arange(levels(n), dtype=np.float64)
    return sigma2 / (2.0 * (1.0 - 2.0 ** (-(ell + 1.0))))


def prefix_variances(sigma2: float, n: int) -> np.ndarray:
    """λ²(i) for i = 1 … n: the variance of the prefix-sum estimate after leaf i (eq. 2/4)."""
    v = node_variances(sigma2, n)
    i = np.arange(1, n + 1)
    out = np.zeros(n)
    for ell in range(v.size):
        out += ((i >> ell) & 1) * v[ell]
    return out


def _level_sizes(n: int) -> list[int]:
    return [n >> ell for ell in range(levels(n))]


def honaker_prefixes(leaves: np.ndarray, noise: np.ndarray, sigma2: float) -> np.ndarray:
    """Bottom-up Honaker prefix-sum estimates after each leaf of m trees of n leaves at once.

    ``leaves`` (m, n) are the true per-leaf increments, ``noise`` (m, nodes)
    the trees' node noise, level by level (leaves first).

    The estimates are linear in (leaves, noise) and noise-free nodes give exact
    sums (a node's two weights add up to one), so ``honaker_prefixes(L, N)`` =
    ``cumsum(L) + honaker_prefixes(0, N)``: callers may keep the noise-only part.
    """
    leaves = np.asarray(leaves, dtype=np.float64)
    n = leaves.shape[1]
    sizes = _level_sizes(n)
    v = node_variances(sigma2, n)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    true = leaves
    est = leaves + noise[:, : sizes[0]]
    estimates = [est]
    for ell in range(1, len(sizes)):
        m = sizes[ell]
        true = true[:, 0 : 2 * m : 2] + true[:, 1 : 2 * m : 2]
        y = true + noise[:, offsets[ell] : offsets[ell] + m]
        children = est[:, 0 : 2 * m : 2] + est[:, 1 : 2 * m : 2]
        w_own = v[ell] / sigma2
        w_children = v[ell] / (2.0 * v[ell - 1])
        est = w_own * y + w_children * children
        estimates.append(est)
    i = np.arange(1, n + 1)
    out = np.zeros(leaves.shape)
    for ell, est_l in enumerate(estimates):
        bit = ((i >> ell) & 1).astype(bool)
        out[:, bit] += est_l[:, (i[bit] >> ell) - 1]
    return out


def noise_only_prefixes(noise: np.ndarray, sigma2: float, n: int) -> np.ndarray:
    """``honaker_prefixes(zeros, noise, sigma2)``, bit for bit, without the all-zero true sums.

    The same floating-point operations in the same order (adding the zero
    leaves is exact), so the two agree exactly (tested).
    """
    sizes = _level_sizes(n)
    v = node_variances(sigma2, n)
    i = np.arange(1, n + 1)
    out = np.zeros((noise.shape[0], n))
    est = noise[:, : sizes[0]]
    offset = sizes[0]
    for ell in range(len(sizes)):
        if ell:
            m = sizes[ell]
            y = noise[:, offset : offset + m]
            offset += m
            children = est[:, 0 : 2 * m : 2] + est[:, 1 : 2 * m : 2]
            est = (v[ell] / sigma2) * y + (v[ell] / (2.0 * v[ell - 1])) * children
        bit = ((i >> ell) & 1).astype(bool)
        out[:, bit] += est[:, (i[bit] >> ell) - 1]
    return out


def noise_prefixes(stream: KeyedStream, sigma2: Fraction, trees: int, n: int) -> np.ndarray:
    """Noise-only prefix estimates (trees, n) of ``trees`` new trees over n leaves, drawn in one call."""
    nodes = sum(_level_sizes(n))
    noise = discrete_gaussian(stream, sigma2, trees * nodes).reshape(trees, nodes)
    return noise_only_prefixes(noise, float(sigma2), n)


def selection_thresholds(sigma2: float, n: int, beta: float, horizon: int) -> np.ndarray:
    """τ(i) for i = 1 … n such that P[∃ i: error(i) > τ(i)] ≤ β over ``horizon`` triggers.

    The error of a prefix estimate is a weighted sum of independent discrete
    Gaussians, which is sub-Gaussian with variance proxy λ²(i); a union bound
    over the horizon gives τ(i) = λ(i)·√(2 ln(horizon/β)). (App. B uses the
    Gaussian inverse CDF, exact for continuous noise; the sub-Gaussian bound is
    the rigorous counterpart for the exact discrete noise used here.)
    """
    thresholds: np.ndarray = np.sqrt(prefix_variances(sigma2, n)) * math.sqrt(2.0 * math.log(horizon / beta))
    return thresholds
