"""The server-side assignors give Kafka 4.1's assignments: generated groups (homogeneous and heterogeneous
subscriptions, current targets to keep, revoke and rebalance, including topics no longer subscribed) are handed to
Kafka 4.1.1's own UniformAssignor and RangeAssignor (tests/support/java/AssignorCheck.java, groups held as Kafka's
TargetAssignmentBuilder holds them) and to ours (members and targets in the Java orders the group logic gives it);
every target must be the same."""

from __future__ import annotations

import base64
import random
import uuid

import pytest

from coordinator.group.assignor import (AssignorError, GroupSpec, MemberSpec, RangeAssignor, SubscriptionType,
                                        UniformAssignor)
from coordinator.group.assignor.java_order import member_order
from coordinator.group.assignor.spec import ordered
from tests.support import kafka_java

pytestmark = pytest.mark.interop

CASES = 400

Group = tuple[dict[uuid.UUID, int], dict[str, tuple[list[uuid.UUID], dict[uuid.UUID, list[int]]]]]


def kafka_id(topic_id: uuid.UUID) -> str:
    """org.apache.kafka.common.Uuid.toString."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def generated(rng: random.Random) -> Group:
    """A group as Kafka can have it: topics that exist, subscriptions to some of them, current targets that do
    not overlap (partitions of topics a member no longer subscribes to included)."""
    topics = {uuid.UUID(int=rng.getrandbits(128)): rng.randint(1, 12) for _ in range(rng.randint(1, 4))}
    ids = list(topics)
    member_ids = [base64.urlsafe_b64encode(rng.randbytes(16)).decode().rstrip("=")
                  for _ in range(rng.randint(1, 7))]
    shared = rng.sample(ids, rng.randint(1, len(ids)))
    homogeneous = rng.random() < 0.5
    subscriptions = {m: shared if homogeneous else rng.sample(ids, rng.randint(1, len(ids))) for m in member_ids}
    current: dict[str, dict[uuid.UUID, list[int]]] = {m: {} for m in member_ids}
    for topic_id, count in topics.items():
        for partition in range(count):
            if rng.random() < 0.7:
                owner = rng.choice(member_ids)
                current[owner].setdefault(topic_id, []).append(partition)
    return topics, {m: (subscriptions[m], current[m]) for m in member_ids}


def kafka_lines(group: Group) -> str:
    topics, members = group
    lines = [f"topic\t{t}\t{count}" for t, count in topics.items()]
    for member_id, (subscribed, current) in members.items():
        target = ";".join(f"{t}:{','.join(map(str, ps))}" for t, ps in current.items())
        lines.append(f"member\t{member_id}\t{','.join(map(str, subscribed))}\t{target}")
    return "\n".join(lines)


ASSIGNORS: dict[str, UniformAssignor | RangeAssignor] = {"uniform": UniformAssignor(), "range": RangeAssignor()}


def ours(assignor: str, group: Group) -> str:
    topics, members = group
    kind = (SubscriptionType.HOMOGENEOUS if len({frozenset(s) for s, _ in members.values()}) <= 1
            else SubscriptionType.HETEROGENEOUS)
    specs = {m: MemberSpec(tuple(members[m][0]), ordered(members[m][1])) for m in member_order(members)}
    try:
        assigned = ASSIGNORS[assignor].assign(GroupSpec(specs, kind, topics))
    except AssignorError as exc:
        return f"ERROR\t{exc}"
    return "|".join(
        f"{m}=" + ";".join(f"{kafka_id(t)}:{','.join(map(str, sorted(ps)))}"
                           for t, ps in sorted(assigned.get(m, {}).items(), key=lambda tp: kafka_id(tp[0])) if ps)
        for m in sorted(members))


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_our_assignor_assigns_as_kafkas(assignor: str) -> None:
    rng = random.Random(848)
    groups = [generated(rng) for _ in range(CASES)]
    kafka = kafka_java.run("AssignorCheck", "\n\n".join(map(kafka_lines, groups)) + "\n", assignor)
    assert len(kafka) == len(groups)
    answers = zip(groups, kafka, (ours(assignor, g) for g in groups))
    different = [(kafka_lines(g), k, o) for g, k, o in answers if k != o]
    assert not different, f"{len(different)} of {len(groups)} differ, first:\n{different[0]}"
    assert sum(line.startswith("ERROR") for line in kafka) == 0
