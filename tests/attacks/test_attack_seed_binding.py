"""Attacks on the seed (issue 29): the seed binds everything that shapes the output (threat model, rule 1).

A release's seed is an HMAC of its seed material, and a release whose seed was already charged is a
free replay with the same noise. So anything that changes the output without changing the seed
hands out correlated noise on different answers for free: subtracting two releases then gives
exact counts. Two ways did this before the fix:

1. **One file, two readings, one seed.** The material held each input's bytes (its SHA-256) but
   not how they were read. A file that is valid CSV *and* valid NDJSON, named ``k.csv`` once and
   ``k.jsonl`` once, lists other groups each time; the same goes for ``--delimiter``, the data file
   itself and standard input with ``--input-format`` (and ``.gz`` names are bound too).
2. **Same seed, other calibration.** A ``pure`` and a ``br`` ledger (one person can hold both:
   ``--analyst``) got the same seed for the same query, so their noise (Laplace scales 2 and 4)
   came from the same uniforms.

Each test here failed on the code before the fix; replays of exactly equal runs stay free.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from dptest import cli, history, runner

from dpcli.release import seeds as release
from dpcli.cli.app import app
from dpcli.core.prf import canonical_json
from dpcli.io import inputs

N = 60  # units per group in the polyglot data files


# ---- polyglots: one file, two readings ----------------------------------------------------------


def csv_and_ndjson(columns: Sequence[str], csv_rows: Sequence[Sequence[str]],
                   json_rows: Sequence[Sequence[str]]) -> bytes:
    """Bytes that are a CSV with ``columns`` and ``csv_rows``, and an NDJSON with ``json_rows``.

    Each line is a JSON object ``{"z":[0,"a","b",0], "c1":"x", "c2":"y"}``. Split on commas it is
    the CSV fields ``{"z":[0``, ``"a"``, ``"b"``, ``0]``, `` "c1":"x"``, …: the array holds the CSV
    values (the header line's array holds the column names), the object's keys the NDJSON ones. The
    header line is an NDJSON record too, so there is one more JSON row than CSV rows.
    """
    assert len(json_rows) == len(csv_rows) + 1

    def line(array: Sequence[str], record: Sequence[str]) -> str:
        items = ",".join(json.dumps(v) for v in array)
        fields = "".join(f", {json.dumps(c)}:{json.dumps(v)}" for c, v in zip(columns, record))
        return '{"z":[0,' + items + ",0]" + fields + "}\n"

    return "".join(line(a, r) for a, r in zip([columns, *csv_rows], json_rows)).encode()


def comma_and_semicolon(rows: int) -> bytes:
    """Bytes that are two CSVs: split on ``,`` every unit ``u…`` is in group G, split on ``;`` every
    unit ``v…`` is in group H (header ``user,g,x;g;user;y,z``)."""
    return ("user,g,x;g;user;y,z\n" + "".join(f"u{i},G,x;H;v{i};y,z\n" for i in range(rows))).encode()


def two_group_data() -> bytes:
    """Units ``u…`` in group G as CSV, units ``v…`` in group H as NDJSON."""
    return csv_and_ndjson(["user", "g"], [[f"u{i}", "G"] for i in range(N)],
                          [["v0", "X"], *([f"v{i}", "H"] for i in range(1, N + 1))])


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def hard_link(path: Path, name: str) -> Path:
    """A second name for ``path``'s bytes (the same inode)."""
    other = path.with_name(name)
    os.link(path, other)
    return other


# ---- running ------------------------------------------------------------------------------------


def init(mode: str = "pure", analyst: str = "default") -> None:
    """A ledger for ``analyst``: pure ε = 50, or br at ε_per = 0.5, or approx/zcdp with room to spare."""
    limits = {"pure": ["--epsilon", "50"], "approx": ["--epsilon", "50", "--delta", "1e-5"],
              "zcdp": ["--rho", "50", "--delta", "1e-5"],
              "br": ["--epsilon-per", "0.5", "--delta", "1e-10", "--info-budget", "3000", "--call-budget", "30",
                     "--delta-prime", "1e-9"]}[mode]
    r = cli("--analyst", analyst, "budget", "init", analyst, "--mode", mode, *limits)
    assert r.exit_code == 0, r.stderr


def summary(*args: Any, stdin: bytes | None = None, analyst: str = "default") -> dict[str, Any]:
    """Run ``dpcli --analyst ANALYST ARGS --json`` and return its summary (asserting success)."""
    r = runner.invoke(app, ["--analyst", analyst, *(str(a) for a in args), "--json"], input=stdin)
    assert r.exit_code == 0, (args, r.stdout, r.stderr)
    return json.loads(r.stdout)["summary"]


def histogram(data: Path | str, keys: Path, *extra: Any, analyst: str = "default",
              stdin: bytes | None = None) -> dict[str, Any]:
    return summary("histogram", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--epsilon", "0.5",
                   *extra, analyst=analyst, stdin=stdin)


def assert_two_releases(first: dict[str, Any], second: dict[str, Any]) -> None:
    """Two different inputs or calibrations: two seeds, and the second is charged too."""
    assert first["seed_id"] != second["seed_id"], "same seed (same noise) for two different releases"
    assert first["charged"] and second["charged"]


def assert_free_replay(first: dict[str, Any], second: dict[str, Any]) -> None:
    """Everything equal: the same seed, and the second run is free."""
    assert first["seed_id"] == second["seed_id"] and second["charged"] is False


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return write(tmp_path / "groups.csv", b"g\nG\nH\nX\n")


# ---- attack 1: one file, two readings, one seed ------------------------------------------------


@pytest.mark.parametrize("command", ["histogram", "topk"])
def test_a_group_list_read_as_csv_and_as_ndjson_is_two_lists(tmp_path, command):
    """``k.csv`` lists B1, B2; the same bytes as ``k.jsonl`` list A0, A1, A2: two releases, two charges."""
    init()
    data = write(tmp_path / "d.csv", ("user,g\n" + "".join(f"u{i},{'AB'[i % 2]}{i % 3}\n" for i in range(300)))
                 .encode())
    k_csv = write(tmp_path / "k.csv", csv_and_ndjson(["g"], [["B1"], ["B2"]], [["A0"], ["A1"], ["A2"]]))
    k_json = hard_link(k_csv, "k.jsonl")
    assert inputs.open_input(str(k_csv), text_columns=("g",)).frame.collect()["g"].to_list() == ["B1", "B2"]
    assert inputs.open_input(str(k_json), text_columns=("g",)).frame.collect()["g"].to_list() == ["A0", "A1", "A2"]

    def run(k: Path) -> dict[str, Any]:
        if command == "histogram":
            return histogram(data, k)
        return summary("topk", data, "--by", "g", "--privacy-unit", "user", "--keys", k, "-k", "1",
                       "--epsilon-per", "0.5")

    first = run(k_csv)
    assert_free_replay(first, run(k_csv))
    assert_two_releases(first, run(k_json))


def test_the_data_read_as_csv_and_as_ndjson_is_two_inputs(tmp_path, keys):
    init()
    d_csv = write(tmp_path / "d.csv", two_group_data())
    d_json = hard_link(d_csv, "d.jsonl")
    first = histogram(d_csv, keys)
    assert_free_replay(first, histogram(d_csv, keys))
    as_json = histogram(d_json, keys)
    assert_two_releases(first, as_json)
    # The name is not the reading: d.csv read as NDJSON is what d.jsonl was, a free replay of it.
    assert_free_replay(as_json, histogram(d_csv, keys, "--input-format", "ndjson"))


def test_standard_input_read_as_csv_and_as_ndjson_is_two_inputs(keys):
    init()
    data = two_group_data()
    first = histogram("-", keys, stdin=data)
    assert_free_replay(first, histogram("-", keys, "--input-format", "csv", stdin=data))
    assert_two_releases(first, histogram("-", keys, "--input-format", "ndjson", stdin=data))


def test_the_data_split_on_another_delimiter_is_another_input(tmp_path, keys):
    init()
    data = write(tmp_path / "d.csv", comma_and_semicolon(N))
    first = histogram(data, keys)
    assert_free_replay(first, histogram(data, keys, "--delimiter", ","))
    assert_two_releases(first, histogram(data, keys, "--delimiter", ";"))


def test_a_compressed_name_is_another_reading(tmp_path, keys):
    """``d.csv.gz`` is decompressed by dpcli; the same bytes as ``d.csv`` are given to the parser
    as they are. That is another reading, so another seed. (Here polars recognises the gzip bytes
    itself and reads the same rows: the second run is charged though a replay would have been
    harmless. Binding how bytes are read costs that; proving two readings equal is not attempted.)"""
    import gzip

    init()
    gz = write(tmp_path / "d.csv.gz", gzip.compress(("user,g\n" + "".join(f"u{i},G\n" for i in range(N))).encode(),
                                                    mtime=0))
    first = histogram(gz, keys)
    assert_free_replay(first, histogram(gz, keys))
    assert_two_releases(first, histogram(hard_link(gz, "d.csv"), keys))
    table = inputs.open_input(str(gz), text_columns=("user", "g"))
    assert table.reading == inputs.Reading("csv", ".gz", ",", ("user", "g"))


# ---- attack 2: same seed, other calibration -----------------------------------------------------


def test_a_pure_and_a_br_ledger_get_independent_noise(tmp_path, keys):
    """The same query on a pure ledger (Laplace scale 2) and a br ledger (scale 4, KnownLap) of one
    person: before, one seed, so the two noises came from the same uniforms."""
    init("pure", "p")
    init("br", "b")
    data = write(tmp_path / "d.csv", ("user,g\n" + "".join(f"u{i},G\n" for i in range(N))).encode())
    pure = histogram(data, keys, "--agg", "count-units", analyst="p")
    br = histogram(data, keys, "--agg", "count-units", analyst="b")
    assert_two_releases(pure, br)
    assert_free_replay(br, histogram(data, keys, "--agg", "count-units", analyst="b"))


@pytest.mark.parametrize("modes", [("pure", "approx"), ("approx", "zcdp"), ("pure", "br")])
def test_topk_under_two_accounting_modes_gets_two_seeds(tmp_path, keys, modes):
    """topk with the same ε_per on two ledgers of other modes: the seed binds the mode (and the plan)."""
    data = write(tmp_path / "d.csv", ("user,g\n" + "".join(f"u{i},{'GH'[i % 2]}\n" for i in range(N))).encode())
    out = []
    for mode in modes:
        init(mode, mode)
        out.append(summary("topk", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "-k", "1",
                           "--epsilon-per", "0.5", analyst=mode))
    assert_two_releases(*out)


# ---- state: a restored copy replays a recorded run only when it is read alike --------------------


def _ledger_files(state_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((state_dir / "ledgers").glob("*.*")) if p.suffix != ".lock"}


def _charged() -> list[dict[str, Any]]:
    return [e for e in history() if e["events"] and not e.get("replay_of")]


def test_a_restored_schedule_state_replays_a_run_only_under_the_same_delimiter(tmp_path, keys, state_dir):
    """A schedule's run digest binds the run's seed: a restored state that recomputes a recorded epoch
    from the same bytes split on another delimiter (other units, other groups) is refused."""
    init()
    # 1,000 → 40,000 units: past epoch 1's start by ~40 scales of the crossing test's noise (~700 units at
    # ε = 1, γ = 0.1: docs/commands/schedules.md), so the epoch starts whatever the key.
    small, big = write(tmp_path / "s1.csv", comma_and_semicolon(1000)), write(tmp_path / "s2.csv",
                                                                            comma_and_semicolon(40000))

    def run(path: Path, *extra: str) -> Any:
        return cli("histogram", path, "--by", "g", "--privacy-unit", "user", "--keys", keys, "--schedule", "daily",
                   "--total-epsilon", "1", "--gamma", "0.1", *extra, "--json")

    assert run(small).exit_code == 0
    (state,) = (state_dir / "schedules" / "default").glob("*.json")
    old = state.read_bytes()
    assert run(big).exit_code == 0  # epoch 1
    state.write_bytes(old)  # yesterday's backup
    before = _ledger_files(state_dir)
    refused = run(big, "--delimiter", ";")
    assert refused.exit_code == 78, (refused.stdout, refused.stderr)
    assert _ledger_files(state_dir) == before
    again = run(big)  # the recorded epoch 1, read as it was: the same release, free
    assert again.exit_code == 0, again.stderr
    assert len(_charged()) == 1


def _events(columns_csv: Sequence[Sequence[str]], columns_json: Sequence[Sequence[str]]) -> bytes:
    return csv_and_ndjson(["ts", "user", "page"], columns_csv, columns_json)


def test_a_restored_stream_state_replays_a_run_only_under_the_same_reading(tmp_path, state_dir):
    """A stream's run digest binds how its input was read: an older copy of the state that recomputes
    a recorded run from the same bytes read as NDJSON instead of CSV is refused (it would draw the
    run's noise over other events)."""
    init("approx")
    opts = ["--time", "ts", "--by", "page", "--privacy-unit", "user", "--window", "1d", "--trigger-every", "12h",
            "--max-contributions", "2", "--epsilon", "2", "--delta", "1e-9"]
    day1 = write(tmp_path / "d1.csv", _events([["2026-11-01T01:00:00", f"u{i}", "p1"] for i in range(N)],
                                              [["2026-11-01T01:00:00", f"v{i}", "p2"] for i in range(N + 1)]))
    day2 = write(tmp_path / "d2.csv", _events([["2026-11-02T01:00:00", f"u{i}", "p1"] for i in range(N)],
                                              [["2026-11-02T01:00:00", f"v{i}", "p2"] for i in range(N + 1)]))
    day2_json = hard_link(day2, "d2.jsonl")
    s = tmp_path / "s.state"

    def run(path: Path, through: str) -> Any:
        return cli("stream-replay", path, *opts, "--state", s, "--through", through, "--json")

    assert run(day1, "2026-11-02").exit_code == 0
    old = s.read_bytes()
    assert run(day2, "2026-11-03").exit_code == 0
    s.write_bytes(old)  # yesterday's backup
    before = _ledger_files(state_dir)
    refused = run(day2_json, "2026-11-03")
    assert refused.exit_code == 78, (refused.stdout, refused.stderr)
    assert _ledger_files(state_dir) == before
    again = run(day2, "2026-11-03")  # the recorded run, read as it was: the same rows, free
    assert again.exit_code == 0, again.stderr
    assert len(_charged()) == 1


# ---- every command's seed material: each input with its reading, and the calibration --------------


@pytest.fixture
def materials(monkeypatch) -> Iterator[list[dict[str, Any]]]:
    """Every seed material derived while the test runs, in order."""
    seen: list[dict[str, Any]] = []
    derive = release.derive_seed

    def recording(key: bytes, material: dict[str, Any]) -> bytes:
        seen.append(json.loads(canonical_json(material)))
        return derive(key, material)

    monkeypatch.setattr(release, "derive_seed", recording)
    yield seen


def _assert_bound(material: dict[str, Any], roles: set[str], mode: str) -> None:
    """``material`` binds each input in ``roles`` with its reading, and a calibration under ``mode``."""
    assert set(material["inputs"]) == roles, material["inputs"]
    for role, source in material["inputs"].items():
        assert source["fingerprint"].startswith("sha256:"), role
        assert "format" in source["reading"], role
    assert material["calibration"]["mode"] == mode
    assert material["calibration"]["plan"], material["calibration"]


SAMPLE = Path(__file__).resolve().parent.parent.parent / "sample_data"


def test_every_command_binds_each_input_with_its_reading_and_the_calibration(tmp_path, materials):
    init("approx")
    pv, pages = SAMPLE / "page_views.parquet", SAMPLE / "pages_public.csv"
    common = ["--privacy-unit", "user_id", "--json"]
    runs: list[tuple[list[Any], set[str]]] = [
        (["histogram", pv, "--by", "page", "--keys", pages, "--epsilon", "0.5", *common], {"data", "keys"}),
        (["histogram", pv, "--by", "country", "--epsilon", "0.5", "--delta", "1e-8", *common], {"data"}),
        (["topk", pv, "--by", "page", "-k", "3", "--keys", pages, "--epsilon-per", "0.1", *common], {"data", "domain"}),
        (["topk", pv, "--by", "page", "-k", "3", "--keys", pages, "--schedule", "w", "--scheduler", "fixed",
          "--epsilon", "0.3", "--total-epsilon", "1", *common], {"data", "domain"}),
        (["histogram", pv, "--by", "page", "--keys", pages, "--schedule", "d", "--total-epsilon", "1", *common],
         {"data", "keys"}),
        (["stream-replay", pv, "--time", "ts", "--by", "page", "--window", "1d", "--trigger-every", "12h",
          "--max-contributions", "2", "--epsilon", "2", "--delta", "1e-9", "--through", "2026-11-03", *common],
         {"data"}),
    ]
    for args, roles in runs:
        before = len(materials)
        r = cli(*args)
        assert r.exit_code == 0, (args, r.stderr)
        releases = [m for m in materials[before:] if m["query"].get("command") != "schedule-sizes"]
        sizes = [m for m in materials[before:] if m["query"].get("command") == "schedule-sizes"]
        assert len(releases) == 1, args
        _assert_bound(releases[0], roles, "pure" if "--schedule" in args and args[0] == "topk" else "approx")
        for size in sizes:  # bbscheduler's noisy size: the snapshot with its reading, and the schedule's spec
            assert set(size["inputs"]) == {"data"} and size["calibration"]["mode"] == "schedule"

    r = cli("tabulate", SAMPLE / "persons.parquet", "--spec", SAMPLE / "safetab_spec.toml", "--json")
    assert r.exit_code == 0, r.stderr
    tab = materials[-1]
    assert tab["inputs"]["spec"] == {"fingerprint": tab["inputs"]["spec"]["fingerprint"],
                                     "reading": {"format": "toml"}}
    assert tab["inputs"]["blocks"]["reading"]["format"] == "csv"
    assert tab["calibration"]["mode"] == "approx" and tab["calibration"]["plan"]["noise"] == "geometric"

    r = cli("stream-replay", pv, "--time", "ts", "--by", "page", "--window", "1d", "--trigger-every", "12h",
            "--max-contributions", "2", "--epsilon", "2", "--delta", "1e-9", "--through", "2026-11-03",
            "--state", tmp_path / "s.state", *common)
    assert r.exit_code == 0, r.stderr
    state_seed = materials[-1]
    assert state_seed["inputs"] == {}  # the stream's seed is made once; each run's input is bound by its digest
    assert state_seed["calibration"]["mode"] == "approx" and state_seed["calibration"]["plan"]["sigma2_count"]


def test_a_catalog_origin_enters_the_seed(tmp_path, state_dir):
    """An input opened by a catalog name carries its catalog entry: another entry over the same
    bytes is another input."""
    state_dir.mkdir(mode=0o700)
    path = write(tmp_path / "d.csv", b"user,g\nu1,G\n")
    plain = inputs.open_input(str(path))
    entry = {"dataset": "views", "location": str(path), "format": "csv", "delimiter": ",", "compression": "",
             "privacy_unit": "user"}
    named = inputs.InputTable(frame=plain.frame, fingerprint=plain.fingerprint, name="views", format="csv",
                             reading=plain.reading, origin=entry)
    assert named.seed_material() == {**plain.seed_material(), "origin": entry}
    calibration = release.Calibration("pure", {"scale": 1})

    def seed(table: inputs.InputTable) -> str:
        return release.release_seed(state_dir, {"q": 1}, {"data": table}, calibration).id

    assert seed(plain) == seed(plain) != seed(named)
    assert seed(named) != seed(inputs.InputTable(frame=plain.frame, fingerprint=plain.fingerprint, name="views",
                                                format="csv", reading=plain.reading,
                                                origin={**entry, "privacy_unit": "household"}))


def test_what_of_a_plan_stays_out_of_the_seed_is_listed():
    """The calibration is every field that takes part in a plan's equality, recursively; the fields
    that do not are listed here (a lazily filled cache, display text, an event's free-form detail),
    so a new one is left out of the seed only knowingly. A value of a kind the seed cannot hold fails."""
    import numpy as np

    from dpcli.core.events import PrivacyEvent
    from dpcli.core.mechanisms import Noise
    from dpcli.tasks.histogram import HistogramPlan, NoisyStatistic
    from dpcli.tasks.stream.plan import StreamPlan
    from dpcli.tasks.tabulate import TabulatePlan
    from dpcli.tasks.tabulate_spec import Level
    from dpcli.tasks.topk import TopKPlan

    classes = (HistogramPlan, NoisyStatistic, TopKPlan, StreamPlan, TabulatePlan, Level, Noise, PrivacyEvent)
    left_out = {c.__name__: [f.name for f in dataclasses.fields(c) if not f.compare] for c in classes}
    assert left_out == {"HistogramPlan": [], "NoisyStatistic": [], "TopKPlan": [],
                        "StreamPlan": ["thresholds", "summary"], "TabulatePlan": ["events"], "Level": [], "Noise": [],
                        "PrivacyEvent": ["detail"]}
    with pytest.raises(TypeError):
        release.plan_material({"scales": np.array([1.0])})
