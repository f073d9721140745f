"""Online conversion between a classic group and a consumer group (Kafka 4.1's validateOnlineUpgrade,
convertToConsumerGroup, ConsumerGroup.fromClassicGroup; validateOnlineDowngradeWithFencedMember,
convertToClassicGroup, ClassicGroup.fromConsumerGroup), under `group.consumer.migration.policy`.

The first ConsumerGroupHeartbeat to a classic group with members converts it: each classic member becomes a
consumer group member that speaks the classic protocol, STABLE at the classic generation, its target and its
assignment what the classic leader gave it. The records are the classic group's tombstone, then 5 per member, 3,
7 per member, 6 and 8 per member; the joiner's own records follow in the same write, so a load sees the conversion
whole or not at all.

When the last member that speaks the consumer protocol leaves or is fenced and classic members remain, the group
goes back: the consumer group's tombstones, then the classic group's record (Stable at generation = group epoch,
each member assigned its target), written together; a rebalance follows.
"""

from __future__ import annotations

import logging
import uuid

from coordinator.group.api import JoinGroupProtocol
from coordinator.group.member import MemberMetadata
from coordinator.group.metadata import GroupMetadata
from coordinator.group.modern.errors import ApiError
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.member import ConsumerGroupMember, MemberState
from coordinator.group.modern.records import (ClassicMemberMetadata, ConsumerGroupRecord, GroupEpochRecord,
                                              Partitions, RecordType, TargetAssignmentEpochRecord,
                                              TargetAssignmentRecord, Tombstone, sorted_partitions)
from coordinator.group.observer import GroupObserver
from coordinator.group.modern.topics import metadata_hash
from coordinator.topics import TopicsView
from coordinator.group.state import GroupState
from protocol.consumer_protocol import (Assignment, ConsumerProtocolError, decode_assignment, decode_subscription,
                                        encode_assignment)
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
            log.warning("Cannot upgrade classic group %s to consumer group: userData from a custom assignor would be "
                        "lost.", group_id)
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


def validate_online_downgrade(group: ConsumerGroup, fenced_member_id: str, policy: str, classic_max_size: int
                              ) -> bool:
    """Kafka's validateOnlineDowngradeWithFencedMember: the last consumer-protocol member goes and classic ones
    remain, within the policy and the classic group's maximum size."""
    if not _all_classic_except(group, fenced_member_id) or len(group.members) <= 1:
        return False
    return _downgrade_allowed(group, len(group.members) - 1, policy, classic_max_size)


def validate_online_downgrade_with_replaced(group: ConsumerGroup, replaced_member_id: str, policy: str,
                                            classic_max_size: int) -> bool:
    """Kafka's validateOnlineDowngradeWithReplacedMember: a classic static member takes the place of the last
    consumer-protocol member (the group keeps its size), within the policy and the classic group's maximum size."""
    if not _all_classic_except(group, replaced_member_id):
        return False
    return _downgrade_allowed(group, len(group.members), policy, classic_max_size)


def _all_classic_except(group: ConsumerGroup, member_id: str) -> bool:
    """Kafka's ConsumerGroup.allMembersUseClassicProtocolExcept."""
    member = group.members.get(member_id)
    classic = sum(1 for m in group.members.values() if m.uses_classic_protocol)
    return member is not None and not member.uses_classic_protocol and classic == len(group.members) - 1


def _downgrade_allowed(group: ConsumerGroup, size: int, policy: str, classic_max_size: int) -> bool:
    if not downgrade_enabled(policy):
        log.info("Cannot downgrade consumer group %s to classic group because the online downgrade is disabled.",
                 group.group_id)
        return False
    if size > classic_max_size:
        log.info("Cannot downgrade consumer group %s to classic group because its group size is greater than "
                 "classic group max size.", group.group_id)
        return False
    return True


def consumer_group_tombstones(group: ConsumerGroup) -> list[ConsumerGroupRecord]:
    """Kafka's ConsumerGroup.createGroupTombstoneRecords, in its order: 8 per member, 7 per member, 6, 5 per
    member, 16 per resolved regular expression, 4, 3."""
    group_id, members = group.group_id, list(group.members)
    records: list[ConsumerGroupRecord] = [Tombstone(RecordType.CURRENT_MEMBER_ASSIGNMENT, group_id, m)
                                          for m in members]
    records += [Tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, group_id, m) for m in members]
    records.append(Tombstone(RecordType.TARGET_ASSIGNMENT_METADATA, group_id))
    records += [Tombstone(RecordType.MEMBER_METADATA, group_id, m) for m in members]
    records += [Tombstone(RecordType.REGULAR_EXPRESSION, group_id, regex=r) for r in group.resolved_regexes]
    records.append(Tombstone(RecordType.PARTITION_METADATA, group_id))
    records.append(Tombstone(RecordType.GROUP_METADATA, group_id))
    return records


def classic_group_from(group: ConsumerGroup, leaving_member_id: str | None, topics: TopicsView, now_ms: int,
                       observer: GroupObserver) -> GroupMetadata:
    """Kafka's ClassicGroup.fromConsumerGroup: a Stable classic group at generation = group epoch whose members
    are the remaining (classic) ones, each assigned its target as a ConsumerProtocolAssignment."""
    classic = GroupMetadata(group.group_id, GroupState.STABLE, now_ms, observer)
    classic.protocol_type = CONSUMER_PROTOCOL_TYPE
    classic.generation_id = group.group_epoch
    for member_id, member in group.members.items():
        if member_id == leaving_member_id or member.classic is None:
            continue
        protocols = [JoinGroupProtocol(name, metadata) for name, metadata in member.classic.protocols]
        classic.add(MemberMetadata(member_id, member.instance_id, member.client_id, member.client_host,
                                   member.rebalance_timeout_ms, member.classic.session_timeout_ms,
                                   CONSUMER_PROTOCOL_TYPE, protocols))
    classic.protocol_name = classic.select_protocol()
    classic.subscribed_topics = classic._compute_subscribed_topics()  # noqa: SLF001 (as loading sets it)
    for member_id, classic_member in classic.members.items():
        try:
            version = decode_subscription(classic_member.metadata(classic.protocol_name))[0]
        except (ConsumerProtocolError, KeyError):
            version = 0
        named = []
        for topic_id, ps in group.target_of(member_id).items():
            image = topics.by_id(topic_id)
            if image is not None:
                named.append((image.name, tuple(ps)))
        classic_member.assignment = encode_assignment(Assignment(tuple(named)), min(version, 3))
    return classic
