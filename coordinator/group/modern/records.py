"""The consumer group's records in `__consumer_offsets` (Kafka 4.1's types 3-8 and 16), as typed values.

Group logic produces these; replaying them (ConsumerGroup.replay) is the only way the group's state changes, so a
load after a crash and a live heartbeat take the same path. The bytes are coordinator/storage/consumer_records.py.
Partitions are held as {topic id: sorted tuple of partitions}.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field

Partitions = dict[uuid.UUID, tuple[int, ...]]


class RecordType(enum.IntEnum):
    GROUP_METADATA = 3
    PARTITION_METADATA = 4  # written by Kafka 4.0; 4.1 only tombstones it
    MEMBER_METADATA = 5
    TARGET_ASSIGNMENT_METADATA = 6
    TARGET_ASSIGNMENT_MEMBER = 7
    CURRENT_MEMBER_ASSIGNMENT = 8
    REGULAR_EXPRESSION = 16


@dataclass(frozen=True, slots=True)
class GroupEpochRecord:
    """ConsumerGroupMetadata (3): the group epoch; MetadataHash (tagged, 4.1) summarises the subscribed topics."""

    group_id: str
    epoch: int
    metadata_hash: int = 0
    record_type = RecordType.GROUP_METADATA


@dataclass(frozen=True, slots=True)
class ClassicMemberMetadata:
    """What a member that speaks the classic protocol (JoinGroup/SyncGroup) inside a consumer group adds to record
    5 (tagged field 0): its session timeout and the protocols of its JoinGroup, (name, metadata) in its order."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class MemberMetadataRecord:
    """ConsumerGroupMemberMetadata (5): a member's subscription and identity."""

    group_id: str
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]  # sorted, as Kafka writes them
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic: ClassicMemberMetadata | None = None  # None: the member speaks the consumer protocol
    record_type = RecordType.MEMBER_METADATA


@dataclass(frozen=True, slots=True)
class TargetAssignmentEpochRecord:
    """ConsumerGroupTargetAssignmentMetadata (6): the group epoch the target assignment was computed at."""

    group_id: str
    assignment_epoch: int
    record_type = RecordType.TARGET_ASSIGNMENT_METADATA


@dataclass(frozen=True, slots=True)
class TargetAssignmentRecord:
    """ConsumerGroupTargetAssignmentMember (7): one member's target."""

    group_id: str
    member_id: str
    partitions: Partitions = field(default_factory=dict)
    record_type = RecordType.TARGET_ASSIGNMENT_MEMBER


@dataclass(frozen=True, slots=True)
class CurrentAssignmentRecord:
    """ConsumerGroupCurrentMemberAssignment (8): the member's epochs, state and what it may own now."""

    group_id: str
    member_id: str
    member_epoch: int
    previous_member_epoch: int
    state: int  # MemberState value
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    record_type = RecordType.CURRENT_MEMBER_ASSIGNMENT


@dataclass(frozen=True, slots=True)
class RegexRecord:
    """ConsumerGroupRegularExpression (16): the topics a subscribed regular expression resolved to, at which
    metadata version and when."""

    group_id: str
    regex: str
    topics: tuple[str, ...]  # sorted
    version: int
    timestamp_ms: int
    record_type = RecordType.REGULAR_EXPRESSION


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A key with a null value: the record of that type (and member, or regular expression) is deleted."""

    record_type: RecordType
    group_id: str
    member_id: str | None = None  # for the per-member types 5, 7, 8
    regex: str | None = None  # for type 16


ConsumerGroupRecord = (GroupEpochRecord | MemberMetadataRecord | TargetAssignmentEpochRecord | TargetAssignmentRecord
                       | CurrentAssignmentRecord | RegexRecord | Tombstone)

CONSUMER_GROUP_RECORD_CLASSES = (GroupEpochRecord, MemberMetadataRecord, TargetAssignmentEpochRecord,
                                 TargetAssignmentRecord, CurrentAssignmentRecord, RegexRecord, Tombstone)

PER_MEMBER_TYPES = frozenset({RecordType.MEMBER_METADATA, RecordType.TARGET_ASSIGNMENT_MEMBER,
                              RecordType.CURRENT_MEMBER_ASSIGNMENT})


def sorted_partitions(partitions: dict[uuid.UUID, set[int]] | dict[uuid.UUID, frozenset[int]] | Partitions
                      ) -> Partitions:
    """{topic: sorted tuple}, empty topics dropped: the canonical form kept in records and members."""
    return {topic_id: tuple(sorted(ps)) for topic_id, ps in partitions.items() if ps}
