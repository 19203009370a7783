"""Budget splits several tasks share: a release's ε or ρ divided among the mechanisms that spend it.

:func:`gaussian_budget` is the split of a Gaussian release (histogram and sql): ``--rho`` as given, or the ρ whose
conversion to (ε, δ) gives ``--epsilon``, with δ halved between the conversion and the selection when groups are
discovered. (The parts that choose ``auto`` bounds and report the bias: :class:`dpcli.tasks.auto_bounds.BudgetParts`.)
"""

from __future__ import annotations

from fractions import Fraction

from dpcli.core.accounting import composition as acc
from dpcli.core.exact import floor_parameter, fraction_text
from dpcli.errors import UsageError


def gaussian_budget(epsilon: Fraction | None, rho: Fraction | None, delta: Fraction,
                    discovered: bool) -> tuple[Fraction, Fraction, Fraction]:
    """(ρ, the δ of the (ε, δ) conversion, the δ of the selection) of a release with Gaussian noise: ``--rho`` as
    given, or the ρ whose conversion at δ (half of it when groups are ``discovered``: the other half is the
    selection's) gives ``--epsilon`` (histogram and sql)."""
    if rho is not None:
        if epsilon is not None:
            raise UsageError("and an ε calibrate the same Gaussian noise: give one of them", field="rho")
        return rho, delta, delta
    if epsilon is None or not 0 < delta < 1:
        raise UsageError("Gaussian noise needs --rho, or --epsilon with --delta in (0, 1)")
    conversion = delta / 2 if discovered else delta
    found = floor_parameter(acc.rho_for_epsilon(float(epsilon), float(conversion)))
    if found <= 0:
        raise UsageError(f"{fraction_text(epsilon)} is too small for Gaussian noise at this δ", field="epsilon")
    return found, conversion, delta - conversion
