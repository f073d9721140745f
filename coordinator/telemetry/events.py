"""The event topic: one JSON record per group event, for analytics (schema: docs/state-topic.md, "Event topic").

`EventTopicObserver` is a `GroupObserver`; the coordinator calls it synchronously on the event loop, so it only
serializes and enqueues (librdkafka's `produce()` never waits: a full queue raises BufferError and the event is
dropped and counted). Delivery happens on librdkafka's threads; one poll thread counts failures. Nothing here
can block or fail a group operation: losing the event topic loses events, never availability.

While the event topic is unreachable, events wait in the producer's queue, which is bounded (at most
`event_queue_max_messages` events and `_QUEUE_MAX_KBYTES`): an outage shorter than `event_delivery_timeout_ms`
loses nothing. Past it, waiting events are dropped as lost (librdkafka's message timeout), and once the queue is
full new ones are dropped at once. Either kind of loss is logged once per burst, when it starts and when events
go through again (with the count), never per event; the totals are `dropped` and `failed`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable

from confluent_kafka import KafkaError, Producer

from coordinator.group.observer import ConsumerRebalance, GroupObserver, RebalanceCategory, RebalanceCause
from coordinator.security.clusters import secured
from coordinator.security.identity import current_identity
from coordinator.storage.config import EVENT_LINGER_MS, StorageConfig
from coordinator.telemetry.event_schema import EVENT_SCHEMA_VERSION, new_event  # noqa: F401 (the version: re-exported)
from coordinator.timer.clock import Clock, WallClock
from coordinator.storage.kafka_logs import kafka_reachable, librdkafka_logger
from coordinator.storage.topics import ensure_event_topic, make_admin

log = logging.getLogger("coordinator.telemetry.events")

_POLL_INTERVAL_S = 0.1
CONSUMER = "consumer"  # the `protocol` of a consumer group's events
# A bound on the queue's memory too: events are small (~300 bytes), but their ids come from clients.
_QUEUE_MAX_KBYTES = 65_536


class _Losses:
    """Events lost for one reason, counted, and logged once per burst: a WARNING at the first loss, and one when
    events go through again that says how many the burst lost. Each instance is used by one thread only."""

    __slots__ = ("topic", "event", "total", "_burst", "_burst_started", "quiet")

    def __init__(self, topic: str, event: str) -> None:
        self.topic = topic
        self.event = event
        self.total = 0
        self._burst = 0
        self._burst_started = 0.0
        self.quiet = False  # closing: still counted, no longer logged (the close reports them)

    def lost(self, error: object, detail: str) -> None:
        self.total += 1
        self._burst += 1
        if self._burst == 1 and not self.quiet:
            self._burst_started = time.monotonic()
            log.warning("event=%s topic=%s error=%s %s (further losses are counted, and logged when events go "
                        "through again)", self.event, self.topic, error, detail)

    def through(self) -> None:
        """An event went through: ends the burst, if any."""
        if self._burst:
            if not self.quiet:
                log.warning("event=%s_ended topic=%s lost=%d burst_ms=%d lost_total=%d", self.event, self.topic,
                            self._burst, (time.monotonic() - self._burst_started) * 1000, self.total)
            self._burst = 0


class _DeliveryCounts:
    """Delivery reports of the event producer (its poll thread)."""

    __slots__ = ("delivered", "failures", "timeout_ms")

    def __init__(self, topic: str, timeout_ms: int) -> None:
        self.delivered = 0
        self.failures = _Losses(topic, "group_events_lost")
        self.timeout_ms = timeout_ms

    def on_delivery(self, error: KafkaError | None, _message: object) -> None:
        if error is None:
            self.delivered += 1
            self.failures.through()
            kafka_reachable()
            return
        self.failures.lost(error, f"reason=not_delivered delivery_timeout_ms={self.timeout_ms}")


class EventPublisher:
    """Fire-and-forget JSON records to one topic, keyed by group id, through its own producer and poll thread."""

    def __init__(self, config: StorageConfig) -> None:
        assert config.event_topic is not None
        self.topic = config.event_topic
        self._drops = _Losses(self.topic, "group_events_dropped")  # queue full or produce refused (loop thread)
        self._queue_max = config.event_queue_max_messages
        self._accepted = 0  # taken by the producer (loop thread)
        # the client's callback must not reference self: no cycle
        self._reports = _DeliveryCounts(self.topic, config.event_delivery_timeout_ms)
        self._producer: Producer | None = Producer(secured({
            "bootstrap.servers": config.bootstrap,
            "client.id": f"{config.client_id}-events",
            "acks": 1,
            "linger.ms": EVENT_LINGER_MS,
            "partitioner": "murmur2_random",  # the Java client's key → partition mapping
            "queue.buffering.max.messages": config.event_queue_max_messages,
            "queue.buffering.max.kbytes": _QUEUE_MAX_KBYTES,
            "message.timeout.ms": config.event_delivery_timeout_ms,
            "on_delivery": self._reports.on_delivery,
            "logger": librdkafka_logger("events"),
        }))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll_loop, name="event-producer-poll", daemon=True)
        self._thread.start()

    def publish(self, group_id: str, event: dict[str, Any]) -> None:
        if self._producer is None:
            self._drops.total += 1  # closed: nothing to report any more
            return
        try:
            self._producer.produce(self.topic, key=group_id.encode(), value=json.dumps(event).encode())
        except Exception as exc:  # BufferError (queue full) or KafkaException: drop, never raise
            self._drops.lost(exc, f"reason=queue_full_or_refused queue_max_messages={self._queue_max}")
        else:
            self._accepted += 1
            self._drops.through()

    @property
    def dropped(self) -> int:
        """Events refused at once: the queue was full (or the producer closed)."""
        return self._drops.total

    @property
    def delivered(self) -> int:
        return self._reports.delivered

    @property
    def failed(self) -> int:
        """Events accepted, then given up: not acknowledged within the delivery timeout (or purged at close)."""
        return self._reports.failures.total

    @property
    def queued(self) -> int:
        """Events waiting for the event topic: accepted, and neither delivered nor given up yet (any thread)."""
        return max(0, self._accepted - self.delivered - self.failed)

    def _poll_loop(self) -> None:
        producer = self._producer
        while not self._stop.is_set() and producer is not None:
            producer.poll(_POLL_INTERVAL_S)

    def close_blocking(self, timeout_ms: int = 2_000) -> None:
        """Stop polling, give queued events a short chance and destroy the client; call from a worker thread."""
        self._stop.set()
        self._thread.join()
        producer, self._producer = self._producer, None
        if producer is None:
            return
        remaining = producer.flush(timeout_ms / 1000)
        if remaining:
            self._reports.failures.quiet = True  # the purged events are counted as failed, reported below
            log.warning("event=group_events_unsent topic=%s count=%d", self.topic, remaining)
            producer.purge()
            producer.flush(0)
        log.info("event=event_publisher_closed topic=%s delivered=%d failed=%d dropped=%d", self.topic,
                 self.delivered, self.failed, self.dropped)
        producer.close()  # destroyed on this thread, never by the cyclic GC (see topics.py)


class EventTopicObserver(GroupObserver):
    """Turns coordinator callbacks into versioned JSON events; `trace_id_for(group_id)` adds the rebalance's
    trace id when tracing is on."""

    def __init__(self, publisher: EventPublisher, wall_clock: Clock | None = None,
                 trace_id_for: Callable[[str], str | None] | None = None,
                 include_offset_commits: bool = False) -> None:
        self.publisher = publisher
        self.clock = wall_clock or WallClock()  # epoch milliseconds, never the monotonic coordinator clock
        self.trace_id_for = trace_id_for
        self.include_offset_commits = include_offset_commits

    def _emit(self, event_type: str, group_id: str, **fields: Any) -> None:
        if event_type == "member_joined":  # emitted on the joining member's own request, whichever protocol
            identity = current_identity()  # (coordinator/security/identity)
            if identity is not None:
                fields.update(principal=identity.principal, security_protocol=identity.security_protocol)
        event = new_event(event_type, group_id, self.clock.now_ms(), **fields)
        if self.trace_id_for is not None:
            trace_id = self.trace_id_for(group_id)
            if trace_id:
                event["trace_id"] = trace_id
        self.publisher.publish(group_id, event)

    def on_state_change(self, group_id: str, old_state: str, new_state: str, generation: int) -> None:
        self._emit("state_change", group_id, old_state=str(old_state), new_state=str(new_state),
                   generation=generation)

    def on_member_joined(self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
                         client_host: str) -> None:
        self._emit("member_joined", group_id, member_id=member_id, group_instance_id=group_instance_id,
                   client_id=client_id, client_host=client_host)

    def on_member_replaced(self, group_id: str, old_member_id: str, new_member_id: str,
                           group_instance_id: str) -> None:
        self._emit("member_replaced", group_id, old_member_id=old_member_id, new_member_id=new_member_id,
                   group_instance_id=group_instance_id)

    def on_member_left(self, group_id: str, member_id: str, group_instance_id: str | None, reason: str) -> None:
        self._emit("member_left", group_id, member_id=member_id, group_instance_id=group_instance_id,
                   reason=reason)

    def on_member_failed(self, group_id: str, member_id: str, group_instance_id: str | None, reason: str) -> None:
        self._emit("member_failed", group_id, member_id=member_id, group_instance_id=group_instance_id,
                   reason=reason)

    def on_rebalance_started(self, group_id: str, generation: int, cause: RebalanceCause) -> None:
        self._emit("rebalance_started", group_id, generation=generation, reason=cause.text,
                   cause_category=cause.category.value)

    def on_rebalance_completed(self, group_id: str, generation: int, member_count: int, duration_ms: int) -> None:
        self._emit("rebalance_completed", group_id, generation=generation, member_count=member_count,
                   duration_ms=duration_ms)

    # --- consumer groups: the same event types, with protocol "consumer" ---------------------------------------
    def on_consumer_member_joined(self, group_id: str, member_id: str, group_instance_id: str | None,
                                  client_id: str, client_host: str, protocol: str) -> None:
        self._emit("member_joined", group_id, protocol=CONSUMER, member_id=member_id,
                   group_instance_id=group_instance_id, client_id=client_id, client_host=client_host)

    def on_consumer_member_replaced(self, group_id: str, old_member_id: str, new_member_id: str,
                                    group_instance_id: str) -> None:
        self._emit("member_replaced", group_id, protocol=CONSUMER, old_member_id=old_member_id,
                   new_member_id=new_member_id, group_instance_id=group_instance_id)

    def on_consumer_member_left(self, group_id: str, member_id: str, group_instance_id: str | None,
                                reason: str) -> None:
        self._emit("member_left", group_id, protocol=CONSUMER, member_id=member_id,
                   group_instance_id=group_instance_id, reason=reason)

    def on_consumer_member_failed(self, group_id: str, member_id: str, group_instance_id: str | None,
                                  reason: str, category: RebalanceCategory) -> None:
        self._emit("member_failed", group_id, protocol=CONSUMER, member_id=member_id,
                   group_instance_id=group_instance_id, reason=reason)

    def on_consumer_rebalance_started(self, group_id: str, rebalance: ConsumerRebalance) -> None:
        self._emit("rebalance_started", group_id, protocol=CONSUMER, generation=rebalance.previous_epoch,
                   reason=rebalance.cause.text, cause_category=rebalance.cause.category.value)

    def on_consumer_rebalance_completed(self, group_id: str, group_epoch: int, member_count: int,
                                        duration_ms: int | None) -> None:
        # duration_ms None: resumed after a load (a failover, a restart), its start not known here; the
        # completion still closes the rebalance the previous owner's rebalance_started opened
        self._emit("rebalance_completed", group_id, protocol=CONSUMER, generation=group_epoch,
                   member_count=member_count, duration_ms=duration_ms)

    def on_offsets_committed(self, group_id: str, member_id: str, partition_count: int) -> None:
        if self.include_offset_commits:
            self._emit("offsets_committed", group_id, member_id=member_id, partition_count=partition_count)

    def on_offsets_expired(self, group_id: str, partition_count: int) -> None:
        self._emit("offsets_expired", group_id, partition_count=partition_count)

    def on_offsets_deleted(self, group_id: str, partition_count: int) -> None:
        self._emit("offsets_deleted", group_id, partition_count=partition_count)

    def on_group_deleted(self, group_id: str, partition_count: int) -> None:
        self._emit("group_deleted", group_id, partition_count=partition_count)

    # --- clients' transactions: their offsets pending, then committed or aborted by the marker -------------------
    def on_txn_offsets_pending(self, group_id: str, transactional_id: str, producer_id: int, producer_epoch: int,
                               partition_count: int) -> None:
        self._emit("txn_offsets_pending", group_id, transactional_id=transactional_id, producer_id=producer_id,
                   producer_epoch=producer_epoch, partition_count=partition_count, outcome="pending")

    def on_txn_group_offsets_settled(self, group_id: str, transactional_id: str | None, producer_id: int,
                                     producer_epoch: int, committed: bool, partition_count: int,
                                     first_pending_ms: int | None) -> None:
        outcome = "committed" if committed else "aborted"
        now_ms = self.clock.now_ms()
        self._emit(f"txn_offsets_{outcome}", group_id, transactional_id=transactional_id, producer_id=producer_id,
                   producer_epoch=producer_epoch, partition_count=partition_count, outcome=outcome,
                   duration_ms=None if first_pending_ms is None else max(0, now_ms - first_pending_ms))


async def start_event_publisher(config: StorageConfig) -> EventPublisher | None:
    """Create or verify the event topic and start its producer (None when the event topic is off). The topic is
    optional: if it cannot be made, the publisher still starts (events wait or are dropped, groups lose
    nothing). Close it with `close_blocking` (in a thread) before the state store closes."""
    if config.event_topic is None:
        return None
    admin = make_admin(config)
    try:
        await ensure_event_topic(admin, config)
    except Exception as exc:
        log.warning("event=event_topic_unavailable topic=%s error=%s", config.event_topic, exc)
    finally:
        admin.release()
    return EventPublisher(config)
