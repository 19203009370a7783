"""Tumult Analytics on Spark: the query of ``bench/bench_spark.py``, user-level, groups discovered.

Count and mean of ``v`` (bounds 0..100) per ``page``, each ``user_id`` protected as a whole
(``AddRowsWithID``), truncated to 5 pages per user (``MaxGroupsPerID``) and 3 rows per (user,
page) (``MaxRowsPerGroupPerID``), ε = 1 and δ = 1e-9 in all, groups discovered from the data:

1. ``groupby(["page"]).count()`` with automatic partition selection (an experimental Tumult
   feature, ``config.features.auto_partition_selection``), ApproxDPBudget(0.5, 1e-9): Tumult
   gives half of it (ε 0.25 and all of δ) to selecting the groups and half to the counts;
2. ``groupby(KeySet of the released pages).average("v", 0, 100)`` with PureDPBudget(0.5): the
   groups released by step 1 are public after it (post-processing), so the mean is released for
   exactly those groups. Tumult splits the average's budget between its sum and its count.

dpcli does the same release in one pass (distinct units for the threshold, rows, centred sum,
ε/3 each). Tumult runs two Spark jobs over the input, as its API releases one aggregation per query.

Usage: python tumult_histogram.py FILE.parquet [--master local[2]] [--out OUT.csv]
Prints the number of released pages. Needs ``pip install tmlt.analytics`` (its own pyspark 3.5).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    # Tumult's truncation and noise run as Python UDFs on the executors: they need this venv's python.
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession
    from tmlt.analytics import (
        AddRowsWithID,
        ApproxDPBudget,
        KeySet,
        MaxGroupsPerID,
        MaxRowsPerGroupPerID,
        PureDPBudget,
        QueryBuilder,
        Session,
    )
    from tmlt.analytics.config import config

    spark = (SparkSession.builder.master(a.master).appName("tumult-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    config.features.auto_partition_selection.enable()

    data = spark.read.parquet(a.path).select("user_id", "page", "v")
    session = Session.from_dataframe(
        privacy_budget=ApproxDPBudget(1.0, 1e-9),
        source_id="events",
        dataframe=data,
        protected_change=AddRowsWithID(id_column="user_id"),
    )
    bounded = (QueryBuilder("events").enforce(MaxGroupsPerID("page", 5))
               .enforce(MaxRowsPerGroupPerID("page", 3)))
    counts = session.evaluate(bounded.groupby(["page"]).count(), ApproxDPBudget(0.5, 1e-9)).cache()
    pages = KeySet.from_dataframe(counts.select("page"))
    bounded = (QueryBuilder("events").enforce(MaxGroupsPerID("page", 5))
               .enforce(MaxRowsPerGroupPerID("page", 3)))
    means = session.evaluate(bounded.groupby(pages).average("v", low=0, high=100, name="mean"),
                             PureDPBudget(0.5))
    out = counts.join(means, on="page", how="inner").toPandas().sort_values("page")
    if a.out:
        out.to_csv(a.out, index=False)
    print(len(out))
    spark.stop()


if __name__ == "__main__":
    sys.exit(main())
