"""The Kafka-backed store's tombstones across a broker outage (the rules of coordinator/storage/tombstones.py):
a failed tombstone is written once Kafka is back; a newer write of the same key wins over it; a newer write that
fails too leaves the tombstone owed."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordinator.embedded import EmbeddedKafka
from coordinator.group.store import StoreError
from coordinator.group.records import OffsetRecord
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore, loaded_offset_records
from tests.support.service import unique

COMMIT_TIMEOUT_MS = 1_500
KAFKA_BACK_WITHIN_S = 180  # a restarted JVM on a loaded 2-core machine; bounded all the same


def offset(value: int) -> OffsetRecord:
    return OffsetRecord(value, commit_timestamp_ms=value)


async def stored(store: KafkaGroupStore, group_id: str, offsets: dict[tuple[str, int], OffsetRecord],
                 timeout_s: float = KAFKA_BACK_WITHIN_S) -> None:
    """store_offsets retried on StoreError until it succeeds (bounded), as a client retries a timed-out commit:
    on a loaded machine a write may outlast the short commit timeout, and a restarted broker takes a while to
    take writes again."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await store.store_offsets(group_id, offsets)
            return
        except StoreError:
            assert time.monotonic() < deadline, f"{group_id}: not stored within {timeout_s}s"


async def until_all_written(store: KafkaGroupStore, timeout_s: float = KAFKA_BACK_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while store.unwritten_tombstones:
        assert time.monotonic() < deadline, store.unwritten_tombstones
        await asyncio.sleep(0.2)


async def test_tombstones_owed_across_an_outage(restartable_kafka: EmbeddedKafka) -> None:
    config = StorageConfig(bootstrap=restartable_kafka.bootstrap, state_topic=unique("__state"), partitions=3,
                           event_topic=None, commit_timeout_ms=COMMIT_TIMEOUT_MS)
    store = KafkaGroupStore(config, load_timeout_ms=60_000)
    await store.start()
    try:
        await stored(store, "deleted", {("t", 0): offset(1), ("t", 1): offset(2)})
        await stored(store, "rewritten", {("t", 0): offset(3)})
        await stored(store, "failed-again", {("t", 0): offset(4)})

        await restartable_kafka.stop()
        await store.delete_group("deleted", [("t", 0), ("t", 1)], write_group_tombstone=False)
        await store.delete_offsets("rewritten", [("t", 0)])
        await store.delete_offsets("failed-again", [("t", 0)])
        with pytest.raises(StoreError):  # a newer value that is not written either: the tombstone stays owed
            await store.store_offsets("failed-again", {("t", 0): offset(5)})
        await restartable_kafka.start()
        await stored(store, "rewritten", {("t", 0): offset(6)})  # newer than its tombstone: it wins
        await until_all_written(store)
        await store.flush()
    finally:
        await store.close()

    fresh = KafkaGroupStore(config, load_timeout_ms=60_000)
    await fresh.start()
    try:
        offsets = loaded_offset_records(await fresh.read())
    finally:
        await fresh.close()
    assert {group: {tp: r.offset for tp, r in records.items()} for group, records in offsets.items()} == {
        "rewritten": {("t", 0): 6}}
