"""The written ConsumerGroupHeartbeats of one state partition that arrive in one loop turn while an append of the
partition is in flight share one store append (one transaction), of one group or of several, as Kafka's runtime
appends the records of one loop as one batch: each is answered only once that append is acknowledged; a failed one
answers each of them with Kafka's error and takes every group it touched back to before its first record; writes
made directly meanwhile keep the partition's order. With nothing in flight the first goes at once. Through the
runtime on a manual clock and the in-memory store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordinator.group.errors import kafka4_append_error
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.modern.records import CurrentAssignmentRecord, GroupEpochRecord, MemberMetadataRecord
from coordinator.group.result import Write
from protocol.error_codes import Errors
from tests.support.consumer_group_env import FOO, GROUP, Env

OTHER = "h"  # a second group, on the same state partition (the environment has one)


@pytest.fixture
async def env():  # type: ignore[no-untyped-def]
    environment = Env(offsets_topic_num_partitions=1)
    yield environment
    await environment.close()


def state(group: ConsumerGroup) -> dict[str, Any]:
    return {name: getattr(group, name) for name in (
        "group_epoch", "metadata_hash", "assignment_epoch", "members", "static_members", "targets",
        "_partition_epochs")}


def heartbeat(env: Env, group_id: str, member_id: str, epoch: int, owned: dict | None = None  # type: ignore[type-arg]
              ) -> Any:
    topics = ("foo",) if epoch == 0 else None
    if epoch == 0:
        owned = {}
    request = HeartbeatRequest(group_id, member_id, epoch, subscribed_topic_names=topics,
                               rebalance_timeout_ms=30_000 if epoch == 0 else -1,
                               owned=None if owned is None else list(owned.items()), client_id=member_id,
                               client_host="/127.0.0.1")
    return env.runtime.consumer_group_heartbeat(request)


def beat(env: Env, group_id: str, member_id: str) -> Any:
    """The member's heartbeat as its client sends it: its epoch, and what it was last told it owns."""
    member = env.runtime.shard_for(group_id).consumer_groups[group_id].members[member_id]
    return heartbeat(env, group_id, member_id, member.member_epoch, owned=member.assigned)


async def revoking(env: Env, group_id: str) -> list[str]:
    """A Stable group of a, b, c (two partitions of foo each), then three more joined: a, b and c each have one
    partition to give up at their next heartbeat."""
    await asyncio.gather(*(heartbeat(env, group_id, m, 0) for m in "abc"))
    await asyncio.gather(*(heartbeat(env, group_id, m, 0) for m in "xyz"))
    group = env.runtime.shard_for(group_id).consumer_groups[group_id]
    assert all(len(group.members[m].assigned[FOO]) == 2 and len(group.target_of(m)[FOO]) == 1 for m in "abc")
    return ["a", "b", "c"]


async def in_flight(env: Env) -> asyncio.Event:
    """An append of the partition in flight (another group's, held until the returned gate is set): the written
    heartbeats that come meanwhile wait for the end of their turn."""
    gate = env.store.hold_next_write()
    write = Write("elsewhere", [GroupEpochRecord("elsewhere", 1, 0)])
    env.runtime.shard_for(GROUP).append(write)
    for _ in range(100):  # until the store holds it (bounded)
        if env.store.writes and env.store.writes[-1] == write.records:
            return gate
        await asyncio.sleep(0)
    raise AssertionError("the write in flight did not reach the store")


def replayed(env: Env, group_id: str) -> ConsumerGroup:
    group = ConsumerGroup(group_id)
    for record in env.store.consumer_records:
        if record.group_id == group_id:
            group.replay(record)
    return group


async def test_written_heartbeats_of_one_turn_share_one_store_write(env: Env) -> None:
    members = await revoking(env, GROUP)
    gate = await in_flight(env)
    writes = len(env.store.writes)
    answers = await asyncio.gather(*(beat(env, GROUP, m) for m in members))
    assert len(env.store.writes) == writes + 1  # one append, one acknowledgement for the three
    [write] = env.store.writes[writes:]
    gate.set()
    assert [(type(r), r.member_id) for r in write] == [(CurrentAssignmentRecord, m) for m in members]
    group = env.group()
    for member_id, answer in zip(members, answers):  # each told to keep only its target, at its epoch
        assert (answer.error, answer.member_epoch) == (Errors.NONE, group.members[member_id].member_epoch)
        assert answer.assignment == group.target_of(member_id)
    assert state(replayed(env, GROUP)) == state(group)


async def test_with_nothing_in_flight_the_first_written_heartbeat_goes_at_once_and_its_turns_others_after_it(
        env: Env) -> None:
    members = await revoking(env, GROUP)
    writes = len(env.store.writes)
    answers = await asyncio.gather(*(beat(env, GROUP, m) for m in members))
    assert [a.error for a in answers] == [Errors.NONE] * 3
    assert [[r.member_id for r in write] for write in env.store.writes[writes:]] == [["a"], ["b", "c"]]
    assert state(replayed(env, GROUP)) == state(env.group())


async def test_written_heartbeats_of_two_groups_in_one_turn_share_one_store_write(env: Env) -> None:
    assert env.runtime.shard_for(GROUP) is env.runtime.shard_for(OTHER)
    await revoking(env, GROUP)
    await revoking(env, OTHER)
    gate = await in_flight(env)
    writes = len(env.store.writes)
    answers = await asyncio.gather(beat(env, GROUP, "a"), beat(env, OTHER, "a"), beat(env, GROUP, "b"),
                                   beat(env, OTHER, "b"))
    assert [a.error for a in answers] == [Errors.NONE] * 4
    [write] = env.store.writes[writes:]
    # one group's heartbeats of the turn are one write (its records in the order they came), the groups' writes in
    # the order each group first wrote
    assert [(r.group_id, r.member_id) for r in write] == [(GROUP, "a"), (GROUP, "b"), (OTHER, "a"), (OTHER, "b")]
    gate.set()
    for group_id in (GROUP, OTHER):
        assert state(replayed(env, group_id)) == state(env.runtime.shard_for(group_id).consumer_groups[group_id])


async def test_a_failed_shared_write_answers_each_heartbeat_and_undoes_every_member_of_every_group(
        env: Env) -> None:
    await revoking(env, GROUP)
    await revoking(env, OTHER)
    before = {g: state(env.runtime.shard_for(g).consumer_groups[g].snapshot()) for g in (GROUP, OTHER)}
    gate = await in_flight(env)
    writes = len(env.store.writes)
    env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)  # the turn's append (the one in flight is held)
    answers = await asyncio.gather(*(beat(env, g, m) for m in "abc" for g in (GROUP, OTHER)))
    assert len(env.store.writes) == writes + 1
    assert [a.error for a in answers] == [kafka4_append_error(Errors.NOT_ENOUGH_REPLICAS)] * 6
    gate.set()
    for group_id in (GROUP, OTHER):  # every member back as before the turn, not only the last one written
        assert state(env.runtime.shard_for(group_id).consumer_groups[group_id]) == before[group_id]
    # retried, the members revoke as if the failed turn had not been
    retried = await asyncio.gather(*(beat(env, g, m) for m in "abc" for g in (GROUP, OTHER)))
    assert [a.error for a in retried] == [Errors.NONE] * 6
    for group_id in (GROUP, OTHER):
        group = env.runtime.shard_for(group_id).consumer_groups[group_id]
        assert all(group.members[m].assigned == group.target_of(m) for m in "abc")
        assert state(replayed(env, group_id)) == state(group)


async def test_joins_of_two_groups_in_one_turn_are_written_together_and_answered_after_it(env: Env) -> None:
    first = await in_flight(env)
    gate = env.store.hold_next_write()  # the joins' append
    joins = [asyncio.ensure_future(heartbeat(env, g, "m", 0)) for g in (GROUP, OTHER)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(env.store.writes) == 2 and not any(j.done() for j in joins)  # one append, not acknowledged yet
    assert {type(r) for r in env.store.writes[1]} >= {MemberMetadataRecord, GroupEpochRecord}
    assert {r.group_id for r in env.store.writes[1]} == {GROUP, OTHER}
    first.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not any(j.done() for j in joins)
    gate.set()
    answers: list[HeartbeatResponse] = await asyncio.gather(*joins)
    assert [(a.error, a.member_epoch) for a in answers] == [(Errors.NONE, 1), (Errors.NONE, 1)]


async def test_a_write_made_directly_in_the_same_turn_goes_after_the_turns_writes(env: Env) -> None:
    shard = env.runtime.shard_for(GROUP)
    gate = await in_flight(env)
    first, second, direct = (Write(GROUP, [GroupEpochRecord(GROUP, epoch, 0)]) for epoch in (1, 2, 3))
    done = [shard.append_in_turn(first), shard.append_in_turn(second)]
    assert not first.sealed and not second.sealed  # waiting for the end of the turn
    done.append(shard.append(direct))
    assert first.sealed and second.sealed
    gate.set()
    assert await asyncio.gather(*done) == [Errors.NONE] * 3  # type: ignore[arg-type]
    assert env.store.writes[1:] == [first.records + second.records, direct.records]


async def test_without_write_turns_each_written_heartbeat_is_its_own_append(env: Env) -> None:
    env.runtime.write_turns = False
    members = await revoking(env, GROUP)
    gate = await in_flight(env)
    writes = len(env.store.writes)
    answers = asyncio.gather(*(beat(env, GROUP, m) for m in members))
    gate.set()
    assert [a.error for a in await answers] == [Errors.NONE] * 3
    assert [[r.member_id for r in write] for write in env.store.writes[writes:]] == [["a"], ["b"], ["c"]]
