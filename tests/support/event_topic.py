"""Reading the event topic back with a real consumer."""
from __future__ import annotations

import json
import time
from typing import Any

from confluent_kafka import Consumer

from tests.support.service import unique


def read_events(bootstrap: str, topic: str, group_id: str, until: Any, timeout_s: float = 20) -> list[dict[str, Any]]:
    """Every event of `group_id` from the beginning of the topic, until `until(events)` holds (or the timeout)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("e2e-reader"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    events: list[dict[str, Any]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not until(events):
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            event = json.loads(message.value())
            assert message.key() == event["group_id"].encode()  # keyed by group: one group's events stay in order
            if event["group_id"] == group_id:
                events.append(event)
    finally:
        consumer.close()
    return events
