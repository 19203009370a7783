"""Rule 1, the seed binds everything that shapes the output: each input with how it was read, and the calibration.

Attacks on the seed (issue 29). A release's seed is an HMAC of its seed material, and a release whose
seed was already charged is a free replay with the same noise. So anything that changes the output
without changing the seed hands out correlated noise on different answers for free: subtracting two
releases then gives exact counts. Two ways did this before the fix:

1. **One file, two readings, one seed.** The material held each input's bytes (its SHA-256) but
   not how they were read. A file that is valid CSV *and* valid NDJSON, named ``k.csv`` once and
   ``k.jsonl`` once, lists other groups each time; the same goes for ``--delimiter``, the data file
   itself and standard input with ``--input-format`` (and ``.gz`` names are bound too).
2. **Same seed, other calibration.** A ``pure`` and a ``br`` ledger (one person can hold both:
   ``--analyst``) got the same seed for the same query, so their noise (Laplace scales 2 and 4)
   came from the same uniforms.

A catalog name is part of an input's reading too (issue 29's service-mode review): two names for one
file, or one name whose entry was edited, are two releases. Each test here failed on the code before
the fix; replays of exactly equal runs stay free. (A restored stream or schedule state that recomputes
a recorded run from the same bytes read another way is rule 2's: ``test_rule2_state_bound_to_ledger.py``.)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dptest import PERSONS_SMALL, PV_SMALL, cli, init_ledger, runner
from polyglots import N, comma_and_semicolon, csv_and_ndjson, hard_link, write
from service_checks import QUERY

from dpcli.cli.app import app
from dpcli.core.prf import canonical_json
from dpcli.io import inputs
from dpcli.io import tables
from dpcli.release import seeds as release


def two_group_data() -> bytes:
    """Units ``u…`` in group G as CSV, units ``v…`` in group H as NDJSON."""
    return csv_and_ndjson(["user", "g"], [[f"u{i}", "G"] for i in range(N)],
                          [["v0", "X"], *([f"v{i}", "H"] for i in range(1, N + 1))])


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


# ---- attack 1: one file, two readings, one seed ------------------------------------------------


@pytest.mark.parametrize("command", ["histogram", "topk"])
def test_a_group_list_read_as_csv_and_as_ndjson_is_two_lists(tmp_path, command):
    """``k.csv`` lists B1, B2; the same bytes as ``k.jsonl`` list A0, A1, A2: two releases, two charges."""
    init_ledger()
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
    init_ledger()
    d_csv = write(tmp_path / "d.csv", two_group_data())
    d_json = hard_link(d_csv, "d.jsonl")
    first = histogram(d_csv, keys)
    assert_free_replay(first, histogram(d_csv, keys))
    as_json = histogram(d_json, keys)
    assert_two_releases(first, as_json)
    # The name is not the reading: d.csv read as NDJSON is what d.jsonl was, a free replay of it.
    assert_free_replay(as_json, histogram(d_csv, keys, "--input-format", "ndjson"))


def test_standard_input_read_as_csv_and_as_ndjson_is_two_inputs(keys):
    init_ledger()
    data = two_group_data()
    first = histogram("-", keys, stdin=data)
    assert_free_replay(first, histogram("-", keys, "--input-format", "csv", stdin=data))
    assert_two_releases(first, histogram("-", keys, "--input-format", "ndjson", stdin=data))


def test_the_data_split_on_another_delimiter_is_another_input(tmp_path, keys):
    init_ledger()
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

    init_ledger()
    gz = write(tmp_path / "d.csv.gz", gzip.compress(("user,g\n" + "".join(f"u{i},G\n" for i in range(N))).encode(),
                                                    mtime=0))
    first = histogram(gz, keys)
    assert_free_replay(first, histogram(gz, keys))
    assert_two_releases(first, histogram(hard_link(gz, "d.csv"), keys))
    table = inputs.open_input(str(gz), text_columns=("user", "g"))
    assert table.reading == tables.Reading("csv", ".gz", ",", ("user", "g"))


# ---- attack 2: same seed, other calibration -----------------------------------------------------


def test_a_pure_and_a_br_ledger_get_independent_noise(tmp_path, keys):
    """The same query on a pure ledger (Laplace scale 2) and a br ledger (scale 4, KnownLap) of one
    person: before, one seed, so the two noises came from the same uniforms."""
    init_ledger("pure", analyst="p")
    init_ledger("br", analyst="b")
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
        init_ledger(mode, analyst=mode)
        out.append(summary("topk", data, "--by", "g", "--privacy-unit", "user", "--keys", keys, "-k", "1",
                           "--epsilon-per", "0.5", analyst=mode))
    assert_two_releases(*out)


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
    init_ledger("approx")
    pv, pages = PV_SMALL, SAMPLE / "pages_public.csv"  # (what is bound does not depend on the data's size)
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

    r = cli("tabulate", PERSONS_SMALL, "--spec", SAMPLE / "safetab_spec.toml", "--json")
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
    named = tables.InputTable(frame=plain.frame, fingerprint=plain.fingerprint, name="views", format="csv",
                             reading=plain.reading, origin=entry)
    assert named.seed_material() == {**plain.seed_material(), "origin": entry}
    calibration = release.Calibration("pure", {"scale": 1})

    def seed(table: tables.InputTable) -> str:
        return release.release_seed(state_dir, {"q": 1}, {"data": table}, calibration).id

    assert seed(plain) == seed(plain) != seed(named)
    assert seed(named) != seed(tables.InputTable(frame=plain.frame, fingerprint=plain.fingerprint, name="views",
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
    from dpcli.tasks.tabulate.query import Level
    from dpcli.tasks.topk import TopKPlan

    classes = (HistogramPlan, NoisyStatistic, TopKPlan, StreamPlan, TabulatePlan, Level, Noise, PrivacyEvent)
    left_out = {c.__name__: [f.name for f in dataclasses.fields(c) if not f.compare] for c in classes}
    # HistogramPlan's parts and ledger (mode, limits) re-plan a release at bounds chosen from the data: the
    # query's canonical form binds the parts (auto, shares), the calibration the mode, and parts refuse br
    # ledgers, the only mode whose limits calibrate (test_histogram_auto.py::test_the_seed_binds_the_parts).
    assert left_out == {"HistogramPlan": ["parts", "ledger"], "NoisyStatistic": [], "TopKPlan": [],
                        "StreamPlan": ["thresholds", "summary"], "TabulatePlan": ["events"], "Level": [], "Noise": [],
                        "PrivacyEvent": ["detail"]}
    with pytest.raises(TypeError):
        release.plan_material({"scales": np.array([1.0])})


# ---- catalog names: each entry is its own reading ------------------------------------------------


def test_two_catalog_names_for_one_file_are_two_releases(svc):
    """The seed binds the catalog entry: another name (or an edited entry) is never a free replay."""
    svc.catalog_toml = svc.catalog_toml.replace(
        "[public.pages]", f'[datasets.visits2]\nlocation = "{svc.data / "visits.csv"}"\nprivacy_unit = "user"\n'
        'analysts = ["*"]\n[public.pages]')
    svc.setup(ledgers=False)
    query = ["--by", "page", "--epsilon", "1", "--delta", "1e-6", "--json"]
    first = json.loads(svc.run("alice", "histogram", "visits", *query).stdout)["summary"]
    again = json.loads(svc.run("alice", "histogram", "visits", *query).stdout)["summary"]
    other = json.loads(svc.run("alice", "histogram", "visits2", *query).stdout)["summary"]
    assert first["charged"] and not again["charged"] and other["charged"]
    assert other["seed_id"] != first["seed_id"]


def test_resists_free_replays_across_catalog_names_and_entry_edits(svc):
    svc.catalog_toml += (f'[datasets.visits2]\nlocation = "{svc.data / "visits.csv"}"\nprivacy_unit = "user"\n'
                         'analysts = ["*"]\n')
    svc.setup(ledgers=False)
    first = svc.run("alice", *QUERY)
    assert svc.run("alice", *QUERY).stdout == first.stdout  # the same name: a free replay
    other = svc.run("alice", "histogram", "visits2", *QUERY[2:])
    svc.catalog_toml = svc.catalog_toml.replace('privacy_unit = "user"', 'privacy_unit = "secret"', 1)
    svc.setup(ledgers=False)
    edited = svc.run("alice", *QUERY)
    assert other.exit_code == edited.exit_code == 0
    history = json.loads(svc.run("alice", "budget", "history", "--json").stdout)
    assert [bool(e["replay_of"]) for e in history] == [False, True, False, False]


def test_the_rule_that_chooses_histogram_bounds_is_in_its_seed(monkeypatch):
    """Histogram's automatic bounds were chosen by quantiles, then by two versions of the bias–variance rule, all
    with AutoBounds' ``"v": 1``. A release recorded under one rule and replayed under another would be the same seed
    with other bounds: the same noise on other answers, for free. The rule's version is in the seed material."""
    from fractions import Fraction

    from dpcli.tasks import auto_bounds
    from dpcli.tasks.histogram import HistogramQuery

    q = HistogramQuery(by=("g",), unit="u", aggregations=("count",), epsilon=Fraction(1), delta=Fraction(1, 10**6),
                       auto=auto_bounds.AutoBounds(partitions=True))
    now = q.canonical()
    assert now["auto"]["rule"] == auto_bounds.BIAS_VARIANCE_RULE
    monkeypatch.setattr(auto_bounds, "BIAS_VARIANCE_RULE", "bias-variance 1")
    assert q.canonical() != now
    assert "auto" not in HistogramQuery(by=("g",), unit="u", epsilon=Fraction(1), delta=Fraction(1, 10**6)).canonical()
