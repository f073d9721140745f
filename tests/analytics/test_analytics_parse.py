"""The job's Spark SQL validity check agrees with the schema module's `problem_of` record for record, and the
connector jars match the pinned pyspark without duplicating its own jars."""

from __future__ import annotations

import datetime as dt
import json
import re
import tomllib
from pathlib import Path
from typing import Any

from analytics.events import parse
from coordinator.embedded import ensure_spark_kafka_jars
from coordinator.embedded.jars import SPARK_KAFKA_JARS
from coordinator.telemetry.event_schema import new_event, problem_of

ROOT = Path(__file__).resolve().parents[2]


def corpus() -> list[bytes | None]:
    base = new_event("rebalance_completed", "g", 1_700_000_000_000, generation=3, member_count=2, duration_ms=9)

    def variant(**changes: Any) -> bytes:
        event = {**base, **changes}
        return json.dumps({k: v for k, v in event.items() if v != "<drop>"}).encode()

    return [
        variant(), variant(trace_id="ab" * 16), variant(trace_id=None), variant(added_later=[1, 2]),
        variant(version="<drop>"), variant(version="1"), variant(version=True), variant(version=2),
        variant(version=2, generation="not even an int"), variant(type="shiny_new_event"), variant(type="<drop>"),
        variant(duration_ms="<drop>"), variant(duration_ms=None), variant(generation="3"),
        variant(generation=2 ** 31), variant(ts_ms=1.5), variant(group_id="<drop>"),
        json.dumps(new_event("member_failed", "g", 1, member_id="m", group_instance_id=None, reason="r")).encode(),
        json.dumps(new_event("member_failed", "g", 1, member_id="m", reason="r")).encode(),
        json.dumps(new_event("member_joined", "g", 1, member_id="m", group_instance_id="i", client_id="c",
                             client_host="/h")).encode(),
        b"not json", b"[1, 2]", b'"text"', b"{", b"\xff\xfe", None, b"",
    ]


def python_problem(value: bytes | None) -> str | None:
    try:
        decoded = json.loads(value) if value is not None else None
    except ValueError:
        decoded = None
    problem = problem_of(decoded)
    return None if problem is None else problem.value


def test_spark_and_the_schema_module_judge_every_record_alike(spark: Any) -> None:
    values = corpus()
    moment = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    frame = spark.createDataFrame([(value, 0, offset, moment) for offset, value in enumerate(values)],
                                  "value binary, partition int, offset long, timestamp timestamp")
    judged = {row["offset"]: row["problem"] for row in parse(frame).select("offset", "problem").collect()}
    assert [judged[i] for i in range(len(values))] == [python_problem(v) for v in values]


def test_connector_jars_match_the_pinned_pyspark() -> None:
    import pyspark

    pin = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
               ["spark"] if d.startswith("pyspark"))
    assert pin == f"pyspark=={SPARK_KAFKA_JARS.version()}" == f"pyspark=={pyspark.__version__}"
    jars = {path.name for path in ensure_spark_kafka_jars()}
    assert {re.sub(r"-[0-9][^-]*\.jar$", "", name) for name in jars} == {
        "spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients", "commons-pool2"}
    bundled = {re.sub(r"-[0-9][^-]*\.jar$", "", p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert not {re.sub(r"-[0-9][^-]*\.jar$", "", name) for name in jars} & bundled  # pyspark's own stay out


def test_the_reason_category_comes_from_the_cause_when_the_event_has_one(spark: Any) -> None:
    from pyspark.sql import functions as F

    from analytics.tables import reason_category

    misleading = "Removing member m-1 on LeaveGroup; client reason: Adding new member"
    rows = [(misleading, "member_left"), ("Adding new member m-2; client reason: left on LeaveGroup", "member_joined"),
            ("Updating metadata for member m-1 during Stable; client reason: x", "metadata_changed"),
            ("removing member m-3 on heartbeat expiration", None),
            ("Adding new member m-4", "a_category_from_a_newer_writer")]
    frame = spark.createDataFrame(rows, "reason string, cause_category string")
    found = [row[0] for row in frame.select(reason_category(F.col("reason"), F.col("cause_category"))).collect()]
    assert found == ["member_left", "member_joined", "member_metadata_changed", "session_timeout", "other"]
