"""The SparkSession: local mode by default, any master URL otherwise, Spark's Kafka source from the jar cache."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def spark_kafka_jars() -> list[str]:
    from coordinator.embedded import ensure_spark_kafka_jars

    return [str(path) for path in ensure_spark_kafka_jars()]


def build_session(master: str | None = None, app_name: str = "coordinator-analyze",
                  shuffle_partitions: int | None = None) -> "SparkSession":
    """A session with the connector's jars handed over by `spark.jars` (Maven provisioned them once; no Ivy).

    Local mode binds to loopback (SPARK_LOCAL_IP) and uses few shuffle partitions: the aggregated tables are
    small, and 200 empty tasks per shuffle would cost more than the work on a laptop."""
    master = master or DEFAULT_MASTER
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.jars", ",".join(spark_kafka_jars()))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true"))
    if local:
        builder = (builder.config("spark.ui.enabled", "false")
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 4)))
    elif shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("COORDINATOR_SPARK_LOG_LEVEL", "WARN"))
    return session
