"""The loader's transaction tracking against the embedded broker (coordinator/storage/transaction_log.py,
uncommitted_load.py): our own open transaction at the end of a load is dropped while a client's is returned as
pending; an aborted transaction of ours is never loaded; the tail from the load's end reports a client's batch
and then its marker."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import Producer

from coordinator.group.records import OffsetRecord
from coordinator.group.store import LoadedGroups
from coordinator.storage.loader import consumer_settings, read_state_with_transactions
from coordinator.storage.records import OffsetCommitKey, encode_key, encode_offset_commit_value
from coordinator.storage.uncommitted_load import UncommittedLoad
from coordinator.storage.transaction_log import TransactionalBatch, TransactionMarker, tail_events
from coordinator.timer.clock import MonotonicClock
from protocol.fetch_reader import MarkerType
from tests.support.kafka_store import unique_topic
from tests.support.transactions_wire import connect, create_topic

pytestmark = pytest.mark.integration


def offset_record(group: str, value: int) -> tuple[bytes, bytes]:
    return (encode_key(OffsetCommitKey(group, "orders", 0)),
            encode_offset_commit_value(OffsetRecord(value, commit_timestamp_ms=value)))


async def started_transaction(bootstrap: str, transactional_id: str, topic: str, group: str, value: int) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    await asyncio.to_thread(producer.init_transactions, 30)
    producer.begin_transaction()
    key, record = offset_record(group, value)
    producer.produce(topic, key=key, value=record, partition=0)
    await asyncio.to_thread(producer.flush, 30)
    return producer


async def load(bootstrap: str, topic: str, prefix: str) -> tuple[LoadedGroups, UncommittedLoad | None]:
    settings = consumer_settings(bootstrap, "test", 1 << 20)
    return await asyncio.to_thread(read_state_with_transactions, settings, topic, [0], MonotonicClock(), 20_000,
                                   own_transactional_id_prefix=prefix)


async def test_ours_open_is_dropped_a_clients_is_pending_ours_aborted_never_loaded(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    create_topic(kafka_bootstrap, topic)
    prefix = f"{topic}-ours"
    ours_aborted = await started_transaction(kafka_bootstrap, f"{prefix}-p0", topic, "mine", 5)
    await asyncio.to_thread(ours_aborted.abort_transaction, 30)
    ours_open = await started_transaction(kafka_bootstrap, f"{prefix}-p0", topic, "mine", 6)
    client = await started_transaction(kafka_bootstrap, f"app-{uuid.uuid4().hex}", topic, "app", 7)
    committed = await started_transaction(kafka_bootstrap, f"app2-{uuid.uuid4().hex}", topic, "app2", 8)
    await asyncio.to_thread(committed.commit_transaction, 30)
    try:
        state, found = await load(kafka_bootstrap, topic, prefix)
        assert found is not None
        assert {g: {tp: r.offset for tp, r in o.items()} for g, o in state.offsets.items()} == {
            "app2": {("orders", 0): 8}}  # ours aborted (5) and open (6) never loaded, the client's open (7) pending
        assert state.offsets["app2"][("orders", 0)].log_offset == 4  # ours 0, its marker 1, ours 2, client 3, app2 4
        [pending] = found.pending[0]
        assert [(c.key.group, c.value.offset if c.value else None) for c in pending.offset_commits] == [("app", 7)]
        assert found.aborted_batches == 1 and found.committed_batches == 1
        assert found.positions[0] >= 5
    finally:
        for producer in (ours_open, client):
            await asyncio.to_thread(producer.abort_transaction, 30)


async def test_the_tail_reports_a_clients_batch_then_its_marker(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    create_topic(kafka_bootstrap, topic)
    _state, found = await load(kafka_bootstrap, topic, f"{topic}-ours")
    assert found is not None
    fetcher = await connect(kafka_bootstrap)
    producer = await started_transaction(kafka_bootstrap, f"app-{uuid.uuid4().hex}", topic, "app", 9)
    events: list[object] = []
    try:
        tail = tail_events(fetcher, topic, 0, found.positions[0], max_wait_ms=200)
        commit = asyncio.ensure_future(asyncio.sleep(0))
        async with asyncio.timeout(60):
            async for _position, new in tail:
                events += new
                if len(events) == 1 and commit.done():
                    commit = asyncio.ensure_future(asyncio.to_thread(producer.commit_transaction, 30))
                if any(isinstance(e, TransactionMarker) for e in events):
                    break
        await commit
    finally:
        await fetcher.close()
    batch, marker = events
    assert isinstance(batch, TransactionalBatch) and isinstance(marker, TransactionMarker)
    assert batch.batch.base_offset == 0 and [r.offset for r in batch.batch.records] == [0]
    assert (marker.producer_id, marker.marker, marker.offset) == (batch.batch.producer_id, MarkerType.COMMIT, 1)
