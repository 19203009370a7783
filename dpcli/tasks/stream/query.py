"""A stream-replay release's public parameters (:class:`StreamQuery`) and their limits.

Every check here depends on the parameters only (public): a refused query
fails the same way for every dataset, before any data is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from dpcli import bounding
from dpcli.core.exact import fraction_text
from dpcli.errors import UsageError
from dpcli.tasks.auto_bounds import (
    QUANTILE_SCALE,
    AutoBounds,
    BudgetParts,
    check_choice,
    check_share,
    pure_epsilon,
)
from dpcli.tasks.bias_report import check_bias

#: Event times (epoch seconds, UTC) that dates can show: 0001-01-01T00:00:00 … 9999-12-31T23:59:59.
MIN_SECONDS = -62_135_596_800
MAX_SECONDS = 253_402_300_799
#: Largest public parameters: beyond them the float calibration over- or underflows, or one key's
#: trees (``triggers`` floats each) and the threshold cache (up to triggers²/2 floats) grow too large.
MAX_WINDOW_DAYS = 36_500
MAX_TRIGGERS = 4096
MAX_RECORDS = 1_000_000
MAX_MU = 1_000_000_000
MAX_EPSILON = 100
MIN_DELTA = Fraction(1, 10**100)
CLAMP_RANGE = (1e-9, 1e15)


@dataclass(frozen=True)
class StreamQuery:
    """One stream-replay release (validated by :meth:`validate`)."""

    time: str
    keys: tuple[str, ...]
    unit: str
    window: int  # seconds
    triggers: int
    max_records: int  # C
    epsilon: Fraction
    delta: Fraction
    value: str | None = None
    clamp: float | None = None  # L
    mu: int = 0
    # Bounds left to dpcli (``auto``: C and/or L, chosen at run time) and the bias report's share. A bound still
    # to be chosen is held as C = 0 or L = None until :meth:`resolved` (:attr:`pending`).
    auto: AutoBounds | None = None
    report_bias: Fraction | None = None

    @property
    def parts(self) -> BudgetParts:
        """The budget's parts: choosing bounds, the bias report, the release (DP-SQLP) itself."""
        return BudgetParts(self.auto.share if self.auto else Fraction(0), self.report_bias or Fraction(0))

    @property
    def pending(self) -> bool:
        """Are bounds still to be chosen from the data (C or L ``auto``, not yet :meth:`resolved`)?"""
        a = self.auto
        return a is not None and ((a.contributions and self.max_records == 0) or (a.values and self.clamp is None))

    def resolved(self, max_records: int, clamp: float | None) -> StreamQuery:
        """The query at the chosen bounds (its :meth:`canonical` is unchanged: the request is what it binds)."""
        return replace(self, max_records=max_records, clamp=clamp)

    @property
    def step(self) -> int:
        """Seconds per trigger (micro-batch)."""
        return self.window // self.triggers

    def validate(self) -> None:
        """Refuse parameters that cannot be honoured (all public: exit 2, before any data is read)."""
        if self.unit in self.keys:
            raise UsageError("cannot include the privacy unit column", field="key")
        self._check_window()
        self._check_auto()
        chosen_later = self.auto is not None and self.auto.contributions and self.max_records == 0
        if not chosen_later and not 1 <= self.max_records <= MAX_RECORDS:
            raise UsageError(f"must be between 1 and {MAX_RECORDS}", field="max_records")
        if not 0 < self.epsilon <= MAX_EPSILON:
            raise UsageError(f"must be in (0, {MAX_EPSILON}] for stream-replay", field="epsilon")
        if not MIN_DELTA <= self.delta < 1:
            raise UsageError("must be in [1e-100, 1) for stream-replay", field="delta")
        self._check_value()
        if not 0 <= self.mu <= MAX_MU:
            raise UsageError(f"must be between 0 and {MAX_MU}", field="mu")

    def _check_window(self) -> None:
        """A window of at most MAX_WINDOW_DAYS, split into at most MAX_TRIGGERS equal triggers."""
        if self.window < 1 or self.triggers < 1:
            raise UsageError("and the number of triggers must be positive", field="window")
        if self.window > MAX_WINDOW_DAYS * 86400:
            raise UsageError(f"must be at most {MAX_WINDOW_DAYS}d", field="window")
        if self.triggers > MAX_TRIGGERS:
            raise UsageError(f"at most {MAX_TRIGGERS} triggers per window (got {self.triggers})")
        if self.window % self.triggers:
            raise UsageError(f"{self.window}s does not split into {self.triggers} equal triggers", field="window")

    def _check_auto(self) -> None:
        """What ``auto`` a stream takes (C and L, no partition bound), and shares that leave the release half."""
        a = self.auto
        if a is not None:
            if a.partitions or not (a.contributions or a.values):
                raise UsageError("of stream-replay are --max-contributions and --bounds", field="auto")
            if a.values and self.value is None:
                raise UsageError("auto is needed with a value column (--value)", field="bounds")
            check_share(a.share, "auto_share")
        if self.report_bias is not None:
            check_share(self.report_bias, "bias_share")
        if self.parts.release < Fraction(1, 2):
            raise UsageError("and --bias-share together must be at most 0.5 (the release keeps at least half of "
                             "the budget)", field="auto_share")
        if a is not None:
            quantiles = int(a.contributions) + int(a.values)
            check_choice(pure_epsilon(self.epsilon, None, a.share, quantiles), scale=QUANTILE_SCALE)
        if self.report_bias is not None:
            check_bias(self.epsilon, None, self.report_bias)

    def _check_value(self) -> None:
        """``--value`` and its clamp together (each missing one named), the clamp within CLAMP_RANGE."""
        if self.auto is not None and self.auto.values and self.clamp is None:
            return
        if self.value is not None and self.clamp is None:
            raise UsageError("is needed by a sum of values: -L:L, the range the values are clamped to (e.g. "
                             "-300:300), chosen without looking at the data", field="clamp")
        if self.value is None and self.clamp is not None:
            raise UsageError("is needed with bounds: the numeric column summed", field="value")
        if self.clamp is not None and not (math.isfinite(self.clamp)
                                           and CLAMP_RANGE[0] <= self.clamp <= CLAMP_RANGE[1]):
            raise UsageError(f"must be between {CLAMP_RANGE[0]:g} and {CLAMP_RANGE[1]:g}", field="clamp")

    def canonical(self) -> dict[str, Any]:
        """The query as JSON (part of the release seed and of a state file: never change its shape)."""
        a = self.auto
        out: dict[str, Any] = {
            "time": self.time, "keys": list(self.keys), "unit": self.unit, "window": self.window,
            "triggers": self.triggers, "max_records": None if a and a.contributions else self.max_records,
            "epsilon": fraction_text(self.epsilon), "delta": fraction_text(self.delta), "value": self.value,
            "clamp": None if a and a.values else self.clamp, "mu": self.mu,
        }
        if a is not None:  # only when used: every other query keeps its seed and its state files
            out["auto"] = a.canonical()
        if self.report_bias is not None:
            out["report_bias"] = fraction_text(self.report_bias)
        return out

    @property
    def grid(self) -> bounding.ValueGrid | None:
        """The value grid: [−L, L] in at least 2^10 steps (None without a value column)."""
        if self.clamp is None:
            return None
        return bounding.ValueGrid(-self.clamp, self.clamp,
                                  bounding.default_granularity(-self.clamp, self.clamp, 1 << 10))
