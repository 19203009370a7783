"""The accuracy bench's error metrics and table logic (bench/accuracy, issue 38): fast, no peers, no data."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the bench package

from bench.accuracy import report
from bench.accuracy.metrics import coverage, group_errors, pooled_median, topk_share
from bench.accuracy.spec import BY_NAME, group_key


def test_relative_errors_count_an_unreleased_group_as_100_percent() -> None:
    errs = group_errors({"a": 110.0, "b": 95.0, "extra": 1.0}, {"a": 100.0, "b": 100.0, "c": 50.0}, absolute=False)
    assert errs == pytest.approx([0.10, 0.05, 1.0])


def test_absolute_errors_leave_an_unreleased_group_out() -> None:
    errs = group_errors({"a": -1.5, "b": None}, {"a": 1.0, "b": 2.0}, absolute=True, missing_error=None)
    assert errs == [2.5]


def test_pooled_median_is_over_every_group_and_draw() -> None:
    # per-draw medians would be 0.2 and 0.9 (mean 0.55); the pooled median of the six is 0.5 + 0.6 / 2.
    assert pooled_median([[0.1, 0.2, 0.6], [0.5, 0.9, 1.0]]) == pytest.approx(0.55)
    assert pooled_median([[0.1, 0.2, 0.3], [0.4]]) == pytest.approx(0.25)
    assert math.isnan(pooled_median([[], []]))


def test_topk_share_ignores_order_and_extra_groups() -> None:
    assert topk_share(["C", "A", "Z"], ["A", "B", "C", "D"]) == 0.5
    assert topk_share([], ["A"]) == 0.0


def test_coverage_counts_margins_that_hold_the_truth() -> None:
    hit, n = coverage({"a": 10.0, "b": 10.0, "c": 5.0}, {"a": 2.0, "b": 0.5}, {"a": 11.0, "b": 11.0, "c": 5.0})
    assert (hit, n) == (1, 2)  # c has no margin, b misses by 1 > 0.5


def test_group_key_matches_across_tools() -> None:
    assert group_key(["EWR", 6]) == group_key(["EWR", 6.0]) == "EWR|6"
    assert group_key(["01"]) == "01"  # state codes keep their leading zero


def test_evaluate_pools_draws_and_counts_failures() -> None:
    q = BY_NAME["carrier_count"]
    draws = [{q.name: {"values": {"AA": 90.0, "UA": 200.0}, "moe": {"AA": 20.0, "UA": 5.0},
                       "max_partitions": 1, "max_contributions": 365}},
             {q.name: {"error": "dpcli: error: boom"}}]
    cell = report.evaluate(q, draws, {"AA": 100.0, "UA": 100.0})
    assert cell["value"] == pytest.approx(0.55)  # median of 0.1 and 1.0
    assert cell["failed"] == 1 and cell["error"] == "dpcli: error: boom"
    assert cell["coverage"] == [1, 2]
    assert report.fmt(q, cell) == "55.0% (1 of 2 failed)"


def test_evaluate_topk_and_minutes() -> None:
    q = BY_NAME["dest_top10"]
    cell = report.evaluate(q, [{q.name: {"unlisted": ["A", "B"], "listed": ["A", "B", "C", "D"]}},
                               {q.name: {"unlisted": None, "unlisted_error": "x", "listed": ["A"]}}],
                           ["A", "B", "C", "D"])
    assert cell["unlisted"] == 0.5 and cell["unlisted_failed"] == 1 and cell["listed"] == pytest.approx(0.625)
    m = BY_NAME["carrier_median_delay"]
    cell = report.evaluate(m, [{m.name: {"values": {"AA": 1.0, "UA": None}}}], {"AA": -1.0, "UA": 3.0})
    assert cell["value"] == 2.0 and report.fmt(m, cell) == "2.00"


def test_targets_compare_against_the_best_peer() -> None:
    cells = {"dpcli default": {"carrier_count": {"value": 0.030}}, "OpenDP": {"carrier_count": {"value": 0.026}},
             "PipelineDP": {"carrier_count": {"value": 0.020}}}
    rows = {t: ok for t, ok, _ in report.targets(cells)}
    assert rows["carrier_count: default ≤ 1.25 × best peer"] is False  # 0.030 > 1.25 × 0.020
    cells["dpcli default"]["carrier_count"]["value"] = 0.025
    rows = {t: ok for t, ok, _ in report.targets(cells)}
    assert rows["carrier_count: default ≤ 1.25 × best peer"] is True
    assert rows["mean dep_delay: auto ≤ best peer"] is None  # not measured


def test_write_section_replaces_its_own_section_only(tmp_path: Path) -> None:
    md = tmp_path / "results.md"
    md.write_text("# r\n\n## 16. before\nx\n\n## 17. Issue 38: old\nold table\n\n## Profiled and fixed\ny\n")
    report.write_section(md, "## 17. Issue 38: new\nnew table\n")
    text = md.read_text()
    assert "old table" not in text and "new table" in text
    assert text.index("## 16.") < text.index("## 17.") < text.index("## Profiled and fixed")
    fresh = tmp_path / "fresh.md"
    fresh.write_text("# r\n\n## 16. before\n\n## Profiled and fixed\ny\n")
    report.write_section(fresh, "## 17. Issue 38: new\n")
    assert fresh.read_text().index("## 17.") < fresh.read_text().index("## Profiled")


def test_markdown_renders_every_query_and_marks_targets() -> None:
    q = BY_NAME["carrier_count"]
    cells = {"dpcli careful": {q.name: {"value": 0.03, "draws": 1, "failed": 0}},
             "dpcli auto": {q.name: {"value": 0.05, "draws": 1, "failed": 0, "caps": [[1, 300]], "coverage": [9, 16]}}}
    doc = {"date": "d", "cells": cells, "versions": {"dpcli auto": "v"}, "notes": {}, "rows": {"flights": 1, "acs": 1}}
    text = report.markdown(doc)
    assert text.count("\n| ") >= 8 + 2  # a row per query, then the targets table
    assert "| flights per carrier | not run | 5.0% | 3.0% |" in text
    assert "| carrier_count: auto ≤ 1.25 × careful | **fail** |" in text  # 0.05 > 1.25 × 0.03
    assert "carrier_count 9/16" in text
