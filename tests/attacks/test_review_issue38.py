"""Adversarial review of issue 38's changes (histogram/sql defaults, auto bounds, quantiles, topk threshold).

Each test failed at fa0255e because of the flaw its docstring names, and holds since the fix: the choice of
bounds under ρ spent up to 6× its charge (weights split ρ linearly); the resolved quantile grid was not seed
material; a zcdp ledger dropped the left-out choice; sql's left-out caps with ρ on an approx ledger were refused.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from dptest import SAMPLE, cli, init_ledger

from dpcli.tasks import auto_bounds
from dpcli.tasks.auto_bounds import choose

PV = str(SAMPLE / "page_views.csv")


def _record_auto_epsilons(monkeypatch) -> list[Fraction]:
    """Record the pure ε of every ε-DP mechanism the choice of bounds runs (AboveThreshold walks, the one-row
    check, the noisy sizes, the noisy number of groups)."""
    spent: list[Fraction] = []

    def wrap(name: str, position: int):
        original = getattr(choose, name)

        def recorded(*args, **kwargs):
            spent.append(Fraction(args[position]))
            return original(*args, **kwargs)

        # where the choice calls it, and where a task does (``auto_bounds.noisy_groups``)
        for module in (choose, auto_bounds):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, recorded)

    wrap("first_within", 3)  # (above, allowed, sensitivity, epsilon, …): one AboveThreshold, ε-DP
    wrap("first_reaching", 2)  # (at_most, level, epsilon, …)
    wrap("one_row_each", 3)  # (lf, shape, allowed, epsilon, …)
    wrap("one_group_each", 3)  # (lf, shape, allowed, epsilon, …)
    wrap("_noisy_count", 2)  # (frame, sensitivity, epsilon, …)
    wrap("noisy_groups", 3)  # (frame, shape, at_least, epsilon, …)
    return spent


@pytest.mark.parametrize("extra", [
    ["--agg", "sum", "--value", "duration_s", "--bounds", "auto"],
    ["--agg", "count"],
])
def test_auto_bounds_under_rho_charges_what_its_weighted_walks_spend(tmp_path, monkeypatch, extra):
    """Finding 1 (HIGH): under --rho the choice of bounds is charged ρ·share, split into `model_parts` equal
    parts as ε_part = √(2ρ·share/parts); but the walks then run at WALK_WEIGHT·ε_part (4×) and
    VALUE_WEIGHT·ε_part (then 8×), the one-row check at 2×. An ε-DP mechanism is ε²/2-zCDP, so a walk at w·ε_part
    spends w²·ρ_part, not w·ρ_part: the weights compose linearly in ε, quadratically in ρ. Here the choice spends
    Σ ε_i²/2 ≈ 3–6× the ρ the ledger is charged for it."""
    monkeypatch.setenv("DPCLI_STATE_DIR", str(tmp_path / "state"))
    init_ledger("zcdp")
    spent = _record_auto_epsilons(monkeypatch)
    r = cli("histogram", PV, "--by", "page", "--privacy-unit", "user_id", "--rho", "0.5", "--delta", "1e-6",
            "--max-partitions", "auto", "--max-contributions", "auto", *extra, "--json",
            "-o", tmp_path / "out.csv")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)
    charged = sum(Fraction(e["rho"]) for e in summary["cost"] if e["mechanism"] == "histogram/auto-bounds")
    assert spent, "the choice ran no mechanism"
    actual = sum(e * e / 2 for e in spent)  # ε-DP ⇒ ε²/2-zCDP (Bun–Steinke Prop. 1.4), composed additively
    assert actual <= charged * (1 + Fraction(1, 10**6)), (
        f"the choice of bounds spends ρ = {float(actual):.4g} but is charged ρ = {float(charged):.4g}")


def _keys(tmp_path) -> str:
    pages = sorted({line.split(",")[1] for line in open(PV).read().splitlines()[1:]})
    path = tmp_path / "pages.csv"
    path.write_text("page\n" + "".join(f"{p}\n" for p in pages))
    return str(path)


def test_zcdp_ledger_keeps_the_left_out_choice(tmp_path, monkeypatch):
    """Finding 2 (LOW, correctness): HistogramTask.for_ledger computes ``task = self.with_defaults(mode)`` and
    then, on a zcdp ledger with the noise left out, ``task = replace(self, …)``: the chosen defaults are thrown
    away. A zcdp analyst who leaves the caps out gets caps of 1 and the old "left at 1" notes (and a quantile or
    sum without --bounds is refused with "--bounds is needed"), while the same command on pure/approx/rdp
    ledgers (or with --noise gaussian given) chooses them. The docs promise the choice wherever auto runs."""
    monkeypatch.setenv("DPCLI_STATE_DIR", str(tmp_path / "state"))
    init_ledger("zcdp")
    r = cli("histogram", PV, "--by", "page", "--privacy-unit", "user_id", "--epsilon", "1", "--delta", "1e-6",
            "--keys", _keys(tmp_path), "--json", "-o", tmp_path / "out.csv")
    assert r.exit_code == 0, r.stderr
    assert "left out, so chosen from the data" in r.stderr, r.stderr
    assert json.loads(r.stdout).get("auto"), "no bounds were chosen for the left-out caps"


def test_sql_defaults_with_rho_on_an_approx_ledger_are_not_refused(tmp_path, monkeypatch):
    """Finding 3 (LOW, correctness): histogram keeps caps of 1 for "ρ on an approx ledger" (the choice's zCDP part
    has no δ of its own to convert at), but SqlTask.with_defaults never sees the ledger's mode: the same sql query
    with --rho --delta --noise gaussian that runs with explicit caps is refused (exit 77, "sql/auto-bounds is zCDP:
    give --delta …" although --delta was given) once the caps are left out."""
    monkeypatch.setenv("DPCLI_STATE_DIR", str(tmp_path / "state"))
    init_ledger("approx")
    q = "SELECT page, ANON_COUNT(*) AS c FROM v GROUP BY page"
    args = ["sql", q, "--table", f"v={PV}", "--privacy-unit", "v.user_id", "--rho", "0.01", "--delta", "1e-7",
            "--noise", "gaussian"]
    explicit = cli(*args, "--max-partitions", "1", "--max-contributions", "1", "-o", tmp_path / "a.csv")
    assert explicit.exit_code == 0, explicit.stderr
    left_out = cli(*args, "-o", tmp_path / "b.csv")
    assert left_out.exit_code == 0, left_out.stderr


def _quantile_material(monkeypatch, steps: int):
    from dpcli.release import seeds
    from dpcli.tasks import histogram as h
    from dpcli.tasks.histogram import query

    monkeypatch.setattr(query, "QUANTILE_STEPS", steps)  # where the query's default grid reads it
    q = h.HistogramQuery(by=("page",), unit="user_id", aggregations=("median",), value="duration_s",
                         bounds=(0.0, 600.0), max_partitions=2, max_contributions=2, epsilon=Fraction(1),
                         domain="keys")
    task = h.HistogramTask(q)
    plan = h.plan_histogram(q, "approx", {})
    grid = q.grid
    return (seeds.task_material(task), seeds.Calibration("approx", plan).seed_material(),
            seeds.engine_versions()), grid.granularity


def test_the_default_quantile_grid_is_bound_into_the_seed(monkeypatch):
    """Finding 4 (MEDIUM, rule 1): a915b85 made the default grid of a quantiles-only query 65,536 steps (was 4096)
    without any version in the seed: the grid is not in the task, the plan or the engine versions, so the same
    command before and after the upgrade has the same seed, the ledger records the rerun as a free replay, and the
    bytes differ (reproduced: `histogram page_views.csv --by page --agg median --value duration_s --bounds 0:600
    --max-partitions 2 --max-contributions 2 --epsilon 1 --keys pages.csv` at 8f72b6e, then at fa0255e with the same
    state directory: seed 1d5b4526…, `replay: true`, /p/000 19.62 → 19.2969). Same class: 2d1a17f lets K exceed the
    noisy group count (every candidate without a list) and keeps BIAS_VARIANCE_RULE = "bias-variance 3". Here: two
    grids that release different values must give different seed material."""
    old, g_old = _quantile_material(monkeypatch, 1 << 12)
    new, g_new = _quantile_material(monkeypatch, 1 << 16)
    assert g_old != g_new  # the releases differ
    assert old != new, "the default grid changed the release but not its seed: a rerun after the upgrade is free"
