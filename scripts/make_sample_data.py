"""Generate sample_data/: synthetic page views (heavy-tailed users, Zipf pages) and a public page list.

``page_views.parquet`` has 300,000 rows (the README's examples); ``page_views.csv``
is its first 50,000 rows for CSV and stdin examples; ``pages_public.csv`` lists
the 50 pages a site publishes (a known domain for ``--keys``/``--domain``).

Deterministic (fixed numpy seed): this is *data generation*, not DP noise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl


def main(out_dir: Path, rows: int = 300_000) -> None:
    rng = np.random.default_rng(20261122)
    n_users = 30_000
    activity = rng.pareto(1.2, n_users) + 1.0
    users = rng.choice(n_users, size=rows, p=activity / activity.sum())
    n_pages = 400
    page_w = 1.0 / np.arange(1, n_pages + 1) ** 1.1
    pages = rng.choice(n_pages, size=rows, p=page_w / page_w.sum())
    countries = np.array(["US", "DE", "IN", "BR", "FR", "JP", "NG", "CA"])
    country_of_user = rng.choice(countries.size, size=n_users, p=[0.3, 0.1, 0.2, 0.1, 0.08, 0.1, 0.07, 0.05])
    ts = np.datetime64("2026-11-01T00:00:00") + rng.integers(0, 21 * 86400, rows).astype("timedelta64[s]")
    df = pl.DataFrame(
        {
            "user_id": [f"u{u:05d}" for u in users],
            "page": [f"/p/{p:03d}" for p in pages],
            "country": countries[country_of_user[users]],
            "duration_s": np.round(rng.lognormal(3.0, 1.0, rows), 1),
            "ts": ts.astype("datetime64[ms]"),
        }
    ).sort("ts")
    df.write_parquet(out_dir / "page_views.parquet", compression="zstd", compression_level=19)
    df.head(50_000).write_csv(out_dir / "page_views.csv")
    keys = pl.DataFrame({"page": [f"/p/{p:03d}" for p in range(50)]})
    keys.write_csv(out_dir / "pages_public.csv")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "sample_data"))
