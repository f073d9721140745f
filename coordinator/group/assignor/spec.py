"""What an assignor sees (Kafka's GroupSpec, MemberSubscriptionAndAssignment, SubscribedTopicDescriber) and returns.

Members are given in the order Kafka's coordinator iterates them (a Java HashMap of member ids: see java_order),
so that an assignor ported step by step makes the same choices as Kafka's for the same inputs."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from coordinator.group.assignor.java_order import partition_order, topic_map_order

TopicPartitions = dict[uuid.UUID, set[int]]  # topic id -> partitions
Assignment = dict[uuid.UUID, frozenset[int]]
# A current target as Kafka's assignor iterates it: topics, and each topic's partitions, in Kafka's order.
OrderedAssignment = dict[uuid.UUID, tuple[int, ...]]


class AssignorError(Exception):
    """Kafka's PartitionAssignorException: the heartbeat fails UNKNOWN_SERVER_ERROR."""


class SubscriptionType(enum.Enum):
    HOMOGENEOUS = "homogeneous"  # every member subscribes to the same topics
    HETEROGENEOUS = "heterogeneous"


@dataclass(frozen=True, slots=True)
class MemberSpec:
    subscribed_topic_ids: tuple[uuid.UUID, ...]  # in the member's subscription order (resolved names)
    assignment: OrderedAssignment  # the member's current target, in Kafka's iteration order (see ordered())
    rack_id: str | None = None
    instance_id: str | None = None


def ordered(assignment: Mapping[uuid.UUID, Collection[int]]) -> OrderedAssignment:
    """A target as Kafka holds it in memory (HashMap of topic id -> HashSet of partitions), in its iteration order."""
    return {topic_id: tuple(partition_order(assignment[topic_id])) for topic_id in topic_map_order(assignment)}


def existing(partitions: tuple[int, ...], count: int) -> tuple[int, ...]:
    """The partitions of a current target that the topic still has. Kafka's metadata image never shrinks a topic id,
    so its builders take a current target as it is; a stale Metadata answer can show fewer partitions here, and a
    partition that is not there is neither kept nor handed out (revoked like a topic no longer subscribed)."""
    return partitions if all(p < count for p in partitions) else tuple(p for p in partitions if p < count)


@dataclass(slots=True)
class GroupSpec:
    members: dict[str, MemberSpec]  # member id -> spec, in Kafka's iteration order
    subscription_type: SubscriptionType
    partition_counts: Mapping[uuid.UUID, int]  # subscribed topic id -> partition count
    owners: dict[tuple[uuid.UUID, int], str] = field(default_factory=dict)  # the current target, inverted

    def __post_init__(self) -> None:
        if not self.owners:
            self.owners = {(topic_id, partition): member_id
                           for member_id, spec in self.members.items()
                           for topic_id, partitions in spec.assignment.items() for partition in partitions}

    def partition_count(self, topic_id: uuid.UUID) -> int:
        """-1 for a topic the metadata does not have (Kafka's SubscribedTopicDescriber.numPartitions)."""
        return self.partition_counts.get(topic_id, -1)

    def is_partition_assigned(self, topic_id: uuid.UUID, partition: int) -> bool:
        return (topic_id, partition) in self.owners
