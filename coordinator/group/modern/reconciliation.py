"""Moving a member from its current assignment towards its target (Kafka's CurrentAssignmentBuilder).

Revoke before assign: while the member still reports a partition it must give up, it stays UNREVOKED_PARTITIONS at
its epoch and is told only what it keeps. Once those are gone it moves to the target epoch and gets the target's
partitions that no other member still holds (partition epoch -1); the ones still held make it
UNRELEASED_PARTITIONS until their owners release them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from coordinator.group.modern.member import ConsumerGroupMember, MemberState
from coordinator.group.modern.records import Partitions, sorted_partitions

PartitionEpoch = Callable[[uuid.UUID, int], int]  # -1 when no member holds the partition
OwnedPartitions = Sequence[tuple[uuid.UUID, Sequence[int]]] | None  # None: the request did not say


class FencedMemberEpoch(Exception):
    """FENCED_MEMBER_EPOCH, with Kafka's message."""


def reconcile(member: ConsumerGroupMember, target_epoch: int, target: Partitions,
              partition_epoch: PartitionEpoch, owned: OwnedPartitions) -> ConsumerGroupMember:
    """The member after one heartbeat that reported `owned` (Kafka's CurrentAssignmentBuilder.build)."""
    if member.state is MemberState.STABLE:
        if member.member_epoch != target_epoch:
            return _next(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
        return member
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if _still_owns(owned, member.pending_revocation):
            return member
        return _next(member, member.member_epoch + 1, target_epoch, target, partition_epoch, owned)
    if member.state is MemberState.UNRELEASED_PARTITIONS:
        return _next(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
    if owned is None or len(owned) > 0:
        raise FencedMemberEpoch("The consumer group member is in a unknown state. The member must abandon all its "
                                "partitions and rejoin.")
    return _next(member, target_epoch, target_epoch, target, partition_epoch, owned)


def _still_owns(owned: OwnedPartitions, revoking: Partitions) -> bool:
    if owned is None:
        return True
    return any(p in revoking.get(topic_id, ()) for topic_id, partitions in owned for p in partitions)


def _next(member: ConsumerGroupMember, member_epoch: int, target_epoch: int, target: Partitions,
          partition_epoch: PartitionEpoch, owned: OwnedPartitions) -> ConsumerGroupMember:
    kept: dict[uuid.UUID, set[int]] = {}
    revoking: dict[uuid.UUID, set[int]] = {}
    to_assign: dict[uuid.UUID, set[int]] = {}
    unreleased = False
    for topic_id in set(target) | set(member.assigned):
        wanted = set(target.get(topic_id, ()))
        current = set(member.assigned.get(topic_id, ()))
        kept[topic_id] = current & wanted
        revoking[topic_id] = current - kept[topic_id]
        free = {p for p in wanted - kept[topic_id] if partition_epoch(topic_id, p) == -1}
        unreleased = unreleased or len(free) < len(wanted - kept[topic_id])
        to_assign[topic_id] = free
    pending = sorted_partitions(revoking)
    if pending and _still_owns(owned, pending):
        return member.moved_to(member_epoch, MemberState.UNREVOKED_PARTITIONS, sorted_partitions(kept), pending)
    if any(to_assign.values()):
        for topic_id, partitions in to_assign.items():
            kept[topic_id] |= partitions
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return member.moved_to(target_epoch, state, sorted_partitions(kept), {})
