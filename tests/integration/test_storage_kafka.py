"""The Kafka-backed store against a real Apache Kafka broker: topic setup, write, reload, failures."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import ConfigResource

from protocol.error_codes import Errors
from coordinator.group.store import StoreError
from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore, loaded_group_records, loaded_offset_records
from coordinator.storage.loader import LoadError
from coordinator.storage.topics import TopicMismatchError, make_admin, partition_count
from tests.support.kafka_store import stable_group, started_store, unique_topic

pytestmark = pytest.mark.integration


async def test_fresh_store_loads_exactly_what_was_written(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    writer = await started_store(kafka_bootstrap, topic)
    groups = {f"group-{g}": stable_group(generation=g + 1) for g in range(12)}
    offsets = {gid: {("orders", p): OffsetRecord(offset=100 * p + 7, leader_epoch=3, metadata=f"m{p}",
                                                 commit_timestamp_ms=1_700_000_000_123)
                     for p in range(4)} for gid in groups}
    try:
        await asyncio.gather(*(writer.store_group(gid, record) for gid, record in groups.items()))
        await asyncio.gather(*(writer.store_offsets(gid, offs) for gid, offs in offsets.items()))
        # later generations and commits win; a simple (offset-only) group keeps its expire timestamp
        groups["group-0"] = stable_group(generation=9, size=2)
        await writer.store_group("group-0", groups["group-0"])
        offsets["group-1"][("orders", 0)] = OffsetRecord(offset=999, commit_timestamp_ms=5)
        await writer.store_offsets("group-1", {("orders", 0): offsets["group-1"][("orders", 0)]})
        offsets["simple"] = {("t", 0): OffsetRecord(offset=1, commit_timestamp_ms=2, expire_timestamp_ms=3)}
        await writer.store_offsets("simple", offsets["simple"])
    finally:
        await writer.close()

    reader = await started_store(kafka_bootstrap, topic)
    try:
        state = await reader.read()
    finally:
        await reader.close()
    assert loaded_group_records(state) == groups
    assert loaded_offset_records(state) == offsets
    assert state.unknown_records == state.malformed_records == 0


async def test_tombstones_remove_groups_and_offsets_on_reload(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic)
    try:
        for gid in ("keep", "gone"):
            await store.store_group(gid, stable_group(generation=1))
            await store.store_offsets(gid, {("t", 0): OffsetRecord(1, commit_timestamp_ms=1),
                                            ("t", 1): OffsetRecord(2, commit_timestamp_ms=1)})
        await store.delete_group("gone", [("t", 0), ("t", 1)], write_group_tombstone=True)
        await store.delete_offsets("keep", [("t", 1)])
        await store.store_offsets("keep", {("t", 2): OffsetRecord(3, commit_timestamp_ms=1)})
        await store.flush()
        state = await store.read()
    finally:
        await store.close()
    assert set(state.groups) == {"keep"}
    assert set(state.offsets) == {"keep"}
    assert set(state.offsets["keep"]) == {("t", 0), ("t", 2)}


async def test_state_topic_is_created_compacted_with_the_configured_partitions(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic, partitions=7)
    await store.close()
    admin = make_admin(StorageConfig(bootstrap=kafka_bootstrap))
    try:
        assert await partition_count(admin, topic) == 7
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        configs = await asyncio.wrap_future(admin.client.describe_configs([resource])[resource])
    finally:
        admin.release()
    assert configs["cleanup.policy"].value == "compact"
    assert configs["min.insync.replicas"].value == "1"  # single broker: RF 1


async def test_existing_topic_with_another_partition_count_refuses_to_start(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    first = await started_store(kafka_bootstrap, topic, partitions=3)
    await first.close()
    second = KafkaGroupStore(StorageConfig(bootstrap=kafka_bootstrap, state_topic=topic, event_topic=None,
                                           partitions=5))
    with pytest.raises(TopicMismatchError, match="has 3 partitions"):
        await second.start()
    await second.close()


async def test_too_large_group_record_fails_with_message_too_large(kafka_bootstrap: str) -> None:
    store = await started_store(kafka_bootstrap, unique_topic())
    record = stable_group(generation=1, size=1)
    record.members[0].assignment = b"x" * 2_000_000
    try:
        with pytest.raises(StoreError) as failure:
            await store.store_group("huge", record)
    finally:
        await store.close()
    assert failure.value.error == Errors.MESSAGE_TOO_LARGE


async def test_unreachable_cluster_fails_start_within_the_admin_timeout() -> None:
    store = KafkaGroupStore(StorageConfig(bootstrap="127.0.0.1:1", state_topic=unique_topic(), event_topic=None,
                                          admin_timeout_ms=2_000))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(KafkaException, match="Timed out"):
        await store.start()
    # the 2 s admin timeout, with room for a loaded machine; far below the 30 s default, so an ignored setting fails
    assert loop.time() - started < 15
    await store.close()


async def test_existing_uncompacted_topic_is_used_with_a_warning(kafka_bootstrap: str, caplog) -> None:
    topic = unique_topic()
    from coordinator.storage.topics import create_topic
    admin = make_admin(StorageConfig(bootstrap=kafka_bootstrap))
    try:
        await create_topic(admin, topic, 5, 1, {"cleanup.policy": "delete"})
    finally:
        admin.release()
    store = await started_store(kafka_bootstrap, topic)
    try:
        await store.store_group("g", stable_group(generation=1))
        assert set((await store.read()).groups) == {"g"}
    finally:
        await store.close()
    assert "event=state_topic_not_compacted" in caplog.text


async def test_failed_start_and_load_leave_no_kafka_client_for_the_garbage_collector() -> None:
    """librdkafka aborts the process when a client is destroyed on one of its threads, where Python's cyclic
    GC may run: a client held only by a failure's traceback must already be destroyed, GC or not."""
    def live_clients() -> list[object]:
        return [o for o in gc.get_objects() if isinstance(o, (AdminClient, Producer, Consumer))]

    store = KafkaGroupStore(StorageConfig(bootstrap="127.0.0.1:1", state_topic=unique_topic(), event_topic=None,
                                          admin_timeout_ms=1_000), load_timeout_ms=500)
    gc.disable()
    already_alive = {id(client) for client in live_clients()}  # other tests' clients are not ours to judge
    try:
        with pytest.raises(KafkaException) as start_failure:
            await store.start()
        with pytest.raises(LoadError) as load_failure:
            await store.read()
        await store.close()
        assert start_failure.value is not None and load_failure.value is not None  # tracebacks still alive
        assert [client for client in live_clients() if id(client) not in already_alive] == []
    finally:
        gc.enable()


async def test_a_state_topic_not_described_yet_is_not_a_reason_to_stop(kafka_bootstrap: str, caplog) -> None:
    """A topic another instance has just created may be unknown to the broker answering DescribeConfigs (an
    integration run saw a store's start fail with UNKNOWN_TOPIC_OR_PART there): the compaction check is advice,
    so the start goes on and says the check was not made."""
    from coordinator.storage.topics import _warn_unless_compacted

    caplog.set_level(logging.INFO, logger="coordinator.storage")
    admin = make_admin(StorageConfig(bootstrap=kafka_bootstrap))
    try:
        await _warn_unless_compacted(admin, unique_topic(), 10_000)  # no such topic: UNKNOWN_TOPIC_OR_PART
    finally:
        admin.release()
    assert "event=state_topic_config_unknown" in caplog.text
    assert "UNKNOWN_TOPIC_OR_PART" in caplog.text
