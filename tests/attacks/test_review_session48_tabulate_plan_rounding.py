"""Review session 48, item 4 (number format): ``tabulate --dry-run``'s figures are costs, and the one format
rounds what is charged up (root help: "spent and charged rounded up"). Commit 0028eb9 did so (``_up``); 32761eb
(a schedules commit) put back ``:.3g``, rounding to nearest: the plan prints ``pure DP: ε = 15.3`` for a release
that costs 15.32 (its ledger line says "needs 15.32"), and each level's ε and ρ below their values."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dptest import cli, init_ledger

SPEC = Path(__file__).resolve().parent.parent.parent / "sample_data" / "safetab_spec.toml"


def test_the_tabulate_plan_never_shows_a_cost_below_its_value():
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    exact = json.loads(cli("tabulate", "--dry-run", "--spec", SPEC, "--json").stdout)
    text = cli("tabulate", "--dry-run", "--spec", SPEC).stdout
    shown = float(re.search(r"pure DP: +ε = (\S+)", text).group(1))
    assert shown >= exact["geometric"]["pure_epsilon"], (shown, exact["geometric"]["pure_epsilon"])
    rdp = float(re.search(r"RDP \(eq\. 39-40\): +ε = (\S+)", text).group(1))
    assert rdp >= exact["geometric"]["rdp_epsilon"], (rdp, exact["geometric"]["rdp_epsilon"])
    first = exact["geometric"]["levels"][0]
    row = next(line for line in text.splitlines() if line.startswith(first["level"]))
    assert float(row.split()[-4]) >= first["epsilon_step2"], row
