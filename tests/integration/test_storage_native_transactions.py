"""The native transactional writer (coordinator/storage/native_transactions.py, `state_writer="native"`) against a
real broker: acknowledged writes are visible read_committed at the offsets reported; a transaction that fails is
invisible and the writer recovers; back-to-back transactions absorb Kafka's CONCURRENT_TRANSACTIONS (never
reported to the caller); a newer holder of the transactional id fences the writer (on_fenced once, later writes
fail, nothing of the zombie visible); a partition added ahead of its write."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.storage.loader import consumer_settings
from coordinator.storage.native_transactions import NativeTransactionalProducer
from coordinator.storage.partition_writers import TransactionalWriters
from coordinator.storage.state_producers import producer_settings
from tests.support.kafka_store import started_store, unique_topic

pytestmark = pytest.mark.integration
TIMEOUT_MS = 30_000  # a loaded machine must not fail what is tested: outcomes, not speed


def committed(bootstrap: str, topic: str, partition: int, until_key: bytes) -> list[Message]:
    """A read_committed reader's records of the partition up to the one keyed `until_key` (bounded wait)."""
    reader = Consumer(consumer_settings(bootstrap, f"{topic}-reader", 1_048_576))
    reader.assign([TopicPartition(topic, partition, 0)])
    seen: list[Message] = []
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    try:
        while time.monotonic() < deadline and not any(m.key() == until_key for m in seen):
            message = reader.poll(0.1)
            if message is not None and message.error() is None:
                seen.append(message)
    finally:
        reader.close()
    return seen


async def native_store(bootstrap: str, topic: str, **overrides: object) -> tuple[KafkaGroupStore,
                                                                                  NativeTransactionalProducer]:
    store = await started_store(bootstrap, topic, transactional_id=f"{topic}-writer", commit_timeout_ms=TIMEOUT_MS,
                                state_writer="native", transactional_producers=1, **overrides)
    writers = store._producer
    assert isinstance(writers, TransactionalWriters)
    producer = writers.producers[0]
    assert isinstance(producer, NativeTransactionalProducer)
    return store, producer


async def test_writes_are_committed_visible_read_committed_at_their_offsets(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    store, producer = await native_store(kafka_bootstrap, topic)
    try:
        first: list[int] = []
        second: list[int] = []
        assert await producer.send([(0, b"a", b"1"), (1, b"b", b"2"), (0, b"c", b"3")], offsets=first) is None
        assert await producer.send([(0, b"d", b"4")], offsets=second) is None
    finally:
        await store.close()
    seen = committed(kafka_bootstrap, topic, 0, b"d")
    at = {m.key(): m.offset() for m in seen}
    assert [m.key() for m in seen] == [b"a", b"c", b"d"]  # markers are not records to a reader
    assert sorted(first) == sorted([at[b"a"], at[b"c"], committed(kafka_bootstrap, topic, 1, b"b")[0].offset()])
    assert second == [at[b"d"]]


async def test_back_to_back_transactions_absorb_concurrent_transactions(kafka_bootstrap: str) -> None:
    """Each write alone, the next sent as soon as the last is answered: Kafka's transaction coordinator is still
    writing the previous commit's markers, refuses the next AddPartitionsToTxn CONCURRENT_TRANSACTIONS, and the
    writer retries it; no caller sees it. Group commit: writes sent together share a transaction."""
    topic = unique_topic()
    store, producer = await native_store(kafka_bootstrap, topic)
    try:
        for i in range(30):
            assert await producer.send([(i % 3, b"k%d" % i, b"v")]) is None
        assert producer.transactions == 30
        # the refusals happen (what the writer exists for); if Kafka stops sending them, this says so
        assert producer.concurrent_transactions_retries > 0
        before = producer.transactions
        results = await asyncio.gather(*(producer.send([(0, b"g%d" % i, b"v")]) for i in range(40)))
        assert results == [None] * 40
        assert producer.transactions - before < 40  # group commit
    finally:
        await store.close()
    keys = [m.key() for m in committed(kafka_bootstrap, topic, 0, b"g39")]
    assert [k for k in keys if k.startswith(b"g")] == [b"g%d" % i for i in range(40)]  # in order


async def test_a_failed_transaction_is_invisible_and_the_writer_recovers(kafka_bootstrap: str) -> None:
    """A write one of whose partitions refuses its batch (too large for the topic): its other partition's batch
    was appended, and is aborted (the re-initialisation's epoch bump); the next write commits."""
    topic = unique_topic()
    store, producer = await native_store(kafka_bootstrap, topic, topic_configs={"max.message.bytes": "100000"})
    try:
        error = await producer.send([(0, b"lost", b"x"), (1, b"big", b"y" * 200_000)])
        assert isinstance(error, KafkaError) and error.code() > 0, error  # the broker's refusal, as it is
        assert await asyncio.wait_for(producer.send([(0, b"after", b"z")]), TIMEOUT_MS / 1000) is None
    finally:
        await store.close()
    assert [m.key() for m in committed(kafka_bootstrap, topic, 0, b"after")] == [b"after"]


async def test_a_newer_holder_of_the_id_fences_the_writer(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    store, _ = await native_store(kafka_bootstrap, topic)
    settings = producer_settings(store.config)
    fenced: list[bool] = []
    old = NativeTransactionalProducer(topic, settings, "old", f"{topic}-p0", TIMEOUT_MS,
                                      on_fenced=lambda: fenced.append(True), fatal_is_fence=True)
    new = NativeTransactionalProducer(topic, settings, "new", f"{topic}-p0", TIMEOUT_MS, fatal_is_fence=True)
    try:
        await old.start(TIMEOUT_MS)
        assert await old.send([(0, b"old-1", b"v")]) is None
        await new.start(TIMEOUT_MS)
        zombie = await old.send([(0, b"zombie", b"v")])  # refused: nothing of it visible
        assert isinstance(zombie, KafkaError) and zombie.code() == KafkaError._FENCED, zombie
        assert old.fenced and fenced == [True]
        later = await old.send([(0, b"later", b"v")])  # fenced for good: it never takes the id back
        assert isinstance(later, KafkaError) and later.code() == KafkaError._FENCED
        assert await new.send([(0, b"new-1", b"v")]) is None
        assert fenced == [True]  # once
        assert not new.fenced
    finally:
        await old.close()
        await new.close()
        await store.close()
    assert [m.key() for m in committed(kafka_bootstrap, topic, 0, b"new-1")] == [b"old-1", b"new-1"]


async def test_a_partition_added_ahead_is_committed_with_the_write_or_alone(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    store, producer = await native_store(kafka_bootstrap, topic)
    try:
        producer.open_ahead(2)
        assert producer._opening is not None
        await producer._opening
        assert producer._added == {2}  # AddPartitionsToTxn done before the write: no marker record needed
        before = producer.transactions
        assert await producer.send([(2, b"w", b"v")]) is None
        assert producer.transactions == before + 1
        producer.open_ahead(1)  # no write comes: committed alone after OPEN_AHEAD_HOLD_S
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while producer.transactions == before + 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert producer.transactions == before + 2 and not producer._added
        assert await producer.send([(1, b"x", b"v")]) is None
        # added ahead, its leader known and connected: the write's Produce leaves from send() itself, not from
        # the transaction's task a loop turn later
        producer.open_ahead(2)
        assert producer._opening is not None
        await producer._opening
        early = producer.produced_early
        offsets: list[int] = []
        written = producer.send([(2, b"w2", b"v")], offsets=offsets)
        assert producer.produced_early == early + 1
        assert await written is None and len(offsets) == 1
    finally:
        await store.close()
    assert [m.key() for m in committed(kafka_bootstrap, topic, 2, b"w2")] == [b"w", b"w2"]


async def test_a_native_owners_open_transaction_is_ours_to_the_next_owners_load(kafka_bootstrap: str) -> None:
    """Several instances, both native: the previous owner of a partition has records in the log in a transaction
    it has not ended (its Produce done, no EndTxn: it stalled). The new owner's load names the transaction ours by
    its id (`<prefix>-p<partition>`, as the librdkafka writer's), aborts it with its fence, loads none of it, and
    the previous owner's next write is refused."""
    from coordinator.group.partitioner import partition_for
    from coordinator.group.records import OffsetRecord
    from coordinator.storage.records import OffsetCommitKey, encode_key, encode_offset_commit_value

    topic = unique_topic()
    prefix = f"{topic}-coordinator"
    new = await started_store(kafka_bootstrap, topic, transactional_id=prefix, partition_fencing=True,
                              commit_timeout_ms=TIMEOUT_MS, state_writer="native")
    settings = producer_settings(new.config)
    old = NativeTransactionalProducer(topic, settings, "old-p3", f"{prefix}-p3", TIMEOUT_MS, fatal_is_fence=True)
    group = next(f"g-{i}" for i in range(10_000) if partition_for(f"g-{i}", 5) == 3)  # started_store: 5 partitions
    try:
        await old.start(TIMEOUT_MS)
        deadline = asyncio.get_running_loop().time() + TIMEOUT_MS / 1000
        await old._add_partitions({3}, deadline)
        key = encode_key(OffsetCommitKey(group, "orders", 0))
        value = encode_offset_commit_value(OffsetRecord(99, commit_timestamp_ms=99))
        await old._produce({3: [(key, value, None)]}, deadline)  # in the log, its transaction open

        loaded = await asyncio.wait_for(new.load([3]), 60)  # fences `old`, not held back by its transaction
        assert group not in loaded.offsets
        # ours, so dropped (a client's open transaction would be left pending for the partition's tail)
        assert old.producer_id not in new._load_pending.get(3, set())
        refused = await old.send([(3, key, value)])
        assert isinstance(refused, KafkaError) and refused.code() == KafkaError._FENCED, refused
        await new.store_offsets(group, {("orders", 0): OffsetRecord(7, commit_timestamp_ms=7)})
        reloaded = await new.load([3])
        assert {p: r.offset for (_, p), r in reloaded.offsets[group].items()} == {0: 7}
    finally:
        await old.close()
        await new.close()
