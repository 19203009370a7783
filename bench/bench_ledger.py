"""Ledger charge latency against ledger length, in every accounting mode (issue 16: ≤ 20 ms at 10,000 entries;
issue 42: a pld charge ≤ 50 ms).

A ledger of N entries is written once (sealed like real charges would leave it), then charged 15 times
with fresh seeds; the median and worst wall-clock time of one ``ledger.charge`` (lock, verify the
mark, check the budget, append, fsync, new mark) are printed as a Markdown table. A pld charge costs its
block's PLD (a discrete Gaussian count and its threshold's δ), computed afresh for every charge (its cache
cleared, as in a cron job's own process); dp_accounting's import (about a second, once per process) is
done before timing and printed apart.

    .venv/bin/python bench/bench_ledger.py [--sizes 10,1000,10000] [--charges 15] [--modes pure,pld]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from dpcli.core.accounting import pld
from dpcli.core.accounting.budget import Limits
from dpcli.core.events import PrivacyEvent
from dpcli.state import ledger
from dpcli.state.ledger import costs as ledger_costs
from dpcli.state.ledger import document as ledger_document
from dpcli.state.ledger import format as ledger_format

LIMITS = {
    "pure": {"epsilon": Fraction(10**6)},
    "approx": {"epsilon": Fraction(10**6), "delta": Fraction(1, 10)},
    "zcdp": {"rho": Fraction(10**6), "delta": Fraction(1, 10)},
    "rdp": {"epsilon": Fraction(10**9), "delta": Fraction(1, 10)},
    "br": {"epsilon_per": Fraction(1, 10), "delta": Fraction(1, 10**10), "info_budget": 10**9, "call_budget": 10**9,
           "delta_prime": Fraction(1, 10**9)},
    "pld": {"epsilon": Fraction(10**9), "delta": Fraction(1, 10)},
}


def events(mode: str) -> list[PrivacyEvent]:
    if mode == "pld":
        return [PrivacyEvent("zcdp", "histogram/gaussian", rho=Fraction(1, 1000), delta=Fraction(1, 10**8),
                             rdp_curve="discrete_gaussian"),
                PrivacyEvent("approx", "histogram/threshold", delta=Fraction(1, 10**8))]
    return [event(mode)]


def event(mode: str) -> PrivacyEvent:
    if mode == "br":
        return PrivacyEvent("br", "topk", epsilon=Fraction(1, 10), delta=Fraction(1, 10**10), units=21, calls=1)
    if mode in ("zcdp", "rdp"):
        return PrivacyEvent("zcdp", "histogram/gaussian", rho=Fraction(1, 1000))
    return PrivacyEvent("pure", "histogram/laplace", epsilon=Fraction(1, 1000))


def ledger_with(root: Path, mode: str, n: int) -> None:
    """A sealed ledger of ``n`` charged entries (as n charges would leave it, written in one go)."""
    ledger.init_ledger(root, "a", Limits(mode, LIMITS[mode]))
    led = ledger.read_ledger(root, "a")
    when = ledger_format.iso_time(ledger_format.utc_now())
    evs = [e.to_json() for e in events(mode)]
    entries = [{"seq": i + 1, "time": when, "period": 0, "command": "histogram", "query_id": f"q:{i:016x}",
                "seed_id": f"{i:024x}", "events": evs, "summary": "histogram of data.parquet: 8 group(s) released"}
               for i in range(n)]
    ledger_costs.annotate(led, entries)  # a pld ledger's entries carry their costs
    ledger_document.write_ledger(root, led.path, ledger_document.document_of(led, entries))


def time_charges(root: Path, mode: str, charges: int) -> list[float]:
    out = []
    for i in range(charges):
        pld._cached_cost.cache_clear()  # each charge computes its PLD, as a cron job's own process does
        t0 = time.perf_counter()
        ledger.charge(root, "a", command="histogram", query_id="q", seed_id=f"new-{i}", reserve=events(mode))
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,1000,10000")
    ap.add_argument("--charges", type=int, default=15)
    ap.add_argument("--modes", default=",".join(LIMITS))
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if "pld" in args.modes.split(","):
        t0 = time.perf_counter()
        pld.block_cost(events("pld"))
        print(f"(pld: dp_accounting imported and a first block costed in {time.perf_counter() - t0:.2f} s)\n")
    print("| mode | " + " | ".join(f"{n:,} entries: median / max ms" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for mode in args.modes.split(","):
        cells = []
        for n in sizes:
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp) / "state"
                ledger_with(root, mode, n)
                ms = time_charges(root, mode, args.charges)
                cells.append(f"{statistics.median(ms):.1f} / {max(ms):.1f}")
        print(f"| {mode} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
