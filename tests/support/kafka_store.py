"""The Kafka-backed store on a real broker: a fresh state topic, records to write, a started store, and what a
fresh store loads back."""
from __future__ import annotations

import uuid

from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore, loaded_offset_records


# The transactional writer a started store gets unless a test says otherwise (StorageConfig.state_writer); the
# `state_writer` fixture below runs a test once per writer.
STATE_WRITER = "librdkafka"
STATE_WRITERS = ("librdkafka", "native")


def unique_topic() -> str:
    return f"__state-{uuid.uuid4().hex[:10]}"


def member(i: int, instance: str | None = None) -> MemberRecord:
    return MemberRecord(member_id=f"consumer-{i}-{uuid.uuid4()}", group_instance_id=instance,
                        client_id=f"consumer-{i}", client_host="/127.0.0.1", rebalance_timeout_ms=300_000,
                        session_timeout_ms=10_000, subscription=b"\x00\x01sub" + bytes([i]),
                        assignment=b"\x00\x01asg" + bytes([i]))


def stable_group(generation: int, size: int = 3) -> GroupRecord:
    members = [member(i, instance=f"static-{i}" if i == 0 else None) for i in range(size)]
    return GroupRecord(protocol_type="consumer", generation=generation, protocol="range",
                       leader=members[0].member_id, current_state_timestamp_ms=1_700_000_000_000 + generation,
                       members=members)


async def started_store(bootstrap: str, topic: str, **overrides) -> KafkaGroupStore:
    store = KafkaGroupStore(StorageConfig(bootstrap=bootstrap, state_topic=topic, event_topic=None,
                                          **{"partitions": 5, "state_writer": STATE_WRITER, **overrides}),
                           load_timeout_ms=60_000)
    await store.start()
    return store


async def read_back(bootstrap: str, topic: str) -> dict[str, dict[tuple[str, int], OffsetRecord]]:
    """Every group's offsets as a fresh store loads them."""
    reader = await started_store(bootstrap, topic)
    try:
        return loaded_offset_records(await reader.read())
    finally:
        await reader.close()
