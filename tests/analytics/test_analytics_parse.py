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


def test_consumer_group_events_make_rebalances_as_classic_ones_do(spark: Any) -> None:
    """A consumer group's (KIP-848) events: `protocol` parsed, a bump superseded by the next one's fence is one
    rebalance with two triggers, its category from the first cause, its end the epoch every member reached."""
    from analytics.tables import TimeRange, rebalances

    consumer = {"protocol": "consumer"}
    events = [
        new_event("member_joined", "cg", 1_000, member_id="b", group_instance_id=None, client_id="c",
                  client_host="/h", **consumer),
        new_event("rebalance_started", "cg", 1_000, generation=1, cause_category="member_joined",
                  reason="Member b joins the consumer group using the consumer protocol.", **consumer),
        new_event("member_failed", "cg", 1_200, member_id="a", group_instance_id=None, **consumer,
                  reason="Member a fenced from the group because it failed to transition from epoch 1 within 300ms."),
        new_event("rebalance_started", "cg", 1_200, generation=2, cause_category="rebalance_timeout",
                  reason="Member a fenced from the group because it failed to transition from epoch 1 within 300ms.",
                  **consumer),
        new_event("rebalance_completed", "cg", 1_500, generation=3, member_count=1, duration_ms=300, **consumer),
        new_event("rebalance_started", "cg", 2_000, generation=3, cause_category="subscription_changed",
                  reason="Member b updated its subscribed topics to: [t1, t2].", **consumer),
        new_event("rebalance_completed", "cg", 2_100, generation=4, member_count=1, duration_ms=100, **consumer),
    ]
    assert all(problem_of(event) is None for event in events)
    moment = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    frame = spark.createDataFrame([(json.dumps(e).encode(), 0, offset, moment) for offset, e in enumerate(events)],
                                  "value binary, partition int, offset long, timestamp timestamp")
    parsed = parse(frame)
    assert {row["protocol"] for row in parsed.select("protocol").collect()} == {"consumer"}
    rows = sorted(rebalances(parsed.filter("problem is null"), TimeRange(0, 3_000)).collect(),
                  key=lambda row: row["episode"])
    assert [(r["status"], r["triggers"], r["reason_category"], r["from_generation"], r["generation"],
             r["duration_ms"]) for r in rows] == [("completed", 2, "member_joined", 1, 3, 300),
                                                  ("completed", 1, "subscription_changed", 3, 4, 100)]
