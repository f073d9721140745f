"""Several writes appended together (`KafkaGroupStore.append_together`, the runtime's writes of one loop turn) on a
real broker: writes of several groups go in one transaction and share its outcome; a write too large on its own is
refused alone and the others are written; a fresh store reads every written one back."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.group.records import GroupMetadataRecord
from coordinator.group.store import StoreError
from coordinator.storage.partition_writers import TransactionalWriters
from protocol.error_codes import Errors
from tests.support.kafka_store import stable_group, started_store, unique_topic

pytestmark = pytest.mark.integration
LOADED_MACHINE_TIMEOUT_MS = 30_000


async def test_writes_of_several_groups_share_one_transaction_and_are_read_back(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic, partitions=1, transactional_id=f"{topic}-writer",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    try:
        writers = store._producer
        assert isinstance(writers, TransactionalWriters)
        groups = ["g1", "g2", "g3"]
        outcomes = store.append_together(0, [[GroupMetadataRecord(g, stable_group(generation=i + 1))]
                                             for i, g in enumerate(groups)])
        assert len(set(map(id, outcomes))) == 1  # one append
        assert await asyncio.gather(*outcomes) == [None] * 3
        assert writers.transactions == 1
    finally:
        await store.close()
    reader = await started_store(kafka_bootstrap, topic, partitions=1)
    try:
        state = await reader.read([0])
    finally:
        await reader.close()
    assert {g: state.groups[g].generation for g in groups} == {"g1": 1, "g2": 2, "g3": 3}


async def test_a_write_too_large_alone_is_refused_alone(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic, partitions=1, transactional_id=f"{topic}-writer",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS, max_write_bytes=1_500)
    try:
        small, large = stable_group(generation=1, size=1), stable_group(generation=2, size=30)
        outcomes = store.append_together(0, [[GroupMetadataRecord("a", small)], [GroupMetadataRecord("b", large)],
                                             [GroupMetadataRecord("c", small)]])
        results = await asyncio.gather(*outcomes, return_exceptions=True)
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], StoreError) and results[1].error == Errors.MESSAGE_TOO_LARGE
    finally:
        await store.close()
    reader = await started_store(kafka_bootstrap, topic, partitions=1)
    try:
        state = await reader.read([0])
    finally:
        await reader.close()
    assert sorted(state.groups) == ["a", "c"]
