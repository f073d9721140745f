"""Exact expiry times from our coordinator's event topic (`member_failed` events, stamped by the coordinator
with wall-clock ms), for detection lateness = expiry − last heartbeat − session timeout.

A coordinator without an event topic (Kafka's own) cannot be asked; the simulation then reports detection
from the members' side only (UNKNOWN_MEMBER_ID on return) and no lateness.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import defaultdict

from confluent_kafka import Consumer, TopicPartition


class ExpiryWatcher:
    """Reads the event topic from its end on a thread; collects member_failed times of the given groups."""

    def __init__(self, bootstrap: str, topic: str, group_ids: set[str], *,
                 settings: dict[str, str] | None = None) -> None:
        """`settings`: the consumer's security (librdkafka names)."""
        self.topic = topic
        self._group_ids = group_ids
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"simulate-{uuid.uuid4().hex[:8]}",
                                   "enable.auto.commit": False, "log_level": 3, **(settings or {})})
        self._expiries: dict[tuple[str, str], list[int]] = defaultdict(list)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="expiry-watcher", daemon=True)

    def start(self, timeout_s: float = 30) -> None:
        """Blocking: positions at the end of every partition before returning (so nothing later is missed)."""
        metadata = self._consumer.list_topics(self.topic, timeout=timeout_s)
        partitions = metadata.topics[self.topic].partitions
        if metadata.topics[self.topic].error is not None or not partitions:
            raise RuntimeError(f"event topic {self.topic!r} not found: {metadata.topics[self.topic].error}")
        assigned = []
        for partition in partitions:  # from each partition's end as of now, resolved before returning
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=timeout_s)
            assigned.append(TopicPartition(self.topic, partition, high))
        self._consumer.assign(assigned)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            try:
                event = json.loads(message.value() or b"")  # a null value is no event (ValueError)
            except (ValueError, TypeError):
                continue
            if event.get("type") == "member_failed" and event.get("group_id") in self._group_ids:
                with self._lock:
                    self._expiries[(event["group_id"], event.get("member_id", ""))].append(int(event["ts_ms"]))

    def expiries(self) -> dict[tuple[str, str], list[int]]:
        with self._lock:
            return {key: list(times) for key, times in self._expiries.items()}

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._consumer.close()
