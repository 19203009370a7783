"""Rule 3, reports hold no exact statistics: histogram, topk and tabulate summaries on D and D′.

Attack (issue 15, finding 3): summaries must not carry exact statistics of the data. D and D′ = D plus
one privacy unit alone in a new group (named to sort last, so the noise draws of the other groups stay
aligned) are released under the same forced seed (``report_diff.differential``). Exit code, stderr,
every ``--json`` summary field and the ledger entries must be identical; only noisy released values
(and fields computed from them alone) may differ. Before the fix, histogram's ``groups_seen`` (true
groups before thresholding), topk's ``h_bottom`` (h_(k̄+1) plus a public constant) and tabulate's
``truncated_records`` told D from D′ exactly.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from dptest import ledger_argv
from report_diff import APPROX, PURE, csv_text, differential
from tabulate_specs import write_spec


def _units(groups: dict[str, int], prefix: str = "u") -> pl.DataFrame:
    users = [f"{prefix}{g}{i}" for g, n in groups.items() for i in range(n)]
    return pl.DataFrame({"user": users, "g": [g for g, n in groups.items() for _ in range(n)]})


BASE = _units({"a": 300, "b": 200, "c": 120})
NEW = pl.DataFrame({"user": ["newcomer"], "g": ["zzz"]})  # one unit, alone in a group that sorts last
D, D2 = csv_text(BASE), csv_text(pl.concat([BASE, NEW]))


def _assert_same(diff: list[str]) -> None:
    assert diff == [], "D and D′ are told apart by:\n" + "\n".join(diff)


def test_histogram_threshold_summary_reveals_nothing(tmp_path):
    data = tmp_path / "events.csv"
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6", "--json"]
    a, b, diff = differential(args, data, D, D2, tmp_path, setup=[APPROX])
    assert a.exit_code == 0, a.stderr
    _assert_same(diff)


def test_histogram_keys_summary_reveals_nothing(tmp_path):
    data, keys = tmp_path / "events.csv", tmp_path / "keys.csv"
    keys.write_text("g\na\nb\nc\nzzz\n")
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--epsilon", "1", "--keys", keys, "--json"]
    a, b, diff = differential(args, data, D, D2, tmp_path, setup=[PURE])
    assert a.exit_code == 0, a.stderr
    _assert_same(diff)


def test_histogram_unklap_summary_reveals_nothing(tmp_path):
    """UnkLap's v_⊥ (summary ``bottom``) is a noisy threshold, part of Alg. 3's output: it may differ."""
    data = tmp_path / "events.csv"
    br = ledger_argv("br", "--epsilon-per", "0.5", "--delta", "1e-9", "--info-budget", "100", "--call-budget", "5",
                     "--delta-prime", "1e-9")
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--selection", "unklap", "--max-groups", "3",
            "--json"]
    a, b, diff = differential(args, data, D, D2, tmp_path, setup=[br], noisy={"json.summary.bottom"})
    assert a.exit_code == 0, a.stderr
    _assert_same(diff)


def test_topk_known_domain_summary_reveals_nothing(tmp_path):
    data, dom = tmp_path / "events.csv", tmp_path / "dom.csv"
    dom.write_text("g\na\nb\nc\nzzz\n")
    args = ["topk", data, "--by", "g", "-k", "2", "--privacy-unit", "user", "--keys", dom,
            "--epsilon-per", "0.5", "--json"]
    a, b, diff = differential(args, data, D, D2, tmp_path, setup=[APPROX])
    assert a.exit_code == 0, a.stderr
    _assert_same(diff)


def test_topk_unknown_domain_summary_reveals_nothing(tmp_path):
    """d̄ = 3: h = (300, 200, 120, 0) on D and (300, 200, 120, 1) on D′. k̄ is an exponential-mechanism
    output (paid by the '+1' of Theorem 1) and may be released; h_⊥ = h_(k̄+1) + constant may not."""
    data = tmp_path / "events.csv"
    args = ["topk", data, "--by", "g", "-k", "2", "--privacy-unit", "user", "--max-groups", "3",
            "--epsilon-per", "0.5", "--delta", "1e-6", "--json"]
    noisy = {"json.summary.k_bar", "json.summary.found", "json.summary.bottom", "json.summary.br_units"}
    a, b, diff = differential(args, data, D, D2, tmp_path, setup=[APPROX], noisy=noisy)
    assert a.exit_code == 0, a.stderr
    _assert_same(diff)


def _persons(rows: list[tuple[str, str, int, str, int]]) -> str:
    return "block,race,eth,sex,age\n" + "".join(f"{b},{r},{e},{s},{a}\n" for b, r, e, s, a in rows)


def test_tabulate_summary_reveals_nothing(tmp_path: Path):
    """The newcomer is alone in state 02 (sorts last) and in two iterations (WC, B) at stability 1:
    truncated to one. The truncation must not be counted anywhere public."""
    levels = "\n".join(f'[[levels]]\ngeography = "{g}"\niterations = "reg"\nepsilon = 2\nstability = 1\n'
                       'on_unstable = "truncate"\n' for g in ("nation", "state"))
    spec = write_spec(tmp_path, levels)
    base = [("01001", "1000", 1, "1", 30)] * 150 + [("01002", "2000", 1, "2", 50)] * 150
    data = tmp_path / "persons.csv"
    args = ["tabulate", data, "--spec", spec, "--json"]
    noisy = {"json.summary.levels.*.branches", "json.summary.rows"}
    a, b, diff = differential(args, data, _persons(base), _persons(base + [("02001", "1000;2000", 1, "1", 40)]),
                              tmp_path, setup=[PURE], noisy=noisy)
    assert a.exit_code == 0, a.stderr
    _assert_same(diff)


@pytest.mark.parametrize("command", ["histogram", "topk"])
def test_dry_run_reads_no_data(tmp_path, command):
    """--dry-run prints calibration and cost only: the same for any data (even a missing file)."""
    data = tmp_path / "events.csv"
    extra = ["--epsilon", "1", "--delta", "1e-6"] if command == "histogram" else \
        ["-k", "2", "--epsilon-per", "0.5", "--delta", "1e-6"]
    args = [command, data, "--by", "g", "--privacy-unit", "user", *extra, "--dry-run"]
    a, b, diff = differential(args, data, D, D2, tmp_path, setup=[APPROX])
    assert a.exit_code == 0, a.stderr
    _assert_same(diff)


def test_histogram_auto_bounds_and_bias_report_reveal_nothing(tmp_path):
    """Bounds chosen from the data and the bias report (issue 33): the chosen bounds and the bias counts are noisy
    released values; the parts, their costs, the dry-run-like fields, messages and the ledger must not move."""
    values = pl.DataFrame({"v": [float(i % 37) for i in range(BASE.height)] + [3.0]})
    d = csv_text(pl.concat([BASE, NEW]).hstack(values))
    d_without = csv_text(BASE.hstack(values.head(BASE.height)))
    data = tmp_path / "events.csv"
    args = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--agg", "count,sum", "--value", "v",
            "--max-partitions", "auto", "--max-contributions", "auto", "--bounds", "auto", "--report-bias",
            "--epsilon", "1", "--delta", "1e-6", "--json"]
    noisy = {"json.summary.auto.*", "json.summary.max_*", "json.summary.groups", "json.summary.margins*",
             "json.summary.threshold"}
    a, b, diff = differential(args, data, d_without, d, tmp_path, setup=[APPROX], noisy=noisy)
    assert a.exit_code == 0, a.stderr
    _assert_same([line for line in diff if not line.startswith("stderr:")])
    # the bias report's note carries its noisy shares, units and margin, and the bounds chosen: equal once masked
    masked = [re.sub(r"-?\d[\d,.e+]*", "N", r.stderr) for r in (a, b)]
    assert masked[0] == masked[1] and "bounds cut (noisy average shares" in masked[0]


def test_histogram_bias_variance_internal_sizes_are_never_printed(tmp_path, state_dir):
    """The bias–variance rule's noisy sizes (groups, units, pairs, rows) steer the choice and are never released:
    given unmistakable values, none may appear in stdout, stderr, the output file or any state file."""
    from unittest import mock

    from dptest import cli, init_ledger

    from dpcli.tasks import auto_bounds
    from dpcli.tasks.auto_bounds import choose

    data, out = tmp_path / "d.csv", tmp_path / "out.csv"
    data.write_text(csv_text(BASE.with_columns(v=pl.lit(2.5))))
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    groups, sizes = 7_654_321, 8_765_432
    calls: list[str] = []

    def noisy_groups(*args, **kwargs):
        calls.append("groups")
        return groups

    def noisy_count(*args, **kwargs):
        calls.append("size")
        return sizes

    def one_row_each(*args, **kwargs):  # its noisy count is compared inside, never returned: "no", so C is walked
        calls.append("check")
        return False

    with mock.patch.object(auto_bounds, "noisy_groups", noisy_groups), \
            mock.patch.object(choose, "_noisy_count", noisy_count), \
            mock.patch.object(choose, "one_row_each", one_row_each):
        r = cli("histogram", data, "--by", "g", "--privacy-unit", "user", "--agg", "count,sum", "--value", "v",
                "--max-partitions", "auto", "--max-contributions", "auto", "--bounds", "auto", "--epsilon", "1",
                "--delta", "1e-6", "--json", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert calls == ["groups", "check", "size", "size", "size"]  # the one-row check; units, pairs, rows
    texts = [r.stdout, r.stderr, out.read_text()] + [p.read_bytes().decode("utf-8", "replace")
                                                    for p in state_dir.rglob("*") if p.is_file()]
    for secret in (groups, sizes):
        assert not any(str(secret) in t for t in texts), secret
