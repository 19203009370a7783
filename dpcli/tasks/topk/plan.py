"""A top-k release planned from the query and the ledger alone (no data): each stage's ε and δ, the count's
noise, a br ledger's units (:func:`plan_topk`), and the dry run's description (:func:`describe_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dpcli.core import mechanisms as mech
from dpcli.core import selection as sel
from dpcli.core.display import parameter_text
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.core.prf import KeyedStream
from dpcli.errors import UsageError
from dpcli.tasks.topk.query import TopKQuery
from dpcli.tasks.topk.threshold import SelectionPlan, plan_selection, unkgumb_offsets

if TYPE_CHECKING:
    from dpcli.tasks.dry_runs import TopKDryRun


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


def br_units(q: TopKQuery, released: int | None, bottom: bool) -> int:
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


def stage_events(q: TopKQuery, mode: str, eps: Fraction, delta: Fraction, units: int) -> list[PrivacyEvent]:
    if q.method == "threshold":  # (ε_sel, δ) thresholding, then KnownGumb over the groups it released
        ranking = stage_events(replace(q, known_domain=True, selection=None, max_partitions=None, selection_share=None),
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


def describe_plan(q: TopKQuery, plan: TopKPlan) -> TopKDryRun:
    """The public calibration and cost of a planned query (``--dry-run``): no data involved. With τ ``auto``
    the count noise's scale and margin depend on τ: "chosen at run time", no number."""
    described: TopKDryRun = {"query": q.canonical(), "guarantee": plan.guarantee,
                 "reserve": [e.to_json() for e in plan.reserve],
                 "count_noise": plan.count_noise.to_json() if plan.count_noise else None,
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
        described["count_noise"] = {"noise": plan.count_noise.to_json()["noise"],
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
    reserve = stage_events(q, ledger_mode, eps, delta, br_units(q, None, False)) + parts.events("topk", whole, None)
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
        return {"epsilon": float(dp), "delta": 0.0, "br_units": br_units(q, None, False),
                "source": "Lemma 5.2" if q.with_counts else "k-fold peeling exponential mechanism"}
    if q.method == "threshold":
        ranking = "Lemma 5.2" if q.with_counts else "k-fold peeling exponential mechanism"
        return {"epsilon": float(dp), "delta": float(delta), "selection_epsilon": float(selection_epsilon(q, eps)),
                "ranking_epsilon": float(_ranking_epsilon(q, eps)),
                "source": f"minimum-unit thresholding (paper 002, Sec. 4.2.3), then {ranking} over the groups it "
                          "released; sequential composition"}
    return {"epsilon": float(dp), "delta": float(delta), "br_units_max": br_units(q, None, False),
            "source": "Theorem 1" if q.with_counts else "Sec. 6.2 (ranking only)"}
