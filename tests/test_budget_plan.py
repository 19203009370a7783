"""``dpcli budget plan`` (issue 42, item 3): how many more releases like one fit, and what each may spend for N
more. The plan agrees with the ledger on every mode: plan N, charge N new releases, and the one after them is
refused (exit 77); it reads no record and prints nothing that depends on the data."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import polars as pl
import pytest
from dptest import cli, history, init_ledger

from dpcli.core.events import PrivacyEvent
from dpcli.state.ledger import planning


def _data(path: Path, users: int) -> Path:
    """``users`` units, three rows each over three groups: another ``users`` is another release (a new seed)."""
    rows = [(f"u{i}", "abc"[(i + j) % 3]) for i in range(users) for j in range(3)]
    pl.DataFrame({"user": [r[0] for r in rows], "g": [r[1] for r in rows]}).write_csv(path)
    return path


@pytest.fixture
def keys(tmp_path):
    path = tmp_path / "keys.csv"
    path.write_text("g\na\nb\nc\n")
    return path


def _plan(*release, runs: int | None = None):
    extra = ["--runs", str(runs)] if runs is not None else []
    r = cli("budget", "plan", "--json", *extra, "--", *release)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


# (ledger mode and limits, the release's budget options, the command): each fits a handful of times
MODES = {
    "pure": (("--epsilon", "1"), ("--epsilon", "0.3"), "histogram"),
    "approx": (("--epsilon", "1", "--delta", "1e-5"), ("--epsilon", "0.3"), "histogram"),
    "zcdp": (("--rho", "0.05", "--delta", "1e-6"), ("--rho", "0.012"), "histogram"),
    "rdp": (("--epsilon", "2", "--delta", "1e-6"), ("--epsilon", "0.5"), "histogram"),
    "br": (("--epsilon-per", "0.5", "--delta", "1e-9", "--info-budget", "100", "--call-budget", "3",
            "--delta-prime", "1e-9"), ("--epsilon-per", "0.5"), "topk"),
    "pld": (("--epsilon", "1", "--delta", "1e-6"), ("--epsilon", "0.3", "--noise", "gaussian", "--delta", "1e-8"),
            "histogram"),
}


def _release(command: str, data: Path, keys: Path, budget: tuple[str, ...]) -> list[str]:
    if command == "topk":
        return ["topk", str(data), "--by", "g", "-k", "2", "--privacy-unit", "user", "--max-groups", "3", *budget]
    return ["histogram", str(data), "--by", "g", "--privacy-unit", "user", "--keys", str(keys),
            "--max-contributions", "3", *budget]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_plan_n_charge_n_and_the_next_is_refused(mode, tmp_path, keys, state_dir):
    limits, budget, command = MODES[mode]
    init_ledger(mode, *limits)
    first = _release(command, _data(tmp_path / "d0.csv", 30), keys, budget)
    n = _plan(*first)["fit"]["count"]
    assert 2 <= n <= 12, n  # a handful: the test charges them all
    for i in range(n):  # each on other data: a new release, never a free replay
        r = cli(*_release(command, _data(tmp_path / f"d{i + 1}.csv", 31 + i), keys, budget))
        assert r.exit_code == 0, (mode, i, r.stderr)
        assert _plan(*first)["fit"]["count"] == n - i - 1  # the plan follows the ledger down
    refused = cli(*_release(command, _data(tmp_path / "last.csv", 99), keys, budget))
    assert refused.exit_code == 77, (mode, refused.stderr)
    assert _plan(*first)["fit"] == {"count": 0, "at_least": False,
                                    "next_refused": _plan(*first)["fit"]["next_refused"]}


def test_runs_gives_the_largest_budget_at_which_n_more_fit(tmp_path, keys, state_dir):
    """``--runs 3``: 3 releases fit at the budget it gives, and not at the next one up in its last digit."""
    init_ledger("pure", "--epsilon", "1")
    release = _release("histogram", _data(tmp_path / "d.csv", 30), keys, ("--epsilon", "0.9"))
    plan = _plan(*release, runs=3)
    value = Fraction(plan["runs"]["value"])
    assert plan["runs"]["option"] == "--epsilon" and value == Fraction(3333, 10000)  # 3 · 0.3333 ≤ 1 < 3 · 0.3334
    up = [a if a != "0.9" else str(value + Fraction(1, 10000)) for a in release]
    assert _plan(*up)["fit"]["count"] == 2
    at = [a if a != "0.9" else str(value) for a in release]
    assert _plan(*at)["fit"]["count"] == 3
    assert plan["runs"]["moe95"]  # the margins at that ε, as its dry run states them


@pytest.mark.parametrize(("mode", "limits", "option", "value"), [
    ("pure", ("--epsilon", "1"), "--epsilon", "3333/10000"),
    ("zcdp", ("--rho", "0.05", "--delta", "1e-6"), "--rho", "1666/100000"),
])
def test_runs_without_a_budget_in_the_command_starts_from_what_is_left(mode, limits, option, value, tmp_path, keys,
                                                                        state_dir):
    """``--runs N`` asks for the budget, so the command line need not give one: the plan starts from the ledger's
    ε (or ρ) left over N, says so, and finds the same largest budget as a command line that gives any."""
    init_ledger(mode, *limits)
    release = _release("histogram", _data(tmp_path / "d.csv", 30), keys, ())
    plan = _plan(*release, runs=3)
    assert plan["assumed"]["option"] == option
    assert plan["runs"]["option"] == option and Fraction(plan["runs"]["value"]) == Fraction(value)
    text = cli("budget", "plan", "--runs", "3", "--", *release)
    assert text.exit_code == 0 and f"the command gives no budget: planned at {option}" in text.stdout
    assert cli("budget", "plan", "--", *release).exit_code == 2  # without --runs the release's budget is needed


def test_the_plan_reads_no_record(tmp_path, keys, state_dir):
    """A differential check: one more person in the data changes nothing the plan prints (the plan is a function
    of the command line and the ledger's balances); and the data need not exist."""
    init_ledger("approx", "--epsilon", "1", "--delta", "1e-5")
    base = ["--by", "g", "--privacy-unit", "user", "--epsilon", "0.2", "--delta", "1e-7"]
    d = cli("budget", "plan", "--runs", "4", "--", "histogram", _data(tmp_path / "d.csv", 30), *base)
    d2 = cli("budget", "plan", "--runs", "4", "--", "histogram", _data(tmp_path / "d2.csv", 31), *base)
    missing = cli("budget", "plan", "--runs", "4", "--", "histogram", tmp_path / "later.csv", *base)
    assert d.exit_code == d2.exit_code == missing.exit_code == 0, (d.stderr, missing.stderr)
    assert d.stdout == d2.stdout == missing.stdout and d.stderr == d2.stderr
    assert history() == []  # nothing charged


def test_a_refreshing_ledger_says_when_the_period_ends_and_what_a_fresh_one_fits(tmp_path, keys, state_dir):
    init_ledger("pure", "--epsilon", "1", "--refresh-days", "7")
    release = _release("histogram", _data(tmp_path / "d.csv", 30), keys, ("--epsilon", "0.25"))
    assert cli(*release).exit_code == 0
    plan = _plan(*release)
    assert plan["fit"]["count"] == 3 and plan["period"]["fresh"]["count"] == 4 and plan["period"]["ends"]


@pytest.mark.parametrize("args, said", [
    ((), "give the release after --"),
    (("--", "budget", "show"), "give the release after --"),
    (("--runs", "3", "--", "tabulate", "--spec", "sample_data/safetab_spec.toml"), "--runs scales the release's"),
])
def test_refusals_are_one_line_exit_2(args, said, state_dir):
    init_ledger("pure", "--epsilon", "1")
    r = cli("budget", "plan", *args)
    assert r.exit_code == 2 and said in r.stderr and r.stdout == ""


def test_the_commands_own_refusal_ends_the_plan(tmp_path, state_dir):
    init_ledger("pure", "--epsilon", "1")
    r = cli("budget", "plan", "--", "histogram", _data(tmp_path / "d.csv", 5), "--by", "g", "--privacy-unit",
            "user", "--epsilon", "-1")
    assert r.exit_code == 2 and "--epsilon" in r.stderr and "budget plan for" not in r.stdout


def test_a_tabulation_is_counted_too(state_dir):
    init_ledger("approx", "--epsilon", "100", "--delta", "1e-3")
    plan = _plan("tabulate", "--spec", "sample_data/safetab_spec.toml")
    assert plan["command"] == "tabulate" and plan["fit"]["count"] >= 1 and plan["cost"]


def test_rdp_counts_as_the_ledger_adds_curves_one_charge_at_a_time():
    """On an RDP ledger the count found on scaled curves is checked against the curves summed one charge at a
    time (floating sums): the two agree here over many charges, and the count is the sequential one."""
    from dpcli.core.accounting.budget import Limits, Spend
    from dpcli.state.ledger.model import Ledger

    led = Ledger(Path("x"), "a", "id", Limits("rdp", {"epsilon": Fraction(3), "delta": Fraction(1, 10**6)}),
                 None, None, 1e-9, ())  # type: ignore[arg-type]
    events = [PrivacyEvent("pure", "m", epsilon=Fraction(1, 20))]
    fit = planning.releases_that_fit(led, events, Spend())
    assert fit.count is not None and fit.count > 50 and not fit.at_least
    accountant = led.accountant
    need = accountant.spend(events)
    assert accountant.fits(planning._sequential(led, events, Spend(), fit.count - 1), need) is None
    assert accountant.fits(planning._sequential(led, events, Spend(), fit.count), need) is not None


def test_a_release_of_no_cost_fits_any_number_and_a_tiny_one_is_capped():
    from dpcli.core.accounting.budget import Limits, Spend
    from dpcli.state.ledger.model import Ledger

    led = Ledger(Path("x"), "a", "id", Limits("pure", {"epsilon": Fraction(10)}), None, None, 1e-9, ())  # type: ignore[arg-type]
    assert planning.releases_that_fit(led, [], Spend()).count is None
    tiny = [PrivacyEvent("pure", "m", epsilon=Fraction(1, 10**9))]
    assert planning.releases_that_fit(led, tiny, Spend()) == planning.Fit(planning.MAX_COUNTED, at_least=True)
    exact = [PrivacyEvent("pure", "m", epsilon=Fraction(1, 7))]
    assert planning.releases_that_fit(led, exact, Spend()).count == 70  # 70/7 = 10 exactly: the 70th still fits


def test_runs_at_an_exact_boundary_and_when_no_budget_fits(tmp_path, state_dir):
    """50 releases of ε 0.02 spend exactly 1 (they fit: the boundary is found, not 0.01999); 365 releases of δ 1e-8
    each spend more δ than the ledger's 1e-6 whatever their ε: no value fits, and the plan says why."""
    init_ledger("approx", "--epsilon", "1", "--delta", "1e-6")
    release = ["histogram", str(_data(tmp_path / "d.csv", 30)), "--by", "g", "--privacy-unit", "user", "--epsilon",
               "0.1", "--delta", "1e-8"]
    assert _plan(*release, runs=50)["runs"]["value"] == "0.02"
    none = _plan(*release, runs=365)["runs"]
    assert none["value"] is None and none["fits_at_smallest"]["count"] == 100
    assert "δ left is 0" in none["fits_at_smallest"]["next_refused"]


def test_a_pld_series_plan_n_reserve_charge_n_and_the_next_is_refused(tmp_path, keys, state_dir):
    """On a pld ledger ``--runs N --reserve`` reserves N releases as one series at the largest ε that fits their
    N-fold PLD (more than N releases charged one by one allow): the N releases at that ε are covered, the plan
    counts them down, and the one after them is refused."""
    init_ledger("pld", "--epsilon", "1", "--delta", "1e-6")
    release = _release("histogram", _data(tmp_path / "d0.csv", 30), keys, ("--epsilon", "0.1"))
    runs = 6
    plan = _plan(*release, runs=runs)
    alone, series = Fraction(plan["runs"]["value"]), Fraction(plan["runs"]["series"]["value"])
    assert series > alone and history() == []  # planning reserves nothing
    text = cli("budget", "plan", "--runs", str(runs), "--", *release).stdout
    assert f"as one series of {runs} (--reserve, their N-fold PLD): --epsilon {plan['runs']['series']['value']}" in text
    r = cli("budget", "plan", "--json", "--runs", str(runs), "--reserve", "--", *release)
    assert r.exit_code == 0, r.stderr
    reserved = json.loads(r.stdout)["runs"]["series"]
    assert Fraction(reserved["value"]) == series and reserved["reserved"]["entry"] == 1
    at = [a if a != "0.1" else str(series) for a in release]
    assert _plan(*at)["fit"]["count"] == runs
    for i in range(runs):
        done = cli(*[a if a != "0.1" else str(series) for a in
                     _release("histogram", _data(tmp_path / f"d{i + 1}.csv", 31 + i), keys, ("--epsilon", "0.1"))])
        assert done.exit_code == 0, (i, done.stderr)
        assert _plan(*at)["fit"]["count"] == runs - i - 1
    refused = cli(*[a if a != "0.1" else str(series) for a in
                    _release("histogram", _data(tmp_path / "last.csv", 99), keys, ("--epsilon", "0.1"))])
    assert refused.exit_code == 77, refused.stderr
    assert [e.get("series_run") for e in history()][1:] == list(range(1, runs + 1))


def test_a_reserving_plan_does_not_say_nothing_was_charged(tmp_path, keys, state_dir):
    """``--reserve`` debits the series: its text says so rather than the plan's usual "nothing charged"."""
    init_ledger("pld", "--epsilon", "1", "--delta", "1e-6")
    release = _release("histogram", _data(tmp_path / "d0.csv", 30), keys, ("--epsilon", "0.1"))
    planned = cli("budget", "plan", "--runs", "3", "--", *release)
    assert "nothing read, nothing charged" in planned.stdout
    reserved = cli("budget", "plan", "--runs", "3", "--reserve", "--", *release)
    assert reserved.exit_code == 0, reserved.stderr
    assert "nothing charged" not in reserved.stdout and "the series reserved is charged" in reserved.stdout


def test_reserve_needs_runs_and_a_pld_ledger(tmp_path, keys, state_dir):
    init_ledger("approx", "--epsilon", "1", "--delta", "1e-6")
    release = _release("histogram", _data(tmp_path / "d.csv", 30), keys, ("--epsilon", "0.1"))
    for extra in (["--reserve"], ["--runs", "3", "--reserve"]):
        r = cli("budget", "plan", *extra, "--", *release)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert history() == []


def test_the_text_says_which_release_would_be_refused(tmp_path, keys, state_dir):
    """The new-user trial read "the next would be refused: ε left is 0" after "fits now: 6 more" as the next one: the
    refusal is the ledger's answer to the release after those that fit."""
    init_ledger("pure", "--epsilon", "1")
    release = _release("histogram", _data(tmp_path / "d.csv", 30), keys, ("--epsilon", "0.3"))
    r = cli("budget", "plan", "--", *release)
    assert r.exit_code == 0, r.stderr
    assert "  one more after those would be refused: " in r.stdout and "the next would be refused" not in r.stdout
