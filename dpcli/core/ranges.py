"""The ranges numeric parameters accept: one rule for the CLI's options and the library's specs.

Each :class:`Range` is closed, refused in one line that names the option and the range (exit 2). The CLI parses an
option's text and checks it here (:func:`dpcli.cli._options.positive`); a spec built by a library caller checks
its values against the same ranges (:class:`dpcli.core.schedules.ScheduleSpec`), so both refuse alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dpcli.core.exact import to_fraction
from dpcli.errors import UsageError


@dataclass(frozen=True)
class Range:
    """The closed interval of values a numeric option accepts (0 is handled separately for δ)."""

    lo: Fraction
    hi: Fraction
    lo_text: str
    hi_text: str

    def check(self, option: str, value: Fraction, text: str, zero_ok: bool = False) -> Fraction:
        """``value`` if it lies in the range (or is 0 and ``zero_ok``), else a one-line usage error."""
        if (zero_ok and value == 0) or self.lo <= value <= self.hi:
            return value
        zero = " or 0" if zero_ok else ""
        raise UsageError(
            f"{option} must be in [{self.lo_text}, {self.hi_text}]{zero} "
            f"(the range dpcli's samplers and accounting honour), got {text.strip()}"
        )


def _range(lo: str, hi: str) -> Range:
    return Range(to_fraction(lo), to_fraction(hi), lo, hi)


#: ε of a release or a ledger (--epsilon, --epsilon-per, --total-epsilon): below 1e-12 the
#: noise scale leaves the exact samplers' range; above 1e6 nothing is protected anyway.
EPSILON_RANGE = _range("1e-12", "1e6")
#: ρ (zCDP) of a release or a ledger: ε ≈ √ρ for small ρ and ≈ ρ for large ρ.
RHO_RANGE = _range("1e-24", "1e12")
#: δ-like probabilities (--delta, --delta-per, --delta-prime, --total-delta, --report-delta, --beta):
#: δ above 1/2 protects nothing, and δ below 1e-100 is far smaller than any float accounting resolves.
PROBABILITY_RANGE = _range("1e-100", "0.5")
#: Any other positive number (e.g. --granularity): a finite double, not subnormal.
ANY_POSITIVE = _range("1e-300", "1e300")

#: Ranges of the positive options, by flag (others get :data:`ANY_POSITIVE`).
POSITIVE_RANGES: dict[str, Range] = {
    "--epsilon": EPSILON_RANGE,
    "--epsilon-per": EPSILON_RANGE,
    "--total-epsilon": EPSILON_RANGE,
    "--rho": RHO_RANGE,
    "--gamma": _range("0.001", "0.999"),  # bbscheduler's growth factor: about ln(growth)/γ epochs
    "--improver-c": _range("1e-6", "0.5"),  # and < 1/4 for a new schedule (schedule_spec)
}
