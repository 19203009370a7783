"""The TPC-H bench of ``dpcli sql`` (issue 41 item 5): ``make bench-tpch`` runs :mod:`bench.bench_tpch`."""
