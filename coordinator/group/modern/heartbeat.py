"""ConsumerGroupHeartbeat (Kafka 4.1's GroupMetadataManager.consumerGroupHeartbeat and GroupCoordinatorService's
request validation): a function of the group, the request and the topics, returning the records to write and the
response. The caller replays the records onto the group, writes them, then answers.

    join/heartbeat: member created or updated (record 5 if changed) → group epoch bumped (record 3) when a
    subscription or the subscribed topics changed → target computed when the group epoch is ahead of the
    assignment epoch (7 per changed member, then 6) → the member reconciled (8 if changed) → session timer re-armed.
    leave (-1) / session expiry: 8, 7 and 5 tombstoned, then the group epoch bumped (3), in Kafka's order.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.group.assignor import ASSIGNORS, DEFAULT_ASSIGNOR, AssignorError, GroupSpec, MemberSpec
from coordinator.group.assignor import SubscriptionType
from coordinator.group.assignor.java_order import member_order
from coordinator.group.modern.errors import ApiError
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.member import (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH,
                                             ConsumerGroupMember, MemberState)
from coordinator.group.modern.reconciliation import FencedMemberEpoch, OwnedPartitions, reconcile
from coordinator.group.modern.regex import REGEX_REFRESH_INTERVAL_MS, DescribableTopics, Refresh, regexes_after
from coordinator.group.modern.records import (ConsumerGroupRecord, GroupEpochRecord, Partitions, RecordType,
                                              TargetAssignmentEpochRecord, TargetAssignmentRecord, Tombstone,
                                              sorted_partitions)
from coordinator.group.modern.topics import bumped_group_epoch, metadata_hash
from coordinator.topics import TopicsView
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")

CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION = 1


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: OwnedPartitions = None  # (topic id, partitions) pairs; None = unchanged since the last heartbeat
    client_id: str = ""
    client_host: str = ""
    version: int = 1
    describable_topics: DescribableTopics | None = None  # the requester's topic rights (regex.py resolutions)


@dataclass(slots=True)
class HeartbeatResponse:
    error: Errors = Errors.NONE
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Partitions | None = None  # None: not sent (unchanged)


@dataclass(frozen=True, slots=True)
class PendingTarget:
    """A heartbeat that found its group's epoch ahead of the assignment epoch and, its records replayed, waits for
    the target that the group's heartbeats of one batch share (`answer_pending`): what its answer needs."""

    member_id: str
    owned: OwnedPartitions
    assigned_before: Partitions  # the member's assignment before this heartbeat
    full: bool  # the request repeats every field: the assignment is sent even when unchanged
    heartbeat_interval_ms: int


@dataclass(slots=True)
class HeartbeatResult:
    records: list[ConsumerGroupRecord] = field(default_factory=list)
    response: HeartbeatResponse = field(default_factory=HeartbeatResponse)
    created: ConsumerGroup | None = None  # the group this join created: the records are replayed onto it
    refresh_regexes: Refresh | None = None  # to resolve after the answer (regex.py)
    pending: PendingTarget | None = None  # set instead of `response` when the target is left to the batch


class MemberTimers(Protocol):
    """The session and rebalance timers (the shard's, on the timing wheel)."""

    def schedule_session(self, group_id: str, member_id: str) -> None: ...
    def schedule_rebalance(self, group_id: str, member_id: str, member_epoch: int, timeout_ms: int) -> None: ...
    def cancel_rebalance(self, group_id: str, member_id: str) -> None: ...
    def cancel_all(self, group_id: str, member_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Settings:
    heartbeat_interval_ms: int
    max_size: int
    assignors: tuple[str, ...] = tuple(ASSIGNORS)  # the ones a request may name, in the order Kafka lists them
    default_assignor: str = DEFAULT_ASSIGNOR  # for a group whose members name none
    metadata_refresh_interval_ms: int = 5_000  # how often a group looks at its subscribed topics again
    regex_refresh_interval_ms: int = REGEX_REFRESH_INTERVAL_MS  # how often its regular expressions are resolved again


def validate(request: HeartbeatRequest, settings: Settings) -> None:
    """GroupCoordinatorService.throwIfConsumerGroupHeartbeatRequestIsInvalid, in its order."""
    epoch = request.member_epoch
    if (request.version >= CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION or epoch > 0
            or epoch == LEAVE_GROUP_MEMBER_EPOCH):
        _not_blank(request.member_id, "MemberId can't be empty.")
    _not_blank(request.group_id, "GroupId can't be empty.")
    _not_blank(request.instance_id, "InstanceId can't be empty.")
    _not_blank(request.rack_id, "RackId can't be empty.")
    if epoch == 0:
        if request.rebalance_timeout_ms == -1:
            raise ApiError(Errors.INVALID_REQUEST, "RebalanceTimeoutMs must be provided in first request.")
        if request.owned is None or len(request.owned) > 0:
            raise ApiError(Errors.INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise ApiError(Errors.INVALID_REQUEST,
                           "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.")
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if request.instance_id is None:
            raise ApiError(Errors.INVALID_REQUEST, "InstanceId can't be null.")
    elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        raise ApiError(Errors.INVALID_REQUEST, "MemberEpoch is invalid.")
    if request.server_assignor is not None and request.server_assignor not in settings.assignors:
        raise ApiError(Errors.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {request.server_assignor} is not supported. "
                       f"Supported assignors: {', '.join(settings.assignors)}.")


def _not_blank(value: str | None, message: str) -> None:
    """Kafka's throwIfEmptyString: null passes, empty or whitespace-only fails."""
    if value is not None and not value.strip():
        raise ApiError(Errors.INVALID_REQUEST, message)


def heartbeat(group: ConsumerGroup | None, request: HeartbeatRequest, topics: TopicsView, settings: Settings,
              timers: MemberTimers, now_ms: int, now_wall_ms: int | None = None, *,
              defer_target: bool = False) -> HeartbeatResult:
    """Records and response of a valid request (see `validate`); raises ApiError. `group` is None if no consumer
    group of that id exists. `now_ms` is the monotonic clock's (deadlines), `now_wall_ms` the wall clock's (stored
    timestamps; the same clock when not given). `defer_target`: a heartbeat that finds the group epoch ahead of the
    assignment epoch stops before the target (its records so far, `pending` instead of a response): the caller
    replays them and answers it with the other heartbeats of its batch (`answer_pending`)."""
    if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
        if group is None:
            raise ApiError(Errors.GROUP_ID_NOT_FOUND, f"Consumer group {request.group_id} not found.")
        return leave(group, request, topics, timers)
    return _join_or_heartbeat(group, request, topics, settings, timers, now_ms,
                              now_ms if now_wall_ms is None else now_wall_ms, defer_target)


def _join_or_heartbeat(group: ConsumerGroup | None, request: HeartbeatRequest, topics: TopicsView,
                       settings: Settings, timers: MemberTimers, now_ms: int, now_wall_ms: int,
                       defer_target: bool = False) -> HeartbeatResult:
    group_id, epoch = request.group_id, request.member_epoch
    result = HeartbeatResult()
    if group is None:
        if epoch != 0:
            raise ApiError(Errors.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
        group = result.created = ConsumerGroup(group_id)
    member_id = request.member_id
    if len(group.members) >= settings.max_size and (not member_id or member_id not in group.members):
        raise ApiError(Errors.GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum capacity of "
                       f"{settings.max_size} members.")
    if not member_id:
        member_id = str(uuid.uuid4())  # v0 only: v1 clients generate their own
    records = result.records
    replaced: str | None = None  # a static member's previous member id, replaced by this one
    if request.instance_id is None:
        member = _member(group, member_id, epoch, request.owned)
    else:
        member, replaced = _static_member(group, member_id, epoch, request.instance_id, request.owned, records)
    updated = _updated(member, request)

    def regexes() -> bool:
        bump, result.refresh_regexes = regexes_after(group, member, updated, records, topics, now_wall_ms,
                                                     refresh_interval_ms=settings.regex_refresh_interval_ms)
        return bump

    group_epoch, _changed = subscribe(group, member, updated, replaced, records, topics, settings, now_ms, regexes)
    full = epoch == 0 or (request.rebalance_timeout_ms != -1 and request.subscribed_topic_names is not None
                          and request.owned is not None)
    if defer_target and group_epoch > group.assignment_epoch:
        timers.schedule_session(group_id, member_id)
        result.pending = PendingTarget(member_id, request.owned, member.assigned, full,
                                       settings.heartbeat_interval_ms)
        return result
    target = member_target(group, updated, replaced, group_epoch, records, topics,
                           default_assignor=settings.default_assignor)
    reconciled = reconcile_member(group, updated, target, request.owned, records)
    if reconciled is not updated:
        if reconciled.state is MemberState.UNREVOKED_PARTITIONS:
            timers.schedule_rebalance(group_id, member_id, reconciled.member_epoch, reconciled.rebalance_timeout_ms)
        else:
            timers.cancel_rebalance(group_id, member_id)
        updated = reconciled
    timers.schedule_session(group_id, member_id)
    result.response = HeartbeatResponse(
        member_id=member_id, member_epoch=updated.member_epoch, heartbeat_interval_ms=settings.heartbeat_interval_ms,
        assignment=updated.assigned if full or updated.assigned != member.assigned else None)
    return result


def steady_heartbeat(group: ConsumerGroup, request: HeartbeatRequest, topics: TopicsView, settings: Settings,
                     timers: MemberTimers, now_ms: int) -> HeartbeatResponse | None:
    """The heartbeat that changes nothing, answered as `heartbeat` answers it with none of its work: a valid request
    (see `validate`) of a known consumer-protocol member at its epoch, reconciled to the group's assignment epoch,
    that brings no change to the member, in a group with no target to compute, no regular expression to resolve
    and subscribed topics whose metadata did not change when it is looked at again (`subscribe`). Only the session
    timer (and that look's deadline) move. None: anything might change (`heartbeat` decides)."""
    member = group.members.get(request.member_id)
    if (member is None or request.member_epoch <= 0 or request.member_epoch != member.member_epoch
            or member.classic is not None or not member.is_reconciled_to(group.assignment_epoch)
            or group.group_epoch == 0 or group.group_epoch > group.assignment_epoch
            or group.has_regex_subscribers()):
        return None
    instance_id = request.instance_id
    if instance_id is not None and group.static_members.get(instance_id) != member.member_id:
        return None  # another member holds that instance id, or none does: `heartbeat` says which error
    if _updated(member, request) is not member:
        return None
    if not topics_unchanged(group, topics, settings.metadata_refresh_interval_ms, now_ms):
        return None  # the epoch is bumped
    timers.schedule_session(group.group_id, member.member_id)
    full = (request.rebalance_timeout_ms != -1 and request.subscribed_topic_names is not None
            and request.owned is not None)
    return HeartbeatResponse(member_id=member.member_id, member_epoch=member.member_epoch,
                             heartbeat_interval_ms=settings.heartbeat_interval_ms,
                             assignment=member.assigned if full else None)


def topics_unchanged(group: ConsumerGroup, topics: TopicsView, refresh_interval_ms: int, now_ms: int) -> bool:
    """A steady heartbeat's look at the group's subscribed topics (`subscribe`'s, for a member that changes
    nothing): once the refresh deadline is reached, their metadata hash is computed again; the same, the next look
    is a refresh interval away. False: it changed (the full path bumps the group epoch); nothing was moved."""
    if now_ms >= group.metadata_refresh_deadline_ms:
        if metadata_hash(group.topic_names(), topics) != group.metadata_hash:
            return False
        group.metadata_refresh_deadline_ms = now_ms + refresh_interval_ms
    return True


@dataclass(frozen=True, slots=True)
class Target:
    """What a member is reconciled towards: the assignment epoch and its partitions."""

    epoch: int
    partitions: Partitions


def subscribe(group: ConsumerGroup, member: ConsumerGroupMember, updated: ConsumerGroupMember, replaced: str | None,
              records: list[ConsumerGroupRecord], topics: TopicsView, settings: Settings, now_ms: int,
              regexes: Callable[[], bool] = lambda: False) -> tuple[int, bool]:
    """The part Kafka 4.1's consumerGroupHeartbeat and classicGroupJoinToConsumerGroup share: the member's record 5
    if its subscription metadata changed; the group epoch bumped (record 3) when its subscription changed, the
    group is new, `regexes` says so (run between the two: the heartbeat's regular expressions; a classic member
    has none), or the subscribed topics' metadata changed (looked at again at most once per refresh interval).
    Returns the group epoch and whether the member's subscription changed."""
    group_id = group.group_id
    changed = False
    if updated is not member and not updated.same_subscription_metadata(member):
        records.append(updated.metadata_record(group_id))
        changed = updated.subscribed_topic_names != member.subscribed_topic_names
    bump = regexes() or changed or group.group_epoch == 0  # a new group leaves epoch 0 whatever it subscribes to
    group_epoch = group.group_epoch
    if bump or now_ms >= group.metadata_refresh_deadline_ms:
        unchanged = updated is member and replaced is None  # the steady heartbeat: the group's own names
        new_hash = metadata_hash(group.topic_names() if unchanged else group.subscribed_topic_names(updated, replaced),
                                 topics)
        group.metadata_refresh_deadline_ms = now_ms + settings.metadata_refresh_interval_ms
        if bump or new_hash != group.metadata_hash:
            group_epoch += 1
            records.append(bumped_group_epoch(group_id, group_epoch, new_hash))
    return group_epoch, changed


def member_target(group: ConsumerGroup, updated: ConsumerGroupMember, replaced: str | None, group_epoch: int,
                  records: list[ConsumerGroupRecord], topics: TopicsView, *,
                  default_assignor: str = DEFAULT_ASSIGNOR) -> Target:
    """The member's target: computed for every member when the group epoch is ahead of the assignment epoch, else
    the current one (a replacing static member inherits its predecessor's)."""
    if group_epoch > group.assignment_epoch:
        targets = _compute_targets(group, updated, replaced, group_epoch, topics, records, default_assignor)
        return Target(group_epoch, targets.get(updated.member_id, {}))
    return current_target(group, updated.member_id, replaced)


def answer_pending(group: ConsumerGroup, pending: Sequence[PendingTarget], topics: TopicsView,
                   timers: MemberTimers, records: list[ConsumerGroupRecord], *,
                   default_assignor: str = DEFAULT_ASSIGNOR) -> list[HeartbeatResponse]:
    """The answers of a batch's heartbeats (`heartbeat(defer_target=True)`), in arrival order; their records are
    appended to `records` and replayed onto the group as they are made. The target is computed once for all of
    them when the group epoch is ahead of the assignment epoch (7 per changed target, then 6), then each member is
    reconciled towards it (8 if that changed anything) as Kafka's heartbeat does after computing its target.
    Raises ApiError when the assignor fails (nothing of the batch can be written)."""
    made: list[ConsumerGroupRecord] = []
    if group.group_epoch > group.assignment_epoch:
        members = group.members
        _assign(group, members, {member_id: group.target_of(member_id) for member_id in members},
                group.preferred_assignor() or default_assignor, group.group_epoch, topics, made)
    responses: list[HeartbeatResponse] = []
    for waiting in pending:
        for record in made:
            group.replay(record)
        records.extend(made)
        made = []
        member = group.members.get(waiting.member_id)
        if member is None:  # fenced or replaced since its heartbeat (the batch is answered after that change)
            responses.append(HeartbeatResponse(Errors.UNKNOWN_MEMBER_ID, f"Member {waiting.member_id} is not a "
                                               f"member of group {group.group_id}."))
            continue
        try:
            reconciled = reconcile_member(group, member, current_target(group, member.member_id, None),
                                          waiting.owned, made)
        except ApiError as exc:
            responses.append(HeartbeatResponse(exc.error, exc.message))
            continue
        if reconciled is not member:
            if reconciled.state is MemberState.UNREVOKED_PARTITIONS:
                timers.schedule_rebalance(group.group_id, member.member_id, reconciled.member_epoch,
                                          reconciled.rebalance_timeout_ms)
            else:
                timers.cancel_rebalance(group.group_id, member.member_id)
        responses.append(HeartbeatResponse(
            member_id=member.member_id, member_epoch=reconciled.member_epoch,
            heartbeat_interval_ms=waiting.heartbeat_interval_ms,
            assignment=reconciled.assigned if waiting.full or reconciled.assigned != waiting.assigned_before
            else None))
    for record in made:
        group.replay(record)
    records.extend(made)
    return responses


def current_target(group: ConsumerGroup, member_id: str, replaced: str | None) -> Target:
    return Target(group.assignment_epoch, group.targets.get(
        member_id, group.target_of(replaced) if replaced is not None else {}))


def reconcile_member(group: ConsumerGroup, member: ConsumerGroupMember, target: Target, owned: OwnedPartitions,
                     records: list[ConsumerGroupRecord]) -> ConsumerGroupMember:
    """Kafka's maybeReconcile: the member moved towards its target (record 8 if that changed anything); the member
    itself when it is reconciled already or nothing moved."""
    if member.is_reconciled_to(target.epoch):
        return member
    try:
        reconciled = reconcile(member, target.epoch, target.partitions, group.partition_epoch, owned)
    except FencedMemberEpoch as exc:
        raise ApiError(Errors.FENCED_MEMBER_EPOCH, str(exc)) from exc
    if reconciled.same_assignment_state(member):
        return member
    records.append(reconciled.assignment_record(group.group_id))
    return reconciled


def _member(group: ConsumerGroup, member_id: str, epoch: int, owned: OwnedPartitions) -> ConsumerGroupMember:
    member = group.members.get(member_id)
    if member is None:
        if epoch != 0:
            raise ApiError(Errors.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group "
                           f"{group.group_id}.")
        log.info("[GroupId %s] Member %s joins the consumer group using the consumer protocol.", group.group_id,
                 member_id)
        return ConsumerGroupMember(member_id)
    _check_epoch(member, epoch, owned)
    return member


def _static_member(group: ConsumerGroup, member_id: str, epoch: int, instance_id: str, owned: OwnedPartitions,
                   records: list[ConsumerGroupRecord]) -> tuple[ConsumerGroupMember, str | None]:
    """Kafka's getOrMaybeSubscribeStaticConsumerGroupMember: the member, and the member id it replaces (a static
    member rejoining after leaving with epoch -2 takes its predecessor's place, assignment and target)."""
    group_id = group.group_id
    existing = group.static_member(instance_id)
    if epoch == 0:
        if existing is None:
            log.info("[GroupId %s] Static member %s with instance id %s joins the consumer group using the consumer "
                     "protocol.", group_id, member_id, instance_id)
            return group.members.get(member_id) or ConsumerGroupMember(member_id), None
        if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            log.info("[GroupId %s] Static member %s with instance id %s cannot join the group because the instance "
                     "id is is owned by member %s.", group_id, member_id, instance_id, existing.member_id)
            raise ApiError(Errors.UNRELEASED_INSTANCE_ID, f"Static member {member_id} with instance id "
                           f"{instance_id} cannot join the group because the instance id is owned by "
                           f"{existing.member_id} member.")
        successor = existing.replace(member_id=member_id, member_epoch=0, previous_member_epoch=0)
        records.extend(_member_tombstones(group_id, existing.member_id))
        records.append(successor.metadata_record(group_id))
        records.append(TargetAssignmentRecord(group_id, member_id, group.target_of(existing.member_id)))
        records.append(successor.assignment_record(group_id))
        log.info("[GroupId %s] Static member with instance id %s re-joins the consumer group using the consumer "
                 "protocol. Created a new member %s to replace the existing member %s.", group_id, instance_id,
                 member_id, existing.member_id)
        return successor, existing.member_id
    existing = _known_static_member(group, member_id, instance_id)
    _check_epoch(existing, epoch, owned)
    return existing, None


def _known_static_member(group: ConsumerGroup, member_id: str, instance_id: str) -> ConsumerGroupMember:
    existing = group.static_member(instance_id)
    if existing is None:
        raise ApiError(Errors.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
    if existing.member_id != member_id:
        log.info("[GroupId %s] Static member %s with instance id %s is fenced by existing member %s.",
                 group.group_id, member_id, instance_id, existing.member_id)
        raise ApiError(Errors.FENCED_INSTANCE_ID, f"Static member {member_id} with instance id {instance_id} was "
                       f"fenced by member {existing.member_id}.")
    return existing


def _member_tombstones(group_id: str, member_id: str) -> list[ConsumerGroupRecord]:
    """Current assignment, target, metadata: the order replay needs."""
    return [Tombstone(RecordType.CURRENT_MEMBER_ASSIGNMENT, group_id, member_id),
            Tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, group_id, member_id),
            Tombstone(RecordType.MEMBER_METADATA, group_id, member_id)]


def _check_epoch(member: ConsumerGroupMember, received: int, owned: OwnedPartitions) -> None:
    """Kafka's throwIfConsumerGroupMemberEpochIsInvalid: the previous epoch is accepted with a subset of the
    assignment (the response that bumped the epoch may have been lost)."""
    if received > member.member_epoch:
        raise ApiError(Errors.FENCED_MEMBER_EPOCH, f"The consumer group member has a greater member epoch "
                       f"({received}) than the one known by the group coordinator ({member.member_epoch}). "
                       "The member must abandon all its partitions and rejoin.")
    if received < member.member_epoch and (received != member.previous_member_epoch
                                           or not _is_subset(owned, member.assigned)):
        raise ApiError(Errors.FENCED_MEMBER_EPOCH, f"The consumer group member has a smaller member epoch "
                       f"({received}) than the one known by the group coordinator ({member.member_epoch}). "
                       "The member must abandon all its partitions and rejoin.")


def _is_subset(owned: OwnedPartitions, assigned: Partitions) -> bool:
    if owned is None:
        return False
    return all(topic_id in assigned and set(ps) <= set(assigned[topic_id]) for topic_id, ps in owned)


def _updated(member: ConsumerGroupMember, request: HeartbeatRequest) -> ConsumerGroupMember:
    """The member with every non-null field of the request, and the connection's client id and host; the member
    itself when nothing differs (the steady heartbeat)."""
    changes: dict[str, object] = {}
    if request.client_id != member.client_id:
        changes["client_id"] = request.client_id
    if request.client_host != member.client_host:
        changes["client_host"] = request.client_host
    if request.instance_id is not None and request.instance_id != member.instance_id:
        changes["instance_id"] = request.instance_id
    if request.rack_id is not None and request.rack_id != member.rack_id:
        changes["rack_id"] = request.rack_id
    if request.rebalance_timeout_ms != -1 and request.rebalance_timeout_ms != member.rebalance_timeout_ms:
        changes["rebalance_timeout_ms"] = request.rebalance_timeout_ms
    if request.server_assignor is not None and request.server_assignor != member.server_assignor:
        changes["server_assignor"] = request.server_assignor
    if request.subscribed_topic_names is not None:
        names = tuple(sorted(set(request.subscribed_topic_names)))
        if names != member.subscribed_topic_names:
            changes["subscribed_topic_names"] = names
    if request.subscribed_topic_regex is not None and request.subscribed_topic_regex != member.subscribed_topic_regex:
        changes["subscribed_topic_regex"] = request.subscribed_topic_regex
    return member.replace(**changes) if changes else member


def _compute_targets(group: ConsumerGroup, updated: ConsumerGroupMember, replaced: str | None, group_epoch: int,
                     topics: TopicsView, records: list[ConsumerGroupRecord],
                     default_assignor: str = DEFAULT_ASSIGNOR) -> Mapping[str, Partitions]:
    """Kafka's TargetAssignmentBuilder: every member's new target; records 7 for the members whose target changed,
    then 6. A replacing static member starts from its predecessor's target."""
    members = group.members_with(updated, replaced)
    current = {member_id: group.target_of(member_id) for member_id in members}
    if replaced is not None:
        current[updated.member_id] = group.target_of(replaced)
    assignor_name = group.preferred_assignor(updated, replaced) or default_assignor
    return _assign(group, members, current, assignor_name, group_epoch, topics, records)


def _assign(group: ConsumerGroup, members: Mapping[str, ConsumerGroupMember], current: Mapping[str, Partitions],
            assignor_name: str, group_epoch: int, topics: TopicsView, records: list[ConsumerGroupRecord]
            ) -> Mapping[str, Partitions]:
    """The assignor's run over `members` starting from their `current` targets, and its records (7, then 6)."""
    order = member_order(members)
    subscriptions = {member_id: group.effective_topics(m) for member_id, m in members.items()}
    homogeneous = len(set(subscriptions.values())) <= 1
    partition_counts: dict[uuid.UUID, int] = {}
    ids_of: dict[frozenset[str], tuple[uuid.UUID, ...]] = {}  # each subscription's topic ids, looked up once
    specs: dict[str, MemberSpec] = {}
    for member_id in order:
        member = members[member_id]
        subscription = subscriptions[member_id]
        topic_ids = ids_of.get(subscription)
        if topic_ids is None:
            found = [image for image in map(topics.by_name, sorted(subscription)) if image is not None]
            partition_counts.update((image.topic_id, image.partitions) for image in found)
            topic_ids = ids_of[subscription] = tuple(image.topic_id for image in found)
        specs[member_id] = MemberSpec(topic_ids, group.ordered_target(member_id, current[member_id]), member.rack_id,
                                      member.instance_id)
    spec = GroupSpec(specs, SubscriptionType.HOMOGENEOUS if homogeneous else SubscriptionType.HETEROGENEOUS,
                     partition_counts)
    started = time.monotonic()
    try:
        assigned = ASSIGNORS[assignor_name].assign(spec)
    except AssignorError as exc:
        raise ApiError(Errors.UNKNOWN_SERVER_ERROR, f"Failed to compute a new target assignment for epoch "
                       f"{group_epoch}: {exc}.") from exc
    log.info("[GroupId %s] Computed a new target assignment for epoch %d with '%s' assignor in %dms.",
             group.group_id, group_epoch, assignor_name, (time.monotonic() - started) * 1000)
    targets: dict[str, Partitions] = {}
    for member_id in order:
        target = sorted_partitions(assigned.get(member_id, {}))
        targets[member_id] = target
        if group.targets.get(member_id) != target:  # a member without a target yet always gets a record
            records.append(TargetAssignmentRecord(group.group_id, member_id, target))
    records.append(TargetAssignmentEpochRecord(group.group_id, group_epoch))
    return targets


def leave(group: ConsumerGroup, request: HeartbeatRequest, topics: TopicsView, timers: MemberTimers
          ) -> HeartbeatResult:
    """Epoch -1 leaves for good; a static member's -2 leaves for now: it keeps its assignment and instance id (the
    session timer keeps running) so that it gets them back when it rejoins in time."""
    group_id, member_id, instance_id = group.group_id, request.member_id, request.instance_id
    response = HeartbeatResponse(member_id=member_id, member_epoch=request.member_epoch)
    if instance_id is None:
        member = group.members.get(member_id)
        if member is None:
            raise ApiError(Errors.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}.")
        log.info("[GroupId %s] Member %s left the consumer group.", group_id, member_id)
        return HeartbeatResult(fence(group, member, topics, timers), response)
    member = _known_static_member(group, member_id, instance_id)
    if request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        log.info("[GroupId %s] Static member %s with instance id %s temporarily left the consumer group.", group_id,
                 member_id, instance_id)
        leaving = member.replace(member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH, pending_revocation={})
        return HeartbeatResult([leaving.assignment_record(group_id)], response)
    log.info("[GroupId %s] Static member %s with instance id %s left the consumer group.", group_id, member_id,
             instance_id)
    return HeartbeatResult(fence(group, member, topics, timers), response)


def fence(group: ConsumerGroup, member: ConsumerGroupMember, topics: TopicsView, timers: MemberTimers
          ) -> list[ConsumerGroupRecord]:
    """Kafka's consumerGroupFenceMember: the member's records tombstoned (current assignment, target, metadata:
    the order matters on replay), then the group epoch bumped; the target is recomputed by the next heartbeat."""
    group_id, member_id = group.group_id, member.member_id
    records = _member_tombstones(group_id, member_id)
    regex = member.subscribed_topic_regex
    if regex and group.subscribed_regexes()[regex] == 1:  # its last subscriber: the resolution goes too
        records.append(Tombstone(RecordType.REGULAR_EXPRESSION, group_id, regex=regex))
    records.append(GroupEpochRecord(group_id, group.group_epoch + 1,
                                    metadata_hash(group.subscribed_topic_names(removing=member_id), topics)))
    timers.cancel_all(group_id, member_id)
    return records
