"""Compaction keeps the latest record per key: after many generations, commits and deletions and a real log
cleaner pass (tiny segments), a fresh load gives the same state as replaying the whole history did."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore

pytestmark = pytest.mark.integration

# Compaction held off (min.compaction.lag.ms of a day) while the history is written and replayed in full: on a
# loaded machine writing it can outlast the cleaner's 15 s backoff. Then the lag drops to 0 (HOLD_OFF → RELEASE).
COMPACT_FAST = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.001", "delete.retention.ms": "100",
                "min.compaction.lag.ms": "86400000"}
RELEASE = {"min.compaction.lag.ms": "0"}
GROUPS = [f"group-{i}" for i in range(8)]
ROUNDS = 12
CLEANER_WAIT_S = 240  # the broker's cleaner wakes every log.cleaner.backoff.ms (15 s by default); a loaded machine
WRITE_TIMEOUT_MS = 30_000  # this test is not about write timeouts: generous, so a loaded machine does not fail it


def generation_record(generation: int) -> GroupRecord:
    members = [MemberRecord(f"m-{i}", None, "c", "/127.0.0.1", 30_000, 10_000, b"s", b"gen-%d" % generation)
               for i in range(3)]
    return GroupRecord("consumer", generation, "range", "m-0", generation, members)


async def write_history(store: KafkaGroupStore) -> int:
    written = 0
    for generation in range(1, ROUNDS + 1):
        for group_id in GROUPS:
            await store.store_group(group_id, generation_record(generation))
            await store.store_offsets(group_id, {("t", p): OffsetRecord(generation * 100 + p, commit_timestamp_ms=1)
                                                 for p in range(3)})
            written += 4
        await asyncio.sleep(0.15)  # older than segment.ms: the next append rolls a new segment
    await store.delete_group("group-0", [("t", 0), ("t", 1), ("t", 2)], write_group_tombstone=True)
    await store.delete_offsets("group-1", [("t", 2)])
    await store.flush()
    return written + 5  # tombstones: three offsets and the group of group-0, one offset of group-1


def release_compaction(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in RELEASE.items()])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=60)


async def test_fresh_load_after_compaction_equals_full_replay(kafka_bootstrap: str) -> None:
    config = StorageConfig(bootstrap=kafka_bootstrap, state_topic=f"__state-{uuid.uuid4().hex[:8]}", partitions=2,
                           event_topic=None, topic_configs=COMPACT_FAST, commit_timeout_ms=WRITE_TIMEOUT_MS)
    store = KafkaGroupStore(config, load_timeout_ms=60_000)
    await store.start()
    try:
        written = await write_history(store)
        before = await store.read()
        assert before.records == written  # nothing cleaned yet: every record replayed
        await asyncio.to_thread(release_compaction, kafka_bootstrap, config.state_topic)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLEANER_WAIT_S
        after = before
        while after.records > written // 2 and loop.time() < deadline:
            await asyncio.sleep(2)
            await store.store_offsets("roller", {("t", 0): OffsetRecord(1, commit_timestamp_ms=1)})  # rolls segments
            after = await store.read()
    finally:
        await store.close()
    assert after.records <= written // 2, f"the log cleaner did not compact within {CLEANER_WAIT_S}s"
    assert after.groups == before.groups
    assert {g: o for g, o in after.offsets.items() if g != "roller"} == before.offsets
    assert "group-0" not in after.groups and "group-0" not in after.offsets
    assert {g: v.generation for g, v in after.groups.items()} == {g: ROUNDS for g in GROUPS[1:]}
    assert set(after.offsets["group-1"]) == {("t", 0), ("t", 1)}
