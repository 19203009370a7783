"""Rule 1 (the seed binds everything that shapes the output): the rules that choose a release's bounds and
report what they cut are code, not options, and a new version of one must never reuse an old release's seed.

Attack: an operator upgrades dpcli; the choice of left-out caps (or the bias report) now computes something
else, but every option, input and calibration is the same. Before seed material 4 (issue 38) the bias report's
version (``bias_report.RULE``) and the bias–variance rule's (``BIAS_VARIANCE_RULE``) entered no seed: the rerun
was a free replay of the old release (same seed, same noise) whose output was computed by other rules, so
two outputs with one noise, and no second charge. Now each version is in every seed
(:func:`dpcli.release.seeds.rule_versions`): a changed version is another release, charged.
"""

from __future__ import annotations

import json

import pytest
from dptest import PV_SMALL, cli, history, init_ledger

from dpcli.release import seeds
from dpcli.tasks import auto_bounds, bias_report

#: A default histogram: caps left out (chosen by the bias–variance rule) and the bias report on.
DEFAULT = ("histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--epsilon", "1", "--delta", "1e-6",
           "--json")


@pytest.mark.parametrize(("module", "name", "other"), [
    (bias_report, "RULE", "unit shares 3"),
    (auto_bounds, "BIAS_VARIANCE_RULE", "bias-variance 6"),
    (auto_bounds, "AUTO_VERSION", 3),
])
def test_a_new_rule_version_is_another_release_never_a_free_replay(monkeypatch, module, name, other):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-4")
    first = json.loads(cli(*DEFAULT).stdout)["summary"]
    again = json.loads(cli(*DEFAULT).stdout)["summary"]
    assert again["seed_id"] == first["seed_id"] and history()[-1]["replay_of"] == 1  # the same rules: free
    monkeypatch.setattr(module, name, other)
    assert seeds.rule_versions() != {}  # read at each release, from the modules that own the rules
    upgraded = json.loads(cli(*DEFAULT).stdout)["summary"]
    assert upgraded["seed_id"] != first["seed_id"]
    assert history()[-1]["replay_of"] is None and len([e for e in history() if e["events"]]) == 2  # charged
