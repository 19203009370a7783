"""Rule 4 for tabulate: a bad person record changes nothing public.

Attack (issue 15, finding 4): tabulate's errors must not be an oracle on private records. The analyst
writes the spec and the block list, so a refusal that depends on the records ("N record(s) map to more
than stability", "N record(s) have a block id missing from the public block list", "N null or
unparsable value(s)", bad sex codes, negative ages, "has no records") counts any predicate for free —
and even fail-or-not leaks a bit. D with no bad record and D′ with one must give the same exit code,
the same stderr (with -v: the summary line) and the same ledger entries.
"""

from __future__ import annotations

import pytest
from report_diff import PURE, differential
from tabulate_specs import write_spec

#: Two levels at stability 1 (no on_unstable: the default must be safe too).
LEVELS = "\n".join(f'[[levels]]\ngeography = "{g}"\niterations = "reg"\nepsilon = 2\nstability = 1\n'
                   for g in ("nation", "area"))

#: Single-iteration persons only (race 2000, not Hispanic: iteration B alone).
GOOD = "".join(f"0100{1 + i % 2},2000,1,{1 + i % 2},{20 + i % 50}\n" for i in range(200))
HEADER = "block,race,eth,sex,age\n"
BAD = {
    "over stability": "01001,1000;2000,1,1,30\n",  # W-in-combination and B: two groups at stability 1
    "unknown block": "09999,2000,1,1,30\n",
    "null age": "01001,2000,1,1,\n",
    "unparsable age": "01001,2000,1,1,thirty\n",
    "fractional age": "01001,2000,1,1,30.5\n",
    "null block": ",2000,1,1,30\n",
    "unparsable race": "01001,abc,1,1,30\n",
    "partly unparsable race": "01001,2000;x,1,1,30\n",
    "empty race": "01001,,1,1,30\n",
    "unparsable ethnicity": "01001,2000,yes,1,30\n",
    "bad sex code": "01001,2000,1,9,30\n",
    "negative age": "01001,2000,1,1,-5\n",
}


@pytest.mark.parametrize("case", list(BAD))
def test_one_bad_record_changes_nothing_public(tmp_path, case):
    spec = write_spec(tmp_path, LEVELS)
    data = tmp_path / "persons.csv"
    args = ["-v", "tabulate", data, "--spec", spec]
    a, b, diff = differential(args, data, HEADER + GOOD, HEADER + GOOD + BAD[case], tmp_path, setup=[PURE])
    assert a.exit_code == 0, a.stderr
    assert diff == [], "\n".join(diff)
    if case != "over stability":  # dropped inside the tabulation: the very same release
        assert a.stdout == b.stdout


def test_empty_data_is_released_like_any_other(tmp_path):
    """No records at all vs one record: both released (every cell gets noise), same report."""
    spec = write_spec(tmp_path, LEVELS)
    data = tmp_path / "persons.csv"
    args = ["-v", "tabulate", data, "--spec", spec]
    a, b, diff = differential(args, data, HEADER, HEADER + "01001,2000,1,1,30\n", tmp_path, setup=[PURE])
    assert a.exit_code == 0, a.stderr
    assert diff == [], "\n".join(diff)
    assert a.stdout.startswith("level,geo_id,iteration,sex,age,count\n") and len(a.stdout.splitlines()) > 1


def test_bad_record_in_the_first_rows_changes_nothing_public(tmp_path):
    """Bad values at the top of a CSV are where type inference looks: still no difference."""
    spec = write_spec(tmp_path, LEVELS)
    data = tmp_path / "persons.csv"
    args = ["-v", "tabulate", data, "--spec", spec]
    bad = "01001,x,y,9,old\n"
    a, b, diff = differential(args, data, HEADER + GOOD, HEADER + bad + GOOD, tmp_path, setup=[PURE])
    assert a.exit_code == 0, a.stderr
    assert diff == [], "\n".join(diff)
