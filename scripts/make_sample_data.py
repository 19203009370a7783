"""Generate sample_data/: synthetic page views (heavy-tailed users, Zipf pages) and a public page list.

``page_views.parquet`` has 300,000 rows (the README's examples); ``page_views.csv``
is its first 50,000 rows for CSV and stdin examples; ``pages_public.csv`` lists
the 50 pages a site publishes (a known domain for ``--keys``/``--domain``).

``persons.parquet`` (200,000 synthetic persons; ``--persons N`` for more, e.g. the
1M of the tabulate benchmark) and ``blocks.csv`` (the public list of 1,000
invented blocks: 5 states × 4 counties × 50 blocks, some in one of 3 AIANNH
areas) feed ``dpcli tabulate`` with ``safetab_spec.toml``.

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


def persons(out_dir: Path, n: int = 200_000, compression_level: int = 19) -> None:
    """Synthetic persons over an invented geography: race codes with multiplicity 1-3.

    ``compression_level`` (zstd) only changes the file's size and the time to write it (bench/ writes
    its 10M and 30M persons at 3), never its rows."""
    rng = np.random.default_rng(20261123)
    blocks = [f"{st:02d}{co:03d}{bl:04d}" for st in range(1, 6) for co in range(1, 5) for bl in range(50)]
    aiannh = np.where(rng.random(len(blocks)) < 0.08, rng.choice(["A01", "A02", "A03"], len(blocks)), "")
    pl.DataFrame({"block": blocks, "aiannh": aiannh}).write_csv(out_dir / "blocks.csv")
    block_w = rng.pareto(1.5, len(blocks)) + 1.0
    major_w = np.array([0.55, 0.15, 0.03, 0.12, 0.02, 0.13])  # six major race groups, codes M000-M999
    n_codes = rng.choice([1, 2, 3], size=n, p=[0.85, 0.12, 0.03])
    majors = rng.choice(6, size=(n, 3), p=major_w)
    detail = rng.choice(10, size=(n, 3), p=np.array([0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.05, 0.03, 0.02, 0.01]))
    codes = (majors + 1) * 1000 + detail * 100 + rng.integers(0, 100, size=(n, 3))
    # The first k of each person's three codes, ';'-separated (vectorised: 30M persons for bench/).
    parts = [pl.Series(codes[:, j]).cast(pl.String) for j in range(3)]
    k = pl.Series(n_codes)
    more = [pl.when(pl.col("k") > j).then(";" + pl.col(f"c{j}")).otherwise(pl.lit("")) for j in (1, 2)]
    race = (pl.DataFrame({"c0": parts[0], "c1": parts[1], "c2": parts[2], "k": k})
            .select(pl.concat_str([pl.col("c0"), *more])).to_series())
    df = pl.DataFrame(
        {
            "block_id": np.array(blocks)[rng.choice(len(blocks), size=n, p=block_w / block_w.sum())],
            "race": race,
            "hispanic": rng.choice([1, 2], size=n, p=[0.82, 0.18]),
            "sex": rng.choice(["1", "2"], size=n),
            "age": np.minimum(rng.gamma(2.2, 18.0, n).astype(np.int64), 110),
        }
    )
    df.write_parquet(out_dir / "persons.parquet", compression="zstd", compression_level=compression_level)


if __name__ == "__main__":
    args = sys.argv[1:]
    n_persons = 200_000
    if "--persons" in args:
        i = args.index("--persons")
        n_persons = int(args[i + 1])
        del args[i : i + 2]
    target = Path(args[0] if args else "sample_data")
    if n_persons == 200_000:
        main(target)
    persons(target, n_persons)
