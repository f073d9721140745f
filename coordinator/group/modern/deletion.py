"""Deleting a consumer group (DeleteGroups): Kafka 4.1's ConsumerGroup.validateDeleteGroup and
createGroupTombstoneRecords."""

from __future__ import annotations

from coordinator.group.modern.group import ConsumerGroup, ConsumerGroupState
from coordinator.group.modern.records import RecordType, Tombstone
from protocol.error_codes import Errors


def delete_error(group: ConsumerGroup) -> Errors | None:
    """Only an Empty consumer group may be deleted."""
    return None if group.state is ConsumerGroupState.EMPTY else Errors.NON_EMPTY_GROUP


def deletion_tombstones(group: ConsumerGroup) -> list[Tombstone]:
    """Every record of the group tombstoned in Kafka's order (replay checks it: members' assignments before their
    metadata, the group's epoch last): current assignments, targets, the target's epoch, member metadata,
    resolved regular expressions, the partition metadata 4.0 wrote, the group's epoch."""
    group_id = group.group_id
    members = list(group.members)
    return ([Tombstone(RecordType.CURRENT_MEMBER_ASSIGNMENT, group_id, m) for m in members]
            + [Tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, group_id, m) for m in members]
            + [Tombstone(RecordType.TARGET_ASSIGNMENT_METADATA, group_id)]
            + [Tombstone(RecordType.MEMBER_METADATA, group_id, m) for m in members]
            + [Tombstone(RecordType.REGULAR_EXPRESSION, group_id, regex=r) for r in group.resolved_regexes]
            + [Tombstone(RecordType.PARTITION_METADATA, group_id),
               Tombstone(RecordType.GROUP_METADATA, group_id)])
