"""``dpcli budget plan --runs N`` on an RDP ledger does work that grows with the *count* of releases that fit, not
with N: every budget the search tries (``largest_budget``: some 20 to 60 of them) counts all the releases that fit
at it (``releases_that_fit``), and on an RDP ledger re-composes the curves one charge at a time *from scratch*
for each step of ``_sequential_count`` (``_sequential(k)`` is k curve additions, called at least twice). One
count near the cap (ε 0.0007 on a ledger of (1, 10⁻⁶): 99,399 fit) takes about 50 s of a core here; a plan with
``--runs`` that tries dozens of such budgets takes tens of minutes, and in service mode any analyst can start as
many as they like on the shared machine (rule 10's spirit: work bounded by public parameters, here only by
MAX_COUNTED). Not a privacy leak (the work is a function of public inputs), an availability one.

The test counts the curve compositions ``largest_budget`` makes for ``--runs 3`` from a small ε: a search that
only needs to know whether 3 fit should not compose thousands of charges."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from dpcli.core.accounting.budget import Limits, Spend
from dpcli.core.events import PrivacyEvent
from dpcli.state.ledger import planning
from dpcli.state.ledger.model import Ledger


def test_runs_on_an_rdp_ledger_does_not_compose_every_release_that_fits(monkeypatch):
    led = Ledger(Path("x"), "a", "id", Limits("rdp", {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}),
                 None, None, 1e-9, ())  # type: ignore[arg-type]
    accountant = led.accountant
    calls = [0]
    spend = type(accountant).spend

    def counted(self, events, base=None):
        calls[0] += 1
        return spend(self, events, base)

    monkeypatch.setattr(type(accountant), "spend", counted)
    best = planning.largest_budget(led, Spend(), 3, Fraction("0.004"),
                                   lambda b: [PrivacyEvent("pure", "m", epsilon=b)])
    assert best is not None
    assert calls[0] < 2_000, calls[0]  # BUG: tens of thousands of compositions to find where 3 fit
