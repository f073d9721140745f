"""The event topic unreachable for longer than the delivery timeout, against a real broker whose JVM is stopped
(SIGSTOP) and continued: the producer's queue stays bounded (events beyond it are refused at once), waiting events
are given up after the timeout, each kind of loss is logged once for the burst (not per event) and once more with
its count when events go through again, the metrics count them by outcome, and events published after the outage
arrive."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from coordinator.embedded import EmbeddedKafka
from coordinator.storage.config import StorageConfig
from coordinator.storage.topics import ensure_event_topic, make_admin
from coordinator.telemetry.events import EventPublisher
from coordinator.telemetry.metrics import MetricsObserver
from coordinator.telemetry.otel import start_telemetry
from tests.support.machine import timed_span
from tests.support.polling import wait_until

LOGGER = "coordinator.telemetry.events"
TIMEOUT_MS = 3_000
QUEUE = 20  # events the producer holds
EXTRA = 7  # published on a full queue: refused at once
AFTER = 5
WAIT_S = 90  # bounded waits for a loaded machine; the assertions are on counts, not on durations


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.message for r in caplog.records if r.name == LOGGER and r.message.startswith(f"event={event} ")]


def exported(publisher: EventPublisher) -> dict[str, int]:
    """The publisher's figures as the metrics export them (coordinator.events by outcome, coordinator.events.queued)."""
    reader = InMemoryMetricReader()
    telemetry = start_telemetry(env={}, metric_readers=[reader])
    try:
        MetricsObserver(telemetry.meter_provider.get_meter("test")).watch_events(publisher)
        data = reader.get_metrics_data()
    finally:
        telemetry.shutdown()
    points = {m.name: m.data.data_points for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics}
    figures = {p.attributes["outcome"]: p.value for p in points["coordinator.events"]}
    [queued] = points["coordinator.events.queued"]
    return {**figures, "queued": queued.value}


def read_back(bootstrap: str, topic: str, until_seen: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while not until_seen(events) and time.monotonic() < deadline:
            for message in consumer.consume(100, 0.5):
                if message.error() is None:
                    events.append(json.loads(message.value()))
    finally:
        consumer.close()
    return events


async def test_an_outage_past_the_delivery_timeout_loses_a_bounded_burst_logged_once(
        restartable_kafka: EmbeddedKafka, caplog: pytest.LogCaptureFixture) -> None:
    config = StorageConfig(bootstrap=restartable_kafka.bootstrap, event_topic=f"__events-{uuid.uuid4().hex[:8]}",
                           event_partitions=1, event_delivery_timeout_ms=TIMEOUT_MS, event_queue_max_messages=QUEUE)
    admin = make_admin(config)
    try:
        await ensure_event_topic(admin, config)
    finally:
        admin.release()
    caplog.set_level(logging.INFO, logger=LOGGER)
    publisher = EventPublisher(config)
    try:
        publisher.publish("g", {"n": "before"})
        await wait_until(lambda: publisher.delivered == 1, WAIT_S, "the first event delivered")

        pid = restartable_kafka.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with timed_span() as publishing:
                for i in range(QUEUE + EXTRA):
                    publisher.publish("g", {"n": f"during-{i}"})
            assert publishing.own_s < 2.0, publishing  # never waits for Kafka (what the machine took aside)
            assert publisher.dropped == EXTRA  # the queue holds QUEUE events; the rest is refused at once
            assert exported(publisher) == {"delivered": 1, "failed": 0, "dropped": EXTRA, "queued": QUEUE}
            assert len(lines(caplog, "group_events_dropped")) == 1

            await wait_until(lambda: publisher.failed == QUEUE, WAIT_S, "the queued events given up")
            assert time.monotonic() - started >= TIMEOUT_MS / 1000 - 0.2  # not before their timeout
            [lost] = lines(caplog, "group_events_lost")  # one line for the burst, not one per event
            assert f"delivery_timeout_ms={TIMEOUT_MS}" in lost and config.event_topic in lost
            assert publisher.delivered == 1
        finally:
            os.kill(pid, signal.SIGCONT)

        for i in range(AFTER):
            publisher.publish("g", {"n": f"after-{i}"})
        await wait_until(lambda: publisher.delivered == 1 + AFTER, WAIT_S, "the events after the outage delivered")
        [lost_ended] = lines(caplog, "group_events_lost_ended")
        assert f" lost={QUEUE} " in lost_ended and f"lost_total={QUEUE}" in lost_ended
        [dropped_ended] = lines(caplog, "group_events_dropped_ended")
        assert f" lost={EXTRA} " in dropped_ended
        assert len(lines(caplog, "group_events_lost")) == 1 and len(lines(caplog, "group_events_dropped")) == 1
        assert (publisher.failed, publisher.dropped) == (QUEUE, EXTRA)
        assert exported(publisher) == {"delivered": 1 + AFTER, "failed": QUEUE, "dropped": EXTRA, "queued": 0}
    finally:
        await asyncio.to_thread(publisher.close_blocking)
    [closed] = lines(caplog, "event_publisher_closed")
    assert f"delivered={1 + AFTER} failed={QUEUE} dropped={EXTRA}" in closed

    after = [f"after-{i}" for i in range(AFTER)]
    events = await asyncio.to_thread(read_back, restartable_kafka.bootstrap, config.event_topic,
                                     lambda seen: after[-1] in [e["n"] for e in seen])
    seen = [e["n"] for e in events]
    assert seen[0] == "before" and [n for n in seen if n.startswith("after-")] == after, seen
    # refused events never reach the topic (a given-up one may: the broker can still write what it had read)
    assert not {f"during-{i}" for i in range(QUEUE, QUEUE + EXTRA)} & set(seen), seen
