"""Deterministic synthetic event data modelled on DP-SQLP's synthetic set (paper 001, Sec. 5.1).

* per-unit record counts: Zipf–Mandelbrot on [1, 10^5], P(x) ∝ (x + 26)^-6.738
  (the paper's parameters; their mean is 6.1, not the 10 the text states, while
  the "≈15% of users have more than 10 records" it also states holds: 15.9%);
* the key of each record: Zipf–Mandelbrot over ``n_keys`` keys, q = 1000, s = 1.4;
* event time uniform over one day (the paper shuffles records within the day; ``span``
  sets its length, e.g. 100,000 s so that 1,000 triggers have whole-second lengths);
* a value column uniform on 0..99 (for sums).

``--second``, ``--pages`` and ``--heavy`` are three more, independent generators (:func:`write_second`,
:func:`write_pages`, :func:`write_heavy`). numpy's seeded generator is used here to make *data*; it never touches a release.
Usage: python bench/synthetic.py OUT.parquet ROWS [--keys N] [--seed S] [--second | --pages | --heavy]
"""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl

DAY_START = 1_760_400_000  # 2025-10-14T00:00:00Z: a multiple of both 86,400 s and 10^5 s (window starts)


def zipf_mandelbrot(rng: np.random.Generator, n: int, q: float, s: float, size: int) -> np.ndarray:
    """``size`` draws from {1..n} with P(x) ∝ (x + q)^-s (inverse CDF on a table)."""
    x = np.arange(1, n + 1, dtype=np.float64)
    cdf = np.cumsum((x + q) ** -s)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), n - 1) + 1


def events(n_users: int, n_keys: int = 10**6, seed: int = 1, max_rows: int | None = None,
           span: int = 86400) -> pl.DataFrame:
    """Columns user_id (i64), key (i64), value (i64), ts (epoch seconds, uniform over ``span`` s), shuffled."""
    rng = np.random.default_rng(seed)
    counts = zipf_mandelbrot(rng, 10**5, 26.0, 6.738, n_users)
    users = np.repeat(np.arange(n_users, dtype=np.int64), counts)
    if max_rows is not None:
        users = users[rng.permutation(users.size)[:max_rows]]
    n = users.size
    return pl.DataFrame({
        "user_id": users,
        "key": zipf_mandelbrot(rng, n_keys, 1000.0, 1.4, n).astype(np.int64) - 1,
        "value": rng.integers(0, 100, n, dtype=np.int64),
        "ts": DAY_START + rng.integers(0, span, n, dtype=np.int64),
    }).sample(fraction=1.0, shuffle=True, seed=seed)


def events_with_rows(rows: int, n_keys: int = 10**6, seed: int = 1) -> pl.DataFrame:
    """About ``rows`` events: enough users for that many records (mean 6.1 per user), cut to ``rows``."""
    return events(int(rows / 6.0) + 1000, n_keys, seed, max_rows=rows)


def write(path: str, rows: int, n_keys: int = 10**6, seed: int = 1) -> None:
    """Write about ``rows`` events to Parquet; above 20M rows, as 10M-row chunks with seeds seed, seed+1, …
    (their user ids overlap, which only adds records per user) to keep the generator's memory small."""
    if rows <= 20_000_000:
        events_with_rows(rows, n_keys, seed).write_parquet(path, row_group_size=1_000_000)
        return
    chunks = [events_with_rows(10_000_000, n_keys, seed + s) for s in range(rows // 10_000_000)]
    pl.concat(chunks).write_parquet(path, row_group_size=1_000_000)


def write_second(path: str, rows: int, seed: int = 7) -> None:
    """A second, independent DP-SQLP-style generator (issue 20): exactly 10^6 users whose record
    counts are Zipf–Mandelbrot with q = 2, s = 1.8 on [1, 10^4], scaled so the file has about
    ``rows`` records, and keys Zipf–Mandelbrot (q = 10, s = 1.1) over 10^5 keys; user ids are a
    random permutation, rows are shuffled."""
    rng = np.random.default_rng(seed)
    n_users = 10**6
    weights = zipf_mandelbrot(rng, 10**4, 2.0, 1.8, n_users).astype(np.float64)
    counts = np.maximum(1, np.round(weights * rows / weights.sum())).astype(np.int64)
    users = np.repeat(rng.permutation(n_users).astype(np.int64), counts)
    n = users.size
    pl.DataFrame({
        "user_id": users,
        "key": zipf_mandelbrot(rng, 10**5, 10.0, 1.1, n).astype(np.int64) - 1,
        "value": rng.integers(0, 100, n, dtype=np.int64),
        "ts": DAY_START + rng.integers(0, 86400, n, dtype=np.int64),
    }).sample(fraction=1.0, shuffle=True, seed=seed).write_parquet(path, row_group_size=1_000_000)


def write_pages(path: str, rows: int, seed: int = 30, n_pages: int = 10**6, n_users: int = 10**6) -> None:
    """A third, independent generator (issue 30: top-k over about a million groups): page views where

    * a page's popularity is Zipf–Mandelbrot over ``n_pages`` pages, P(page = x) ∝ (x + 100)^-0.9
      (a flat head and a long tail);
    * a user's activity is log-normal with σ = 2 over ``n_users`` users, each view's user drawn in
      proportion to it (heavy-tailed: a few users view thousands of pages, most a handful);
    * page ids and user ids are random permutations, so neither id's order carries its popularity,
      and each row is drawn independently (no order in the file).

    At 10M rows (seed 30): 936,847 distinct pages (the 1,000th largest has 749 distinct users;
    140,947 have one), 639,701 distinct users (median 4 views, mean 15.6, the busiest 22,468 = 0.22%
    of all views, the busiest 1% of users 31%), 9.91M distinct (user, page) pairs.

    Columns ``user_id`` and ``key`` (Int64, the page), as the harness's other files; seeded, so the
    same arguments write the same file.
    """
    rng = np.random.default_rng(seed)
    activity = rng.lognormal(0.0, 2.0, n_users)
    cdf = np.cumsum(activity)
    cdf /= cdf[-1]
    user_ids = rng.permutation(n_users).astype(np.int64)
    users = user_ids[np.minimum(np.searchsorted(cdf, rng.random(rows), side="right"), n_users - 1)]
    page_ids = rng.permutation(n_pages).astype(np.int64)
    pages = page_ids[zipf_mandelbrot(rng, n_pages, 100.0, 0.9, rows) - 1]
    pl.DataFrame({"user_id": users, "key": pages}).write_parquet(path, row_group_size=1_000_000)


def write_heavy(path: str, rows: int, seed: int = 41) -> None:
    """A fourth, independent generator (issue 41, item 6: top-k over a million keys with heavy-tailed users):

    * ``rows // 10`` users, each with a record count drawn from P(n) ∝ (n + 1.656)^-2.2 on [1, 10^5] (mean 10.0;
      36% of users have one record, the largest about 10^5 at 10M rows);
    * each record's key from P(r) ∝ (r + 1000)^-1.4 over as many keys as users (ranks 1..users);
    * user ids and key ids are random permutations (no id carries its size or popularity), rows shuffled;
    * cut to ``rows`` records when the counts add up to more (a uniform sample of the records).

    Columns ``user_id`` and ``key`` (Int64), as the harness's other files; seeded.
    """
    rng = np.random.default_rng(seed)
    n_users = max(rows // 10, 1)
    counts = zipf_mandelbrot(rng, 10**5, 1.656, 2.2, n_users)
    users = np.repeat(rng.permutation(n_users).astype(np.int64), counts)
    if users.size > rows:  # exactly ``rows`` records (at most): a uniform sample of them, as events_with_rows cuts
        users = users[np.sort(rng.permutation(users.size)[:rows])]
    key_ids = rng.permutation(n_users).astype(np.int64)
    keys = key_ids[zipf_mandelbrot(rng, n_users, 1000.0, 1.4, users.size) - 1]
    order = rng.permutation(users.size)
    pl.DataFrame({"user_id": users[order], "key": keys[order]}).write_parquet(path, row_group_size=1_000_000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("rows", type=int)
    ap.add_argument("--keys", type=int, default=10**6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--second", action="store_true", help="the second generator (write_second)")
    ap.add_argument("--pages", action="store_true",
                    help="the third generator (write_pages): ~1M pages, heavy-tailed users")
    ap.add_argument("--heavy", action="store_true",
                    help="the fourth generator (write_heavy): heavy-tailed users over ~1M keys (issue 41)")
    a = ap.parse_args()
    if a.heavy:
        write_heavy(a.out, a.rows)
    elif a.second:
        write_second(a.out, a.rows)
    elif a.pages:
        write_pages(a.out, a.rows)
    else:
        write(a.out, a.rows, a.keys, a.seed)


if __name__ == "__main__":
    main()
