"""Review session 48, item 3 (schedules): a stored schedule that continued before ``ScheduleSpec.check`` no
longer does.

dpcli 0.2 accepted ``--improver-c`` in (0, 1/2] (commit 60a9aa0 narrowed new schedules to (0, 1/4) and kept
existing ones: ``as_in`` takes the stored c, and ``advice.improver_c_without_gain`` notes any c ≥ 1/4). Up to
0028eb9 such a schedule (here c = 0.4) ran on when its owner gave no ``--improver-c``. Now ``ScheduleSpec``
re-checks itself in ``replace`` inside ``as_in`` and lets a stored c through only up to 1/4: the run is refused
(exit 2) with "--improver-c must be in (0, 1/4)", naming an option the user did not give; the reservation is
stranded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_schedules import _legacy, legacy  # noqa: E402,F401  (the legacy state fixture)


def test_a_dpcli_0_2_bbimprover_with_c_above_one_quarter_runs_on(legacy, state_dir):  # noqa: F811
    from dpcli.state import documents
    from dpcli.state import schedules as store

    directory = state_dir / "schedules" / "default"
    (doc,) = [s for s in store.all_schedules(state_dir, "default") if s["spec"]["name"] == "old"]
    del doc["spec"]["index"]  # as dpcli 0.2 wrote it
    doc["spec"]["c"] = 0.4  # dpcli 0.2: --improver-c in (0, 1/2]
    documents.write(directory / f"{doc['key']}.json", store.KIND, doc)
    r = _legacy(legacy, "snap2", "old", "--scheduler", "bbimprover", "--total-delta", "1e-6")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["schedule"]["c"] == 0.4
