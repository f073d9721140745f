"""The group's index of who holds each partition (`ConsumerGroup.partition_epoch`) against records replayed in the
order a load reads them: a member's release must not drop the entry of another member that holds the partition at
the same epoch (seed 2250 of --protocol upgrade: a loaded member's partitions were given to a newcomer)."""

from __future__ import annotations

import uuid

from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.records import (CurrentAssignmentRecord, MemberMetadataRecord, RecordType,
                                              Tombstone)

TOPIC = uuid.UUID(int=7)


def _member(group_id: str, member_id: str) -> MemberMetadataRecord:
    return MemberMetadataRecord(group_id, member_id, None, None, "client", "/host", ("t0",), None, 30000, None)


def test_a_tombstoned_member_of_the_same_epoch_leaves_the_holders_entry() -> None:
    group = ConsumerGroup("g")
    # an older member held 3..5 at epoch 4 (its writes landed), then a member that replaced it was written with all
    # six at the same epoch, then the older member's tombstones (a repair resent after the newer member's join)
    group.replay(_member("g", "old"))
    group.replay(CurrentAssignmentRecord("g", "old", 4, 3, 0, {TOPIC: (3, 4, 5)}))
    group.replay(_member("g", "new"))
    group.replay(CurrentAssignmentRecord("g", "new", 4, 3, 0, {TOPIC: tuple(range(6))}))
    for record_type in (RecordType.CURRENT_MEMBER_ASSIGNMENT, RecordType.TARGET_ASSIGNMENT_MEMBER,
                        RecordType.MEMBER_METADATA):
        group.replay(Tombstone(record_type, "g", "old"))
    assert set(group.members) == {"new"}
    assert [group.partition_epoch(TOPIC, p) for p in range(6)] == [4] * 6


def test_a_members_own_release_clears_its_entries() -> None:
    group = ConsumerGroup("g")
    group.replay(_member("g", "m"))
    group.replay(CurrentAssignmentRecord("g", "m", 2, 1, 0, {TOPIC: (0, 1)}))
    group.replay(CurrentAssignmentRecord("g", "m", 3, 2, 0, {TOPIC: (1,)}))
    assert (group.partition_epoch(TOPIC, 0), group.partition_epoch(TOPIC, 1)) == (-1, 3)
    group.replay(Tombstone(RecordType.MEMBER_METADATA, "g", "m"))
    assert group.partition_epoch(TOPIC, 1) == -1
