"""Issue 40, item 3: a schedule's rules live with :class:`dpcli.core.schedules.ScheduleSpec`. A library caller who
builds a spec meets each rule the CLI meets, in the same words; the CLI only turns ``--schedule``'s options into
values (and keeps the rules about the options themselves: ``--through`` and ``--runs`` against ``--dry-run``)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from dptest import PV_SMALL, cli

from dpcli.errors import UsageError
from dpcli.core.schedules import ScheduleSpec

BASE = dict(name="s", scheduler="bbscheduler", total_epsilon=Fraction(1), total_delta=Fraction(0), gamma=None,
            beta=0.05, c=0.1, run_epsilon=None)

#: (the options after ``--schedule s``, the spec's fields that say the same) for each rule.
RULES = [
    (["--scheduler", "weekly", "--total-epsilon", "1"], {"scheduler": "weekly"}),
    (["--total-epsilon", "1", "--gamma", "1.5"], {"gamma": Fraction(3, 2)}),
    (["--scheduler", "bbimprover", "--total-epsilon", "1", "--total-delta", "1e-6", "--improver-c", "0.3"],
     {"scheduler": "bbimprover", "total_delta": Fraction(1, 10**6), "c": 0.3, "defaulted": frozenset({"index"})}),
    (["--scheduler", "bbimprover", "--total-epsilon", "1", "--total-delta", "1e-6", "--improver-index", "days"],
     {"scheduler": "bbimprover", "total_delta": Fraction(1, 10**6), "index": "days", "defaulted": frozenset({"c"})}),
    (["--total-epsilon", "1", "--improver-c", "0.1"], {"defaulted": frozenset({"index"})}),
    (["--scheduler", "fixed", "--total-epsilon", "1"], {"scheduler": "fixed"}),
    (["--scheduler", "fixed", "--total-epsilon", "1", "--total-delta", "1e-6", "--epsilon", "0.1"],
     {"scheduler": "fixed", "total_delta": Fraction(1, 10**6), "run_epsilon": Fraction(1, 10)}),
    (["--total-epsilon", "1", "--epsilon", "0.1"], {"run_epsilon": Fraction(1, 10)}),
    (["--scheduler", "bbimprover", "--total-epsilon", "1"], {"scheduler": "bbimprover"}),
    (["--total-epsilon", "100", "--total-delta", "1e-6"], {"total_epsilon": Fraction(100),
                                                           "total_delta": Fraction(1, 10**6)}),
]


@pytest.mark.parametrize(("options", "fields"), RULES)
def test_a_library_spec_is_refused_as_the_cli_refuses_it(options, fields):
    with pytest.raises(UsageError) as refused:
        ScheduleSpec(**{**BASE, **fields})
    r = cli("histogram", PV_SMALL, "--by", "page", "--privacy-unit", "user_id", "--max-partitions", "1",
            "--max-contributions", "1", "--schedule", "s", *options)
    assert r.exit_code == 2 and r.stderr == f"dpcli: error: {refused.value}\n", (r.stderr, str(refused.value))


def test_a_valid_spec_and_a_dpcli_0_2_bbimprover_are_accepted():
    ScheduleSpec(**BASE)  # c left at its default for another scheduler is no refusal
    ScheduleSpec(**{**BASE, "scheduler": "bbimprover", "total_delta": Fraction(1, 10**6), "c": 0.25})  # stored c
    with pytest.raises(UsageError, match="1/4"):  # but given, 1/4 is refused (Theorem 13)
        ScheduleSpec(**{**BASE, "scheduler": "bbimprover", "total_delta": Fraction(1, 10**6), "c": 0.25,
                        "defaulted": frozenset({"index"})})
