"""Review of the pld mode: extreme public parameters within the accepted ranges (ε up to 10⁶, ρ up to 10¹²) must
cost a block, never crash in the PLD. Before the fix, a block with an event of ε > 709 ended in an internal
OverflowError (randomized response's e^ε, dpcli's and dp_accounting's), and a discrete Gaussian of a tiny σ (or
a huge ε off a lattice) built a PLD of 10¹⁰ grid points (MemoryError, or the machine's memory exhausted). Such
blocks are now charged by basic composition alone (an upper bound); ordinary blocks keep their PLD."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

from dptest import cli

from dpcli.core.accounting import pld
from dpcli.core.events import PrivacyEvent

F = Fraction

_PROBE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))  # a runaway PLD fails here instead of swapping
from fractions import Fraction as F
from dpcli.core.accounting import pld
from dpcli.core.events import PrivacyEvent
cases = [
    ([PrivacyEvent("approx", "histogram/laplace+threshold", epsilon=F(800), delta=F(1, 10**9))], 1, None),
    ([PrivacyEvent("pure", "histogram/laplace", epsilon=F(1000))], 2, F(1, 10**6)),
    ([PrivacyEvent("zcdp", "histogram/gaussian", rho=F(10**12), delta=F(1, 10**6), rdp_curve="discrete_gaussian")],
     1, None),
    ([PrivacyEvent("zcdp", "histogram/gaussian", rho=F(10**6), delta=F(1, 10**6), rdp_curve="discrete_gaussian")],
     1000, None),
]
for events, count, delta in cases:
    print(pld.block_cost(events, count, delta))
"""


def test_extreme_blocks_are_charged_basically_without_exhausting_memory():
    p = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 4
    assert lines[0] == repr((F(800), F(1, 10**9)))  # basic composition: (ε, δ) as given
    assert lines[1] == repr((F(2000), F(1, 10**6)))


def test_ordinary_blocks_keep_their_pld():
    lap = [PrivacyEvent("pure", "histogram/laplace", epsilon=F(1, 100))]
    eps, _ = pld.block_cost(lap, 365, F(1, 10**6))
    assert eps < F(1)  # far below basic composition's 3.65
    dg = [PrivacyEvent("zcdp", "histogram/gaussian", rho=F(5, 10**5), delta=F(1, 10**7), rdp_curve="discrete_gaussian")]
    assert pld.block_cost(dg, 365, F(1, 10**6))[0] < pld._basic(dg, 365)[0]


def test_the_calculator_answers_at_a_large_epsilon(state_dir):
    r = cli("budget", "compose", "--mode", "pld", "--epsilon", "1000", "--count", "2", "--delta", "1e-6")
    assert r.exit_code == 0, r.stderr
    assert "internal error" not in r.stderr and "epsilon = 2000" in r.stdout


