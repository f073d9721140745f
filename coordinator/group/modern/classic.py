"""Members that speak the classic protocol inside a consumer group (Kafka 4.1's classicGroupJoinToConsumerGroup,
classicGroupSyncToConsumerGroup, classicGroupHeartbeatToConsumerGroup, classicGroupLeaveToConsumerGroup).

Such a member is a consumer group member like any other: its subscription comes from the ConsumerProtocol
subscription of its JoinGroup, the server-side assignor computes its target and it is reconciled as the others are.
What differs is the conversation:

    JoinGroup   the member's state advances (records 5, 3, 7, 6, 8 as a heartbeat would write them), reconciled
                against the partitions its subscription says it owns; answered once written with generation =
                member epoch, never as leader. Then the session timer (its classic session timeout) and a sync
                timer (its rebalance timeout) run.
    SyncGroup   its assigned partitions as a ConsumerProtocolAssignment (REBALANCE_IN_PROGRESS while the group epoch
                is ahead and it has nothing to revoke).
    Heartbeat   REBALANCE_IN_PROGRESS when it must rejoin: the group epoch moved on, it has partitions to revoke, or
                partitions it waited for are free now; a join timer then runs.
    LeaveGroup  its records tombstoned and the group epoch bumped.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.group import join
from coordinator.group.api import (UNKNOWN_MEMBER_ID, JoinGroupRequest, JoinGroupResponse, LeaveGroupResponse,
                                   LeaveGroupResponseMember, MemberIdentity, SyncGroupRequest, SyncGroupResponse)
from coordinator.group.modern.errors import ApiError
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.heartbeat import (MemberTimers, Settings, _member_tombstones, current_target,
                                                member_target, reconcile_member, subscribe)
from coordinator.group.modern.member import ConsumerGroupMember, MemberState
from coordinator.group.modern.records import (ClassicMemberMetadata, ConsumerGroupRecord, GroupEpochRecord,
                                              Partitions, TargetAssignmentRecord)
from coordinator.group.modern.topics import metadata_hash
from coordinator.topics import TopicsView
from protocol.consumer_protocol import (Assignment, ConsumerProtocolError, Subscription, decode_subscription,
                                        encode_assignment)
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")

CONSUMER_PROTOCOL_TYPE = "consumer"


class ClassicTimers(MemberTimers, Protocol):
    """The timers only classic members have (Kafka's join and sync timeouts), and a session timer of their own
    length."""

    def schedule_classic_session(self, group_id: str, member_id: str, timeout_ms: int) -> None: ...
    def schedule_join_timeout_if_absent(self, group_id: str, member_id: str, timeout_ms: int) -> None: ...
    def cancel_join_timeout(self, group_id: str, member_id: str) -> None: ...
    def schedule_sync_timeout(self, group_id: str, member_id: str, timeout_ms: int) -> None: ...
    def cancel_sync_timeout(self, group_id: str, member_id: str) -> None: ...


@dataclass(slots=True)
class ClassicJoinResult:
    """The records to write, the response to send once they are, and what to arm then."""

    records: list[ConsumerGroupRecord] = field(default_factory=list)
    response: JoinGroupResponse = field(default_factory=lambda: JoinGroupResponse(Errors.NONE))
    then: Callable[[], None] | None = None
    downgrade: bool = False  # the records done, the group becomes a classic group (the joiner replaced the last
    # consumer-protocol member with another subscription)


def supports_classic_protocols(group: ConsumerGroup, protocol_type: str, names: set[str]) -> bool:
    """Kafka's ConsumerGroup.supportsClassicProtocols: the consumer protocol type, and (unless the group is empty)
    one of the names supported by every member that speaks the classic protocol."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE:
        return False
    if not group.members:
        return bool(names)
    classic = [m.classic for m in group.members.values() if m.classic is not None]
    return any(all(any(name == p for p, _ in c.protocols) for c in classic) for name in names)


def classic_join(group: ConsumerGroup, req: JoinGroupRequest, topics: TopicsView, settings: Settings,
                 timers: ClassicTimers, now_ms: int, downgrades: Callable[[str], bool] = lambda _replaced: False
                 ) -> ClassicJoinResult:
    """Raises ApiError (the response's error code). `downgrades(replaced member id)`: whether a static member this
    join replaces takes the group back to classic (Kafka's validateOnlineDowngradeWithReplacedMember); it does if
    the joiner's subscription differs, else the joiner gets its predecessor's target as it is."""
    group_id = group.group_id
    is_unknown = req.member_id == UNKNOWN_MEMBER_ID
    # Kafka's Uuid.randomUuid(); join.member_id_suffix is a random uuid too (the simulator seeds it)
    member_id = join.member_id_suffix() if is_unknown else req.member_id
    if len(group.members) >= settings.max_size and (not member_id or member_id not in group.members):
        raise ApiError(Errors.GROUP_MAX_SIZE_REACHED)
    if not supports_classic_protocols(group, req.protocol_type, {p.name for p in req.protocols}):
        raise ApiError(Errors.INCONSISTENT_GROUP_PROTOCOL, f"Member {member_id}'s protocols are not supported.")
    if is_unknown and req.require_known_member_id:
        log.info("[GroupId %s] Dynamic member with unknown member id joins the consumer group. Created a new member "
                 "id %s and requesting the member to rejoin with this id.", group_id, member_id)
        return ClassicJoinResult(response=JoinGroupResponse(Errors.MEMBER_ID_REQUIRED, member_id=member_id))
    subscription = _subscription(req)
    records: list[ConsumerGroupRecord] = []
    replaced: str | None = None
    if req.group_instance_id is None:
        member = group.members.get(member_id) or ConsumerGroupMember(member_id)
        log.info("[GroupId %s] Member %s joins the consumer group using the classic protocol.", group_id, member_id)
    else:
        member, replaced = _static_member(group, member_id, req.group_instance_id, is_unknown, records)
    updated = member.replace(
        instance_id=req.group_instance_id if req.group_instance_id is not None else member.instance_id,
        rack_id=subscription.rack_id if subscription.rack_id is not None else member.rack_id,
        rebalance_timeout_ms=req.rebalance_timeout_ms if req.rebalance_timeout_ms != -1
        else member.rebalance_timeout_ms,
        subscribed_topic_names=tuple(sorted(set(subscription.topics))),
        client_id=req.client_id, client_host=req.client_host,
        classic=ClassicMemberMetadata(req.session_timeout_ms, tuple((p.name, p.metadata) for p in req.protocols)))
    downgrade = replaced is not None and downgrades(replaced)
    group_epoch, changed = subscribe(group, member, updated, replaced, records, topics, settings, now_ms)
    protocol_name = req.protocols[0].name
    if downgrade and changed:  # answered as it is; its SyncGroup finds the classic group rebalancing
        return ClassicJoinResult(records, JoinGroupResponse(
            Errors.NONE, member_id=member_id, generation_id=updated.member_epoch, protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_name=protocol_name), lambda: timers.cancel_join_timeout(group_id, member_id), downgrade=True)
    target = (current_target(group, member_id, replaced) if downgrade
              else member_target(group, updated, replaced, group_epoch, records, topics,
                                 default_assignor=settings.default_assignor))
    updated = reconcile_member(group, updated, target, _owned(subscription, topics), records)
    response = JoinGroupResponse(Errors.NONE, member_id=member_id, generation_id=updated.member_epoch,
                                 protocol_type=CONSUMER_PROTOCOL_TYPE, protocol_name=protocol_name)

    def then() -> None:
        timers.cancel_join_timeout(group_id, member_id)
        timers.schedule_classic_session(group_id, member_id, req.session_timeout_ms)
        timers.schedule_sync_timeout(group_id, member_id, req.rebalance_timeout_ms)

    return ClassicJoinResult(records, response, then)


def _subscription(req: JoinGroupRequest) -> Subscription:
    """Every protocol carries the same subscription: the first one's is read (Kafka's deserializeSubscription)."""
    try:
        return decode_subscription(req.protocols[0].metadata)[1]
    except (ConsumerProtocolError, IndexError) as exc:
        log.warning("event=classic_join_malformed_subscription group=%s member=%s error=%r", req.group_id,
                    req.member_id, exc)
        raise ApiError(Errors.UNKNOWN_SERVER_ERROR, "Malformed embedded consumer protocol in subscription "
                       "deserialization.") from exc


def _owned(subscription: Subscription, topics: TopicsView) -> list[tuple[uuid.UUID, Sequence[int]]]:
    """The owned partitions of the subscription by topic id; topics the metadata does not know are left out."""
    owned: list[tuple[uuid.UUID, Sequence[int]]] = []
    for name, partitions in subscription.owned_partitions:
        image = topics.by_name(name)
        if image is not None:
            owned.append((image.topic_id, partitions))
    return owned


def _static_member(group: ConsumerGroup, member_id: str, instance_id: str, is_unknown: bool,
                   records: list[ConsumerGroupRecord]) -> tuple[ConsumerGroupMember, str | None]:
    """Kafka's getOrMaybeSubscribeStaticConsumerGroupMember for a classic member: a join without a member id takes
    the instance id over from whoever holds it (whatever its protocol); with one, it must be the holder."""
    group_id = group.group_id
    existing = group.static_member(instance_id)
    if not is_unknown:
        return _known_member(group, member_id, instance_id), None
    if existing is None:
        log.info("[GroupId %s] Static member %s with instance id %s joins the consumer group using the classic "
                 "protocol.", group_id, member_id, instance_id)
        return ConsumerGroupMember(member_id), None
    successor = existing.replace(member_id=member_id, member_epoch=0, previous_member_epoch=0)
    records.extend(_member_tombstones(group_id, existing.member_id))
    records.append(successor.metadata_record(group_id))
    records.append(TargetAssignmentRecord(group_id, member_id, group.target_of(existing.member_id)))
    records.append(successor.assignment_record(group_id))
    log.info("[GroupId %s] Static member with instance id %s re-joins the consumer group using the classic protocol. "
             "Created a new member %s to replace the existing member %s.", group_id, instance_id, member_id,
             existing.member_id)
    return successor, existing.member_id


def _known_member(group: ConsumerGroup, member_id: str, instance_id: str | None) -> ConsumerGroupMember:
    """Kafka's validateConsumerGroupMember then throwIfMemberDoesNotUseClassicProtocol."""
    if instance_id is None:
        member = group.members.get(member_id)
        if member is None:
            raise ApiError(Errors.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group "
                           f"{group.group_id}.")
    else:
        member = group.static_member(instance_id)
        if member is None:
            raise ApiError(Errors.UNKNOWN_MEMBER_ID, f"Member with instance id {instance_id} is not a member of "
                           f"group {group.group_id}.")
        if member.member_id != member_id:
            log.info("[GroupId %s] Static member %s with instance id %s is fenced by existing member %s.",
                     group.group_id, member_id, instance_id, member.member_id)
            raise ApiError(Errors.FENCED_INSTANCE_ID)
    if not member.uses_classic_protocol:
        raise ApiError(Errors.UNKNOWN_MEMBER_ID, f"Member {member.member_id} does not use the classic protocol.")
    return member


def _check_generation(member: ConsumerGroupMember, generation_id: int) -> None:
    if member.member_epoch != generation_id:
        raise ApiError(Errors.ILLEGAL_GENERATION)


def classic_sync(group: ConsumerGroup, req: SyncGroupRequest, topics: TopicsView, timers: ClassicTimers
                 ) -> SyncGroupResponse:
    """Raises ApiError. Nothing is written: answered at once."""
    member = _known_member(group, req.member_id, req.group_instance_id)
    _check_generation(member, req.generation_id)
    assert member.classic is not None  # _known_member checked it
    protocol_name = member.classic.protocols[0][0]
    if ((req.protocol_type is not None and req.protocol_type != CONSUMER_PROTOCOL_TYPE)
            or (req.protocol_name is not None and req.protocol_name != protocol_name)):
        raise ApiError(Errors.INCONSISTENT_GROUP_PROTOCOL)
    if group.group_epoch > member.member_epoch and member.state is not MemberState.UNREVOKED_PARTITIONS:
        # behind a rebalance it has not rejoined for yet (one with partitions to revoke has rejoined already)
        timers.schedule_join_timeout_if_absent(group.group_id, member.member_id, member.rebalance_timeout_ms)
        raise ApiError(Errors.REBALANCE_IN_PROGRESS)
    timers.cancel_sync_timeout(group.group_id, member.member_id)
    timers.schedule_classic_session(group.group_id, member.member_id, member.classic.session_timeout_ms)
    return SyncGroupResponse(Errors.NONE, req.protocol_type, req.protocol_name, assignment_bytes(member, topics))


def assignment_bytes(member: ConsumerGroupMember, topics: TopicsView) -> bytes:
    """The member's assigned partitions as a ConsumerProtocolAssignment, in the version of its subscription."""
    assert member.classic is not None
    try:
        version = decode_subscription(member.classic.protocols[0][1])[0]
    except ConsumerProtocolError:
        version = 0
    return encode_assignment(Assignment(_by_name(member.assigned, topics)), min(version, 3))


def _by_name(partitions: Partitions, topics: TopicsView) -> tuple[tuple[str, tuple[int, ...]], ...]:
    named = []
    for topic_id, ps in partitions.items():
        image = topics.by_id(topic_id)
        if image is not None:
            named.append((image.name, tuple(ps)))
    return tuple(named)


def classic_heartbeat(group: ConsumerGroup, member_id: str, generation_id: int, instance_id: str | None,
                      timers: ClassicTimers) -> Errors:
    try:
        member = _known_member(group, member_id, instance_id)
        _check_generation(member, generation_id)
    except ApiError as exc:
        return exc.error
    assert member.classic is not None
    timers.schedule_classic_session(group.group_id, member.member_id, member.classic.session_timeout_ms)
    if (member.member_epoch < group.group_epoch or member.state is MemberState.UNREVOKED_PARTITIONS
            or (member.state is MemberState.UNRELEASED_PARTITIONS and not waiting_on_unreleased(group, member))):
        timers.schedule_join_timeout_if_absent(group.group_id, member.member_id, member.rebalance_timeout_ms)
        return Errors.REBALANCE_IN_PROGRESS
    return Errors.NONE


def waiting_on_unreleased(group: ConsumerGroup, member: ConsumerGroupMember) -> bool:
    """Kafka's ConsumerGroup.waitingOnUnreleasedPartition: some partition of its target it does not have yet is
    still held by another member."""
    if member.state is not MemberState.UNRELEASED_PARTITIONS:
        return False
    for topic_id, partitions in group.target_of(member.member_id).items():
        assigned = member.assigned.get(topic_id, ())
        if any(p not in assigned and group.partition_epoch(topic_id, p) != -1 for p in partitions):
            return True
    return False


def classic_leave(group: ConsumerGroup, leaving: Sequence[MemberIdentity], topics: TopicsView,
                  timers: ClassicTimers) -> tuple[list[ConsumerGroupRecord], LeaveGroupResponse]:
    """Every valid leaver's records tombstoned, then one group epoch bump for them all."""
    group_id = group.group_id
    records: list[ConsumerGroupRecord] = []
    answers = []
    after = group.snapshot()
    for identity in leaving:
        member_id, instance_id = identity.member_id, identity.group_instance_id
        reason = identity.reason or "not provided"
        try:
            member = _leaving_member(group, member_id, instance_id)
        except ApiError as exc:
            answers.append(LeaveGroupResponseMember(member_id, instance_id, exc.error))
            continue
        member_id = member.member_id
        if member_id not in after.members:  # named twice
            answers.append(LeaveGroupResponseMember(member_id, instance_id, Errors.NONE))
            continue
        if instance_id is None:
            log.info("[GroupId %s] Dynamic member %s has left group through explicit `LeaveGroup` request; client "
                     "reason: %s", group_id, member_id, reason)
        else:
            log.info("[GroupId %s] Static member %s with instance id %s has left group through explicit `LeaveGroup` "
                     "request; client reason: %s", group_id, member_id, instance_id, reason)
        tombstones = _member_tombstones(group_id, member_id)
        for record in tombstones:
            after.replay(record)
        records.extend(tombstones)
        timers.cancel_all(group_id, member_id)
        answers.append(LeaveGroupResponseMember(member_id, instance_id, Errors.NONE))
    if records:
        records.append(GroupEpochRecord(group_id, group.group_epoch + 1,
                                        metadata_hash(after.subscribed_topic_names(), topics)))
    return records, LeaveGroupResponse(Errors.NONE, answers)


def _leaving_member(group: ConsumerGroup, member_id: str, instance_id: str | None) -> ConsumerGroupMember:
    if instance_id is None:
        return _known_member(group, member_id, None)
    member = group.static_member(instance_id)
    if member is None:
        raise ApiError(Errors.UNKNOWN_MEMBER_ID)
    if member_id != UNKNOWN_MEMBER_ID and member.member_id != member_id:  # KIP-345 removal names no member id
        raise ApiError(Errors.FENCED_INSTANCE_ID)
    if not member.uses_classic_protocol:
        raise ApiError(Errors.UNKNOWN_MEMBER_ID)
    return member
