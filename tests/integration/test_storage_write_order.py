"""Records of one state partition reach Kafka in the order the shard produced them, tombstones included.

A tombstone (OffsetDelete) and a commit of the same key issued in one loop step must be stored tombstone first:
the other order deletes an acknowledged commit at the next load. The same holds for the retry of a tombstone
that failed: its retry must not land after a newer write of its key, nor a newer write before it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from coordinator.config import CoordinatorConfig
from coordinator.embedded import EmbeddedKafka
from coordinator.group.api import (OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
                                   OffsetDeleteRequest, OffsetDeleteRequestTopic)
from protocol.error_codes import Errors
from coordinator.group.runtime import GroupRuntime
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore, loaded_offset_records
from coordinator.storage.loader import consumer_settings
from coordinator.storage.records import OffsetCommitKey, decode_key
from coordinator.timer import ManualClock, SystemTimer
from tests.support.service import unique

pytestmark = pytest.mark.integration

PARTITIONS = 2
KAFKA_BACK_WITHIN_S = 180  # a restarted JVM on a loaded 2-core machine; bounded all the same


def storage_config(bootstrap: str, topic: str, **settings: int) -> StorageConfig:
    return StorageConfig(bootstrap=bootstrap, state_topic=topic, partitions=PARTITIONS, event_topic=None,
                         transactional_id=unique("order"), **settings)


class Coordinator:
    """A runtime on the real Kafka-backed store (transactional writes)."""

    def __init__(self, store: KafkaGroupStore) -> None:
        self.store = store
        self.timer = SystemTimer("test", clock=ManualClock(1_000_000), executor=lambda fn: fn())
        self.runtime = GroupRuntime(CoordinatorConfig(offsets_topic_num_partitions=PARTITIONS), self.timer, store)

    async def commit(self, group_id: str, offset: int) -> Errors:
        """An offset-only commit (generation -1, no member id) of orders-0."""
        response = await self.runtime.commit_offsets(OffsetCommitRequest(group_id, -1, "", [
            OffsetCommitRequestTopic("orders", [OffsetCommitRequestPartition(0, offset)])]))
        return response.topics[0].partitions[0].error_code

    async def delete(self, group_id: str) -> Errors:
        """The group-level error when the tombstone was not written (it stays owed), else the partition's."""
        response = await self.runtime.delete_offsets(
            OffsetDeleteRequest(group_id, [OffsetDeleteRequestTopic("orders", [0])]))
        if response.error_code != Errors.NONE:
            return response.error_code
        return response.topics[0].partitions[0].error_code

    async def close(self) -> None:
        await self.runtime.shutdown()
        await self.timer.close()
        await self.store.close()


async def start(config: StorageConfig) -> Coordinator:
    store = KafkaGroupStore(config, load_timeout_ms=60_000)
    await store.start()
    return Coordinator(store)


async def stored_offsets(config: StorageConfig) -> dict[str, int]:
    """What a fresh coordinator loads: group → committed offset of orders-0."""
    fresh = KafkaGroupStore(config, load_timeout_ms=60_000)
    await fresh.start()
    try:
        offsets = loaded_offset_records(await fresh.read())
    finally:
        await fresh.close()
    return {group: records[("orders", 0)].offset for group, records in offsets.items() if ("orders", 0) in records}


async def test_a_commit_after_a_tombstone_in_the_same_loop_step_survives(kafka_bootstrap: str) -> None:
    config = storage_config(kafka_bootstrap, unique("__order"))
    coordinator = await start(config)
    groups = [f"g{n}" for n in range(8)]
    try:
        for group in groups:
            assert await coordinator.commit(group, 5) == Errors.NONE
        # Two requests served in one loop step (as from two connections): the delete, then the newer commit.
        outcomes = await asyncio.gather(*(step for group in groups
                                          for step in (coordinator.delete(group), coordinator.commit(group, 7))))
        assert outcomes == [Errors.NONE] * len(outcomes)
        await coordinator.store.flush()
    finally:
        await coordinator.close()
    assert await stored_offsets(config) == {group: 7 for group in groups}


async def test_a_tombstone_retry_never_lands_after_a_newer_commit(
        restartable_kafka: EmbeddedKafka) -> None:
    # retried only when the test says (no back-off timer meanwhile)
    config = storage_config(restartable_kafka.bootstrap, unique("__order"), commit_timeout_ms=1_500,
                            tombstone_retry_ms=3_600_000)
    coordinator = await start(config)
    try:
        assert await coordinator.commit("g", 5) == Errors.NONE
        await restartable_kafka.stop()
        # not written: answered as not done (Kafka 4's error for a failed write), owed, sent again later
        assert await coordinator.delete("g") == Errors.COORDINATOR_NOT_AVAILABLE
        assert coordinator.store.unwritten_tombstones == 1
        await restartable_kafka.start()
        deadline = time.monotonic() + KAFKA_BACK_WITHIN_S
        while await coordinator.commit("other", 1) != Errors.NONE:  # Kafka takes writes again
            assert time.monotonic() < deadline, "Kafka did not take writes again"
        assert coordinator.store.unwritten_tombstones == 1
        # A commit of the key is handled, then the owed tombstone is sent again, in one loop step: the commit is
        # the newer write, so the retry must not land after it.
        newer = asyncio.ensure_future(coordinator.commit("g", 7))
        asyncio.get_running_loop().call_soon(coordinator.store.retry_owed_tombstones)
        assert await newer == Errors.NONE
        await coordinator.store.flush()
        assert coordinator.store.unwritten_tombstones == 0
    finally:
        await coordinator.close()
    assert (await stored_offsets(config))["g"] == 7


async def test_the_store_tells_where_an_offset_tombstone_landed_before_the_delete_is_answered(
        kafka_bootstrap: str) -> None:
    """A client's transactional batch is ordered against our tombstones by log offset: the tombstone writer's
    delivery report gives the shard the tombstone's offset, after the commit it deletes, before the answer."""
    config = storage_config(kafka_bootstrap, unique("__order"))
    coordinator = await start(config)
    partition = coordinator.runtime.partition_for("g")
    landed: list[tuple[str, tuple[str, int], int]] = []
    coordinator.store.follow_tombstones(partition, lambda group_id, tp, offset: landed.append((group_id, tp, offset)))
    try:
        assert await coordinator.commit("g", 5) == Errors.NONE
        committed_at = coordinator.runtime.groups["g"].offsets[("orders", 0)].log_offset
        assert committed_at is not None
        assert await coordinator.delete("g") == Errors.NONE
        assert [(group_id, tp) for group_id, tp, _ in landed] == [("g", ("orders", 0))]
        tombstone_at = landed[0][2]
        assert tombstone_at > committed_at
    finally:
        await coordinator.close()
    reader = Consumer(consumer_settings(kafka_bootstrap, unique("reader"), 1_048_576))
    reader.assign([TopicPartition(config.state_topic, partition, tombstone_at)])
    try:
        deadline = time.monotonic() + 30
        message = None
        while message is None and time.monotonic() < deadline:
            polled = reader.poll(0.2)
            if polled is not None and polled.error() is None:
                message = polled
        assert message is not None and message.offset() == tombstone_at
        assert message.value() is None and decode_key(message.key()) == OffsetCommitKey("g", "orders", 0)
    finally:
        reader.close()
