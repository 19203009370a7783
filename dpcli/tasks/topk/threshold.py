"""``topk`` without a list, by default: private partition selection, then KnownGumb over what it released.

Stage 1 (paper 002, Sec. 4.2.3, minimum-unit thresholding): each unit is counted in at most K̄ of its
groups (a keyed sample of them, :func:`dpcli.bounding.bound_contributions`), once in each; every group
with at least one counted unit gets discrete Laplace(K̄/ε_sel) noise on its distinct-unit count and is
selected when the noisy count reaches the threshold T of :func:`dpcli.core.mechanisms.selection_threshold`
(the smallest T with 1 − (1 − P[1 + Z ≥ T])^K̄ ≤ δ). Stage 2 (paper 000, Alg. 2 and Lemma 5.2): KnownGumb
over the selected groups, as over a public list, on the release's own counts (distinct units, or rows
capped at τ per unit and group: no K̄ bound), then Laplace(2τ/ε_per) on the counts it releases.

Why it is (ε_sel + ε_rank, δ)-DP (the proof in words; docs/commands/topk.md states it for users): take
neighbours D and D' = D plus one unit u. The keyed sample of a unit's groups depends on that unit's
rows and the secret salt only, so every other unit's counted groups are the same in D and D'; u adds 1
to at most K̄ bounded counts. Groups non-empty in both get noisy counts whose vector has ℓ1 sensitivity
≤ K̄, so releasing which of them pass is ε_sel-DP (Laplace mechanism, then post-processing). Groups
non-empty only in D' have bounded count exactly 1 (u alone); each passes with probability
P[1 + Z ≥ T] and, there being at most K̄ of them, one passes with probability ≤ δ: outside that event
the outputs on D' are those of the ε_sel-DP comparison (Wilson et al.'s proof, their Theorem on the
thresholding operator). The selected set S is then public to stage 2: KnownGumb over any fixed domain
is ε_rank-DP (Lemma 5.2: 3kε_per/2 with counts, kε_per without; counts may move by τ in every group, and
|S| < k only shortens the ranking), and adaptive sequential composition adds the two ε's and keeps δ.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from dpcli import bounding
from dpcli.core import mechanisms as mech
from dpcli.core.display import parameter_text
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks.auto_bounds import sampleable

if TYPE_CHECKING:
    from dpcli.tasks.dry_runs import SelectionJSON
    from dpcli.tasks.topk.query import TopKQuery


@dataclass(frozen=True)
class SelectionPlan:
    """The thresholding step's calibration, fixed before any data is read (all public)."""

    epsilon: Fraction  # ε_sel
    delta: Fraction
    max_partitions: int  # K̄
    noise: mech.Noise  # discrete Laplace(K̄/ε_sel)
    threshold: int  # T: a group is selected when its noisy distinct-unit count is ≥ T

    def describe(self) -> SelectionJSON:
        """The step for ``--dry-run``."""
        shown: SelectionJSON = {"method": "threshold", "threshold": self.threshold,
                                "max_partitions": self.max_partitions, "epsilon": fraction_text(self.epsilon),
                                "delta": fraction_text(self.delta)}
        self.noise.described_in(shown)
        shown["counts"] = "distinct units, each counted in at most max_partitions groups"
        return shown


def plan_selection(q: TopKQuery, epsilon: Fraction, delta: Fraction) -> SelectionPlan:
    """Laplace(K̄/ε_sel) on each group's K̄-bounded distinct-unit count and its threshold for δ."""
    k_bar = q.partitions
    noise = mech.laplace(k_bar, epsilon)
    if not sampleable(noise):
        raise UsageError("the threshold selection's noise is too large to sample; use a larger ε or a smaller "
                         "--max-partitions", field="epsilon")
    return SelectionPlan(epsilon, delta, k_bar, noise, mech.selection_threshold(noise, k_bar, float(delta)))


def selection_salt(stream: KeyedStream) -> int:
    """The 128-bit secret salt of the keyed sample of each unit's groups (K̄ of them)."""
    words = stream.child("selection-salt").uint64(2)
    return int(words[0]) | (int(words[1]) << 64)


def select_groups(frame: pl.LazyFrame, q: TopKQuery, plan: SelectionPlan, stream: KeyedStream, *,
                  name: str = "the input", rows: int | None = None,
                  engine: bounding.TotalsEngine | None = None) -> pl.DataFrame:
    """Stage 1: the group keys whose noisy K̄-bounded distinct-unit count reaches the threshold, sorted.

    The noise is drawn in the order of the sorted non-empty groups (i.i.d. draws: which group gets which
    draw does not change the distribution), from ``stream.child("selection")``."""
    spec = bounding.BoundingSpec(q.unit, q.by, max_partitions=plan.max_partitions, max_contributions=1)
    salt = selection_salt(stream)
    if engine is not None:
        totals = engine(spec, salt)
    else:
        totals = bounding.bounded_totals(frame, spec, salt, bounding.unit_buckets(rows), name=name)
    by = list(q.by)
    totals = totals.select([*by, "units"]).sort(by, nulls_last=True)
    units = totals["units"].to_numpy().astype(np.int64)
    noisy = units + plan.noise.sample(stream.child("selection"), units.size)
    return totals.filter(pl.Series(noisy >= plan.threshold)).select(by)


def unkgumb_offsets(q: TopKQuery, epsilon_per: Fraction, delta: Fraction) -> SelectionJSON:
    """UnkGumb's ⊥ for ``--dry-run``: h_(k̄+1) + τ(1 + ln(m/δ)/ε_per) with m = min(k̄, d̄ − k̄) ≥ 1, and k̄ chosen
    at run time in k … d̄: the offset's smallest (m = 1) and largest (m = ⌊d̄/2⌋) values (public)."""
    from dpcli.core import selection as sel

    tau, dbar = q.count_sensitivity, q.groups_considered
    low = sel.bottom_offset(1, dbar, epsilon_per, tau, delta)
    high = sel.bottom_offset(max(dbar // 2, 1), dbar, epsilon_per, tau, delta)
    return {"method": "unkgumb", "bottom": "h_(k̄+1) + offset", "offset_min": round(low, 1),
            "offset_max": round(high, 1), "k_bar": f"chosen at run time in {q.k}…{dbar}",
            "counts": "distinct units" if q.count == "units" else f"rows, at most {tau} per unit and group"}


def selection_lines(selection: SelectionJSON) -> list[str]:
    """The dry run's lines for the selection (:func:`dpcli.cli.render.show_plan`)."""
    if selection.get("method") == "threshold":
        return [f"  selection: a group needs a noisy count of at least {selection['threshold']:,} distinct units, "
                f"each unit counted in at most {selection['max_partitions']} groups (discrete Laplace scale "
                f"{selection['scale']}; epsilon {parameter_text(selection['epsilon'], 'up')}, delta "
                f"{parameter_text(selection['delta'], 'up')}); then KnownGumb "
                "ranks the selected groups (fewer than k selected: fewer released)"]
    if selection.get("method") == "unkgumb":
        return [f"  selection: UnkGumb's ⊥ threshold is the (k̄+1)-th largest count ({selection['counts']}) plus "
                f"{selection['offset_min']:,.0f} to {selection['offset_max']:,.0f} (k̄ {selection['k_bar']}); "
                "a group is released only if its Gumbel-noised count beats ⊥'s (the list may end early)"]
    return []


__all__ = ["SelectionPlan", "plan_selection", "select_groups", "selection_lines", "unkgumb_offsets"]
