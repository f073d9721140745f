"""The records a shard writes to its state-topic partition: Kafka's `__consumer_offsets` records, typed.

A record is a key (which group, which partition) and a value; `value is None` is a tombstone. Values are
Kafka's schemas field for field: `GroupRecord`/`MemberRecord` are GroupMetadataValue (written as v3),
`OffsetRecord` is OffsetCommitValue (v3, or v1 when it carries an expire timestamp; None = no expire
timestamp). The state-topic codec (coordinator/storage/records.py) encodes and decodes these very types.
`Record` is the union every writer and the store take; the consumer protocol's record types join it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from coordinator.group.modern.records import ConsumerGroupRecord

TopicPartition = tuple[str, int]


# (its generated __init__ left as it is: compiled, a class's own __init__ runs in its __new__ too, and
# InMemoryGroupStore deep-copies the records it keeps, which calls __new__ without arguments)
@dataclass(slots=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes  # metadata of the selected protocol
    assignment: bytes


@dataclass(slots=True)
class GroupRecord:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int = -1  # -1 = unknown (v0-1 records)
    members: list[MemberRecord] = field(default_factory=list)


@dataclass(slots=True)
class OffsetRecord:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1
    expire_timestamp_ms: int | None = None
    # Offset of the record in the state partition, when known (loaded or read back): a committed transaction's
    # offset replaces the current one only if its record is later. Not part of the value, so not compared.
    log_offset: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class GroupMetadataRecord:
    """A classic group's metadata (key version 2); None: the group is deleted."""

    group_id: str
    value: GroupRecord | None


@dataclass(frozen=True, slots=True)
class OffsetCommitRecord:
    """A committed offset (key version 1); None: the offset is deleted (OffsetDelete, expiry, DeleteGroups)."""

    group_id: str
    topic: str
    partition: int
    value: OffsetRecord | None


Record = Union[GroupMetadataRecord, OffsetCommitRecord, ConsumerGroupRecord]


def offset_commits(group_id: str, offsets: dict[TopicPartition, OffsetRecord]) -> list[Record]:
    return [OffsetCommitRecord(group_id, topic, partition, value) for (topic, partition), value in offsets.items()]


def tombstones(group_id: str, offsets: list[TopicPartition], group: bool) -> list[Record]:
    """Tombstones of these offsets and, if `group`, of the group's metadata (written last, as Kafka does)."""
    records: list[Record] = [OffsetCommitRecord(group_id, topic, partition, None) for topic, partition in offsets]
    if group:
        records.append(GroupMetadataRecord(group_id, None))
    return records
