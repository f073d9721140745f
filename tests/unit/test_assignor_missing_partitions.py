"""A current target naming partitions the topic no longer has (a Metadata answer showing fewer partitions than
before under the same topic id: Kafka's image never does, ours can when a broker answers from an older view): the
uniform assignor drops them instead of failing, in both builders, and the group logic goes on through the shrink
and the regrowth."""

from __future__ import annotations

import asyncio
import uuid

from coordinator.group.assignor import GroupSpec, MemberSpec, RangeAssignor, SubscriptionType, UniformAssignor
from coordinator.group.assignor.spec import ordered
from coordinator.topics import TopicImage
from tests.support.consumer_group_env import FOO, Env

T1, T2 = uuid.UUID(int=0x71), uuid.UUID(int=0x72)


def _flat(assignment: dict[str, dict[uuid.UUID, frozenset[int]]]) -> dict[str, dict[uuid.UUID, set[int]]]:
    return {m: {t: set(ps) for t, ps in a.items() if ps} for m, a in assignment.items()}


def _every_partition_once(assignment: dict[str, dict[uuid.UUID, frozenset[int]]],
                          counts: dict[uuid.UUID, int]) -> None:
    held = sorted((t, p) for a in assignment.values() for t, ps in a.items() for p in ps)
    assert held == sorted((t, p) for t, count in counts.items() for p in range(count))


def test_homogeneous_drops_partitions_the_topic_no_longer_has() -> None:
    counts = {T1: 3}
    spec = GroupSpec({"a": MemberSpec((T1,), ordered({T1: range(6)})), "b": MemberSpec((T1,), {})},
                     SubscriptionType.HOMOGENEOUS, counts)
    assigned = UniformAssignor().assign(spec)
    _every_partition_once(assigned, counts)
    assert _flat(assigned) == {"a": {T1: {0, 1}}, "b": {T1: {2}}}  # a keeps what it can of what exists


def test_heterogeneous_drops_partitions_the_topic_no_longer_has() -> None:
    counts = {T1: 2, T2: 4}
    spec = GroupSpec({"a": MemberSpec((T1, T2), ordered({T1: range(5), T2: (0, 1)})),
                      "b": MemberSpec((T2,), ordered({T2: (2, 3, 7)}))},
                     SubscriptionType.HETEROGENEOUS, counts)
    assigned = UniformAssignor().assign(spec)
    _every_partition_once(assigned, counts)
    assert _flat(assigned) == {"a": {T1: {0, 1}, T2: {0}}, "b": {T2: {1, 2, 3}}}


def test_range_ignores_current_targets() -> None:
    counts = {T1: 2}
    spec = GroupSpec({"a": MemberSpec((T1,), ordered({T1: range(4)})), "b": MemberSpec((T1,), {})},
                     SubscriptionType.HOMOGENEOUS, counts)
    assert _flat(RangeAssignor().assign(spec)) == {"a": {T1: {0}}, "b": {T1: {1}}}


def targeted(env: Env) -> list[int]:
    """foo's partitions in the members' targets, each once."""
    held = [p for target in env.group().targets.values() for p in target.get(FOO, ())]
    assert len(held) == len(set(held))
    return sorted(held)


def test_a_group_goes_through_a_topic_shown_smaller_and_back() -> None:
    async def scenario() -> None:
        env = Env()
        try:
            a = await env.heartbeat("a", 0)
            b = await env.heartbeat("b", 0)
            a = await env.heartbeat("a", a.member_epoch, owned=dict(a.assignment or []))
            b = await env.heartbeat("b", b.member_epoch, owned=dict(b.assignment or []))
            a = await env.heartbeat("a", a.member_epoch, owned=dict(a.assignment or []))
            epoch = env.group().group_epoch
            assert targeted(env) == [0, 1, 2, 3, 4, 5]
            env.topics.put(TopicImage(FOO, "foo", 2))  # foo had 6
            env.advance(env.runtime.consumer_groups.settings.metadata_refresh_interval_ms)
            shrunk = await env.heartbeat("a", a.member_epoch, owned=dict(a.assignment or []))
            assert shrunk.error == 0 and env.group().group_epoch == epoch + 1
            assert targeted(env) == [0, 1]
            env.topics.put(TopicImage(FOO, "foo", 6))
            env.advance(env.runtime.consumer_groups.settings.metadata_refresh_interval_ms)
            grown = await env.heartbeat("a", shrunk.member_epoch, owned=dict(shrunk.assignment or []))
            assert grown.error == 0 and env.group().group_epoch == epoch + 2
            assert targeted(env) == [0, 1, 2, 3, 4, 5]
        finally:
            await env.runtime.shutdown()
            await env.timer.close()

    asyncio.run(scenario())
