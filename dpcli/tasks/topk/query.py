"""A ``dpcli topk`` query: the groups, the count (distinct units or rows), k, the selection (KnownGumb,
UnkGumb or the threshold) and its options (:class:`TopKQuery`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dpcli import bounding
from dpcli.core.exact import fraction_text
from dpcli.errors import UsageError
from dpcli.tasks import free_replay
from dpcli.tasks.auto_bounds import AutoBounds, BudgetParts, check_share

if TYPE_CHECKING:

    pass


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
