"""OpenDP (Polars Context API): DP count per key, user-level, ≤ 32 keys per user, 1 row per user and key.

Usage: python opendp_histogram.py FILE MODE   (MODE: sample | sample-rows | first | grouped)

* ``sample``: ``truncate_per_group(1, keep="sample")`` + ``truncate_num_groups(32, keep="sample")``
  (random-sampling bounds, OpenDP's default; OpenDP 0.16 with its polars 1.36 fails to run this plan:
  "multiple fields with name 'key' found" in the group-sampling step);
* ``sample-rows``: rows sampled per group (``keep="sample"``), the first 32 groups per user kept;
* ``first``: the same truncations with ``keep="first"``;
* ``grouped``: keep each user's first 32 keys, then group by (user, key) (one row per pair) and count
  (OpenDP requires the group-by truncation to come last).
ε = 1, δ = 1e-9, Laplace noise and OpenDP's own threshold for the unknown key set. Prints the row count.
"""

import sys

import opendp.prelude as dp
import polars as pl

dp.enable_features("contrib")


def main(path: str, mode: str) -> None:
    lf = pl.scan_parquet(path).select("user_id", "key")
    n = lf.select(pl.len()).collect().item()  # a public bound on the length, as OpenDP requires
    context = dp.Context.compositor(
        data=lf,
        privacy_unit=dp.unit_of(contributions=1, identifier="user_id"),
        privacy_loss=dp.loss_of(epsilon=1.0, delta=1e-9),
        split_evenly_over=1,
        margins=[dp.polars.Margin(max_length=n)],
    )
    q = context.query()
    if mode == "grouped":
        q = q.truncate_num_groups(32, by=["key"], keep="first").group_by("user_id", "key").agg(pl.len().alias("n"))
    else:
        rows, groups = {"sample": ("sample", "sample"), "sample-rows": ("sample", "first")}.get(mode, ("first", "first"))
        q = q.truncate_per_group(1, by=["key"], keep=rows).truncate_num_groups(32, by=["key"], keep=groups)
    out = q.group_by("key").agg(dp.len()).release().collect()
    print(out.height)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
