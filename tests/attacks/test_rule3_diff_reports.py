"""Rule 3 for ``dpcli diff`` and ``dpcli budget plan`` (issue 42): what they print is a function of released
values, public options and ledger balances only.

Two datasets D and D′ differ in one person, alone in a group that sorts last and whose noisy count of units
stays far below the threshold (so it is never released). Under one forced seed (report_diff.forced_seed: the
seed ignores the key and the data) both give byte-identical releases; then every byte diff prints about the two
releases, and every byte of the plan of one more release, must be identical for D and D′: diff reads the
releases, their reports in the ledger (noise scales and bounds) and nothing of the data.
"""

from __future__ import annotations

from report_diff import APPROX, report_diff, run_cli


def _data(extra: bool) -> str:
    rows = "".join(f"u{i},{'abcdefghij'[i % 10]},{i % 7}\n" for i in range(4000))
    return "user,g,v\n" + rows + ("ghost,zzz,3\n" if extra else "")


def test_diff_and_budget_plan_text_is_the_same_for_neighbouring_data_at_the_same_releases(tmp_path):
    data, old, new = tmp_path / "d.csv", tmp_path / "old.csv", tmp_path / "new.csv"
    query = ["histogram", data, "--by", "g", "--privacy-unit", "user", "--agg", "count,sum,mean", "--value", "v",
             "--bounds", "0:10", "--max-contributions", "1", "--max-partitions", "1", "--delta", "1e-7"]
    diffs, plans, released, ledgers = [], [], [], []
    for label, extra in (("D", False), ("D-prime", True)):
        data.write_text(_data(extra))
        state = tmp_path / f"state-{label}"
        first = run_cli([*query, "--epsilon", "0.5", "-o", old, "--json"], state, setup=[APPROX])
        second = run_cli([*query, "--epsilon", "0.7", "-o", new, "--json"], state)
        assert first.exit_code == second.exit_code == 0, (first.stderr, second.stderr)
        released.append((old.read_bytes(), new.read_bytes()))
        ledgers.append(second.ledger)
        diffs.append([run_cli(["diff", old, new, *args], state) for args in
                      (["--json"], [], ["--at-least", "50", "--fdr", "0.2"])])
        plans.append(run_cli(["budget", "plan", "--runs", "3", "--", *query, "--epsilon", "0.5"], state))
    assert released[0] == released[1]  # the precondition: the ghost's group was not released in either
    # what diff reads does differ: the reports the ledger keeps hold the bias report's noisy unit count
    biases = [[e.get("report", {}).get("bias") for e in entries] for entries in ledgers]
    assert biases[0] != biases[1]
    for a, b in zip(*diffs, strict=True):
        assert a.exit_code == b.exit_code == 0, (a.stderr, b.stderr)
        assert a.stdout == b.stdout and a.stderr == b.stderr
    assert plans[0].exit_code == 0 and plans[0].stdout == plans[1].stdout and plans[0].stderr == plans[1].stderr
    assert report_diff(*plans) == []
