"""Kafka's `uniform` assignor (UniformAssignor): balance first (every member within one partition of the others),
then stickiness (a member keeps what it has up to its quota).

Heterogeneous groups: uniform_heterogeneous.py. Homogeneous groups (every member subscribes to the same topics)
follow Kafka 4.1's UniformHomogeneousAssignmentBuilder step for step, in Kafka's iteration order: each member, in
turn, gets a quota (the minimum, plus one while `total % members` extra partitions are left); it keeps its current
partitions up to that quota and gives back the rest; a member below its quota gives its extra partition up when
more members are left than extras (a later member may already hold one more); the freed and never-assigned
partitions then fill the members below quota, in order.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from coordinator.group.assignor.java_order import topic_set_order
from coordinator.group.assignor.spec import Assignment, AssignorError, GroupSpec, SubscriptionType, existing
from coordinator.group.assignor.uniform_heterogeneous import HeterogeneousBuilder


class UniformAssignor:
    name: ClassVar[str] = "uniform"  # read on the class too (DEFAULT_ASSIGNOR)

    def assign(self, spec: GroupSpec) -> dict[str, Assignment]:
        if not spec.members:
            return {}
        if spec.subscription_type is SubscriptionType.HOMOGENEOUS:
            return _assign_homogeneous(spec)
        return HeterogeneousBuilder(spec).build()


def _assign_homogeneous(spec: GroupSpec) -> dict[str, Assignment]:
    first = next(iter(spec.members.values()))
    topic_ids = topic_set_order(first.subscribed_topic_ids)
    if not topic_ids:
        return {}
    unassigned: list[tuple[uuid.UUID, int]] = []
    total = 0
    for topic_id in topic_ids:
        count = spec.partition_count(topic_id)
        if count == -1:
            raise AssignorError(f"Members are subscribed to topic {topic_id} which doesn't exist in the topic "
                                "metadata.")
        unassigned.extend((topic_id, p) for p in range(count) if not spec.is_partition_assigned(topic_id, p))
        total += count

    minimum_quota, extra = divmod(total, len(spec.members))
    subscribed = set(topic_ids)
    target: dict[str, dict[uuid.UUID, set[int]]] = {}
    unfilled: list[tuple[str, int]] = []
    members_left = len(spec.members)
    for member_id, member in spec.members.items():
        quota = minimum_quota
        takes_extra = extra > 0
        if takes_extra:
            quota += 1
        kept: dict[uuid.UUID, set[int]] = {}
        for topic_id in member.assignment:
            if topic_id not in subscribed:
                continue  # the whole topic is revoked
            partitions = existing(member.assignment[topic_id], spec.partition_count(topic_id))
            if not partitions:
                continue
            if len(partitions) <= quota:
                quota -= len(partitions)
                kept[topic_id] = set(partitions)
                continue
            for partition in partitions:
                if quota > 0:
                    quota -= 1
                    kept.setdefault(topic_id, set()).add(partition)
                else:
                    unassigned.append((topic_id, partition))
        if quota > 0 and takes_extra and members_left > extra:
            quota -= 1  # an extra partition is not handed out to this member: a later one may already hold it
            takes_extra = False
        if quota > 0:
            unfilled.append((member_id, quota))
        if takes_extra:
            extra -= 1
        members_left -= 1
        target[member_id] = kept

    next_index = 0
    for member_id, remaining in unfilled:
        filling = target[member_id]
        while remaining > 0 and next_index < len(unassigned):
            topic_id, partition = unassigned[next_index]
            next_index += 1
            remaining -= 1
            filling.setdefault(topic_id, set()).add(partition)
    if next_index < len(unassigned):
        raise AssignorError("Partitions were left unassigned")
    return {member_id: {t: frozenset(ps) for t, ps in partitions.items()} for member_id, partitions in target.items()}
