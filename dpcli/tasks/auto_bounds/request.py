"""What a query leaves to dpcli (:class:`AutoBounds`), the bounds then in force (:class:`ChosenBounds`), and the
budget's visible parts (:class:`BudgetParts`: choosing bounds, the bias report, the release; :func:`pure_epsilon`,
each part's ε). Public inputs only: nothing here reads data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpcli.core.accounting import composition as acc
from dpcli.core.events import PrivacyEvent
from dpcli.core.exact import fraction_text
from dpcli.errors import UsageError
from dpcli.tasks.reports import AutoReport

#: The word that asks dpcli to choose a bound.
AUTO = "auto"


#: The default share of the query's ε (or ρ) spent choosing bounds.
AUTO_SHARE = Fraction(1, 10)


#: The version of the rules that choose bounds (a field of every :class:`AutoBounds`, so every release seed binds
#: it by construction: a release chosen by other rules is another release, never a free replay with other bytes).
#: 2 (issue 38): ``dpcli sql`` chooses by the bias–variance rule (:class:`ErrorModel`), as histogram does, instead
#: of quantiles (caps of 2–16 on data of one row per unit in 6 of 10 draws at ε = 1).
AUTO_VERSION = 2


@dataclass(frozen=True)
class AutoBounds:
    """Which bounds a query leaves to dpcli, the share of its budget that chooses them, and the rules' version."""

    partitions: bool = False
    contributions: bool = False
    values: bool = False
    share: Fraction = AUTO_SHARE
    version: int = AUTO_VERSION

    @property
    def choices(self) -> int:
        """How many quantiles are chosen (the value limits are two)."""
        return int(self.partitions) + int(self.contributions) + 2 * int(self.values)

    @property
    def any(self) -> bool:
        return self.choices > 0

    def canonical(self) -> dict[str, Any]:
        """What the seed binds: the bounds chosen, the share, the grids' and levels' version."""
        return {"chosen": [n for n, on in (("max_partitions", self.partitions),
                                           ("max_contributions", self.contributions),
                                           ("bounds", self.values)) if on],
                "share": fraction_text(self.share), "v": self.version}


def check_share(share: Fraction, field: str) -> None:
    """A share of the budget is in (0, 1/2]: the release keeps at least half."""
    if not 0 < share <= Fraction(1, 2):
        raise UsageError(f"must be in (0, 0.5], got {fraction_text(share)}", field=field)


@dataclass(frozen=True)
class BudgetParts:
    """A query's budget in its visible parts: choosing bounds, the bias report, the release itself."""

    auto: Fraction  # the share choosing bounds (0: none)
    bias: Fraction  # the share of the bias report (0: none)

    @property
    def release(self) -> Fraction:
        return 1 - self.auto - self.bias

    def events(self, command: str, epsilon: Fraction | None, rho: Fraction | None) -> list[PrivacyEvent]:
        """The events of the parts besides the release: pure ε (or ρ-zCDP when the query gives ρ)."""
        out: list[PrivacyEvent] = []
        # The bias report's event is named for what it measures ("bias-shares": :mod:`dpcli.tasks.bias_report`),
        # so the plan, and with it the seed, changes with the report's kind.
        for name, share in (("auto-bounds", self.auto), ("bias-shares", self.bias)):
            if share == 0:
                continue
            if rho is not None:
                out.append(PrivacyEvent("zcdp", f"{command}/{name}", rho=rho * share))
            else:
                assert epsilon is not None
                out.append(PrivacyEvent("pure", f"{command}/{name}", epsilon=epsilon * share))
        return out


def pure_epsilon(epsilon: Fraction | None, rho: Fraction | None, share: Fraction, parts: int) -> Fraction:
    """The pure ε of each of ``parts`` equal mechanisms that together spend ``share`` of the budget: ε·share/parts,
    or under ρ the ε whose ε-DP choice spends ρ·share/parts as ε²/2-zCDP (Bun and Steinke 2016, Prop. 1.4).
    A choice is AboveThreshold, not the exponential mechanism: it is ε-DP but not known to be ε-bounded-range,
    so the tighter ε²/8 of bounded-range mechanisms does not apply to it."""
    if rho is None:
        assert epsilon is not None
        return epsilon * share / parts
    return acc.largest_epsilon(rho * share / parts, 2)


@dataclass(frozen=True)
class ChosenBounds:
    """The bounds in force after the choice: given or chosen (None: the query has no such bound)."""

    max_partitions: int | None
    max_contributions: int
    bounds: tuple[float, float] | None
    chosen: tuple[str, ...] = ()
    #: The chosen bounds made the release's noise too large to sample (a tiny ε): placeholders are in force instead
    #: (:func:`dpcli.tasks.histogram.auto.plannable`), decided from the chosen (released) values alone.
    reduced: bool = False

    def to_json(self) -> AutoReport:
        """The bounds in force where chosen, as released (noisy quantities), and whether they were reduced."""
        out: AutoReport = {"reduced": True} if self.reduced else {}
        if "max_partitions" in self.chosen and self.max_partitions is not None:  # (a chosen K is a number)
            out["max_partitions"] = self.max_partitions
        if "max_contributions" in self.chosen:
            out["max_contributions"] = self.max_contributions
        if "bounds" in self.chosen and self.bounds is not None:
            out["bounds"] = [self.bounds[0], self.bounds[1]]
        return out


@dataclass(frozen=True)
class DataShape:
    """The columns a choice reads: the unit, the group columns (none: one group), the value column."""

    unit: str
    by: tuple[str, ...]
    value: str | None = None


def chosen_of(chosen: Mapping[str, Any] | None, given: ChosenBounds) -> ChosenBounds:
    """The bounds in force from a release's metadata (``auto``) and the ones given."""
    chosen = chosen or {}
    bounds = chosen.get("bounds")
    return ChosenBounds(chosen.get("max_partitions", given.max_partitions),
                        chosen.get("max_contributions", given.max_contributions),
                        (float(bounds[0]), float(bounds[1])) if bounds else given.bounds)


#: What a dry run shows for a margin or threshold that depends on a bound chosen from the data.
AT_RUN_TIME = "chosen at run time"
