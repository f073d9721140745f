"""Kafka's UniformHeterogeneousAssignmentBuilder, for members subscribed to different topics: keep what members
have of their subscriptions, hand the unassigned partitions to the least loaded subscribers topic by topic (topics
with the most partitions per subscriber first), then move partitions from the most to the least loaded subscribers
of each shared topic until every topic is balanced (at most 16 rounds). Ported step for step, members in the
group spec's order (Kafka's HashMap order of member ids), so it picks what Kafka picks."""

from __future__ import annotations

import uuid
from functools import cmp_to_key

from coordinator.group.assignor.spec import Assignment, AssignorError, GroupSpec, existing

_MAX_ITERATION_COUNT = 16


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _uuid_key(topic_id: uuid.UUID) -> tuple[int, int]:
    """org.apache.kafka.common.Uuid.compareTo: the two longs, signed."""
    return _signed(topic_id.int >> 64), _signed(topic_id.int & 0xFFFFFFFFFFFFFFFF)


class _Balancer:
    """Kafka's MemberAssignmentBalancer: the subscribers of one topic sorted by load, handing out the least loaded
    member round-robin within its load level and the most loaded ones from the top."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.members: list[int] = []
        self.least_end = 0
        self.least_count = -1
        self.next_least = 0
        self.most_start = 0
        self.most_end = 0
        self.most_count = 1
        self.next_most = -1

    def initialize(self, members: list[int]) -> int:
        sizes = self.sizes
        self.members = sorted(members, key=lambda m: (sizes[m], m))
        self.least_end = 0
        self.least_count = sizes[self.members[0]] - 1
        self.next_least = 0
        self.most_start = self.most_end = len(self.members)
        self.most_count = sizes[self.members[-1]] + 1
        self.next_most = len(self.members) - 1
        return sizes[self.members[-1]] - sizes[self.members[0]]

    def next_least_loaded(self) -> int:
        if self.next_least >= self.least_end:
            self.least_count += 1
            while self.least_end < len(self.members) and self.sizes[self.members[self.least_end]] == self.least_count:
                self.least_end += 1
            self.next_least = 0
        member = self.members[self.next_least]
        self.next_least += 1
        return member

    def next_most_loaded(self) -> int:
        if self.next_most < self.most_start:
            if self.most_end <= self.most_start and self.most_start > 0:
                self.most_count = self.sizes[self.members[self.most_start - 1]]
            else:
                self.most_count -= 1
            while self.most_start > 0 and self.sizes[self.members[self.most_start - 1]] == self.most_count:
                self.most_start -= 1
            self.next_most = self.most_end - 1
        if self.next_most < 0:
            return -1
        member = self.members[self.next_most]
        self.next_most -= 1
        return member

    def exclude_most_loaded(self) -> None:
        index = self.next_most + 1
        self.members[index], self.members[self.most_end - 1] = self.members[self.most_end - 1], self.members[index]
        self.most_end -= 1

    def is_balanced(self) -> bool:
        return self.most_count - self.least_count <= 1


class HeterogeneousBuilder:
    def __init__(self, spec: GroupSpec) -> None:
        self.spec = spec
        self.member_ids = list(spec.members)
        self.subscribers: dict[uuid.UUID, list[int]] = {}
        for index, member_id in enumerate(self.member_ids):
            for topic_id in spec.members[member_id].subscribed_topic_ids:
                if spec.partition_count(topic_id) == -1:
                    raise AssignorError(f"Members are subscribed to topic {topic_id} which doesn't exist in the "
                                        "topic metadata.")
                self.subscribers.setdefault(topic_id, []).append(index)
        self.sizes = [0] * len(self.member_ids)
        self.owners = {topic_id: [-1] * spec.partition_count(topic_id) for topic_id in self.subscribers}
        self.target: list[dict[uuid.UUID, set[int]]] = [{} for _ in self.member_ids]

    def build(self) -> dict[str, Assignment]:
        if not self.subscribers:
            return {}
        self._keep_subscribed()
        self._assign_unassigned()
        self._balance()
        return {member_id: {t: frozenset(ps) for t, ps in self.target[i].items() if ps}
                for i, member_id in enumerate(self.member_ids)}

    def _sorted_topics(self, topic_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        def compare(a: uuid.UUID, b: uuid.UUID) -> int:
            ratio_a = self.spec.partition_count(a) / len(self.subscribers[a])
            ratio_b = self.spec.partition_count(b) / len(self.subscribers[b])
            if ratio_a != ratio_b:
                return -1 if ratio_a > ratio_b else 1  # more partitions per subscriber first
            if len(self.subscribers[a]) != len(self.subscribers[b]):
                return -1 if len(self.subscribers[a]) < len(self.subscribers[b]) else 1
            key_a, key_b = _uuid_key(a), _uuid_key(b)
            return (key_a > key_b) - (key_a < key_b)

        return sorted(topic_ids, key=cmp_to_key(compare))

    def _keep_subscribed(self) -> None:
        for index, member_id in enumerate(self.member_ids):
            member = self.spec.members[member_id]
            subscribed = set(member.subscribed_topic_ids)
            for topic_id, partitions in member.assignment.items():
                if topic_id not in subscribed:
                    continue
                partitions = existing(partitions, len(self.owners[topic_id]))
                self.target[index][topic_id] = set(partitions)
                self.sizes[index] += len(partitions)
                for partition in partitions:
                    self.owners[topic_id][partition] = index

    def _assign_unassigned(self) -> None:
        unassigned = {topic_id: [p for p, owner in enumerate(owners) if owner == -1]
                      for topic_id, owners in self.owners.items()}
        balancer = _Balancer(self.sizes)
        for topic_id in self._sorted_topics([t for t, ps in unassigned.items() if ps]):
            balancer.initialize(self.subscribers[topic_id])
            for partition in unassigned[topic_id]:
                self._assign(topic_id, partition, balancer.next_least_loaded())

    def _balance(self) -> None:
        shared = [topic_id for topic_id, members in self.subscribers.items() if len(members) >= 2]
        if not shared:
            return
        topics = self._sorted_topics(shared)
        last_rebalanced = -1
        balancer = _Balancer(self.sizes)
        for _ in range(_MAX_ITERATION_COUNT):
            for index, topic_id in enumerate(topics):
                if index == last_rebalanced:
                    return
                moved = self._balance_topic(topic_id, balancer)
                if moved > 0 or last_rebalanced == -1:
                    last_rebalanced = index

    def _balance_topic(self, topic_id: uuid.UUID, balancer: _Balancer) -> int:
        owners = self.owners[topic_id]
        if balancer.initialize(self.subscribers[topic_id]) <= 1:
            return 0
        partitions = sorted(range(len(owners)), key=lambda p: (owners[p], p))
        start: dict[int, int] = {}
        end: dict[int, int] = {}  # exclusive
        for i, partition in enumerate(partitions):
            start.setdefault(owners[partition], i)
            end[owners[partition]] = i + 1
        moved = 0
        while not balancer.is_balanced():
            most = -1
            while True:
                most = balancer.next_most_loaded()
                if most == -1:
                    break
                if most not in end or end[most] - start[most] <= 0:
                    balancer.exclude_most_loaded()
                    continue
                break
            if most == -1:
                break
            partition = partitions[end[most] - 1]
            end[most] -= 1
            least = balancer.next_least_loaded()
            if balancer.is_balanced():
                break
            self._assign(topic_id, partition, least)
            moved += 1
        return moved

    def _assign(self, topic_id: uuid.UUID, partition: int, member: int) -> None:
        old = self.owners[topic_id][partition]
        if old != -1:
            partitions = self.target[old].get(topic_id)
            if partitions is not None:
                partitions.discard(partition)
                if not partitions:
                    del self.target[old][topic_id]
            self.sizes[old] -= 1
        self.target[member].setdefault(topic_id, set()).add(partition)
        self.owners[topic_id][partition] = member
        self.sizes[member] += 1
