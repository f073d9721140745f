"""The Kafka-backed store with a transactional producer (coordinator/storage/transactions.py) against a real
broker: concurrent writes share transactions and all become visible; a write that fails leaves nothing behind;
a second store with the same transactional.id fences the first (the fence of several instances, issue 10)."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.group.errors import Errors
from coordinator.group.store import OffsetRecord, StoreError
from coordinator.storage.kafka_store import KafkaGroupStore, loaded_offset_records
from coordinator.storage.transactions import TransactionalWriters
from tests.integration.test_storage_kafka import stable_group, started_store, unique_topic

pytestmark = pytest.mark.integration
LOADED_MACHINE_TIMEOUT_MS = 30_000  # what is tested is atomicity and fencing, not speed: a slow broker must not fail it


def offsets(value: int, partitions: int) -> dict[tuple[str, int], OffsetRecord]:
    return {("orders", p): OffsetRecord(value, commit_timestamp_ms=value) for p in range(partitions)}


async def test_concurrent_writes_share_transactions_and_are_all_visible(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-writer",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    try:
        writes = [store.store_offsets(f"g{i}", offsets(i, 20)) for i in range(40)]
        writes.append(store.store_group("g0", stable_group(generation=3)))
        await asyncio.gather(*writes)
        producer = store._producer
        assert isinstance(producer, TransactionalWriters)
        assert 1 <= producer.transactions < 41  # group commit: fewer transactions than writes
    finally:
        await store.close()
    # Commit markers land after commit_transaction returns: a reader may see the last transactions a moment
    # later (never in part). Read until everything is there, bounded.
    expected_groups = {f"g{i}" for i in range(40)}
    for _attempt in range(20):
        reader = await started_store(kafka_bootstrap, topic)
        try:
            state = await reader.read()
        finally:
            await reader.close()
        loaded = loaded_offset_records(state)
        assert all(len(offs) == 20 for offs in loaded.values())  # a write is never seen in part
        if set(loaded) == expected_groups:
            break
        await asyncio.sleep(0.5)
    assert {g: {tp: r.offset for tp, r in offs.items()} for g, offs in loaded.items()} == {
        f"g{i}": {("orders", p): i for p in range(20)} for i in range(40)}
    assert state.groups["g0"].generation == 3


async def test_a_newer_holder_of_the_transactional_id_fences_the_older(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    first = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-p0",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    second: KafkaGroupStore | None = None
    try:
        await first.store_offsets("g", offsets(1, 3))
        second = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-p0",
                                     commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
        with pytest.raises(StoreError) as failed:
            await first.store_offsets("g", offsets(2, 3))  # a zombie's write: refused, nothing visible
        assert failed.value.error == Errors.NOT_COORDINATOR
        with pytest.raises(StoreError):  # fenced for good: it never takes the id back
            await first.store_offsets("g", offsets(4, 3))
        await second.store_offsets("g", offsets(3, 3))
    finally:
        await first.close()
        if second is not None:
            await second.close()
    reader = await started_store(kafka_bootstrap, topic)
    try:
        loaded = loaded_offset_records(await reader.read())
    finally:
        await reader.close()
    assert {tp: r.offset for tp, r in loaded["g"].items()} == {("orders", p): 3 for p in range(3)}
