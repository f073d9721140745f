"""Online conversion of a classic group into a consumer group (Kafka 4.1's validateOnlineUpgrade,
convertToConsumerGroup and ConsumerGroup.fromClassicGroup), under `group.consumer.migration.policy`.

The first ConsumerGroupHeartbeat to a classic group with members converts it: each classic member becomes a
consumer group member that speaks the classic protocol, STABLE at the classic generation, its target and its
assignment what the classic leader gave it. The records are the classic group's tombstone, then 5 per member, 3,
7 per member, 6 and 8 per member; the joiner's own records follow in the same write, so a load sees the conversion
whole or not at all.
"""

from __future__ import annotations

import logging
import uuid

from coordinator.group.metadata import GroupMetadata
from coordinator.group.modern.errors import ApiError
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.member import ConsumerGroupMember, MemberState
from coordinator.group.modern.records import (ClassicMemberMetadata, ConsumerGroupRecord, GroupEpochRecord,
                                              Partitions, TargetAssignmentEpochRecord, TargetAssignmentRecord,
                                              sorted_partitions)
from coordinator.group.modern.topics import TopicsView, metadata_hash
from coordinator.group.state import GroupState
from protocol.consumer_protocol import ConsumerProtocolError, decode_assignment, decode_subscription
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")

CONSUMER_PROTOCOL_TYPE = "consumer"


def upgrade_enabled(policy: str) -> bool:
    return policy.lower() in ("bidirectional", "upgrade")


def downgrade_enabled(policy: str) -> bool:
    return policy.lower() in ("bidirectional", "downgrade")


def validate_online_upgrade(classic: GroupMetadata, policy: str, consumer_max_size: int) -> None:
    """Raises GROUP_ID_NOT_FOUND with Kafka's message when the classic group may not become a consumer group."""
    group_id = classic.group_id
    if not upgrade_enabled(policy):
        reason = "online upgrade is disabled"
    elif classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
        reason = "the group does not use the consumer embedded protocol"
    elif len(classic.members) > consumer_max_size:
        reason = "the group size exceeds the consumer group maximum size"
    else:
        return
    log.info("Cannot upgrade classic group %s to consumer group because %s.", group_id, reason)
    raise ApiError(Errors.GROUP_ID_NOT_FOUND, f"Cannot upgrade classic group {group_id} to consumer group because "
                   f"{reason}.")


def consumer_group_records(classic: GroupMetadata, topics: TopicsView) -> list[ConsumerGroupRecord]:
    """The consumer group records of the converted classic group (raises GROUP_ID_NOT_FOUND if a member's
    subscription or assignment is not the consumer protocol's, or carries a custom assignor's user data)."""
    group_id, generation = classic.group_id, classic.generation_id
    members: list[ConsumerGroupMember] = []
    for member in classic.members.values():
        try:
            _, subscription = decode_subscription(member.metadata(classic.protocol_name or ""))
            _, assignment = decode_assignment(member.assignment) if member.assignment else (0, None)
        except (ConsumerProtocolError, KeyError, ValueError) as exc:
            log.warning("Cannot upgrade classic group %s to consumer group because the embedded consumer protocol is "
                        "malformed: %r.", group_id, exc)
            raise ApiError(Errors.GROUP_ID_NOT_FOUND, f"Cannot upgrade classic group {group_id} to consumer group "
                           "because the embedded consumer protocol is malformed.") from exc
        if assignment is not None and assignment.user_data:
            raise ApiError(Errors.GROUP_ID_NOT_FOUND, f"Cannot upgrade classic group {group_id} to consumer group "
                           "because an unsupported custom assignor is in use. Please refer to the documentation or "
                           "switch to a default assignor before re-attempting the upgrade.")
        assigned = _by_id(assignment.partitions if assignment is not None else (), topics)
        members.append(ConsumerGroupMember(
            member.member_id, member_epoch=generation, previous_member_epoch=generation, state=MemberState.STABLE,
            instance_id=member.group_instance_id, rack_id=subscription.rack_id,
            rebalance_timeout_ms=member.rebalance_timeout_ms, client_id=member.client_id,
            client_host=member.client_host, subscribed_topic_names=tuple(sorted(set(subscription.topics))),
            assigned=assigned,
            classic=ClassicMemberMetadata(member.session_timeout_ms,
                                          tuple((p.name, p.metadata) for p in member.supported_protocols))))
    names = {name for m in members for name in m.subscribed_topic_names}
    records: list[ConsumerGroupRecord] = [m.metadata_record(group_id) for m in members]
    records.append(GroupEpochRecord(group_id, generation, metadata_hash(names, topics)))
    records += [TargetAssignmentRecord(group_id, m.member_id, m.assigned) for m in members]
    records.append(TargetAssignmentEpochRecord(group_id, generation))
    records += [m.assignment_record(group_id) for m in members]
    return records


def _by_id(partitions: tuple[tuple[str, tuple[int, ...]], ...], topics: TopicsView) -> Partitions:
    """Topics the metadata does not know are left out (Kafka's toTopicPartitionMap)."""
    by_id: dict[uuid.UUID, set[int]] = {}
    for name, ps in partitions:
        image = topics.by_name(name)
        if image is not None:
            by_id.setdefault(image.topic_id, set()).update(ps)
    return sorted_partitions(by_id)


def converted(group_id: str, records: list[ConsumerGroupRecord]) -> ConsumerGroup:
    """The consumer group the conversion records describe (replayed, as a load would)."""
    group = ConsumerGroup(group_id)
    for record in records:
        group.replay(record)
    return group


def is_convertible(classic: GroupMetadata | None) -> bool:
    """A classic group with members: an empty one is simply replaced."""
    return classic is not None and not (classic.is_in(GroupState.EMPTY) or classic.is_in(GroupState.DEAD))
