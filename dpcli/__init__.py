"""dpcli: differentially private statistics over CSV/Parquet files."""

__version__ = "0.1.0"
