"""The event topic: observer callbacks become versioned JSON records keyed by group id; an unreachable broker
never blocks or fails the caller."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from coordinator.group.observer import RebalanceCategory, RebalanceCause
from coordinator.storage.config import StorageConfig
from coordinator.telemetry.events import EVENT_SCHEMA_VERSION, EventPublisher, EventTopicObserver, start_event_publisher
from coordinator.storage.topics import make_admin, partition_count
from coordinator.timer.clock import ManualClock
from tests.support.machine import timed_span

pytestmark = pytest.mark.integration


def read_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[tuple[str, dict]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found: list[tuple[str, dict]] = []
    deadline = time.monotonic() + 30
    try:
        while len(found) < expected and time.monotonic() < deadline:
            for message in consumer.consume(100, 0.5):
                if message.error() is None:
                    found.append((message.key().decode(), json.loads(message.value())))
    finally:
        consumer.close()
    return found


async def test_observer_events_land_in_the_event_topic_as_versioned_json(kafka_bootstrap: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    config = StorageConfig(bootstrap=kafka_bootstrap, state_topic=f"__state-{suffix}", partitions=2,
                           event_topic=f"__events-{suffix}", event_partitions=3)
    publisher = await start_event_publisher(config)
    assert publisher is not None
    observer = EventTopicObserver(publisher, ManualClock(1_700_000_000_000), trace_id_for=lambda g: "ab" * 16)
    try:
        observer.on_rebalance_started("g1", 4, RebalanceCause(RebalanceCategory.MEMBER_JOINED,
                                                              "Adding new member m-2"))
        observer.on_member_joined("g1", "m-2", None, "client-2", "/127.0.0.1")
        observer.on_state_change("g1", "PreparingRebalance", "CompletingRebalance", 5)
        observer.on_rebalance_completed("g1", 5, 2, 3_012)
        observer.on_member_failed("g2", "m-9", "static-9", "session timeout")
        observer.on_member_left("g2", "m-8", None, "the consumer is being closed")
        observer.on_offsets_committed("g2", "m-8", 3)  # not published by default (volume)
    finally:
        await asyncio.to_thread(publisher.close_blocking)  # flushes queued events
    admin = make_admin(config)
    try:
        assert await partition_count(admin, config.event_topic) == 3
    finally:
        admin.release()

    events = read_all(kafka_bootstrap, config.event_topic, 3, expected=6)
    by_type = {event["type"]: (key, event) for key, event in events}
    assert len(events) == 6 and "offsets_committed" not in by_type
    assert all(event["version"] == EVENT_SCHEMA_VERSION and event["ts_ms"] == 1_700_000_000_000
               and event["trace_id"] == "ab" * 16 and key == event["group_id"] for key, event in events)
    assert by_type["rebalance_completed"][1] == {
        "version": 1, "type": "rebalance_completed", "group_id": "g1", "ts_ms": 1_700_000_000_000,
        "generation": 5, "member_count": 2, "duration_ms": 3_012, "trace_id": "ab" * 16}
    assert by_type["member_failed"][1]["reason"] == "session timeout"
    assert by_type["member_failed"][1]["group_instance_id"] == "static-9"
    assert by_type["state_change"][1]["new_state"] == "CompletingRebalance"
    # events of one group keep their order (same key → same partition)
    assert [e["type"] for k, e in events if k == "g1"] == [
        "rebalance_started", "member_joined", "state_change", "rebalance_completed"]


async def test_default_event_time_is_epoch_milliseconds(kafka_bootstrap: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    config = StorageConfig(bootstrap=kafka_bootstrap, state_topic=f"__state-{suffix}", partitions=1,
                           event_topic=f"__events-{suffix}", event_partitions=1)
    publisher = await start_event_publisher(config)
    assert publisher is not None
    before_ms = time.time_ns() // 1_000_000
    try:
        EventTopicObserver(publisher).on_offsets_expired("g", 2)
    finally:
        await asyncio.to_thread(publisher.close_blocking)
    [(key, event)] = read_all(kafka_bootstrap, config.event_topic, 1, expected=1)
    assert before_ms <= event["ts_ms"] <= time.time_ns() // 1_000_000
    assert event["type"] == "offsets_expired" and event["partition_count"] == 2 and "trace_id" not in event


async def test_unreachable_event_broker_never_blocks_or_raises() -> None:
    config = StorageConfig(bootstrap="127.0.0.1:1", event_topic="__events-nowhere", event_queue_max_messages=1_000)
    publisher = EventPublisher(config)
    observer = EventTopicObserver(publisher)
    with timed_span() as publishing:
        for i in range(5_000):
            observer.on_member_joined("g", f"m-{i}", None, "c", "/127.0.0.1")
    await asyncio.to_thread(publisher.close_blocking, 100)
    assert publishing.own_s < 2.0, publishing  # what the machine took (waiting for a CPU) aside
    assert publisher.dropped == 4_000  # the queue holds 1,000; the rest is dropped, not waited for
