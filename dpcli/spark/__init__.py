"""The Spark engine (``--engine spark``): the same contribution bounding, run on a Spark cluster.

Only the bounding and the per-group totals run on Spark, as built-in Spark SQL (no Python UDFs,
so executors need neither dpcli nor polars); the small totals come back through Arrow, and noise,
selection, accounting, the ledger and the output stay on the driver, unchanged. Rows are kept by
the same keyed order as on polars (:mod:`dpcli.bounding.keyed_order`), so both engines
release the same bytes for the same query, data and key. pyspark is imported only here, and only
when asked for (``pip install 'dpcli[spark]'``).
"""
