"""Differentially private top-k (``dpcli topk``), LinkedIn's KnownGumb and UnkGumb (paper 000), and for
groups discovered from the data by default a two-stage selection: private partition selection on
distinct-unit counts (thresholding, paper 002) followed by KnownGumb over the groups it released
(:mod:`dpcli.tasks.topk_threshold`; docs/commands/topk.md has the budget split and its proof).

Counting is per privacy unit: distinct units per group (τ = 1, the default)
or rows with each unit capped at τ rows per group (ℓ∞ sensitivity τ). A unit
may touch any number of groups (unrestricted sensitivity), which is why only
k groups are ever released.

Cost, in ε_per-bounded-range units (Alg. 5) — each Gumbel selection and each
Laplace(2τ/ε_per) count is ε_per-BR:

=================  ======================  ===============================
domain             with counts             --no-counts
=================  ======================  ===============================
known (--domain)   2k                      k
unknown (unkgumb)  2|o| + 1 − 1{⊥}         |o| + 1
=================  ======================  ===============================

The threshold selection (``--selection threshold``, the default outside ``br`` ledgers) is not
bounded-range as a whole: it is charged as an (ε_sel, δ) thresholding event plus KnownGumb's fixed
guarantee; a ``br`` ledger runs UnkGumb by default and refuses ``--selection threshold``.

|o| counts the released groups plus ⊥ when the list ends early. In a ``br``
ledger the unknown-domain cost is debited at its maximum (2k + 1, or k + 1)
before the run reads, and kept (the actual cost is reported), plus one call. Other
ledgers are charged a fixed guarantee from the papers' theorems:
known domain 3kε_per/2-DP with counts (Lemma 5.2) or kε_per-DP without;
unknown domain ((2k + 1)ε_per, δ)-DP (Theorem 1) or ((k + 1)ε_per, δ) without
counts; zcdp ledgers charge (number of BR units)·ε_per²/8.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import polars as pl

from dpcli import bounding
from dpcli.core import mechanisms as mech
from dpcli.core import selection as sel
from dpcli.core.display import parameter_text
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.frames import collect
from dpcli.tasks import Engine, Frames, Needs, PublicList, Result, free_replay
from dpcli.tasks.auto_bounds import AutoBounds, BudgetParts, check_share
from dpcli.tasks.topk_threshold import SelectionPlan, plan_selection, select_groups, unkgumb_offsets

if TYPE_CHECKING:
    from collections.abc import Callable

    from dpcli.advice import Note
    from dpcli.tasks.targets import MarginTarget
    from dpcli.tasks.topk_target import TopKChoice


#: The threshold selection's defaults: each unit counted in at most 4 groups, 1/4 of the release's ε.
DEFAULT_MAX_PARTITIONS = 4
DEFAULT_SELECTION_SHARE = Fraction(1, 4)


def default_selection(mode: str) -> str:
    """The unknown-domain selection a ledger of this mode runs by default: UnkGumb on ``br`` ledgers (their
    bounded-range accounting has no place for a thresholding step), the threshold selection elsewhere."""
    return "unkgumb" if mode == "br" else "threshold"


@dataclass(frozen=True)
class TopKQuery:
    """Everything that defines a top-k release."""

    by: tuple[str, ...]
    unit: str
    k: int
    count: str = "units"  # units or rows (as given: validate refuses others)
    max_contributions: int = 1
    known_domain: bool = False
    dbar: int | None = None
    with_counts: bool = True
    epsilon_per: Fraction | None = None
    delta: Fraction = Fraction(0)
    with_error: bool = free_replay("--with-error", default=False)
    #: ``--max-contributions auto``: τ chosen from the data at this share of the budget (None: τ given).
    auto: AutoBounds | None = None
    #: ``--report-bias``: the share of the budget its count spends (None: no report).
    bias_share: Fraction | None = None
    #: Unknown domain: ``threshold`` (partition selection, then KnownGumb) or ``unkgumb`` (paper 000, Alg. 4);
    #: None: the ledger's default (:func:`default_selection`), resolved by :meth:`TopKTask.for_ledger`.
    selection: str | None = None
    #: ``--max-partitions`` K̄: groups per unit the threshold selection counts (None: the default).
    max_partitions: int | None = None
    #: ``--selection-share``: the share of the release's ε the threshold selection spends (None: the default).
    selection_share: Fraction | None = None

    @property
    def method(self) -> str:
        """``known``, ``threshold`` or ``unkgumb``; an unresolved unknown-domain selection is UnkGumb when d̄ is
        given (``--max-groups`` is UnkGumb's), the threshold one otherwise."""
        if self.known_domain:
            return "known"
        return self.selection or ("unkgumb" if self.dbar is not None else "threshold")

    @property
    def partitions(self) -> int:
        """K̄ of the threshold selection."""
        return self.max_partitions if self.max_partitions is not None else DEFAULT_MAX_PARTITIONS

    @property
    def share(self) -> Fraction:
        """The threshold selection's share of the release's ε."""
        return self.selection_share if self.selection_share is not None else DEFAULT_SELECTION_SHARE

    def resolved(self, mode: str) -> TopKQuery:
        """The query with its unknown-domain selection chosen for a ledger of this mode: the one its options
        name (d̄ UnkGumb's; K̄ or the selection's share the threshold one's), else the mode's default."""
        if self.known_domain or self.selection is not None:
            return self
        if self.dbar is not None:
            return replace(self, selection="unkgumb")
        if self.max_partitions is not None or self.selection_share is not None:
            return replace(self, selection="threshold")
        return replace(self, selection=default_selection(mode))

    @property
    def parts(self) -> BudgetParts:
        """The release's budget in parts: choosing τ, the bias report, the release itself."""
        return BudgetParts(self.auto.share if self.auto else Fraction(0), self.bias_share or Fraction(0))

    @property
    def count_sensitivity(self) -> int:
        """ℓ∞ sensitivity of one group's count, from the stability of its bounding."""
        return int(self.bounding_spec().stability().linf(self.count))

    def bounding_spec(self) -> bounding.BoundingSpec:
        """Rows per unit and group capped at τ (``--count rows``); any number of groups per unit."""
        return bounding.BoundingSpec(self.unit, self.by, max_partitions=None, max_contributions=self.max_contributions)

    @property
    def groups_considered(self) -> int:
        """How many of the largest groups UnkGumb may look at (default max(10k, 1000), Sec. 8.3)."""
        return self.dbar if self.dbar is not None else max(10 * self.k, 1000)

    def validate(self) -> None:
        if not self.by:
            raise UsageError("needs at least one column", field="by")
        if self.unit in self.by:
            raise UsageError(f"cannot include the privacy unit column {self.unit!r}", field="by")
        if self.k < 1:
            raise UsageError(f"-k must be ≥ 1, got {self.k}")
        if self.count not in ("units", "rows"):
            raise UsageError(f"must be units or rows, got {self.count!r}", field="count")
        if self.max_contributions < 1:
            raise UsageError("(τ) must be ≥ 1", field="max_contributions")
        if self.count == "units" and self.max_contributions != 1:
            raise UsageError("applies to counting rows (distinct units have τ = 1)", field="max_contributions")
        self._validate_auto()

    def _validate_auto(self) -> None:
        """``auto`` τ and the bias report: only where τ bounds something (counting rows), shares in (0, 1/2]."""
        if self.auto is not None:
            if self.count != "rows":
                raise UsageError("auto applies to counting rows (distinct units have τ = 1)",
                                 field="max_contributions")
            check_share(self.auto.share, "auto_share")
        if self.bias_share is not None:
            if self.count != "rows":
                raise UsageError("counting distinct units truncates no unit: there is no bias to report "
                                 "(use it with --count rows)", field="report_bias")
            check_share(self.bias_share, "bias_share")
            if self.parts.release < Fraction(1, 2):
                raise UsageError("with --auto-share, leaves the release less than half of the budget",
                                 field="bias_share")
        self._validate_selection()

    def _validate_selection(self) -> None:
        """The selection's options: each only where it acts (one-line usage errors, before any data is read)."""
        if self.selection not in (None, "threshold", "unkgumb"):
            raise UsageError(f"must be threshold or unkgumb, got {self.selection!r}", field="selection")
        given = {"selection": self.selection is not None, "max_partitions": self.max_partitions is not None,
                 "selection_share": self.selection_share is not None, "dbar": self.dbar is not None}
        misplaced = {"known": ("selection", "max_partitions", "selection_share"),
                     "unkgumb": ("max_partitions", "selection_share"), "threshold": ("dbar",)}[self.method]
        why = {"known": "applies to groups discovered from the data (without --keys)",
               "unkgumb": "applies to --selection threshold (UnkGumb counts every group a unit is in)",
               "threshold": "applies to --selection unkgumb (the threshold selection looks at every group)"}
        for name in misplaced:
            if given[name]:
                raise UsageError(why[self.method], field=name)
        if self.method == "unkgumb" and self.k > self.groups_considered:
            raise UsageError(f"{self.k} is larger than the {self.groups_considered} groups considered (d̄)", field="k")
        if self.method == "threshold" and self.partitions < 1:
            raise UsageError(f"(K̄) must be ≥ 1, got {self.partitions}", field="max_partitions")
        if self.method == "threshold" and not 0 < self.share < 1:
            raise UsageError(f"must be in (0, 1), got {fraction_text(self.share)}", field="selection_share")

    def canonical(self) -> dict[str, Any]:
        """What the seed binds (``auto`` and ``report_bias`` only when used: other queries keep their seeds)."""
        out = self._canonical()
        if self.auto is not None:
            out["auto"] = self.auto.canonical()
        if self.bias_share is not None:
            out["report_bias"] = fraction_text(self.bias_share)
        return out

    def _canonical(self) -> dict[str, Any]:
        return {
            "by": list(self.by),
            "unit": self.unit,
            "k": self.k,
            "count": self.count,
            "tau": self.count_sensitivity,
            "domain": "known" if self.known_domain else "unknown",
            "dbar": self.groups_considered if self.method == "unkgumb" else None,
            # the threshold selection's own keys (KnownGumb and UnkGumb keep the canonical form they had)
            **({"selection": "threshold", "max_partitions": self.partitions,
                "selection_share": fraction_text(self.share)} if self.method == "threshold" else {}),
            "counts": self.with_counts,
            "epsilon_per": fraction_text(self.epsilon_per) if self.epsilon_per is not None else None,
            "delta": fraction_text(self.delta),
        }


@dataclass(frozen=True)
class TopKPlan:
    """Calibration and cost, fixed before the data is read."""

    epsilon_per: Fraction
    delta: Fraction
    count_noise: mech.Noise | None
    reserve: list[PrivacyEvent]
    guarantee: dict[str, Any]
    ledger_mode: str
    #: The threshold selection's calibration (None: KnownGumb over a list, or UnkGumb).
    selection: SelectionPlan | None = None

    @property
    def events(self) -> list[PrivacyEvent]:
        """What a release reserves: the most it can cost (its actual cost is settled from its output)."""
        return self.reserve


def _br_units(q: TopKQuery, released: int | None, bottom: bool) -> int:
    """Alg. 5 information units; ``released`` None means the maximum (the reserve). The threshold selection's
    ranking is KnownGumb's (its thresholding step is not bounded-range: charged apart, never in a br ledger)."""
    if q.method in ("known", "threshold"):
        return 2 * q.k if q.with_counts else q.k
    if released is None:
        return 2 * q.k + 1 if q.with_counts else q.k + 1
    size = released + (1 if bottom else 0)  # |o| counts ⊥
    if q.with_counts:
        return 2 * size + 1 - (1 if bottom else 0)
    return size + 1


def _events(q: TopKQuery, mode: str, eps: Fraction, delta: Fraction, units: int) -> list[PrivacyEvent]:
    if q.method == "threshold":  # (ε_sel, δ) thresholding, then KnownGumb over the groups it released
        ranking = _events(replace(q, known_domain=True, selection=None, max_partitions=None, selection_share=None),
                          mode, eps, Fraction(0), units)
        return [PrivacyEvent("approx", "topk/threshold", epsilon=selection_epsilon(q, eps), delta=delta,
                             detail={"max_partitions": str(q.partitions)}), *ranking]
    calls = 0 if q.known_domain else 1
    if mode in ("br", "zcdp"):
        return [PrivacyEvent("br", "topk/" + ("knowngumb" if q.known_domain else "unkgumb"), epsilon=eps,
                             delta=delta, units=units, calls=calls)]
    if q.known_domain:
        total = Fraction(3 * q.k, 2) * eps if q.with_counts else q.k * eps
        return [PrivacyEvent("pure", "topk/knowngumb", epsilon=total)]
    total = (2 * q.k + 1) * eps if q.with_counts else (q.k + 1) * eps
    return [PrivacyEvent("approx", "topk/unkgumb", epsilon=total, delta=delta)]


def epsilon_per_for(epsilon: Fraction, q: TopKQuery) -> Fraction:
    """The ε_per whose release costs ``epsilon`` by the paper's fixed guarantees (``--epsilon``).

    Known domain: 3kε_per/2 with counts (Lemma 5.2), kε_per without; UnkGumb:
    (2k + 1)ε_per with counts (Theorem 1), (k + 1)ε_per without (plus the release's δ); the threshold
    selection: the ranking's KnownGumb gets (1 − share)·ε, the thresholding share·ε (plus δ).
    """
    return epsilon / _whole_epsilon(q, Fraction(1))


def selection_epsilon(q: TopKQuery, eps: Fraction) -> Fraction:
    """The thresholding step's ε when the ranking runs at ε_per = ``eps``: share/(1 − share) of the ranking's."""
    return _ranking_epsilon(q, eps) * q.share / (1 - q.share)


def _ranking_epsilon(q: TopKQuery, eps: Fraction) -> Fraction:
    """KnownGumb's guarantee at ε_per = ``eps``: 3kε_per/2 with counts (Lemma 5.2), kε_per without."""
    return Fraction(3 * q.k, 2) * eps if q.with_counts else q.k * eps


def describe_plan(q: TopKQuery, plan: TopKPlan) -> dict[str, Any]:
    """The public calibration and cost of a planned query (``--dry-run``): no data involved. With τ ``auto``
    the count noise's scale and margin depend on τ: "chosen at run time", no number."""
    described = {"query": q.canonical(), "guarantee": plan.guarantee,
                 "reserve": [e.to_json() for e in plan.reserve],
                 "count_noise": plan.count_noise.describe() if plan.count_noise else None,
                 "count_moe95": plan.count_noise.margin95() if plan.count_noise else None}
    q = q.resolved(plan.ledger_mode)
    if plan.selection is not None:
        described["selection"] = plan.selection.describe()
    elif q.method == "unkgumb":
        described["selection"] = unkgumb_offsets(q, plan.epsilon_per, plan.delta)
    parts = q.parts
    if parts.release != 1:
        whole = whole_epsilon(q)
        described["parts"] = {name: fraction_text(whole * share) for name, share in
                              (("auto-bounds", parts.auto), ("bias", parts.bias), ("release", parts.release))
                              if share}
    if q.auto is not None and plan.count_noise is not None:
        described["count_noise"] = {"noise": plan.count_noise.describe()["noise"],
                                    "scale": "2τ/ε_per, τ chosen at run time"}
        described["count_moe95"] = None
    return described


def plan_topk(q: TopKQuery, ledger_mode: str, limits: dict[str, Fraction]) -> TopKPlan:
    """ε_per and δ from the options (or the br ledger), the count noise, the reserved cost."""
    q = q.resolved(ledger_mode)
    q.validate()
    if ledger_mode == "br" and q.method == "threshold":
        raise UsageError("a br ledger composes bounded-range selections only: its unknown-domain top-k is UnkGumb "
                         "(--selection unkgumb, the default there); the threshold selection needs an approx, zcdp "
                         "or rdp ledger", field="selection")
    eps, delta = _br_budget(q, limits) if ledger_mode == "br" else _given_budget(q)
    if q.method == "unkgumb" and delta < sel.unknown_min_delta(q.groups_considered):
        raise UsageError(
            f"δ = {parameter_text(delta, 'down')} is below what UnkGumb represents with d̄ = {q.groups_considered} "
            f"(≥ {parameter_text(sel.unknown_min_delta(q.groups_considered), 'up')}); use a larger δ or a smaller "
            "--dbar"
        )
    parts = q.parts
    if parts.release != 1 and ledger_mode == "br":
        raise UsageError("a br ledger pays LinkedIn-style selections only: --max-contributions auto and "
                         "--report-bias need a pure, approx, zcdp or rdp ledger")
    whole = _whole_epsilon(q, eps)
    _check_parts_noise(q, whole)
    eps = eps * parts.release  # the release's own part (the whole ε when nothing else is asked)
    noise = _count_noise(q, eps)
    selection = plan_selection(q, selection_epsilon(q, eps), delta) if q.method == "threshold" else None
    reserve = _events(q, ledger_mode, eps, delta, _br_units(q, None, False)) + parts.events("topk", whole, None)
    return TopKPlan(eps, delta, noise, reserve, _guarantee(q, eps, delta), ledger_mode, selection)


def _check_parts_noise(q: TopKQuery, whole: Fraction) -> None:
    """Refuse, before any data is read, a choice of τ or a bias report whose noise cannot be drawn."""
    from dpcli.tasks import auto_bounds as ab
    from dpcli.tasks import bias_report as br

    if q.auto is not None:
        ab.check_choice(ab.pure_epsilon(whole, None, q.auto.share, q.auto.choices), scale=ab.QUANTILE_SCALE)
    if q.bias_share is not None:
        br.check_bias(whole, None, q.bias_share)


def whole_epsilon(q: TopKQuery) -> Fraction:
    """The release's whole ε, which its parts split (the query's ε_per is given: a br ledger, whose ε_per is the
    ledger's, takes no parts)."""
    assert q.epsilon_per is not None
    return _whole_epsilon(q, q.epsilon_per)


def _whole_epsilon(q: TopKQuery, eps: Fraction) -> Fraction:
    """The ε of the release's guarantee for ε_per = ``eps`` (:func:`epsilon_per_for` inverted)."""
    if q.method == "known":
        return _ranking_epsilon(q, eps)
    if q.method == "threshold":
        return _ranking_epsilon(q, eps) + selection_epsilon(q, eps)
    return (2 * q.k + 1) * eps if q.with_counts else (q.k + 1) * eps


def _br_budget(q: TopKQuery, limits: dict[str, Fraction]) -> tuple[Fraction, Fraction]:
    """(ε_per, δ) of a br ledger; the options may only repeat them."""
    eps = limits["epsilon_per"]
    if q.epsilon_per is not None and q.epsilon_per != eps:
        raise UsageError(f"must be left out or match the br ledger's ε_per = {fraction_text(eps)}",
                         field="epsilon_per")
    delta = Fraction(0) if q.known_domain else limits["delta"]
    if q.delta and q.delta != limits["delta"]:
        raise UsageError(f"must be left out or match the br ledger's δ = {fraction_text(limits['delta'])}",
                         field="delta")
    return eps, delta


def _given_budget(q: TopKQuery) -> tuple[Fraction, Fraction]:
    """(ε_per, δ) from the options (δ only to discover groups)."""
    if q.epsilon_per is None:
        raise UsageError("is required: the ε of each selection and count (or give the release's whole ε)",
                         field="epsilon_per")
    if q.known_domain:
        return q.epsilon_per, Fraction(0)
    if not 0 < q.delta < 1:
        raise UsageError("must be in (0, 1) to discover groups (or give the candidates as a public domain list)",
                         field="delta")
    return q.epsilon_per, q.delta


def _count_noise(q: TopKQuery, eps: Fraction) -> mech.Noise | None:
    """Laplace(2τ/ε_per) for the released counts (None with ``--no-counts``), refused if it cannot be sampled."""
    if not q.with_counts:
        return None
    noise = mech.laplace(2 * q.count_sensitivity, eps)
    try:
        noise.sample(KeyedStream(b"\0" * 32, "probe"), 1)
    except ValueError:
        raise UsageError("count noise too large to sample; use a larger --epsilon-per") from None
    return noise


def _guarantee(q: TopKQuery, eps: Fraction, delta: Fraction) -> dict[str, Any]:
    """The (ε, δ) guarantee of the paper's theorem for this query, and its br units."""
    dp = _whole_epsilon(q, eps)
    if q.known_domain:
        return {"epsilon": float(dp), "delta": 0.0, "br_units": _br_units(q, None, False),
                "source": "Lemma 5.2" if q.with_counts else "k-fold peeling exponential mechanism"}
    if q.method == "threshold":
        ranking = "Lemma 5.2" if q.with_counts else "k-fold peeling exponential mechanism"
        return {"epsilon": float(dp), "delta": float(delta), "selection_epsilon": float(selection_epsilon(q, eps)),
                "ranking_epsilon": float(_ranking_epsilon(q, eps)),
                "source": f"minimum-unit thresholding (paper 002, Sec. 4.2.3), then {ranking} over the groups it "
                          "released; sequential composition"}
    return {"epsilon": float(dp), "delta": float(delta), "br_units_max": _br_units(q, None, False),
            "source": "Theorem 1" if q.with_counts else "Sec. 6.2 (ranking only)"}


@dataclass
class TopKRelease:
    table: pl.DataFrame
    bottom: bool
    actual: list[PrivacyEvent]
    metadata: dict[str, Any]


def group_counts(frame: pl.LazyFrame, q: TopKQuery, *, name: str = "the input", rows: int | None = None,
                 engine: bounding.TotalsEngine | None = None, top: int | None = None) -> pl.DataFrame:
    """Per-group counts after bounding (τ rows per unit per group, or distinct units): all groups, or
    with ``top`` only the ``top`` largest (ties: the smaller group first), in no particular order.

    With ``top`` and one pass over the input (:func:`dpcli.bounding.unit_buckets`), the largest are
    taken by ``top_k`` inside the one streaming query: no table of every group's counts is built or
    sorted. The counts are those of :func:`dpcli.bounding.group_totals` (``units`` or ``rows``).
    """
    spec = q.bounding_spec()
    by = list(q.by)
    if engine is None and top is not None and bounding.unit_buckets(rows) == 1:
        partial = bounding.bound_contributions(frame, spec, 0)
        count = pl.len() if q.count == "units" else pl.col(bounding.N_ROWS).sum()
        largest = partial.group_by(by).agg(count.cast(pl.Int64).alias("h")).top_k(
            top, by=["h", *by], reverse=[False] + [True] * len(by))
        return collect(largest, f"cannot read {name}")
    if engine is not None:
        totals = engine(spec, 0)
    else:
        totals = bounding.bounded_totals(frame, spec, 0, bounding.unit_buckets(rows), name=name)
    counts = totals.select([*by, pl.col("units" if q.count == "units" else "rows").alias("h")])
    if top is not None:
        counts = counts.top_k(top, by=["h", *by], reverse=[False] + [True] * len(by))
    return counts


def run_topk(
    frame: pl.LazyFrame, q: TopKQuery, plan: TopKPlan, stream: KeyedStream, domain: pl.DataFrame | None = None,
    *, name: str = "the input", rows: int | None = None, engine: bounding.TotalsEngine | None = None,
) -> TopKRelease:
    """Count, select (KnownGumb or UnkGumb), add count noise; the cost actually incurred.

    ``name`` names the input in error messages; ``rows``: its row count if known without a pass;
    ``engine``: bound on another engine (Spark) instead of polars.
    """
    by = list(q.by)
    q = q.resolved(plan.ledger_mode)
    top = q.groups_considered + 1 if q.method == "unkgumb" else None  # UnkGumb looks at the d̄ + 1 largest only
    if plan.selection is not None:  # stage 1: the groups the thresholding releases become the list
        domain = select_groups(frame, q, plan.selection, stream, name=name, rows=rows, engine=engine)
    counts = group_counts(frame, q, name=name, rows=rows, engine=engine, top=top)
    meta: dict[str, Any] = {"tau": q.count_sensitivity, "selection": q.method}
    if plan.selection is not None:
        assert domain is not None
        # stage 2: KnownGumb over the selected groups, at most k (all of them, ranked, when fewer pass)
        cand = domain.join(counts, on=by, how="left", nulls_equal=True).with_columns(pl.col("h").fill_null(0))
        cand = cand.sort(by, nulls_last=True)  # the race's order: the group keys' (a join keeps no order)
        picks = (sel.known_top_k(stream, cand["h"].to_numpy(), min(q.k, cand.height), plan.epsilon_per,
                                 q.count_sensitivity) if cand.height else [])
        chosen = cand[picks]
        bottom = cand.height < q.k
        # T and K̄ are public parameters; how many groups passed is a function of stage 1's output.
        meta.update({"threshold": plan.selection.threshold, "max_partitions": plan.selection.max_partitions,
                     "selected": cand.height})
    elif q.known_domain:
        assert domain is not None
        if q.k > domain.height:
            raise UsageError(f"-k {q.k} is larger than the domain ({domain.height} candidates)")
        cand = domain.join(counts, on=by, how="left", nulls_equal=True).with_columns(pl.col("h").fill_null(0))
        cand = cand.sort(by, nulls_last=True)
        picks = sel.known_top_k(stream, cand["h"].to_numpy(), q.k, plan.epsilon_per, q.count_sensitivity)
        chosen = cand[picks]
        bottom = False
    else:
        # counts holds the d̄ + 1 largest groups (ties: smaller key first)
        ranked = counts.sort(["h", *by], descending=[True] + [False] * len(by), nulls_last=True)
        res = sel.unknown_top_k(stream, ranked["h"].to_numpy(), q.k, q.groups_considered, plan.epsilon_per,
                                q.count_sensitivity, plan.delta)
        chosen = ranked[res.positions]
        bottom = res.bottom
        # k̄ is the output of an exponential mechanism (paid by the '+1' of Theorem 1), so it may be
        # shown, and with it ⊥'s offset over h_(k̄+1) (public parameters); h_⊥ itself is an exact count plus
        # that offset and is not.
        offset = sel.bottom_offset(res.k_bar, q.groups_considered, plan.epsilon_per, q.count_sensitivity,
                                   plan.delta)
        meta.update({"k_bar": res.k_bar, "dbar": q.groups_considered, "bottom_offset": round(offset, 1)})
    out = chosen.select(by).with_row_index("rank", offset=1).with_columns(pl.col("rank").cast(pl.Int64))
    if q.with_counts:
        assert plan.count_noise is not None
        noisy = chosen["h"].to_numpy() + plan.count_noise.sample(stream.child("counts"), chosen.height)
        out = out.with_columns(pl.Series("count", noisy, dtype=pl.Int64))
        if q.with_error:
            out = out.with_columns(pl.lit(plan.count_noise.margin95(), dtype=pl.Int64).alias("count_moe95"))
        meta["count_noise"] = plan.count_noise.describe()
    units = _br_units(q, out.height, bottom)
    actual = (_events(q, plan.ledger_mode, plan.epsilon_per, plan.delta, units) if plan.ledger_mode == "br"
              else plan.reserve)
    # found, bottom and br_units are functions of the released list alone (post-processing).
    meta.update({"found": out.height, "k": q.k, "bottom": bottom, "br_units": units})
    return TopKRelease(out, bottom, actual, meta)


@dataclass(frozen=True)
class TopKTask:
    """``dpcli topk`` as a :class:`dpcli.tasks.Task` (``defaulted`` and ``unit_label``: for :meth:`notes`;
    ``target``: a count margin target that :meth:`for_ledger` turns into ε_per, ``chosen`` what it chose)."""

    query: TopKQuery
    defaulted: tuple[str, ...] = free_replay("notes' wording", default=())
    unit_label: str | None = free_replay("notes' wording", default=None)
    command: str = "topk"
    #: A scheduled run is accounted in pure ε-DP whatever the ledger's mode.
    scheduled_mode: str = "pure"
    target: MarginTarget | None = free_replay("margin targets (the ε they resolve to is bound)", default=None)
    chosen: TopKChoice | None = free_replay("margin targets (the ε they resolve to is bound)", default=None)
    mode: str = "pure"
    #: ``--epsilon``: the release's whole ε, turned into ε_per once the selection is known (:meth:`for_ledger`).
    epsilon: Fraction | None = None

    def for_ledger(self, mode: str) -> TopKTask:
        """The ledger's default selection (UnkGumb on br ledgers, the threshold one elsewhere), ε_per from the
        release's ε, and with a target the query at the chosen release ε (the seed binds the ε_per)."""
        query = self.query.resolved(mode)
        if self.epsilon is not None:
            query = replace(query, epsilon_per=epsilon_per_for(self.epsilon, query))
        task = replace(self, query=query, epsilon=None)
        if self.target is None:
            return task
        from dpcli.tasks.topk_target import choose

        choice = choose(task.query, self.target, mode)
        return replace(task, query=choice.query, target=None, chosen=choice, mode=mode)

    def budget_hint(self, pays: Callable[[list[PrivacyEvent]], bool]) -> str | None:
        """With a target: the best count margin a ledger that refuses the chosen ε could pay (None without)."""
        if self.chosen is None:
            return None
        from dpcli.tasks.topk_target import reachable

        return reachable(self.chosen, self.mode, pays)

    def at_epsilon(self, epsilon: Fraction) -> TopKTask:
        """The same query at a schedule run's whole ε (split over its selections and counts as for --epsilon)."""
        q = self.query
        return replace(self, query=replace(q, epsilon_per=epsilon_per_for(epsilon, q)))

    def check_schedulable(self) -> None:
        """Refuse a query no schedule can run (each run's ε comes from the schedule: planned per run)."""
        if not self.query.known_domain:
            raise UsageError("a schedule runs pure ε-DP releases: give the candidates with --keys")
        if self.query.epsilon_per is not None:
            raise UsageError("with --schedule each run's ε comes from the schedule; drop --epsilon-per")
        if self.query.auto is not None:
            raise UsageError("--max-contributions auto: a schedule keeps its bounds: choose them once with a run "
                             "without --schedule")
        self.query.validate()

    def schedule_query(self, lists: Mapping[str, str]) -> dict[str, Any]:
        """What names a schedule besides its name: the query without its ε, and the domain's fingerprint."""
        query = {k: v for k, v in self.query.canonical().items() if k != "epsilon_per"}
        return {"command": "topk", **query, "domain": lists["domain"]}

    def check(self) -> None:
        """Refuse an inconsistent query (one-line usage errors) before anything else is read."""
        self.query.validate()
        if self.target is not None:
            from dpcli.tasks.topk_target import count_limit

            if self.query.epsilon_per is not None or self.epsilon is not None:
                raise UsageError("chooses the budget: leave out ε and ε_per", field=self.target.field)
            if self.query.auto is not None:
                raise UsageError("cannot be met with --max-contributions auto: the count margin depends on τ, "
                                 "chosen from the data (give τ, or leave out the target)", field=self.target.field)
            count_limit(self.query, self.target)

    def check_lists(self, lists: Mapping[str, pl.DataFrame | pl.LazyFrame]) -> None:
        """``-k`` at most the known domain's candidates (the list is public: refused before the debit)."""
        domain = lists.get("domain")
        if self.query.known_domain and isinstance(domain, pl.DataFrame) and self.query.k > domain.height:
            raise UsageError(f"-k {self.query.k} is larger than the domain ({domain.height} candidates)", field="k")

    def needs(self) -> Needs:
        q = self.query
        return Needs({q.unit: "key", **dict.fromkeys(q.by, "key")},
                     {"domain": PublicList(q.by)} if q.known_domain else {})

    def plan(self, mode: str, limits: Mapping[str, Fraction]) -> TopKPlan:
        return plan_topk(self.query, mode, dict(limits))

    def describe(self, plan: TopKPlan) -> dict[str, Any]:
        described = describe_plan(self.query, plan)
        if self.chosen is not None:
            described["target"] = self.chosen.to_json()
        return described

    def run(self, frames: Frames, plan: TopKPlan, seed: bytes, engine: Engine | None) -> Result:
        domain = frames.lists.get("domain")
        stream = KeyedStream(seed, "topk")
        query, plan, extra = _bounds_chosen(frames, self.query, plan, stream)
        released = run_topk(frames.data, query, plan, stream, domain if isinstance(domain, pl.DataFrame) else None,
                            name=frames.name, rows=frames.rows, engine=engine.totals if engine else None)
        metadata = {**released.metadata, "command": "topk", "guarantee": plan.guarantee, **extra}
        if self.chosen is not None:
            metadata["target"] = self.chosen.to_json()
        return Result(released.table, metadata, released.actual)

    def summary(self, name: str, result: Result) -> str:
        found, k = result.metadata["found"], self.query.k
        line = f"top-{k} of {name}: {found} group(s)"
        if result.metadata.get("bottom", False) and "selected" in result.metadata:
            line += f", {result.metadata['selected']} group(s) passed the selection"
        elif result.metadata.get("bottom", False):
            line += f", ⊥ reached (only {found} of {k} could be released)"
        if "auto" in result.metadata:
            line += f"; chosen: max_contributions {result.metadata['auto']['max_contributions']}"
        return line

    def notes(self, plan: TopKPlan, result: Result) -> list[Note]:
        from dpcli import advice

        if self.query.auto is not None:  # the count noise of the τ chosen (a released value)
            query = replace(self.query, max_contributions=int(result.metadata["tau"]))
            plan = plan_topk(query, plan.ledger_mode, {})
        notes = advice.topk_notes(self.query, plan, result.table, self.defaulted, self.unit_label)
        if result.metadata.get("bottom", False) and "selected" in result.metadata:
            notes.append(advice.Note(f"fewer than k = {self.query.k} groups reach the selection's threshold of "
                                     f"{result.metadata['threshold']} noisy units: only {result.metadata['found']} "
                                     "released (a larger --selection-share or a smaller --max-partitions lowers it)"))
        elif result.metadata.get("bottom", False):
            notes.append(advice.Note(f"fewer than k = {self.query.k} groups pass the threshold (⊥): only "
                                     f"{result.metadata['found']} released"))
        return notes


def _plannable(q: TopKQuery, plan: TopKPlan, chosen: Any) -> tuple[TopKQuery, TopKPlan, Any]:
    """The query and its plan at the chosen τ, or at τ = 1 (reported as ``reduced``) when the chosen τ's noise
    cannot be sampled: a run must not fail after the choice (a free, data-dependent exit). τ = 1 is what the
    plan was checked with before any data was read."""
    try:
        at = replace(q, max_contributions=chosen.max_contributions)
        replanned = plan_topk(at, plan.ledger_mode, {})
    except UsageError:
        chosen = replace(chosen, max_contributions=1, reduced=True)
        at = replace(q, max_contributions=1)
        replanned = plan_topk(at, plan.ledger_mode, {})
    assert replanned.events == plan.events, "a chosen bound changed the release's cost"
    return at, replanned, chosen


def _bounds_chosen(frames: Frames, q: TopKQuery, plan: TopKPlan, stream: KeyedStream
                   ) -> tuple[TopKQuery, TopKPlan, dict[str, Any]]:
    """With ``--max-contributions auto``: τ chosen from the data (``stream.child("auto")``), the query and its
    plan at that τ (the same events as planned before any data was read); with ``--report-bias``: the noisy
    count of units with a group over τ (``stream.child("bias")``). Metadata for both (released values)."""
    from dpcli.tasks import auto_bounds as ab
    from dpcli.tasks import bias_report as br

    extra: dict[str, Any] = {}
    if q.parts.release == 1:
        return q, plan, extra
    shape = ab.DataShape(q.unit, q.by)
    whole = whole_epsilon(q)
    auto = q.auto
    if auto is not None:
        quantile_epsilon = ab.pure_epsilon(whole, None, auto.share, auto.choices)
        chosen = ab.choose_bounds(frames.data, shape, auto, ab.ChosenBounds(None, 1, None), quantile_epsilon,
                                  stream.child("auto"), 0, frames.name)  # salt 0: topk's bounding salt
        q, plan, chosen = _plannable(q, plan, chosen)
        extra["auto"] = {**chosen.to_json(), "epsilon": fraction_text(whole * auto.share)}
    if q.bias_share is not None:
        bounds = ab.ChosenBounds(None, q.max_contributions, None)
        noise = br.bias_noise(whole, None, q.bias_share)
        extra["bias"] = br.report_bias(frames.data, shape, bounds, noise, stream.child("bias"), 0,
                                       frames.name).to_json()
    return q, plan, extra
