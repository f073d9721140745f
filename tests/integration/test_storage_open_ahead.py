"""A write's transaction opened ahead of it (`KafkaGroupStore.expect_append`, transactions.py `open_ahead`), on a
real broker: the marker that registers the partition is committed in the same transaction as the write that
follows, and a load skips it quietly; with no write, the transaction is committed alone (the partition's last
stable offset is not held back); a store closed meanwhile commits it; a marker the client refuses opens
nothing; a store without transactions ignores it; a partition's new owner fences an old owner's transaction
opened ahead as any other."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from coordinator.group.store import StoreError
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.storage import transactions
from coordinator.storage.loader import consumer_settings
from coordinator.storage.partition_writers import TransactionalWriters
from protocol.error_codes import Errors
from coordinator.storage.records import OPEN_AHEAD_KEY, GroupMetadataKey, encode_key
from tests.support.kafka_store import stable_group, started_store, unique_topic

pytestmark = pytest.mark.integration
LOADED_MACHINE_TIMEOUT_MS = 30_000


def committed_messages(bootstrap: str, topic: str, partition: int, count: int) -> list[Message]:
    """The first `count` records a read_committed reader sees in the partition (bounded wait)."""
    reader = Consumer(consumer_settings(bootstrap, f"{topic}-reader", 1_048_576))
    reader.assign([TopicPartition(topic, partition, 0)])
    seen: list[Message] = []
    deadline = time.monotonic() + LOADED_MACHINE_TIMEOUT_MS / 1000
    try:
        while len(seen) < count and time.monotonic() < deadline:
            message = reader.poll(0.1)
            if message is not None and message.error() is None:
                seen.append(message)
    finally:
        reader.close()
    return seen


@dataclass(frozen=True)
class Transactional:
    """A started store writing with transactions (`TransactionalWriters`), and group "g"'s partition."""

    store: KafkaGroupStore
    topic: str
    partition: int
    writers: TransactionalWriters
    native: bool  # our own writer (state_writer="native"): the partition is added ahead with no marker record


@pytest.fixture
async def transactional(kafka_bootstrap: str, state_writer: str) -> AsyncIterator[Transactional]:
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-writer",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    try:
        writers = store._producer
        assert isinstance(writers, TransactionalWriters)
        yield Transactional(store, topic, store._partition("g"), writers, state_writer == "native")
    finally:
        await store.close()  # again after a test's own close: a no-op


async def test_a_write_commits_the_transaction_opened_ahead_of_it_and_a_load_skips_the_marker(
        kafka_bootstrap: str, transactional: Transactional, caplog: pytest.LogCaptureFixture) -> None:
    store, topic, partition = transactional.store, transactional.topic, transactional.partition
    store.expect_append(partition)
    store.expect_append(partition)  # already open for it: nothing more
    await store.store_group("g", stable_group(generation=4))
    assert transactional.writers.transactions == 1  # the marker and the write, one transaction
    await store.close()
    if transactional.native:  # no marker record: the partition was added to the transaction (AddPartitionsToTxn)
        messages = committed_messages(kafka_bootstrap, topic, partition, 1)
        assert [m.key() for m in messages] == [encode_key(GroupMetadataKey("g"))]
    else:
        messages = committed_messages(kafka_bootstrap, topic, partition, 2)
        assert [m.key() for m in messages] == [OPEN_AHEAD_KEY, encode_key(GroupMetadataKey("g"))]
        assert messages[0].value() is None  # a tombstone: compaction removes it
    reader = await started_store(kafka_bootstrap, topic)
    try:
        with caplog.at_level(logging.WARNING, logger="coordinator.storage"):
            state = await reader.read([partition])
    finally:
        await reader.close()
    assert state.groups["g"].generation == 4
    assert (state.records, state.unknown_records, state.malformed_records) == (
        (1 if transactional.native else 2), 0, 0)
    assert "state_record_skipped" not in caplog.text


async def test_a_transaction_opened_ahead_with_no_write_is_committed_alone(
        kafka_bootstrap: str, transactional: Transactional, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transactions, "OPEN_AHEAD_HOLD_S", 0.2)
    store, writers, partition = transactional.store, transactional.writers, transactional.partition
    store.expect_append(partition)
    deadline = time.monotonic() + LOADED_MACHINE_TIMEOUT_MS / 1000
    while writers.transactions == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert writers.transactions == 1
    if not transactional.native:  # ours commits a transaction with the partition added and nothing in it
        assert [m.key() for m in committed_messages(kafka_bootstrap, transactional.topic, partition, 1)] == [
            OPEN_AHEAD_KEY]
    await store.store_group("g", stable_group(generation=2))  # the next write: a transaction of its own
    assert writers.transactions == 2
    assert [m.key() for m in committed_messages(kafka_bootstrap, transactional.topic, partition, 2)][-1] == \
        encode_key(GroupMetadataKey("g"))


@pytest.mark.parametrize("state_writer", ["librdkafka"])  # ours produces no marker
async def test_a_marker_the_client_refuses_leaves_nothing_opened_ahead(transactional: Transactional) -> None:
    """A marker librdkafka refuses at produce() (here larger than message.max.bytes) opened nothing: its
    partition is not held as opened ahead, so no transaction is committed for it alone after OPEN_AHEAD_HOLD_S,
    and the next write is one transaction."""
    partition, writers = transactional.partition, transactional.writers
    producer = writers._route(partition)
    assert isinstance(producer, transactions.TransactionalProducer)
    producer.open_ahead(partition, (partition, OPEN_AHEAD_KEY, b"x" * 2_000_000))
    await producer._thread.submit(lambda: None)  # after the marker's call: its outcome has reached the loop
    assert not producer._opened_for and producer._open_ahead_expiry is None
    await transactional.store.store_group("g", stable_group(generation=1))
    assert writers.transactions == 1


async def test_a_store_closed_with_a_transaction_opened_ahead_commits_it(kafka_bootstrap: str,
                                                                        transactional: Transactional,
                                                                        recwarn: pytest.WarningsRecorder) -> None:
    transactional.store.expect_append(transactional.partition)
    await transactional.store.close()
    assert transactional.writers.transactions == 1  # committed, not left open for the next holder to abort
    if not transactional.native:
        assert [m.key() for m in committed_messages(kafka_bootstrap, transactional.topic,
                                                    transactional.partition, 1)] == [OPEN_AHEAD_KEY]
    assert [str(w.message) for w in recwarn if "during close" in str(w.message)] == []
    assert [str(w.message) for w in recwarn if "during close" in str(w.message)] == []


async def test_a_store_without_transactions_opens_nothing_ahead(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic)
    partition = store._partition("g")
    try:
        store.expect_append(partition)
        await store.store_group("g", stable_group(generation=1))
    finally:
        await store.close()
    messages = committed_messages(kafka_bootstrap, topic, partition, 1)
    assert [m.key() for m in messages] == [encode_key(GroupMetadataKey("g"))]


async def test_a_transaction_opened_ahead_does_not_survive_the_partitions_new_owner(kafka_bootstrap: str,
                                                                                   state_writer: str) -> None:
    """Several instances: the fence holds with a transaction opened ahead. The new owner's fence aborts it, the
    old owner's write into it is refused (NOT_COORDINATOR) and nothing of it is visible; the new owner's load
    sees what the old one committed before."""
    topic = unique_topic()
    group = "g"
    old = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-coordinator",
                              partition_fencing=True, commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    new = None
    partition = old._partition(group)
    try:
        await old.load([partition])
        await old.store_group(group, stable_group(generation=1))
        old.expect_append(partition)  # the old owner's next generation: its transaction opened ahead
        new = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-coordinator",
                                  partition_fencing=True, commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
        loaded = await new.load([partition])
        assert loaded.groups[group].generation == 1
        with pytest.raises(StoreError) as refused:
            await old.store_group(group, stable_group(generation=2))
        assert refused.value.error == Errors.NOT_COORDINATOR
        await new.store_group(group, stable_group(generation=3))
    finally:
        await old.close()
        if new is not None:
            await new.close()
    reader = await started_store(kafka_bootstrap, topic)
    try:
        state = await reader.read([partition])
    finally:
        await reader.close()
    assert state.groups[group].generation == 3
