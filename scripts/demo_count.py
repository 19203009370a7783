"""Demo of the core: a user-level DP count of distinct users, debited to the ledger.

Each user contributes at most 1 to the count (sensitivity 1), so discrete
Laplace noise with scale 1/ε gives ε-DP per user. Running it twice on the same
file is a free replay with the identical answer.
"""

from __future__ import annotations

import argparse
import os

import polars as pl

from dpcli.core.events import PrivacyEvent, to_fraction
from dpcli.core.prf import KeyedStream, derive_seed, seed_id
from dpcli.core.samplers import discrete_laplace
from dpcli.state import keys, ledger
from dpcli.state.paths import default_state_dir, ensure_state_dir
from dpcli.tables import collect, open_input, require_columns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("--epsilon", default="0.25")
    ap.add_argument("--unit", default="user_id")
    ap.add_argument("--analyst", default=os.environ.get("DPCLI_ANALYST", "demo"))
    args = ap.parse_args()
    eps = to_fraction(args.epsilon)
    root = ensure_state_dir(default_state_dir())
    table = open_input(args.input)
    require_columns(table, {args.unit: "key"})
    true_count = collect(table.frame.select(pl.col(args.unit).n_unique()), "counting").item()
    query = {"command": "demo-count", "unit": args.unit, "epsilon": eps, "data": table.fingerprint}
    seed = derive_seed(keys.load_or_create_key(root), query)
    noisy = true_count + int(discrete_laplace(KeyedStream(seed, "count"), 1 / eps, 1)[0])
    event = PrivacyEvent("pure", "discrete_laplace", epsilon=eps, rdp_curve="discrete_laplace")
    receipt = ledger.charge(
        root, args.analyst, command="demo-count", query_id="demo", seed_id=seed_id(seed), reserve=[event]
    )
    tag = "replay, not charged" if receipt.replay else f"charged ε = {args.epsilon}"
    print(f"distinct users (ε = {args.epsilon}, discrete Laplace scale {1/eps}): {noisy}   [{tag}]")


if __name__ == "__main__":
    main()
