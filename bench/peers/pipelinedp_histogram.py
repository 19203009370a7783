"""PipelineDP (local backend): DP count per key, max_partitions_contributed = 32,
max_contributions_per_partition = 1, ε = 1, δ = 1e-9, private partition selection.

Usage: python pipelinedp_histogram.py FILE. Prints the number of released keys.
"""

import sys

import pipeline_dp
import pyarrow.parquet as pq


def main(path: str) -> None:
    table = pq.read_table(path, columns=["user_id", "key"])
    rows = zip(table.column("user_id").to_pylist(), table.column("key").to_pylist(), strict=True)
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-9)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        metrics=[pipeline_dp.Metrics.COUNT],
        max_partitions_contributed=32,
        max_contributions_per_partition=1,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1], value_extractor=lambda r: 0
    )
    result = engine.aggregate(rows, params, extractors)
    accountant.compute_budgets()
    print(sum(1 for _ in result))


if __name__ == "__main__":
    main(sys.argv[1])
