"""Issue 20, item 2: selection-tree nodes drawn vs needed: a tree whose key is released at its creation trigger needs only
its first leaf (margin[0]); any other tree had an Alg. 4 prediction over all its future prefixes.

Usage: python bench/stream_nodes_used.py EVENTS.parquet  (bench/synthetic.py EVENTS.parquet 1000000 --seed 0)
"""
import hashlib
import sys
from fractions import Fraction

import polars as pl

from dpcli.core import tree
from dpcli.tasks import stream as sr


def run(every, triggers, C, eps, mu=0, window=86400):
    q = sr.StreamQuery(time="ts", keys=("key",), unit="user_id", window=window, triggers=triggers, max_records=C,
                       epsilon=Fraction(eps), delta=Fraction(1, 10**9), mu=mu)
    plan = sr.plan_stream(q)
    drawn = needed = 0
    orig = sr.WindowRun._check_selection
    def counting(self, slots, t):
        nonlocal drawn, needed
        sel = orig(self, slots, t)
        new = self.round_start[slots] == t
        nodes = sum(tree._level_sizes(q.triggers - t + 1))
        k, r = int(new.sum()), int((new & sel).sum())
        drawn += k * nodes
        needed += (k - r) * nodes + r
        return sel
    sr.WindowRun._check_selection = counting
    ev = sr.prepare_events(pl.scan_parquet(sys.argv[1]), q, 10**9)
    rows = sr.StreamState(q, plan, hashlib.sha256(b"x").digest(), track_units=False).advance(ev, 10**9)
    sr.WindowRun._check_selection = orig
    print(f"T={triggers} C={C} eps={eps} mu={mu}: releases {len(rows):,}, nodes drawn {drawn:,}, needed {needed:,} ({100*needed/max(drawn,1):.1f}%)")
run("15m", 96, 32, 1)
run("1h", 24, 32, 1)
run("1h", 24, 1, 40)
run("15m", 96, 1, 40)
run("10m", 36, 2, 60, mu=3, window=21600)
