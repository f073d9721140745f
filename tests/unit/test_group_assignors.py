"""Server-side assignors against expected assignments taken from Kafka's own tests (group-coordinator's
UniformHomogeneousAssignmentBuilderTest as of Kafka 4.1, where a member that cannot fill an extra partition's quota
from what it holds leaves the extra to a later member, and RangeAssignorTest: same members, topic ids, partition
counts and current targets; the expected targets are theirs). Generated groups against Kafka 4.1.1's own
assignor: tests/interop/test_assignors_kafka.py."""

from __future__ import annotations

import base64
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.group.assignor import (AssignorError, GroupSpec, MemberSpec, RangeAssignor, SubscriptionType,
                                        UniformAssignor)
from coordinator.group.assignor.spec import ordered
from coordinator.group.assignor.java_order import string_hash, topic_set_order, uuid_hash

HOMOGENEOUS, HETEROGENEOUS = SubscriptionType.HOMOGENEOUS, SubscriptionType.HETEROGENEOUS


def kafka_uuid(text: str) -> uuid.UUID:
    """org.apache.kafka.common.Uuid.fromString: URL-safe base64 of the 16 bytes, unpadded."""
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))


T1 = kafka_uuid("T1-A4s3VTwiI5CTbEp6POw")
T2 = kafka_uuid("T2-B4s3VTwiI5YHbPp6YUe")
T3 = kafka_uuid("T3-CU8fVTLCz5YMkLoDQsa")


def member(*topics: uuid.UUID, instance_id: str | None = None, **assignment: tuple[int, ...]) -> MemberSpec:
    names = {"t1": T1, "t2": T2, "t3": T3}
    # Kafka's tests give current targets as mkOrderedAssignment (LinkedHashMap/LinkedHashSet): the order given.
    return MemberSpec(tuple(topics), {names[t]: tuple(ps) for t, ps in assignment.items()},
                      instance_id=instance_id)


def spec(members: dict[str, MemberSpec], counts: dict[uuid.UUID, int],
         kind: SubscriptionType = HOMOGENEOUS) -> GroupSpec:
    return GroupSpec(dict(sorted(members.items())), kind, counts)  # Kafka's tests use a TreeMap of members


def flat(assignment: dict[str, dict[uuid.UUID, frozenset[int]]]) -> dict[str, dict[uuid.UUID, set[int]]]:
    return {m: {t: set(ps) for t, ps in a.items() if ps} for m, a in assignment.items()}


def test_java_hashes_match_javas() -> None:
    assert string_hash("A") == 65
    assert string_hash("hello") == 99162322
    assert string_hash("polygenelubricants") == -2147483648  # a classic Java String.hashCode overflow
    assert uuid_hash(uuid.UUID(int=(1 << 64) | 1)) == 0


def test_uniform_first_assignment_two_members_two_topics() -> None:
    # testFirstAssignmentTwoMembersTwoTopicsNoMemberRacks: depends on Java's HashSet order of the topic ids.
    group = spec({"A": member(T1, T3), "B": member(T1, T3)}, {T1: 3, T3: 2})
    assert topic_set_order([T1, T3]) == [T3, T1]
    assert flat(UniformAssignor().assign(group)) == {"A": {T3: {0, 1}}, "B": {T1: {0, 1, 2}}}


def test_uniform_more_members_than_partitions() -> None:
    # testFirstAssignmentNumMembersGreaterThanTotalNumPartitions
    group = spec({m: member(T3) for m in "ABC"}, {T3: 2})
    assert flat(UniformAssignor().assign(group)) == {"A": {}, "B": {T3: {0}}, "C": {T3: {1}}}


def test_uniform_unbalanced_previous_assignment() -> None:
    # testReassignmentForTwoMembersTwoTopicsGivenUnbalancedPrevAssignment
    group = spec({"A": member(T1, T2, t1=(0, 1), t2=(0, 1)), "B": member(T1, T2, t1=(2,), t2=(2,))},
                 {T1: 3, T2: 3})
    assert flat(UniformAssignor().assign(group)) == {"A": {T1: {0, 1}, T2: {0}}, "B": {T1: {2}, T2: {1, 2}}}


def test_uniform_partitions_added() -> None:
    # testReassignmentWhenPartitionsAreAddedForTwoMembersTwoTopics
    group = spec({"A": member(T1, T2, t1=(0, 2), t2=(0,)), "B": member(T1, T2, t1=(1,), t2=(1, 2))},
                 {T1: 6, T2: 5})
    assert flat(UniformAssignor().assign(group)) == {"A": {T1: {0, 2}, T2: {0, 3, 4}},
                                                     "B": {T1: {1, 3, 4, 5}, T2: {1, 2}}}


def test_uniform_member_added() -> None:
    # testReassignmentWhenOneMemberAddedAfterInitialAssignmentWithTwoMembersTwoTopics
    group = spec({"A": member(T1, T2, t1=(0, 2), t2=(0,)), "B": member(T1, T2, t1=(1,), t2=(1, 2)),
                  "C": member(T1, T2)}, {T1: 3, T2: 3})
    assert flat(UniformAssignor().assign(group)) == {"A": {T1: {0, 2}}, "B": {T1: {1}, T2: {1}},
                                                     "C": {T2: {0, 2}}}


def test_uniform_unknown_topic_fails_like_kafka() -> None:
    with pytest.raises(AssignorError, match="doesn't exist in the topic metadata"):
        UniformAssignor().assign(spec({"A": member(T1)}, {}))


def test_range_three_members_different_subscriptions() -> None:
    # RangeAssignorTest.testFirstAssignmentThreeMembersThreeTopicsDifferentSubscriptions
    group = spec({"A": member(T1, T2), "B": member(T3), "C": member(T2, T3)}, {T1: 3, T2: 3, T3: 2},
                 HETEROGENEOUS)
    assert flat(RangeAssignor().assign(group)) == {"A": {T1: {0, 1, 2}, T2: {0, 1}}, "B": {T3: {0}},
                                                   "C": {T2: {2}, T3: {1}}}


def test_range_static_members_keep_their_ranges() -> None:
    # RangeAssignorTest.testMixedStaticMembership: a static member rejoining under a new member id keeps its range.
    members = {"A": member(T1, instance_id="instanceA"), "C": member(T1, instance_id="instanceC"), "B": member(T1)}
    first = RangeAssignor().assign(spec(members, {T1: 5}))
    del members["A"]
    members["memberA1"] = member(T1, instance_id="instanceA")
    second = RangeAssignor().assign(spec(members, {T1: 5}))
    assert second["memberA1"] == first["A"] and second["B"] == first["B"] and second["C"] == first["C"]
    assert flat(first) == {"A": {T1: {0, 1}}, "C": {T1: {2, 3}}, "B": {T1: {4}}}


@settings(max_examples=60, deadline=None)
@given(members=st.integers(1, 8), counts=st.lists(st.integers(0, 12), min_size=1, max_size=3),
       seed=st.randoms(use_true_random=False))
def test_uniform_is_balanced_and_complete(members: int, counts: list[int], seed) -> None:  # type: ignore
    # distinct ids (a shrunk random draws zeros): the low byte is the topic's index
    topics = [uuid.UUID(int=seed.getrandbits(120) << 8 | index) for index in range(len(counts))]
    current: dict[str, dict[uuid.UUID, set[int]]] = {f"m{i}": {} for i in range(members)}
    for topic, count in zip(topics, counts):
        for partition in range(count):
            if seed.random() < 0.5:
                current[f"m{seed.randrange(members)}"].setdefault(topic, set()).add(partition)
    group = GroupSpec({m: MemberSpec(tuple(topics), ordered(a))
                       for m, a in current.items()}, HOMOGENEOUS, dict(zip(topics, counts)))
    result = UniformAssignor().assign(group)
    owned = [(t, p) for a in result.values() for t, ps in a.items() for p in ps]
    assert sorted(owned) == sorted((t, p) for t, c in zip(topics, counts) for p in range(c))
    sizes = [sum(len(ps) for ps in result.get(m, {}).values()) for m in current]
    assert max(sizes) - min(sizes) <= 1


def test_uniform_heterogeneous_first_assignment() -> None:
    # UniformHeterogeneousAssignmentBuilderTest.testFirstAssignmentTwoMembersTwoTopics
    group = spec({"A": member(T1, T3), "B": member(T3)}, {T1: 3, T3: 6}, HETEROGENEOUS)
    assert flat(UniformAssignor().assign(group)) == {"A": {T1: {0, 1, 2}, T3: {4}}, "B": {T3: {0, 1, 2, 3, 5}}}


def test_uniform_heterogeneous_unbalanced_previous_assignment() -> None:
    # testReassignmentForTwoMembersThreeTopicsGivenUnbalancedPrevAssignment
    group = spec({"A": member(T1, t1=(0, 1, 2)), "B": member(T1, T2, t1=(3,), t2=(0,)),
                  "C": member(T1, T2, T3, t1=(4, 5), t2=(1, 2, 3), t3=(0, 1, 2, 3))},
                 {T1: 6, T2: 4, T3: 4}, HETEROGENEOUS)
    assert flat(UniformAssignor().assign(group)) == {"A": {T1: {0, 1, 2, 5}}, "B": {T1: {3}, T2: {0, 1, 2, 3}},
                                                     "C": {T1: {4}, T3: {0, 1, 2, 3}}}


def test_uniform_heterogeneous_member_removed() -> None:
    # testReassignmentWhenOneMemberRemovedAfterInitialAssignmentWithThreeMembersThreeTopics
    group = spec({"A": member(T1, T3, t1=(0, 1, 2), t3=(0, 1)), "B": member(T2, t2=(3, 4, 5, 6))},
                 {T1: 3, T2: 8, T3: 3}, HETEROGENEOUS)
    assert flat(UniformAssignor().assign(group)) == {"A": {T1: {0, 1, 2}, T3: {0, 1, 2}},
                                                     "B": {T2: set(range(8))}}


@settings(max_examples=60, deadline=None)
@given(members=st.integers(1, 6), counts=st.lists(st.integers(0, 10), min_size=1, max_size=4),
       seed=st.randoms(use_true_random=False))
def test_uniform_heterogeneous_assigns_each_partition_to_one_subscriber(members: int, counts: list[int],
                                                                        seed) -> None:  # type: ignore[no-untyped-def]
    # distinct ids (a shrunk random draws zeros): the low byte is the topic's index
    topics = [uuid.UUID(int=seed.getrandbits(120) << 8 | index) for index in range(len(counts))]
    subscriptions = {f"m{i}": tuple(t for t in topics if seed.random() < 0.6) for i in range(members)}
    group = GroupSpec({m: MemberSpec(subs, {}) for m, subs in subscriptions.items()}, HETEROGENEOUS,
                      dict(zip(topics, counts)))
    result = UniformAssignor().assign(group)
    owners: dict[tuple[uuid.UUID, int], str] = {}
    for member_id, assignment in result.items():
        for topic, partitions in assignment.items():
            assert topic in subscriptions[member_id]
            for p in partitions:
                assert (topic, p) not in owners
                owners[(topic, p)] = member_id
    subscribed = {t for subs in subscriptions.values() for t in subs}
    assert set(owners) == {(t, p) for t, c in zip(topics, counts) if t in subscribed for p in range(c)}
