"""A ``dpcli histogram`` query: its aggregations, quantile names, bounds and options (:class:`HistogramQuery`),
and the noisy measurements each aggregation needs.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dpcli import bounding
from dpcli.core.exact import fraction_text
from dpcli.errors import UsageError
from dpcli.tasks import (
    auto_bounds,
    free_replay,
)

if TYPE_CHECKING:
    pass


SIMPLE_AGGREGATIONS = ("count", "count-units", "sum", "mean", "variance")


VALUE_AGGREGATIONS = ("sum", "mean", "variance")


#: The column of a quantile's per-group counts holding the grid value, as its offset from lo in grid units.
QUANTILE_OFFSET = "__x"


#: The default grid of a query whose values feed quantiles only: at least this many steps over its bounds (with a
#: sum, mean or variance, 4096: their noise in grid units grows with the grid). The exponential mechanism's noise
#: does not grow with the grid (its candidates are runs between the data's values, weighted by their widths), so a
#: finer grid only lets a released quantile lie nearer the data.
QUANTILE_STEPS = 1 << 16


_QUANTILE = re.compile(r"(median|p(\d{1,2}(?:\.\d{1,4})?))")  # at most 4 decimals: pNN.dddd


def parse_quantile(name: str) -> Fraction | None:
    """``median`` → 1/2, ``p90`` → 9/10, ``p99.9`` → 999/1000; None if not a quantile name.

    At most four decimals (``p99.9999``): the quantile's denominator enters the exponential
    mechanism's integer utility, which must stay within 64 bits."""
    m = _QUANTILE.fullmatch(name)
    if not m:
        return None
    if m.group(1) == "median":
        return Fraction(1, 2)
    q = Fraction(m.group(2)) / 100
    if not 0 < q < 1:
        return None
    return q


def quantile_label(q: Fraction) -> str:
    """The name of the p-quantile's output column before its value's: ``median``, ``p90``, ``p99.9``."""
    return "median" if q == Fraction(1, 2) else "p" + fraction_text(q * 100)


@dataclass(frozen=True)
class HistogramQuery:
    """Everything that defines a histogram release (validated by :meth:`validate`)."""

    by: tuple[str, ...]
    unit: str
    aggregations: tuple[str, ...] = ("count",)
    value: str | None = None
    bounds: tuple[float, float] | None = None
    granularity: Fraction | None = None
    max_partitions: int = 1
    max_contributions: int = 1
    epsilon: Fraction | None = None
    delta: Fraction = Fraction(0)
    rho: Fraction | None = None
    noise: str = "laplace"  # laplace or gaussian (options as given: validate refuses others)
    domain: str = "threshold"  # keys, threshold or unklap
    max_groups: int = 1000
    # a free replay for every aggregation but a quantile, whose --with-error interval takes a part of its share:
    # that changes its calibration, which the seed binds (the plan's measurements), so it is another release
    with_error: bool = free_replay("--with-error", default=False)
    #: The bounds dpcli chooses from the data (``auto``; None: every bound given), and the share of the
    #: budget of the bias report (``--report-bias``; None: no report).
    auto: auto_bounds.AutoBounds | None = None
    bias_share: Fraction | None = None

    def validate(self) -> None:
        """Refuse inconsistent queries with one-line usage errors (the first problem, in this order)."""
        self._check_choices()
        self._check_columns()
        self._check_aggregations()
        self._check_value()
        self._check_parts()
        if self.bounds is not None:
            self._check_bounds(*self.bounds)
        for name in ("max_partitions", "max_contributions"):
            if getattr(self, name) < 1:
                raise UsageError("must be ≥ 1", field=name)
        if self.domain == "unklap":
            self._check_unklap()

    def _check_choices(self) -> None:
        if self.noise not in ("laplace", "gaussian"):
            raise UsageError(f"must be laplace or gaussian, got {self.noise!r}", field="noise")
        if self.domain not in ("keys", "threshold", "unklap"):
            raise UsageError(f"must be threshold or unklap, got {self.domain!r}", field="selection")

    def _check_columns(self) -> None:
        """Group by at least one column, never by the privacy unit."""
        if not self.by:
            raise UsageError("needs at least one column", field="by")
        if self.unit in self.by:
            raise UsageError(f"cannot include the privacy unit column {self.unit!r} (it would release units)",
                             field="by")

    def _check_aggregations(self) -> None:
        """At least one aggregation, each known, none twice."""
        if not self.aggregations:
            raise UsageError("needs at least one aggregation", field="agg")
        for a in self.aggregations:
            if a not in SIMPLE_AGGREGATIONS and parse_quantile(a) is None:
                raise UsageError(
                    f"unknown aggregation {a!r} (choose from {', '.join(SIMPLE_AGGREGATIONS)}, median, pNN)"
                )
        if len(set(self.aggregations)) != len(self.aggregations):
            raise UsageError("lists an aggregation twice", field="agg")

    def _check_value(self) -> None:
        """``--value`` and ``--bounds`` exactly when an aggregation reads values (each missing one named)."""
        reading = [a for a in self.aggregations if a in VALUE_AGGREGATIONS or parse_quantile(a) is not None]
        needs_value = bool(reading)
        if needs_value and self.value is None:
            raise UsageError(f"is needed by {', '.join(reading)}: the numeric column aggregated", field="value")
        if needs_value and self.bounds is None and not (self.auto and self.auto.values):
            raise UsageError(f"is needed by {', '.join(reading)}: LO:HI, the range the values are clamped to "
                             "(e.g. 0:600), chosen without looking at the data", field="bounds")
        if not needs_value and self.value is not None:
            raise UsageError("is only used by sum, mean, variance and quantiles", field="value")
        if not needs_value and self.auto and self.auto.values:
            raise UsageError("auto needs a value aggregation (sum, mean, variance or a quantile) and --value",
                             field="bounds")

    def _check_parts(self) -> None:
        """The shares of bounds chosen from the data and of the bias report, and what they cannot go with."""
        if self.auto is not None and self.auto.any:
            auto_bounds.check_share(self.auto.share, "auto_share")
            if self.auto.values and self.granularity is not None:
                raise UsageError("needs --bounds LO:HI: a grid spacing cannot be chosen before its bounds",
                                 field="granularity")
            if self.domain == "unklap":
                raise UsageError("unklap releases with given bounds: give --max-partitions and "
                                 "--max-contributions", field="selection")
        if self.bias_share is not None:
            auto_bounds.check_share(self.bias_share, "bias_share")
            if self.domain == "unklap":
                raise UsageError("--report-bias is not offered with unklap", field="selection")
        if self.auto is not None and self.bias_share is not None and self.auto.share + self.bias_share > Fraction(1, 2):
            raise UsageError("and --bias-share together must leave the release at least half of the budget",
                             field="auto_share")

    @property
    def parts(self) -> auto_bounds.BudgetParts | None:
        """The budget's parts besides the release (None: the release spends it all)."""
        choosing = self.auto is not None and self.auto.any
        if not choosing and self.bias_share is None:
            return None
        return auto_bounds.BudgetParts(self.auto.share if choosing and self.auto else Fraction(0),
                                self.bias_share or Fraction(0))

    def release_query(self, chosen: auto_bounds.ChosenBounds | None = None) -> HistogramQuery:
        """The release itself: its share of the budget, the bounds in force (``chosen``, or before the
        choice placeholders that calibrate nothing but its cost), no parts."""
        parts = self.parts
        if parts is None:
            return self
        share = parts.release
        q = replace(self, auto=None, bias_share=None,
                    epsilon=self.epsilon * share if self.epsilon is not None else None,
                    rho=self.rho * share if self.rho is not None else None)
        if chosen is not None:
            return replace(q, max_partitions=chosen.max_partitions or 1, max_contributions=chosen.max_contributions,
                           bounds=chosen.bounds if self.value is not None else None)
        if self.auto is not None and self.auto.values:
            q = replace(q, bounds=(0.0, 1.0))
        return q

    @property
    def shape(self) -> auto_bounds.DataShape:
        return auto_bounds.DataShape(self.unit, self.by, self.value)

    @property
    def counts_rows(self) -> bool:
        """Whether the row cap bounds anything released: every aggregation but count-units reads rows."""
        return any(a != "count-units" for a in self.aggregations)

    def given(self) -> auto_bounds.ChosenBounds:
        """The bounds as given (placeholders where auto)."""
        return auto_bounds.ChosenBounds(self.max_partitions, self.max_contributions, self.bounds)

    def _check_bounds(self, lo: float, hi: float) -> None:
        """Finite bounds with LO < HI, a grid that can honour them, and a variance within the float range."""
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise UsageError(f"must be finite with LO < HI, got {lo}:{hi}", field="bounds")
        grid = self.grid  # the grid is public: one it cannot honour is a usage error (ValueGrid says why)
        if grid is None or "variance" not in self.aggregations:
            return
        top = (Fraction(grid.half_width_units) * grid.granularity) ** 2
        if top > Fraction(sys.float_info.max):
            raise UsageError(
                f"a variance of values within --bounds {lo!r}:{hi!r} can reach {bounding.show_number(top)}, "
                "beyond the float range; rescale the values"
            )

    def _check_unklap(self) -> None:
        """UnkLap releases one Laplace count over at most ``max_groups`` groups."""
        counts = [a for a in self.aggregations if a in ("count", "count-units")]
        if len(self.aggregations) != 1 or not counts:
            raise UsageError("unklap releases exactly one of count or count-units", field="selection")
        if self.noise != "laplace":
            raise UsageError("unklap uses Laplace noise, not Gaussian", field="selection")
        if self.max_groups < 1:
            raise UsageError("must be ≥ 1", field="max_groups")

    @property
    def grid(self) -> bounding.ValueGrid | None:
        if self.bounds is None or self.value is None:
            return None
        only_quantiles = self.quantiles and not set(self.aggregations) & set(VALUE_AGGREGATIONS)
        steps = QUANTILE_STEPS if only_quantiles else 1 << 12
        g = self.granularity or bounding.default_granularity(*self.bounds, steps)
        return bounding.ValueGrid(self.bounds[0], self.bounds[1], g)

    def bounding_spec(self) -> bounding.BoundingSpec:
        """The contribution bounds of this query (their stability calibrates its noise)."""
        return bounding.BoundingSpec(unit=self.unit, by=self.by, max_partitions=self.max_partitions,
                                     max_contributions=self.max_contributions, value=self.value, grid=self.grid)

    @property
    def quantiles(self) -> list[Fraction]:
        return [q for a in self.aggregations if (q := parse_quantile(a)) is not None]

    def canonical(self) -> dict[str, Any]:
        """The query as plain data, for the release seed and the ledger."""
        grid = self.grid
        return {
            "by": list(self.by),
            "unit": self.unit,
            "aggregations": list(self.aggregations),
            "value": self.value,
            "bounds": [grid.lo, grid.hi] if grid else None,
            "granularity": fraction_text(grid.granularity) if grid else None,
            "max_partitions": self.max_partitions,
            "max_contributions": self.max_contributions,
            "epsilon": fraction_text(self.epsilon) if self.epsilon is not None else None,
            "delta": fraction_text(self.delta),
            "rho": fraction_text(self.rho) if self.rho is not None else None,
            "noise": self.noise,
            "domain": self.domain,
            "max_groups": self.max_groups if self.domain == "unklap" else None,
            **self._canonical_parts(),
        }

    def _canonical_parts(self) -> dict[str, Any]:
        """The auto bounds and the bias report, only when asked for (every other query keeps its seed)."""
        out: dict[str, Any] = {}
        if self.auto is not None and self.auto.any:
            out["auto"] = {**self.auto.canonical(), "rule": auto_bounds.BIAS_VARIANCE_RULE}
            for name in out["auto"]["chosen"]:
                out[name] = "auto"
            if self.auto.values:
                out["granularity"] = None
        if self.bias_share is not None:
            out["report_bias"] = fraction_text(self.bias_share)
        return out


#: The noisy measurements each simple aggregation needs (a quantile needs its own: ``q`` + its fraction).
_MEASUREMENTS: dict[str, tuple[str, ...]] = {
    "count": ("rows",),
    "count-units": ("units",),
    "sum": ("sum",),
    "mean": ("rows", "csum"),
    "variance": ("rows", "csum", "csumsq"),
}


def quantile_measurement(aggregation: str) -> str | None:
    """The measurement of a quantile aggregation (``median`` → ``q1/2``); None for any other."""
    p = parse_quantile(aggregation)
    return None if p is None else "q" + fraction_text(p)


def _measurements_of(aggregation: str) -> tuple[str, ...]:
    quantile = quantile_measurement(aggregation)
    if quantile is not None:
        return (quantile,)
    return _MEASUREMENTS[aggregation]  # validated: every other aggregation is in _MEASUREMENTS


def measurement_names(q: HistogramQuery) -> list[str]:
    """The measurements of a query, each once, in the order its aggregations first need them
    (thresholding needs the unit counts last)."""
    wanted = [n for a in q.aggregations for n in _measurements_of(a)]
    if q.domain == "threshold":
        wanted.append("units")
    return list(dict.fromkeys(wanted))
