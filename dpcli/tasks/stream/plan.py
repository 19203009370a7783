"""The privacy split and the calibration of every tree of a stream-replay release (no data read).

Accounting (Sec. 4.4, Sec. 5 split): key selection gets ε/2 and 2δ/3, of which
half the δ converts its zCDP to (ε, δ) and half bounds the (e^ε + 1)·C·β
failure term of Theorem 3.1 over C rounds; perturbation gets ε/2 and δ/3
(zCDP → (ε, δ) by the optimal conversion), split equally between count and
sum; the two parts add up (basic composition) to the requested (ε, δ).
The sensitivities come from the record cap's stability
(:func:`dpcli.bounding.stream_records.record_cap_stability`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
import polars as pl

from dpcli.bounding.stream_records import record_cap_stability
from dpcli.core import tree
from dpcli.core.accounting import composition as acc
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import floor_parameter, fraction_text
from dpcli.core.samplers import effective_sigma2
from dpcli.errors import UsageError
from dpcli.tasks.reports import StreamReport
from dpcli.tasks.stream.query import StreamQuery

#: The discrete Gaussian proposes from a discrete Laplace with scale ⌊σ⌋ + 1 ≤ 2^44 (the samplers' limit).
_MAX_SIGMA2 = Fraction((1 << 44) - 1) ** 2


@dataclass(frozen=True)
class StreamPlan:
    """Calibration of every tree (decided without the data)."""

    beta: float
    sigma2_select: Fraction
    sigma2_count: Fraction
    sigma2_sum: Fraction | None
    thresholds: dict[int, np.ndarray] = field(default_factory=dict, compare=False, hash=False)
    events: tuple[PrivacyEvent, ...] = ()
    summary: StreamReport = field(default_factory=lambda: StreamReport(), compare=False, hash=False)

    def selection_threshold(self, n: int, horizon: int) -> np.ndarray:
        """Selection thresholds τ(i) of a tree over n leaves, i = 1 … n (cached; see
        :func:`dpcli.core.tree.selection_thresholds`)."""
        if n not in self.thresholds:
            self.thresholds[n] = tree.selection_thresholds(float(self.sigma2_select), n, self.beta, horizon)
        return self.thresholds[n]


def _rho(epsilon: float, delta: float) -> Fraction:
    """The zCDP ρ giving (ε, δ), rounded down (a little less budget is safe); never 0."""
    rho = floor_parameter(acc.rho_for_epsilon(epsilon, delta))
    if rho <= 0:
        raise UsageError("is too small to calibrate stream-replay's Gaussian noise", field="epsilon")
    return rho


def _log_beta(q: StreamQuery, eps_k: float, delta_k: float) -> float:
    """log β, β = (δ_k/2)/((e^{ε_k} + 1)·C), in log space: e^{ε_k} overflows for ε_k > 709."""
    log_beta = math.log(delta_k / 2) - (eps_k + math.log1p(math.exp(-eps_k))) - math.log(q.max_records)
    if log_beta < -700.0:
        raise UsageError(f"{fraction_text(q.epsilon)} is too large for key selection's failure "
                         f"probability (below 1e-300); use a smaller --epsilon", field="epsilon")
    return log_beta


def plan_stream(q: StreamQuery) -> StreamPlan:
    """Split (ε, δ) as Sec. 5 and calibrate the trees (Sec. 4.4, App. B).

    With ``auto`` bounds or a bias report, DP-SQLP runs at ε·(1 − shares) and the parts are events of their own
    (:class:`dpcli.tasks.auto_bounds.BudgetParts`); ``q`` must be :meth:`StreamQuery.resolved` by then."""
    q.validate()
    assert not q.pending, "a stream is calibrated at its chosen bounds"
    release_epsilon = q.epsilon * q.parts.release
    eps, delta = float(release_epsilon), float(q.delta)
    stability = record_cap_stability(q.max_records, q.grid)
    lv = tree.levels(q.triggers)
    eps_k, delta_k = eps / 2, 2 * delta / 3
    eps_m, delta_m = eps / 2, delta / 3
    beta = math.exp(_log_beta(q, eps_k, delta_k))
    rho_k = _rho(eps_k, delta_k / 2)
    # Selection: a unit joins at most C rounds, one unit each; every leaf reaches lv nodes of its tree.
    sigma2_select = effective_sigma2(Fraction(stability.l2_squared("units") * lv) / (2 * rho_k))
    rho_m = _rho(eps_m, delta_m)
    rho_col = rho_m / (2 if q.value else 1)
    # Perturbation: all of a unit's records may fall in one leaf, so its L2 change is at most its L1.
    sigma2_count = effective_sigma2(Fraction(stability.l1("rows") ** 2 * lv) / (2 * rho_col))
    sigma2_sum = None
    grid = q.grid
    if grid is not None:
        sigma2_sum = effective_sigma2(Fraction(stability.l1("value") ** 2 * lv) / (2 * rho_col))
    for sigma2 in (sigma2_select, sigma2_count, sigma2_sum):
        if sigma2 is not None and sigma2 > _MAX_SIGMA2:
            raise UsageError(f"stream-replay noise too large to sample (σ = {math.sqrt(float(sigma2)):.3g}); "
                             "use a larger ε, a smaller cap on records per unit or narrower value bounds")
    events = (PrivacyEvent("approx", "stream-replay/dp-sqlp", epsilon=release_epsilon, delta=q.delta,
                           detail={"C": str(q.max_records), "triggers": str(q.triggers)}),
              *q.parts.events("stream-replay", q.epsilon, None))
    summary: StreamReport = {
        "key_selection": {"epsilon": eps_k, "delta": delta_k, "rho_total": float(rho_k), "rounds": q.max_records,
                          "beta": beta, "sigma": math.sqrt(float(sigma2_select))},
        "perturbation": {"epsilon": eps_m, "delta": delta_m, "rho_total": float(rho_m),
                         "sigma_count": math.sqrt(float(sigma2_count)),
                         "sigma_sum": (math.sqrt(float(sigma2_sum)) * float(grid.granularity)
                                       if grid and sigma2_sum else None)},
        "levels": lv,
    }
    if q.auto is not None or q.report_bias is not None:
        summary["parts"] = parts_of(q)
    return StreamPlan(beta, sigma2_select, sigma2_count, sigma2_sum, {}, events, summary)


def parts_of(q: StreamQuery) -> dict[str, str]:
    """The budget's parts as text: the release (DP-SQLP), choosing bounds, the bias report (those used)."""
    parts = q.parts
    out = {"release": f"ε={fraction_text(q.epsilon * parts.release)}, δ={fraction_text(q.delta)}"}
    if parts.auto:
        out["auto-bounds"] = f"ε={fraction_text(q.epsilon * parts.auto)}"
    if parts.bias:
        out["bias"] = f"ε={fraction_text(q.epsilon * parts.bias)}"
    return out


@dataclass(frozen=True)
class PendingPlan:
    """A stream whose bounds are chosen at run time (``auto``), planned before any data is read: its cost, the
    same as the plan at the chosen bounds (asserted when they are), and what the calibration shows without
    them (``summary``; ``moe95_by_trigger`` of the columns whose margin depends on no chosen bound)."""

    events: tuple[PrivacyEvent, ...]
    summary: StreamReport = field(default_factory=lambda: StreamReport(), compare=False, hash=False)
    moe95_by_trigger: dict[str, list[float]] = field(default_factory=dict, compare=False, hash=False)
    chosen_at_run_time: tuple[str, ...] = field(default=(), compare=False, hash=False)


def plan_pending(q: StreamQuery) -> PendingPlan:
    """The plan of a stream whose bounds are ``auto``: the cost (DP-SQLP's event says C ``auto`` when C is
    chosen) and the margins that depend on no chosen bound (counts when only L is chosen)."""
    q.validate()
    assert q.auto is not None
    placeholder = q.resolved(q.max_records or 1, q.clamp if q.clamp is not None else (1.0 if q.value else None))
    at = plan_stream(placeholder)
    margins = margins95_by_trigger(placeholder, at)
    later = tuple(c for c in margins if q.auto.contributions or c != "count")
    dp_sqlp = at.events[0]
    if q.auto.contributions:
        dp_sqlp = replace(dp_sqlp, detail={**dp_sqlp.detail, "C": "auto"})
    summary: StreamReport = {**at.summary, "key_selection": dict(at.summary["key_selection"]),
                                  "perturbation": dict(at.summary["perturbation"])}
    if q.auto.contributions:
        summary["key_selection"].update(rounds=None, beta=None, sigma=None)
        summary["perturbation"]["sigma_count"] = None
    summary["perturbation"]["sigma_sum"] = None if q.value else summary["perturbation"]["sigma_sum"]
    return PendingPlan((dp_sqlp, *at.events[1:]), summary, {c: m for c, m in margins.items() if c not in later},
                       later)


def margins95(q: StreamQuery, plan: StreamPlan) -> dict[str, float]:
    """The 95% margin of each released column, in its units, at a window's worst trigger (the last one's
    in :func:`margins95_by_trigger`: earlier triggers' margins are smaller or equal)."""
    return {column: margins[-1] for column, margins in margins95_by_trigger(q, plan).items()}


def margins95_by_trigger(q: StreamQuery, plan: StreamPlan) -> dict[str, list[float]]:
    """The 95% margin of each released column at each trigger t = 1 … triggers of a window.

    A value released at trigger t is the Honaker prefix estimate of its key's perturbation tree,
    which started at a trigger s ≤ t (the key's first release in the window): after
    i = t − s + 1 ≤ t leaves its noise has variance λ²(i), and λ²(i) depends on i's binary digits,
    so the largest a value at t can have is max λ²(i) over i ≤ t (public: the noise scales and t).
    The noise is a weighted sum of independent discrete Gaussians, each of variance at most its
    parameter σ²: the margin is the normal approximation 1.96·√(max λ²), plus half a unit for the
    rounding of the released value (half a grid step for sums). Margins grow over a window up to
    :func:`margins95`'s.
    """
    def running(sigma2: Fraction, unit: float) -> list[float]:
        worst = np.maximum.accumulate(tree.prefix_variances(float(sigma2), q.triggers))
        return [float(m) for m in (1.96 * np.sqrt(worst) + 0.5) * unit]

    out = {"count": running(plan.sigma2_count, 1.0)}
    grid = q.grid
    if q.value and grid is not None and plan.sigma2_sum is not None:
        out[f"sum_{q.value}"] = running(plan.sigma2_sum, float(grid.granularity))
    return out


def with_margins(table: pl.DataFrame, q: StreamQuery, plan: StreamPlan) -> pl.DataFrame:
    """``table`` with a ``<column>_moe95`` column for each released column: the margin at the row's trigger
    (:func:`margins95_by_trigger`; post-processing of public scales and the released trigger only)."""
    at = table["trigger"].to_numpy().astype(np.int64) - 1
    return table.with_columns([pl.Series(f"{c}_moe95", np.asarray(m, dtype=np.float64)[at], dtype=pl.Float64)
                               for c, m in margins95_by_trigger(q, plan).items()])
