"""Kafka's `range` assignor (RangeAssignor): per topic, its subscribers in a fixed order (members with an instance
id first, by instance id, then the others by member id) each take the next contiguous range; the first
`partitions % subscribers` of them take one more. Deterministic from the subscriptions alone."""

from __future__ import annotations

import uuid
from typing import ClassVar
from dataclasses import dataclass

from coordinator.group.assignor.spec import Assignment, AssignorError, GroupSpec, SubscriptionType


@dataclass(slots=True)
class _Topic:
    topic_id: uuid.UUID
    partitions: int
    members: int
    minimum_quota: int = -1
    extra: int = -1
    next_start: int = 0

    def take_range(self) -> frozenset[int]:
        if self.minimum_quota == -1:
            self.minimum_quota, self.extra = divmod(self.partitions, self.members)
        quota = self.minimum_quota
        if self.extra > 0:
            quota += 1
            self.extra -= 1
        start, end = self.next_start, min(self.next_start + quota, self.partitions)
        self.next_start = end
        return frozenset(range(start, end))


class RangeAssignor:
    name: ClassVar[str] = "range"  # read on the class too (DEFAULT_ASSIGNOR)

    def assign(self, spec: GroupSpec) -> dict[str, Assignment]:
        if not spec.members:
            return {}
        member_ids = _sorted_members(spec)
        topics: dict[uuid.UUID, _Topic] = {}
        homogeneous = spec.subscription_type is SubscriptionType.HOMOGENEOUS
        for member_id in member_ids[:1] if homogeneous else member_ids:
            for topic_id in spec.members[member_id].subscribed_topic_ids:
                topic = topics.get(topic_id)
                if topic is None:
                    count = spec.partition_count(topic_id)
                    if count == -1:
                        raise AssignorError("Member is subscribed to a non-existent topic")
                    topic = topics[topic_id] = _Topic(topic_id, count, len(member_ids) if homogeneous else 0)
                if not homogeneous:
                    topic.members += 1
        result: dict[str, Assignment] = {}
        for member_id in member_ids:
            assignment: Assignment = {}
            for topic_id in spec.members[member_id].subscribed_topic_ids:
                partitions = topics[topic_id].take_range()
                if partitions:
                    assignment[topic_id] = partitions
            result[member_id] = assignment
        return result


def _sorted_members(spec: GroupSpec) -> list[str]:
    def key(member_id: str) -> tuple[int, str]:
        instance_id = spec.members[member_id].instance_id
        return (0, instance_id) if instance_id is not None else (1, member_id)

    return sorted(spec.members, key=key)
