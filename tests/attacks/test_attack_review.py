"""Review attacks (issue 15): paths around the threat model the other attack files do not cover.

Each test runs one release on two datasets of the same header (the same public "schema" for an
analyst who only names columns) that differ in one record, and requires the public outcome (exit
code, stderr) not to depend on that record beyond the noise; or checks that no private text reaches
stderr. The CSV/NDJSON readers infer column types from the records themselves, so for those formats
"the schema" is data unless the reader pins the types.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpcli.cli.app import app

runner = CliRunner()
SECRET = "SECRET4711"


def init(mode: list[str] | None = None) -> None:
    r = runner.invoke(app, ["budget", "init", "default", *(mode or ["--mode", "pure", "--epsilon", "50"])])
    assert r.exit_code == 0, r.stderr


def csv_rows(n: int) -> list[str]:
    return ["uid,g,v"] + [f"{i},{i % 3},{i % 7}" for i in range(n)]


def write(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n")
    return path


def histogram_sum(tmp_path: Path, data: Path, fmt: list[str] | None = None):
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n0\n1\n2\n")
    return runner.invoke(app, ["histogram", str(data), *(fmt or []), "--by", "g", "--privacy-unit", "uid",
                               "--agg", "sum", "--value", "v", "--bounds", "0:10", "--epsilon", "1",
                               "--keys", str(keys)])


# ---- CSV schema inference: one record decides a column's type ------------------------------------


def test_csv_parse_errors_never_quote_a_record(tmp_path):
    """A value past the inference window that does not parse as the inferred type made polars fail with
    the value in its message (``could not parse `SECRET4711` as dtype i64``): private text on stderr."""
    init()
    rows = csv_rows(10_050)
    rows[10_020] = f"10019,1,{SECRET}"
    r = histogram_sum(tmp_path, write(tmp_path / "b.csv", rows))
    assert SECRET not in r.stderr and SECRET not in r.stdout


def test_csv_unterminated_quote_is_not_quoted_back(tmp_path):
    """A malformed quoted field made polars echo the rest of the file (other records) on stderr."""
    init()
    rows = csv_rows(300)
    rows[200] = f'199,"1,{SECRET}'
    r = histogram_sum(tmp_path, write(tmp_path / "q.csv", rows))
    assert SECRET not in r.stderr and "199" not in r.stderr


def test_csv_late_unparsable_value_does_not_fail_the_run(tmp_path):
    init()
    rows = csv_rows(10_050)
    clean = histogram_sum(tmp_path, write(tmp_path / "a.csv", rows))
    rows[10_020] = f"10019,1,{SECRET}"
    dirty = histogram_sum(tmp_path, write(tmp_path / "b.csv", rows))
    assert clean.exit_code == 0, clean.stderr
    assert dirty.exit_code == clean.exit_code, dirty.stderr


def test_csv_one_text_value_does_not_change_the_value_columns_type(tmp_path):
    init()
    rows = csv_rows(300)
    clean = histogram_sum(tmp_path, write(tmp_path / "a.csv", rows))
    rows[5] = "4,1,n/a"
    dirty = histogram_sum(tmp_path, write(tmp_path / "c.csv", rows))
    assert clean.exit_code == 0, clean.stderr
    assert dirty.exit_code == clean.exit_code, dirty.stderr


def test_csv_one_record_does_not_change_the_released_group_types(tmp_path):
    init()
    keys = tmp_path / "keys.csv"
    keys.write_text("g\n0\n1\n2\n")
    outs = []
    for name, odd in (("a.csv", None), ("d.csv", "4,x,3")):
        rows = csv_rows(300)
        if odd:
            rows[5] = odd
        data = write(tmp_path / name, rows)
        r = runner.invoke(app, ["histogram", str(data), "--by", "g", "--privacy-unit", "uid", "--epsilon", "1",
                                "--keys", str(keys), "--json"])
        assert r.exit_code == 0, r.stderr
        outs.append([type(row["g"]) for row in json.loads(r.stdout)["result"]])
    assert outs[0] == outs[1]


def test_csv_invalid_utf8_in_one_record_does_not_fail_the_run(tmp_path):
    """One byte that is not UTF-8 in one record's field failed the whole run ('invalid utf-8 sequence')."""
    init()
    rows = csv_rows(300)
    raw = ("\n".join(rows) + "\n").encode().replace(b"\n200,", b"\n200\xff,", 1)
    data = tmp_path / "u.csv"
    data.write_bytes(raw)
    r = runner.invoke(app, ["topk", str(data), "--by", "g", "--privacy-unit", "uid", "-k", "1",
                            "--epsilon-per", "1", "--keys", str(write(tmp_path / "dom.csv", ["g", "0", "1", "2"]))])
    assert r.exit_code == 0, r.stderr


def test_csv_one_ragged_record_does_not_fail_the_run(tmp_path):
    """A record with one field too many failed the run ('found more fields than defined in Schema')."""
    init()
    rows = csv_rows(300)
    rows[200] = "199,1,3,extra"
    r = histogram_sum(tmp_path, write(tmp_path / "e.csv", rows))
    assert r.exit_code == 0, r.stderr


# ---- NDJSON schema inference ----------------------------------------------------------------------


def test_ndjson_one_late_record_of_another_type_does_not_fail_the_run(tmp_path):
    init()
    recs = [{"uid": i, "g": i % 3, "v": i % 7} for i in range(300)]
    data = tmp_path / "a.ndjson"
    data.write_text("\n".join(json.dumps(x) for x in recs) + "\n")
    clean = histogram_sum(tmp_path, data)
    recs[200] = {"uid": 200, "g": 1, "v": SECRET}
    data = tmp_path / "b.ndjson"
    data.write_text("\n".join(json.dumps(x) for x in recs) + "\n")
    dirty = histogram_sum(tmp_path, data)
    assert SECRET not in dirty.stderr
    assert clean.exit_code == 0, clean.stderr
    assert dirty.exit_code == clean.exit_code, dirty.stderr


# ---- Ledger: a rolled-back ledger accepted by --reseal ----------------------------------------------


def _spend_then_restore(tmp_path, state_dir, with_mark: bool) -> None:
    """Back up the ledger (and its mark if ``with_mark``), spend ε = 5, restore the backup."""
    init()
    ledger_file = state_dir / "ledgers" / "default.json"
    mark = ledger_file.with_suffix(".hwm")
    backup = ledger_file.read_bytes(), mark.read_bytes()
    rows = csv_rows(50)
    r = runner.invoke(app, ["histogram", str(write(tmp_path / "a.csv", rows)), "--by", "g", "--privacy-unit", "uid",
                            "--epsilon", "5", "--keys", str(write(tmp_path / "k.csv", ["g", "0", "1", "2"]))])
    assert r.exit_code == 0, r.stderr
    time.sleep(0.02)
    ledger_file.write_bytes(backup[0])  # the operator restores last night's backup of the state dir
    if with_mark:
        mark.write_bytes(backup[1])


def test_reseal_refuses_a_ledger_its_mark_shows_is_missing_entries(tmp_path, state_dir):
    """The ledger alone restored: the newer sealed mark proves entries are missing, so the message does
    not offer a reseal and a reseal is refused (it would hand back ε = 5)."""
    _spend_then_restore(tmp_path, state_dir, with_mark=False)
    r = runner.invoke(app, ["budget", "show", "default"])
    assert r.exit_code == 78 and "restore the newest copy" in r.stderr and "accept it with" not in r.stderr
    r = runner.invoke(app, ["budget", "verify", "default", "--reseal"])
    assert r.exit_code == 78, r.stderr
    assert runner.invoke(app, ["budget", "show", "default"]).exit_code == 78  # still refused, nothing refunded


def test_a_ledger_restored_with_its_mark_is_refused_and_the_message_warns_against_resealing(tmp_path, state_dir):
    """Ledger and mark restored together: only the file's new ctime tells. dpcli refuses it, and the
    message says a restored backup must not be resealed (that would hand back the budget spent since;
    an operator who holds key and state and reseals anyway cannot be stopped: README, "Not covered")."""
    _spend_then_restore(tmp_path, state_dir, with_mark=True)
    r = runner.invoke(app, ["budget", "show", "default"])
    assert r.exit_code == 78 and "restored backup, restore the newest copy instead" in r.stderr


# ---- Extreme public option values: usage errors, never internal errors (rule 7) ------------------


EXTREME = {
    "delta_underflows": (["histogram", "{data}", "--by", "g", "--privacy-unit", "uid", "--epsilon", "1",
                          "--delta", "1e-400"], None),
    "huge_max_groups": (["histogram", "{data}", "--by", "g", "--privacy-unit", "uid", "--epsilon", "1",
                         "--selection", "unklap", "--max-groups", "99999999999999999999999", "--delta", "1e-6"], None),
    "quantile_digits": (["histogram", "{data}", "--by", "g", "--privacy-unit", "uid", "--agg", "p99.99999999999999999",
                         "--value", "v", "--bounds", "0:10", "--epsilon", "1", "--keys", "{keys}"],
                        None),
    "huge_k": (["topk", "{data}", "--by", "g", "--privacy-unit", "uid", "-k", "99999999999999999999",
                "--epsilon-per", "1", "--delta", "1e-6"], None),
    "compose_overflow": (["budget", "compose", "--mode", "zcdp", "--rho", "1e300", "--delta", "1e-300"], None),
}


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=[pytest.mark.xfail(strict=True, reason=why)] if why else [])
    for name, (_, why) in EXTREME.items()
])
def test_extreme_public_options_are_usage_errors(tmp_path, case):
    init(["--mode", "approx", "--epsilon", "50", "--delta", "0.1"])
    data = write(tmp_path / "a.csv", csv_rows(50))
    keys = write(tmp_path / "k.csv", ["g", "0", "1", "2"])
    argv = [a.format(data=data, keys=keys) for a in EXTREME[case][0]]
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, r.stderr
    assert "internal error" not in r.stderr
