"""A consumer group's write lost while later ones landed, met at the load or at the answer (the simulator's seeds
2137 of --protocol mixed, 1064 and 2013 of --protocol upgrade). Our writes are separate transactions: one can
time out unappended while later ones land, and a writer that gives its partition up before the outcome is known
repairs nothing (docs/architecture.md, "A failed write"). Manual clock, in-memory store
(tests/support/group_harness.py)."""
from __future__ import annotations

import asyncio
import dataclasses
import uuid

from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.modern.records import (ConsumerGroupRecord, CurrentAssignmentRecord, GroupEpochRecord,
                                              MemberMetadataRecord, RecordType, Tombstone)
from coordinator.group.runtime import GroupRuntime
from coordinator.group.state import GroupState
from coordinator.group.store import InMemoryGroupStore
from coordinator.topics import StaticTopics, TopicImage
from protocol.consumer_protocol import Assignment, encode_assignment
from protocol.error_codes import Errors
from tests.support.group_harness import Env, drain, env  # noqa: F401

T = uuid.UUID(int=0x7)


def _heartbeat(env: Env, member_id: str, epoch: int = 0, owned: list[tuple[uuid.UUID, list[int]]] | None = None
               ) -> asyncio.Task[HeartbeatResponse]:
    joining = epoch == 0
    return asyncio.ensure_future(env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", member_id, epoch, rebalance_timeout_ms=30_000 if joining else -1,
        subscribed_topic_names=("t",) if joining else None, owned=[] if joining else owned, client_id=member_id,
        client_host="/127.0.0.1")))


def _owned(response: HeartbeatResponse) -> list[tuple[uuid.UUID, list[int]]]:
    assert response.assignment is not None
    return [(topic_id, list(partitions)) for topic_id, partitions in response.assignment.items()]


async def test_a_member_whose_epoch_the_loaded_group_does_not_reach_is_never_told_a_lower_one(env: Env) -> None:
    """c's join (group epoch 2 and its target) waits in the producer's queue while a reconciles to epoch 2 (its
    revocation, then its new epoch: both land and are answered); the partition is given up and the join then
    times out unappended. The log holds a at epoch 2 beside group and target epoch 1, which no log without a gap
    holds. The load writes a group epoch past 2: a's next heartbeat computes a target at epoch 3 and a moves on
    to it. On the code before, the load kept epoch 1, a's target at epoch 1 took it back there, and a was told
    epoch 1 after 2 (seed 2137 of --protocol mixed: a static join's group epoch 6 and its repairs timed out, a
    member's assignment at epoch 6 landed, the owed repair went with the partition; told epoch 4 after 6)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 4)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    a = await _heartbeat(env, "a")
    assert a.error == Errors.NONE and a.member_epoch == 1
    gate = store.hold_next_write()  # c's join: waits in the producer's queue
    joining = _heartbeat(env, "c")
    await drain()
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    assert group.group_epoch == group.assignment_epoch == 2 and not joining.done()
    revoking = await _heartbeat(env, "a", 1, _owned(a))  # lands: told to revoke, still at epoch 1
    assert revoking.error == Errors.NONE and revoking.member_epoch == 1
    moved = await _heartbeat(env, "a", 1, _owned(revoking))  # lands: epoch 2
    assert moved.error == Errors.NONE and moved.member_epoch == 2 and moved.assignment is None
    partition = env.coordinator.shard_for("g").partition
    await env.coordinator.unload([partition])
    store.unloaded.discard(partition)
    store.fail_next_write(Errors.REQUEST_TIMED_OUT)  # c's join: not appended
    gate.set()
    await drain()
    assert (await joining).error != Errors.NONE
    await env.coordinator.load([partition])
    await drain()
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    assert set(group.members) == {"a"} and group.members["a"].member_epoch == 2
    told = await _heartbeat(env, "a", 2, _owned(revoking))  # (moved's assignment: unchanged)
    assert told.error == Errors.NONE and told.member_epoch > 2, f"told epoch {told.member_epoch} after 2"
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    assert told.member_epoch == group.group_epoch == group.assignment_epoch
    raised = [r.epoch for r in store.consumer_records if isinstance(r, GroupEpochRecord)]
    assert raised[-1] == group.group_epoch, "the raised epoch is in the log"


async def test_a_downgrade_whose_write_fails_after_the_classic_groups_record_was_written_stands(env: Env) -> None:
    """a, the last consumer-protocol member, leaves: the group goes back to classic, its write (the consumer
    group's tombstones, the classic record) waiting in the producer's queue. The classic group rebalances
    meanwhile: x rejoins, leads, and its generation's record is written and x told its assignment. Then the
    downgrade's write times out. Kafka never reverts under a later write (a batch commits only after the ones
    before it), and the log holds the classic record last: the classic group stays, and the consumer group's
    tombstones are written again. On the code before, the downgrade was reverted as the group's latest write:
    the consumer group came back with x at its old epoch and target while x's client held what the classic
    generation gave it (seed 1064 of --protocol upgrade: a rejoining member was then given a partition another
    member's client still owned)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    assert (await _heartbeat(env, "a")).error == Errors.NONE
    x = env.client("x")
    await x.start_join()
    assert x.take_join().error_code == Errors.NONE  # a classic member of the consumer group
    gate = store.hold_next_write()  # the downgrade's write: waits in the producer's queue
    leaving = _heartbeat(env, "a", -1)
    await drain()
    classic = env.group()
    assert "g" not in env.coordinator.shard_for("g").consumer_groups and classic.members.keys() == {x.member_id}
    await x.start_join()
    assert x.take_join().error_code == Errors.NONE and x.is_leader
    synced = await x.start_sync({x.member_id: encode_assignment(Assignment((("t", (0, 1)),)), 0)})
    assert (await synced).error_code == Errors.NONE and env.state() is GroupState.STABLE
    store.fail_next_write(Errors.REQUEST_TIMED_OUT)
    gate.set()
    await drain()
    assert (await leaving).error != Errors.NONE
    await drain()
    assert "g" not in env.coordinator.shard_for("g").consumer_groups, "the downgrade was reverted"
    assert env.group() is classic and env.state() is GroupState.STABLE
    assert await x.heartbeat() == Errors.NONE
    assert any(isinstance(r, Tombstone) and r.member_id == "a" for r in store.consumer_records)
    reloaded = GroupRuntime(env.config, env.timer, store, env.clock)
    try:
        await reloaded.load([env.coordinator.shard_for("g").partition])
        shard = reloaded.shard_for("g")
        assert "g" not in shard.consumer_groups and shard.groups["g"].generation_id == x.generation
    finally:
        await reloaded.shutdown()


def _compacted(records: list[ConsumerGroupRecord]) -> list[ConsumerGroupRecord]:
    """The log once the cleaner has run and delete.retention.ms passed: each key's latest record, in log order,
    tombstones gone."""
    latest: dict[tuple[object, ...], int] = {}
    for index, record in enumerate(records):
        latest[(record.group_id, record.record_type, getattr(record, "member_id", None),
                getattr(record, "regex", None))] = index
    return [records[i] for i in sorted(latest.values()) if not isinstance(records[i], Tombstone)]


async def _loaded(records: list[ConsumerGroupRecord]) -> tuple[Env, InMemoryGroupStore]:
    store = InMemoryGroupStore()
    store.consumer_records = list(records)
    env = Env(store=store)
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 4)])
    await env.coordinator.load()
    await drain()
    return env, store


async def test_a_members_records_left_after_its_metadatas_tombstone_are_tombstoned_at_the_load(env: Env) -> None:
    """a's metadata tombstone is in the log without the tombstones of its current assignment and target, which
    Kafka writes with it, before it (the tombstone writer's owed tombstones sent at a graceful shutdown while a
    write of a's assignment was in flight: seed 2013 of --protocol upgrade). The load drops a, and tombstones what
    the log still holds of it; so once the cleaner has removed the metadata's tombstone, a later load does not make
    a again from its current assignment alone, holding partitions b has now. On the code before, nothing of it
    was tombstoned and the second load made a again beside b."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 4)])
    assert isinstance(env.store, InMemoryGroupStore)
    assert (await _heartbeat(env, "a")).error == Errors.NONE
    assert (await _heartbeat(env, "b")).error == Errors.NONE
    await drain()
    log = [*env.store.consumer_records, Tombstone(RecordType.MEMBER_METADATA, "g", "a")]
    first, store = await _loaded(log)
    try:
        group = first.coordinator.shard_for("g").consumer_groups["g"]
        assert set(group.members) == {"b"}
        after = list(store.consumer_records)
    finally:
        await first.close()
    second, _ = await _loaded(_compacted(after))
    try:
        assert set(second.coordinator.shard_for("g").consumer_groups["g"].members) == {"b"}, "a made again"
    finally:
        await second.close()
    gone = {r.record_type for r in after[len(log):] if isinstance(r, Tombstone) and r.member_id == "a"}
    assert gone == {RecordType.CURRENT_MEMBER_ASSIGNMENT, RecordType.TARGET_ASSIGNMENT_MEMBER}


async def test_a_group_made_by_leftover_records_alone_is_dropped_and_tombstoned_at_the_load(env: Env) -> None:
    """The same with every member's metadata tombstoned and no group epoch record left: the load made a group at
    epoch 0 with no member, which no log Kafka writes holds. It is dropped, and its leftover records tombstoned."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 4)])
    assert isinstance(env.store, InMemoryGroupStore)
    assert (await _heartbeat(env, "a")).error == Errors.NONE
    await drain()
    log = [r for r in env.store.consumer_records if r.record_type in (RecordType.CURRENT_MEMBER_ASSIGNMENT,
                                                                       RecordType.TARGET_ASSIGNMENT_MEMBER)]
    log.append(Tombstone(RecordType.MEMBER_METADATA, "g", "a"))
    first, store = await _loaded(log)
    try:
        assert "g" not in first.coordinator.shard_for("g").consumer_groups
        assert not _compacted(store.consumer_records)
    finally:
        await first.close()


async def test_a_partition_a_departed_member_held_over_a_loaded_owner_stays_the_owners(env: Env) -> None:
    """The log holds a with every partition, then x given them too (a's revocation a lost write) and x's leave:
    loaded, a still owns them all, and a member joining gets none of them until a has revoked them. Replayed one
    record at a time, x's assignment took a's entries in the group's index of owned partitions and x's leave
    dropped them, so the index no longer named a as their owner (on the code before, c was given partitions a still
    owned in its first answer; seed 184 of --protocol upgrade, consumer_owner after a failover)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 4)])
    assert isinstance(env.store, InMemoryGroupStore)
    assert _owned(await _heartbeat(env, "a")) == [(T, [0, 1, 2, 3])]
    await drain()
    a = env.store.consumer_records
    a_metadata = next(r for r in a if isinstance(r, MemberMetadataRecord))
    a_current = next(r for r in reversed(a) if isinstance(r, CurrentAssignmentRecord))
    x_metadata = dataclasses.replace(a_metadata, member_id="x", client_id="x")
    x_current = dataclasses.replace(a_current, member_id="x", member_epoch=a_current.member_epoch + 1,
                                    previous_member_epoch=a_current.member_epoch)
    log = [*a, x_metadata, x_current, *(Tombstone(kind, "g", "x") for kind in (
        RecordType.CURRENT_MEMBER_ASSIGNMENT, RecordType.TARGET_ASSIGNMENT_MEMBER, RecordType.MEMBER_METADATA))]
    loaded, _ = await _loaded(log)
    try:
        assert set(loaded.coordinator.shard_for("g").consumer_groups["g"].members) == {"a"}
        joined = await _heartbeat(loaded, "c")
        assert joined.error == Errors.NONE
        assert _owned(joined) == [], "c given partitions a still owns"
    finally:
        await loaded.close()
