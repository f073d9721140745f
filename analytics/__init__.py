"""Rebalance analytics on Spark (PySpark): the coordinator's event topic in, Parquet tables and an HTML report out.

`coordinator analyze` is the entry point (analytics.cli). Only `report` and `render` work without pyspark; the
rest needs the `spark` extra. docs/analytics.md describes the tables, the report and `--follow`.
"""
