"""The event topic as Spark DataFrames: Spark's Kafka source, parsed with the shared schema
(coordinator/telemetry/event_schema.py), every record either a valid event or a counted problem.

Validity here is `event_schema.problem_of` expressed in Spark SQL (tests/analytics check that both agree on the
same records), so a malformed or future-version record is skipped and counted, never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.telemetry import event_schema as schema
from coordinator.telemetry.event_schema import FieldType, Problem

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

CORRUPT = "_corrupt_record"
# Kafka's record timestamp (set at produce time) is within moments of the event's ts_ms; --since/--until are
# pushed down to the source with this margin and then applied exactly to ts_ms
PUSHDOWN_MARGIN_MS = 60_000


@dataclass(frozen=True)
class Source:
    bootstrap: str
    topic: str = "__coordinator_events"
    since_ms: int | None = None
    until_ms: int | None = None
    kafka_options: tuple[tuple[str, str], ...] = ()  # extra kafka.* settings (security, ...)


def spark_schema():  # -> StructType
    from pyspark.sql import types as T

    spark_types = {FieldType.STRING: T.StringType(), FieldType.INT: T.IntegerType(), FieldType.LONG: T.LongType()}
    fields = [T.StructField(f.name, spark_types[f.type], True) for f in schema.all_fields()]
    return T.StructType(fields + [T.StructField(CORRUPT, T.StringType(), True)])


def _reader_options(source: Source) -> dict[str, str]:
    options = {"kafka.bootstrap.servers": source.bootstrap, "subscribe": source.topic,
               "includeHeaders": "false", "failOnDataLoss": "false"}
    options.update(dict(source.kafka_options))
    return options


def read_batch(spark: "SparkSession", source: Source) -> "DataFrame":
    """Raw records (key, value, partition, offset, timestamp) of the topic within the time range."""
    options = _reader_options(source)
    if source.since_ms is not None:
        options["startingTimestamp"] = str(max(0, source.since_ms - PUSHDOWN_MARGIN_MS))
        options["startingOffsetsByTimestampStrategy"] = "latest"  # a partition with nothing that late: nothing
    else:
        options["startingOffsets"] = "earliest"
    if source.until_ms is not None:
        options["endingTimestamp"] = str(source.until_ms + PUSHDOWN_MARGIN_MS)
    else:
        options["endingOffsets"] = "latest"
    return spark.read.format("kafka").options(**options).load()


def read_stream(spark: "SparkSession", source: Source, starting: str = "latest") -> "DataFrame":
    options = _reader_options(source)
    if source.since_ms is not None:
        options["startingTimestamp"] = str(source.since_ms)
        options["startingOffsetsByTimestampStrategy"] = "latest"
    else:
        options["startingOffsets"] = starting
    return spark.readStream.format("kafka").options(**options).load()


def parse(raw: "DataFrame") -> "DataFrame":
    """One row per record: every schema field (null where absent), `problem` (null = a valid event), the
    record's partition/offset (a group's events are in one partition: offset order is write order) and
    `event_time` (ts_ms as a timestamp)."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string")
    parsed = raw.select(
        value.alias("_json"), "partition", "offset", F.col("timestamp").alias("kafka_timestamp"),
        F.from_json(value, spark_schema(), {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}).alias("e"),
        F.from_json(value, "map<string,string>").alias("_map"),
    )
    columns = [F.col(f"e.{f.name}").alias(f.name) for f in schema.all_fields()]
    with_fields = parsed.select("_json", "_map", "partition", "offset", "kafka_timestamp", F.col(f"e.{CORRUPT}")
                                .alias(CORRUPT), *columns)
    return (with_fields.withColumn("problem", problem_column())
            .withColumn("event_time", F.timestamp_millis(F.col("ts_ms")))
            .drop("_json", "_map", CORRUPT))


def problem_column() -> "Column":
    """`event_schema.problem_of` in Spark SQL, over the typed parse, the corrupt-record column and a string map
    of the object (for presence and for the version when typed parsing failed)."""
    from pyspark.sql import functions as F

    as_map = F.col("_map")
    version = F.col("version")  # a JSON integer only ("1" or 1.0 stay null); kept when other fields fail
    known_type = F.col("type").isin(list(schema.EVENT_FIELDS))
    missing = F.lit(False)
    for event_type, fields in schema.EVENT_FIELDS.items():
        absent = [_absent(field, as_map) for field in schema.COMMON_FIELDS + fields if field.required]
        any_absent = absent[0]
        for condition in absent[1:]:
            any_absent = any_absent | condition
        missing = missing | ((F.col("type") == event_type) & any_absent)
    return (F.when(F.col("_json").isNull() | as_map.isNull(), Problem.NOT_JSON.value)
            .when(version.isNull(), Problem.NO_VERSION.value)
            .when(version > schema.EVENT_SCHEMA_VERSION, Problem.FUTURE_VERSION.value)
            .when(~known_type | F.col("type").isNull(), Problem.UNKNOWN_TYPE.value)
            .when(missing, Problem.MISSING_FIELD.value)
            .when(F.col(CORRUPT).isNotNull(), Problem.BAD_TYPE.value))


def _absent(field: schema.Field, as_map: "Column") -> "Column":
    from pyspark.sql import functions as F

    if field.nullable:  # must be present, may be null: only the raw object can tell
        return ~F.map_contains_key(as_map, field.name)
    return F.col(field.name).isNull() & ~(F.map_contains_key(as_map, field.name) & as_map.getItem(field.name)
                                           .isNotNull())
