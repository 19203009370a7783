"""The plain (non-private) TPC-H query in DuckDB over the Parquet files: ``python plain_duckdb.py Q DIR``.

Run in the bench's own venv (``.venv-tpch``: duckdb, not a dependency of dpcli); the standard text of
:data:`bench.tpch.queries.DUCKDB`, each table a view over its Parquet file, the result printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queries import DUCKDB

TABLES = ("lineitem", "orders", "customer", "part", "supplier", "nation", "region")


def main() -> None:
    query, data = sys.argv[1], sys.argv[2]
    con = duckdb.connect()
    for t in TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{data}/{t}.parquet')")
    print(con.execute(DUCKDB[query]).fetchall())


if __name__ == "__main__":
    main()
