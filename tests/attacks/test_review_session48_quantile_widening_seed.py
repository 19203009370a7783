"""Review session 48, item 1 (rule 1: the seed binds everything that shapes the output).

A quantile-only histogram with ``--bounds auto`` widens the chosen limits by
``dpcli.tasks.histogram.auto.QUANTILE_WIDEN_STEPS`` candidates before it clamps the values the exponential mechanism
reads. That constant is a rule that shapes the release (the limits in force, the grid, every median), but it is in
no version :func:`dpcli.release.seeds.rule_versions` binds (not AUTO_VERSION, not BIAS_VARIANCE_RULE, not
bias_report.RULE). An upgrade that changes it gives a rerun the old seed: recorded as a free replay of the first
release while its limits and medians differ (the same noise over other clamped values, uncharged).
"""

from __future__ import annotations

import json

from dptest import PV_SMALL, cli, history, init_ledger

from dpcli.tasks.histogram import auto as histogram  # where the widening is used

QUANTILES = ("histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--value", "duration_s", "--agg",
             "median", "--bounds", "auto", "--epsilon", "1", "--delta", "1e-6", "--json")


def test_a_new_quantile_widening_is_another_release_never_a_free_replay(monkeypatch):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    first = json.loads(cli(*QUANTILES).stdout)
    monkeypatch.setattr(histogram, "QUANTILE_WIDEN_STEPS", histogram.QUANTILE_WIDEN_STEPS + 10)
    upgraded = json.loads(cli(*QUANTILES).stdout)
    assert upgraded["summary"]["auto"]["bounds"] != first["summary"]["auto"]["bounds"]  # the rule shaped it
    assert upgraded["summary"]["seed_id"] != first["summary"]["seed_id"], "other limits, the same seed"
    assert history()[-1]["replay_of"] is None, "a release at other limits recorded as a free replay"
