"""OpenDP (Polars Context API): DP count per key, user-level, ≤ 32 keys per user, 1 row per user and key.

Usage: python opendp_histogram.py FILE MODE   (MODE: sample | first | grouped)

* ``sample``: ``truncate_per_group(1, keep="sample")`` + ``truncate_num_groups(32, keep="sample")``
  (random-sampling bounds, OpenDP's default);
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
        keep = "sample" if mode == "sample" else "first"
        q = q.truncate_per_group(1, by=["key"], keep=keep).truncate_num_groups(32, by=["key"], keep=keep)
    out = q.group_by("key").agg(dp.len()).release().collect()
    print(out.height)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
