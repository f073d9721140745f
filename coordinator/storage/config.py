"""Settings of the Kafka-backed store: where the state and event topics live and how they are written."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.rewrite_backoff import FIRST_RETRY_MS

DEFAULT_STATE_TOPIC = "__coordinator_state"
DEFAULT_EVENT_TOPIC = "__coordinator_events"
# How long an event may wait for the event topic (queued, or sent and not yet acknowledged) before it is dropped
# and counted as lost (librdkafka's message.timeout.ms, the Java producer's delivery.timeout.ms): an outage of
# Kafka shorter than this loses no event. 0: no time limit (only the queue bound drops events).
DEFAULT_EVENT_DELIVERY_TIMEOUT_MS = 30_000
DEFAULT_EVENT_QUEUE_MAX_MESSAGES = 100_000
EVENT_LINGER_MS = 50  # the event producer batches this long; a delivery timeout must exceed it (librdkafka)


STATE_WRITERS = ("librdkafka", "native")
DEFAULT_MARKERS_SETTLE_MS = 0.0  # off: not shown better in the loaded races of 2026-11-29 (docs/performance.md)


@dataclass(frozen=True)
class StorageConfig:
    bootstrap: str
    state_topic: str = DEFAULT_STATE_TOPIC
    # Kafka's offsets.topic.num.partitions; must never change after deployment (partition_for depends on it).
    partitions: int = 50
    replication_factor: int | None = None  # None: min(3, number of brokers)
    segment_bytes: int = 104_857_600  # offsets.topic.segment.bytes
    commit_timeout_ms: int = 5_000  # offsets.commit.timeout.ms: how long a SyncGroup/OffsetCommit write may take
    # Largest write sent as one record batch (librdkafka's message.max.bytes default; Kafka's max.message.bytes
    # is 1048588). A bigger write would span produce requests and could be stored in part: it is refused.
    max_write_bytes: int = 1_000_000
    tombstone_retry_ms: int = FIRST_RETRY_MS  # a failed tombstone is sent again after this, then backing off
    linger_ms: int = 5  # batches writes from many groups (Kafka's new coordinator: append.linger.ms 10)
    topic_configs: dict[str, str] = field(default_factory=dict)  # extra state-topic configs (tests: segment.ms)
    event_topic: str | None = DEFAULT_EVENT_TOPIC  # None: no event topic
    event_partitions: int = 10
    # Events held while Kafka is slow or away: beyond this many the newest are dropped, never waited for.
    event_queue_max_messages: int = DEFAULT_EVENT_QUEUE_MAX_MESSAGES
    event_delivery_timeout_ms: int = DEFAULT_EVENT_DELIVERY_TIMEOUT_MS
    admin_timeout_ms: int = 30_000
    client_id: str = "group-coordinator"
    # Writes inside transactions (all or nothing, see transactions.py) under this transactional.id; None: the
    # idempotent producer, whose writes may be stored in part when librdkafka splits a batch.
    transactional_id: str | None = None
    transactional_producers: int = 4  # transactions in flight at once (each producer owns partition % count)
    # How long start waits for the transactional ids' producer ids once the cluster answered (a fresh cluster
    # creates and loads __transaction_state first: NOT_COORDINATOR meanwhile), as a Kafka client's initTransactions
    # is retried; said every attempt (transactions.py)
    transactions_init_timeout_ms: int = 120_000
    # Several instances share the state topic: one transactional producer per owned partition, id
    # f"{transactional_id}-p{partition}", created by load (fencing the previous owner), closed by unload.
    partition_fencing: bool = False
    # Which client runs the transactions: "librdkafka" (transactions.py, confluent-kafka) or "native" (our own
    # asyncio client, native_transactions.py: CONCURRENT_TRANSACTIONS retried after 1 ms, not librdkafka's 20 ms)
    state_writer: str = "librdkafka"
    # librdkafka's writer: a transaction that would begin within this of the last commit's outcome is held on a loop
    # timer until then, writes queued meanwhile joining it, so that its AddPartitionsToTxn does not meet Kafka still
    # writing the last one's markers (CONCURRENT_TRANSACTIONS, which librdkafka retries only after a fixed 20 ms);
    # 0: never held (transaction_queue.py `_begin_or_hold`). In the reconciliation traces of 2026-11-29
    # (docs/performance.md) transactions begun within 1 ms of the last commit's outcome were refused 39 times in 265,
    # within 1-2 ms once in 12, later never (of 167); a hold of 1.5 ms (on uvloop's whole-millisecond timers 1.0-2.1
    # ms) cut the refusals from 0.08 to 0.03 per transaction at 1,000 members, but what it costs every held
    # transaction was not shown smaller than what it saves: off by default.
    markers_settle_ms: float = DEFAULT_MARKERS_SETTLE_MS

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError("state topic partitions must be at least 1")
        if self.replication_factor is not None and self.replication_factor < 1:
            raise ValueError("replication factor must be at least 1")
        if self.tombstone_retry_ms < 1:
            raise ValueError("tombstone_retry_ms must be positive")
        if self.commit_timeout_ms < 1:
            raise ValueError("commit_timeout_ms must be positive")
        if self.event_queue_max_messages < 1:
            raise ValueError("the event queue must hold at least 1 event")
        if self.event_delivery_timeout_ms < 0 or 0 < self.event_delivery_timeout_ms <= EVENT_LINGER_MS:
            raise ValueError(f"the event delivery timeout must be 0 (none) or more than the event producer's "
                             f"linger of {EVENT_LINGER_MS} ms, got {self.event_delivery_timeout_ms}")
        if not 0 <= self.markers_settle_ms <= 100:
            raise ValueError(f"markers_settle_ms must be within 0-100, got {self.markers_settle_ms}")
        if self.state_writer not in STATE_WRITERS:
            raise ValueError(f"state_writer must be one of {', '.join(STATE_WRITERS)}, got {self.state_writer!r}")
        if self.partition_fencing and self.transactional_id is None:
            raise ValueError("partition_fencing needs a transactional_id (the prefix of the partitions' ids)")


def min_insync_replicas(replication_factor: int) -> int:
    """Tolerate one replica down, never require more than two: RF 1→1, 2→1, 3→2, 5→2."""
    return min(2, max(1, replication_factor - 1))
