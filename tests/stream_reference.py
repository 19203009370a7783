"""A per-key, plain-Python DP-SQLP engine: the oracle the vectorised one (dpcli.tasks.stream.algorithm)
is tested equal to, release for release. One Python set of units per key and round; every step of
Alg. 2-4 written out per key, as the paper states it (and as dpcli computed it before issue 20)."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import timedelta

import numpy as np
import polars as pl

from dpcli.core import tree
from dpcli.tasks.stream.algorithm import naive_utc


class _Key:
    def __init__(self) -> None:
        self.users: set = set()
        self.round_start = self.pert_start = self.predicted = None
        self.buffer_count = self.buffer_sum = self.pert_count = self.pert_sum = 0
        self.margin = self.noise = None


def _label(key) -> str:
    return json.dumps(list(key), default=str, separators=(",", ":"))


def replay(events: pl.DataFrame, q, plan, stream) -> list[tuple]:
    """Every trigger of every window of ``events`` (from prepare_events), window by window."""
    keys = list(q.keys)
    aggs = [pl.col("__unit").alias("units"), pl.len().alias("n")] + ([pl.col("__v").sum().alias("s")] if q.value else [])
    rows: list[tuple] = []
    parts = events.partition_by(["__window", "__trigger"], as_dict=True, maintain_order=True) if events.height else {}
    for start in sorted({int(w) for w, _ in parts}):
        ws = stream.child(f"window/{start}")
        states: dict = {}
        predicted: dict = defaultdict(set)
        t0 = naive_utc(start)
        for t in range(1, q.triggers + 1):
            part = parts.get((start, t))
            evaluate, new = [], []
            if part is not None:
                b = part.group_by(keys, maintain_order=True).agg(aggs).sort(keys, nulls_last=True)
                sums = b["s"].to_list() if q.value else [0] * b.height
                for key, users, n, s in zip(b.select(keys).rows(), b["units"].to_list(), b["n"].to_list(), sums):
                    st = states.setdefault(key, _Key())
                    st.users.update(users)
                    st.buffer_count += n
                    st.buffer_sum += s
                    if st.round_start is None:
                        if len(st.users) <= q.mu:
                            continue
                        st.round_start = t
                        new.append(key)
                    evaluate.append(key)
            n_leaves = q.triggers - t + 1
            if new:
                noise = tree.noise_prefixes(ws.child(f"select/{t}"), plan.sigma2_select, len(new), n_leaves)
                for key, m in zip(new, noise - q.mu - plan.selection_threshold(n_leaves, q.triggers)):
                    states[key].margin = m
            released = []
            for key in evaluate:
                st = states[key]
                i, units = t - st.round_start, len(st.users)
                if units + st.margin[i] > 0:
                    released.append(key)
                    continue
                later = np.flatnonzero(st.margin[i + 1:] > -units)
                st.predicted = t + 1 + int(later[0]) if later.size else None
                if st.predicted is not None:
                    predicted[st.predicted].add(key)
            released += sorted((k for k in predicted.pop(t, set())
                                if k not in set(evaluate) and states[k].predicted == t), key=_label)
            first = [k for k in released if states[k].pert_start is None]
            if first:
                c = tree.noise_prefixes(ws.child(f"pert-count/{t}"), plan.sigma2_count, len(first), n_leaves)
                s = (tree.noise_prefixes(ws.child(f"pert-sum/{t}"), plan.sigma2_sum, len(first), n_leaves)
                     if q.value else [None] * len(first))
                for key, cn, sn in zip(first, c, s):
                    states[key].pert_start, states[key].noise = t, (cn, sn)
            for key in released:
                st = states[key]
                i = t - st.pert_start
                st.pert_count += st.buffer_count
                row = [t0, t, t0 + timedelta(seconds=t * q.step), *key, int(round(st.pert_count + st.noise[0][i]))]
                if q.value:
                    st.pert_sum += st.buffer_sum
                    row.append(round(st.pert_sum + st.noise[1][i]) * float(q.grid.granularity))
                rows.append(tuple(row))
                st.buffer_count = st.buffer_sum = 0
                st.users, st.round_start, st.margin, st.predicted = set(), None, None, None
    return rows
