"""The workload of issue 38, shared by the harness and the peer scripts (standard library only: each peer
runs in its own venv and imports this file by path).

Every query runs at ε = 1, user-level (the plane ``tailnum`` on flights, the person ``pid`` on ACS).
"Careful" caps are those a user would pick from public knowledge, never from the data: a plane departs
at most once a day, so at most 365 flights per carrier-year (and a plane flies for one carrier) and at
most 31 per month; ``dep_delay`` in -60:300 minutes, ``distance`` in 0:5000 miles; one row per person on
ACS, ``PINCP`` in 0:500000 dollars.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EPSILON = 1.0
DELTA_TOPK = 1e-6  # δ of the top-k without a public list (threshold / partition selection)
TOP_K = 10


@dataclass(frozen=True)
class Query:
    """One row of the table: a statistic per group, and the careful caps for it."""

    name: str  # short id (JSON key)
    label: str  # the table's row
    dataset: str  # "flights" or "acs" (or "flights_delay": flights with a dep_delay)
    by: tuple[str, ...]
    stat: str  # count | mean | median | sum | topk
    keys: str | None  # public key list (file name in the data directory)
    value: str | None = None
    bounds: tuple[float, float] | None = None
    max_partitions: int = 1  # careful: groups per unit
    max_contributions: int = 1  # careful: rows per unit and group
    median_step: float = 1.0  # candidate spacing for peers that need a candidate list (OpenDP)


UNIT = {"flights": "tailnum", "flights_delay": "tailnum", "acs": "pid"}

QUERIES: tuple[Query, ...] = (
    Query("carrier_count", "flights per carrier", "flights", ("carrier",), "count", "carriers.csv",
          max_partitions=1, max_contributions=365),
    Query("month_count", "flights per month", "flights", ("month",), "count", "months.csv",
          max_partitions=12, max_contributions=31),
    Query("origin_month_count", "flights per origin × month", "flights", ("origin", "month"), "count",
          "origin_month.csv", max_partitions=36, max_contributions=31),
    Query("carrier_mean_delay", "mean dep_delay per carrier", "flights_delay", ("carrier",), "mean",
          "carriers.csv", value="dep_delay", bounds=(-60, 300), max_partitions=1, max_contributions=365),
    Query("carrier_median_delay", "median dep_delay per carrier (minutes off)", "flights_delay", ("carrier",),
          "median", "carriers.csv", value="dep_delay", bounds=(-60, 300), max_partitions=1,
          max_contributions=365, median_step=1.0),
    Query("carrier_sum_distance", "sum of distance per carrier", "flights", ("carrier",), "sum", "carriers.csv",
          value="distance", bounds=(0, 5000), max_partitions=1, max_contributions=365),
    # Top-10 destinations by flights: τ = 31 flights per plane and destination is the issue's (its "Done
    # when" states --max-contributions 31). dpcli's topk needs no cap on destinations per plane; the peers'
    # histograms do: K = 1 (each plane in one destination), which keeps their noise at 31 per count.
    Query("dest_top10", "top-10 destinations (share of the true top 10 found)", "flights", ("dest",), "topk",
          "dests.csv", max_partitions=1, max_contributions=31),
    Query("acs_median_income", "one row per person: median income per state", "acs", ("state",), "median",
          "states.csv", value="PINCP", bounds=(0, 500000), max_partitions=1, max_contributions=1,
          median_step=100.0),
)

BY_NAME = {q.name: q for q in QUERIES}


def group_key(values: tuple[object, ...] | list[object]) -> str:
    """One string per group (JSON keys): the --by values joined by '|', integers without a '.0'."""
    out = []
    for v in values:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        out.append(str(v))
    return "|".join(out)


def input_path(work: Path, dataset: str) -> Path:
    """The prepared input of a dataset (written by bench/accuracy/truth.py)."""
    return work / f"{dataset}.parquet"
