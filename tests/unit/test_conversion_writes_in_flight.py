"""Writes in flight when a group id changes type (KIP-848's online upgrade and downgrade, an Empty group replaced
by one of the other type), found by the simulator's --protocol upgrade.

An offset commit whose write is in flight when its group changes type (KIP-848's online upgrade and downgrade)
lands in the group's offsets whatever type the group has by then, as Kafka's do: its offsets live apart from the
group (OffsetMetadataManager, keyed by group id), so a conversion never touches them. Here a group's offsets are
held by its GroupMetadata, and a conversion hands them to another object (the consumer group's offsets holder, the
downgraded classic group, the classic group a failed upgrade restores): a commit acknowledged after that must reach
the new holder. Found by the simulator (seed 51 of --protocol upgrade: a classic member's commit acknowledged just
after the upgrade, its offsets then fetched one commit older). Manual clock, in-memory store
(tests/support/group_harness.py)."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from coordinator.group.api import DeleteGroupsRequest
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.modern.records import Tombstone
from coordinator.group.records import Record
from coordinator.group.state import GroupState
from coordinator.group.store import InMemoryGroupStore, StoreError
from coordinator.rewrite_backoff import FIRST_RETRY_MS
from coordinator.topics import StaticTopics, TopicImage
from coordinator.group.api import SyncGroupRequest
from protocol.consumer_protocol import Assignment, encode_assignment
from protocol.error_codes import Errors
from tests.support.group_harness import (Client, Env, advance_until_joined, commit, drain, env,  # noqa: F401
                                         errors_of, fetch)

T = uuid.UUID(int=0x7)


async def _stable_group(env: Env) -> tuple[Client, Client, InMemoryGroupStore]:
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    x, y = env.client("x"), env.client("y")
    for client in (x, y):
        await client.start_join()
    await advance_until_joined(env, x, y)
    for client in (x, y):
        assert client.take_join().error_code == Errors.NONE
    leader = x if x.is_leader else y
    await leader.start_sync({c.member_id: encode_assignment(Assignment((("t", (i,)),)), 0)
                             for i, c in enumerate((x, y))})
    await (y if leader is x else x).start_sync()
    assert env.state() is GroupState.STABLE
    assert isinstance(env.store, InMemoryGroupStore)
    return x, y, env.store


def _consumer_join(env: Env, member_id: str = "c", epoch: int = 0) -> asyncio.Task[HeartbeatResponse]:
    return asyncio.ensure_future(env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", member_id, epoch, rebalance_timeout_ms=30_000 if epoch == 0 else -1,
        subscribed_topic_names=("t",) if epoch == 0 else None, owned=[] if epoch == 0 else None, client_id=member_id,
        client_host="/127.0.0.1")))


@pytest.mark.parametrize("conversion", ["acked", "failed"])
async def test_a_commit_in_flight_during_an_upgrade_is_in_the_groups_offsets(env: Env, conversion: str) -> None:
    x, _, store = await _stable_group(env)
    assert errors_of(await env.coordinator.commit_offsets(
        commit("g", x.generation, x.member_id, {("t", 0): 5}))) == [Errors.NONE]
    gate_commit, gate_conversion = store.hold_next_write(), store.hold_next_write()
    committing = asyncio.ensure_future(env.coordinator.commit_offsets(
        commit("g", x.generation, x.member_id, {("t", 0): 6})))
    await drain()
    upgrade = _consumer_join(env)
    await drain()
    assert "g" in env.coordinator.shard_for("g").consumer_groups and not upgrade.done()
    gate_commit.set()  # acknowledged after the conversion, before its own write is answered
    await drain()
    assert errors_of(await committing) == [Errors.NONE]
    assert (await fetch(env, "g", {"t": [0]}, require_stable=True))[("t", 0)][0] == 6
    if conversion == "failed":
        store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    gate_conversion.set()
    await drain()
    assert (await upgrade).error == (Errors.NONE if conversion == "acked" else Errors.COORDINATOR_NOT_AVAILABLE)
    if conversion == "failed":  # the classic group is back (its last record: Stable), with the offsets
        assert env.state() is GroupState.STABLE and "g" not in env.coordinator.shard_for("g").consumer_groups
    assert (await fetch(env, "g", {"t": [0]}, require_stable=True))[("t", 0)][0] == 6


async def test_a_commit_in_flight_when_the_group_is_upgraded_then_reverted_lands_in_the_restored_group(env: Env
                                                                                                        ) -> None:
    """The commit is acknowledged only once the failed upgrade put the classic group back."""
    x, _, store = await _stable_group(env)
    gate_commit, gate_conversion = store.hold_next_write(), store.hold_next_write()
    committing = asyncio.ensure_future(env.coordinator.commit_offsets(
        commit("g", x.generation, x.member_id, {("t", 1): 9})))
    await drain()
    upgrade = _consumer_join(env)
    await drain()
    store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    gate_conversion.set()
    await drain()
    assert (await upgrade).error == Errors.COORDINATOR_NOT_AVAILABLE
    assert env.state() is GroupState.STABLE and not committing.done()
    gate_commit.set()
    await drain()
    assert errors_of(await committing) == [Errors.NONE]
    assert (await fetch(env, "g", {"t": [1]}, require_stable=True))[("t", 1)][0] == 9


async def test_an_upgrade_whose_write_failed_under_a_later_write_tombstones_the_classic_record_again(env: Env
                                                                                                   ) -> None:
    """The upgrade's write (the classic group's tombstone and the consumer group's records) fails while a later
    write of the consumer group, computed on top of it, is acknowledged: memory keeps the consumer group (only the
    latest write reverts) and the consumer group's records are written again, and so must the classic group's
    tombstone be: a log with the classic record and the consumer group's records reloads as the classic group,
    which the next join converts again from its old generation (the members' epochs go back). Seed 25 of
    --protocol upgrade (the conversion's write timed out in a Kafka outage; member_epoch after the reload)."""
    _, _, store = await _stable_group(env)
    assert "g" in store.groups
    gate_conversion = store.hold_next_write()
    upgrade = _consumer_join(env, "c")
    await drain()
    second = _consumer_join(env, "d")  # written on top of the unanswered conversion, acknowledged at once
    await drain()
    store.fail_next_write(Errors.REQUEST_TIMED_OUT)  # the conversion's write, released now
    gate_conversion.set()
    await drain()
    assert (await upgrade).error == Errors.COORDINATOR_NOT_AVAILABLE
    await second
    consumer_group = env.coordinator.shard_for("g").consumer_groups.get("g")
    assert consumer_group is not None and "d" in consumer_group.members  # not reverted: a later write stands
    assert "g" not in store.groups  # the classic record is tombstoned again


async def test_a_failed_write_of_a_consumer_group_replaced_by_a_classic_group_does_not_bring_it_back(env: Env
                                                                                                    ) -> None:
    """The last member of a consumer group leaves (its write unanswered), a classic JoinGroup finds the group Empty
    and a classic group takes its place (Kafka replaces an empty group); then the leave's write fails. Only the
    group's latest write reverts it, and that write is no longer the latest: the consumer group must not come back
    beside the classic group (seed 73 of --protocol upgrade: it did, and the classic member's SyncGroup was answered
    with a consumer group there too)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    joined = await _consumer_join(env, "c")
    assert joined.error == Errors.NONE
    gate_leave = store.hold_next_write()
    leaving = asyncio.ensure_future(env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", "c", -1, client_id="c", client_host="/127.0.0.1")))
    await drain()
    consumer_groups = env.coordinator.shard_for("g").consumer_groups
    assert "g" in consumer_groups and not consumer_groups["g"].members and not leaving.done()
    x = env.client("x")
    await x.start_join()
    await advance_until_joined(env, x)
    assert x.take_join().error_code == Errors.NONE
    assert "g" not in consumer_groups and env.group() is not None
    store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    gate_leave.set()
    await drain()
    await leaving
    assert "g" not in consumer_groups  # the classic group stands alone
    await x.start_sync({x.member_id: encode_assignment(Assignment((("t", (0, 1)),)), 0)})
    assert x.sync_task is not None and x.sync_task.done() and x.sync_task.result().error_code == Errors.NONE
    assert env.state() is GroupState.STABLE


@pytest.mark.parametrize("outcome", ["acked", "failed"])
async def test_a_classic_members_sync_in_a_consumer_group_waits_for_the_groups_earlier_write(env: Env,
                                                                                            outcome: str) -> None:
    """A classic member's SyncGroup (or JoinGroup that writes nothing) in a consumer group is answered from memory:
    only once the group's earlier writes are acknowledged, as Kafka's runtime answers a write operation without
    records at the last written offset's commit; if one fails, the member is told to retry — memory may say an
    epoch the log never gets (seed 119 of --protocol upgrade: a classic member told epoch 10 by one instance, 9 by
    the next after a failover)."""
    x, y, store = await _stable_group(env)
    assert (await _consumer_join(env, "c")).error == Errors.NONE  # the group is converted
    assert (await env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", "d", 0, instance_id="id", rebalance_timeout_ms=30_000, subscribed_topic_names=("t",), owned=[],
        client_id="d", client_host="/127.0.0.1"))).error == Errors.NONE  # a static member
    consumer_groups = env.coordinator.shard_for("g").consumer_groups
    await x.start_join()  # the classic member rejoins (the group's target changed): its own write, acknowledged
    assert x.join_task is not None
    joined = await x.join_task
    assert joined.error_code == Errors.NONE
    gate = store.hold_next_write()
    leaving = asyncio.ensure_future(env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", "d", -2, instance_id="id", client_id="d", client_host="/127.0.0.1")))  # held; the target stays
    await drain()
    assert not leaving.done() and consumer_groups["g"].members["d"].member_epoch == -2
    sync = asyncio.ensure_future(env.coordinator.sync_group(SyncGroupRequest(
        "g", joined.generation_id, x.member_id, None, "consumer", "range", [])))
    await drain()
    assert not sync.done(), sync.result()  # waits for the leave's write
    if outcome == "failed":
        store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    gate.set()
    await drain()
    assert (await sync).error_code == (Errors.NONE if outcome == "acked" else Errors.COORDINATOR_NOT_AVAILABLE)
    await leaving


async def test_a_failed_upgrade_of_a_group_mid_rebalance_keeps_its_generations_going(env: Env) -> None:
    """A classic group in PreparingRebalance (no record to go back to) is upgraded and the write is refused: its
    members rejoin the Empty group left, whose next generation follows the classic group's, as Kafka's reverted
    classic group's does — not generation 1 again (seed 207 of --protocol upgrade: generation 1 Stable twice)."""
    x, y, store = await _stable_group(env)
    generation = env.group().generation_id
    z = env.client("z")
    await z.start_join()  # the group rebalances
    assert env.state() is GroupState.PREPARING_REBALANCE
    store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    assert (await _consumer_join(env, "c")).error == Errors.COORDINATOR_NOT_AVAILABLE
    assert "g" not in env.coordinator.shard_for("g").consumer_groups
    x.member_id = ""
    x.generation = -1
    await x.start_join()
    if x.join_task is not None and x.join_task.done() and x.take_join().error_code == Errors.MEMBER_ID_REQUIRED:
        await x.start_join()
    await advance_until_joined(env, x)
    joined = x.take_join()
    assert joined.error_code == Errors.NONE and joined.generation_id > generation


async def test_a_consumer_group_made_over_an_empty_classic_group_tombstones_its_record(env: Env) -> None:
    """An Empty classic group with a record in the log gives way to a consumer group: its record is tombstoned
    (Kafka's maybeDeleteEmptyClassicGroup), or a reload makes the classic group again beside the consumer group
    (seed 361 of --protocol upgrade: the Empty group a failed upgrade left, mid-rebalance, still had its record;
    after a reload the stale classic group was converted over the consumer group's members)."""
    x, y, store = await _stable_group(env)
    for client in (x, y):
        assert await client.leave() == Errors.NONE
    await drain()
    assert env.state() is GroupState.EMPTY and "g" in store.groups
    assert (await _consumer_join(env, "c")).error == Errors.NONE
    await drain()
    assert "g" in env.coordinator.shard_for("g").consumer_groups and "g" not in store.groups


async def test_an_empty_consumer_group_replaced_by_a_classic_group_is_tombstoned(env: Env) -> None:
    """A classic JoinGroup finds the consumer group Empty and a classic group takes its place: the consumer group's
    tombstones are written (Kafka's maybeDeleteEmptyConsumerGroup, with the join). Before, only memory dropped it:
    the log kept its records and a reload made the Empty consumer group again beside the classic group (found by
    the simulator's record-by-record reload check of consumer groups, seed 1 of --protocol upgrade)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    assert (await _consumer_join(env, "c")).error == Errors.NONE
    left = await env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", "c", -1, client_id="c", client_host="/127.0.0.1"))
    assert left.error == Errors.NONE
    x = env.client("x")
    await x.start_join()
    await advance_until_joined(env, x)
    assert x.take_join().error_code == Errors.NONE
    await drain()
    reloaded = ConsumerGroup("g")
    for record in store.consumer_records:
        if record.group_id == "g":
            reloaded.replay(record)
    assert reloaded.deleted  # its group epoch record tombstoned: a load does not make it
    assert env.group() is not None  # the classic group stands


async def test_a_failed_write_of_a_deleted_consumer_group_does_not_bring_it_back(env: Env) -> None:
    """The last member leaves (its write unanswered), DeleteGroups deletes the Empty group (acknowledged), then the
    leave's write times out. It is no longer the group's latest write: the group stays deleted, and the keys the
    failed write wrote (it may have landed, or not) are written again as memory has them, gone. Before, the failure
    reverted to the group as it was before the leave (the member back, in memory), and its rewrite put the member
    back in the log after the deletion (seed 98 of --protocol consumer, found by the record-by-record check)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    assert (await _consumer_join(env, "c")).error == Errors.NONE
    gate_leave = store.hold_next_write()
    leaving = asyncio.ensure_future(env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", "c", -1, client_id="c", client_host="/127.0.0.1")))
    await drain()
    [deleted] = (await env.coordinator.delete_groups(DeleteGroupsRequest(["g"]))).results
    assert deleted.error_code == Errors.NONE
    store.fail_next_write(Errors.REQUEST_TIMED_OUT)  # the leave's write, released now
    gate_leave.set()
    await drain()
    await leaving
    await drain()
    assert "g" not in env.coordinator.shard_for("g").consumer_groups  # still deleted
    reloaded = ConsumerGroup("g")
    for record in store.consumer_records:
        if record.group_id == "g":
            reloaded.replay(record)
    assert not reloaded.members  # a reload makes no member (nor, with the epoch's tombstone, a group)


async def test_a_repair_write_refused_before_the_append_is_written_again(env: Env) -> None:
    """A write that may have landed (timed out) is reverted and its keys are written again as memory has them (the
    new member's tombstones). If that repair is refused before the append (NOT_ENOUGH_REPLICAS), its own revert
    changes nothing in memory and the log may still hold the member: the repair is written again. Seed 652 of
    --protocol upgrade (a static member's join landed, its repair was refused, and a reload made it beside its
    successor with the same instance id: the downgrade raised)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    assert (await _consumer_join(env, "c")).error == Errors.NONE
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    store.fail_next_write(Errors.REQUEST_TIMED_OUT)  # d's join: may have landed
    store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)  # its repair: refused before the append
    joining = _consumer_join(env, "d")
    await drain()
    assert (await joining).error != Errors.NONE
    await drain()
    assert not _tombstones_of(store, "d")  # the refused repair waits for its backoff (rewrite_backoff.py)
    await env.advance(FIRST_RETRY_MS)
    group = env.coordinator.shard_for("g").consumer_groups.get("g")
    assert group is not None and "d" not in group.members and "c" in group.members
    assert _tombstones_of(store, "d"), "d's tombstones were never written"


def _tombstones_of(store: InMemoryGroupStore, member_id: str) -> list[Tombstone]:
    return [r for r in store.consumer_records if isinstance(r, Tombstone) and r.member_id == member_id]


class _RefusingStore(InMemoryGroupStore):
    """Refuses every append before it (NOT_ENOUGH_REPLICAS: an ISR shortage) while `refusing`; `writes` still
    lists each attempt."""

    refusing = False

    async def acknowledge(self, records: list[Record]) -> None:
        await super().acknowledge(records)
        if self.refusing:
            raise StoreError(Errors.NOT_ENOUGH_REPLICAS)


def _repairs_of(store: InMemoryGroupStore, member_id: str) -> int:
    """Attempts to write `member_id`'s tombstones (its repair: the member is not in memory)."""
    return sum(1 for write in store.writes
               if any(isinstance(r, Tombstone) and r.member_id == member_id for r in write))


async def _join_landed_then_refused() -> tuple[Env, _RefusingStore]:
    """c is a member; d's join times out (it may have landed: memory reverts, its tombstones are the repair) while
    the cluster refuses every write from then on."""
    store = _RefusingStore()
    env = Env(store=store)
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    assert (await _consumer_join(env, "c")).error == Errors.NONE
    store.refusing = True
    store.fail_next_write(Errors.REQUEST_TIMED_OUT)  # d's join
    assert (await _consumer_join(env, "d")).error != Errors.NONE
    await drain()
    assert _repairs_of(store, "d") == 1  # the repair at once, refused
    return env, store


async def test_a_refused_repair_is_sent_again_with_a_backoff_until_it_is_written() -> None:
    """A cluster that refuses fast gets the repair once per backoff step (1, 2, 4, 8 s, ... capped at 10 s:
    rewrite_backoff.py, the tombstone writer's schedule), not once per round trip; once the cluster takes it the
    resends stop and no timer is left."""
    env, store = await _join_landed_then_refused()
    try:
        timers = env.timer.size
        await env.advance(30_000, step_ms=100)  # within c's session: only the repair writes
        # resent at 1, 3, 7, 15 and 25 s
        assert _repairs_of(store, "d") == 1 + 5 and len(store.writes) == 2 + 1 + 5
        assert not _tombstones_of(store, "d")
        store.refusing = False
        await env.advance(10_000, step_ms=100)  # the next resend, at 35 s
        assert _repairs_of(store, "d") == 7 and _tombstones_of(store, "d")
        assert env.timer.size == timers - 1  # the repair's timer is gone (c's session's is left)
        await env.advance(20_000, step_ms=100)  # (c's session ends meanwhile: its fence is written)
        assert _repairs_of(store, "d") == 7
    finally:
        await env.close()



async def _cs_heartbeat_waiting_for_the_repair(env: Env) -> asyncio.Task[HeartbeatResponse]:
    """c's steady heartbeat, read from memory while d's refused repair waits for its backoff: it waits too."""
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    answer = _heartbeat(env, "c", epoch=group.members["c"].member_epoch)
    await drain()
    assert not answer.done()
    return answer

@pytest.mark.parametrize("written", [True, False])
async def test_an_answer_read_from_memory_waits_for_a_repair_owed(written: bool) -> None:
    """While a repair waits for its backoff, memory holds what the log may not and no write is in flight: an
    answer read from memory (c's heartbeat, which writes nothing) waits for the resend, as it waits for a write in
    flight; refused again, the client is told to retry (seed 1354 of --protocol upgrade: a revocation told from
    memory during an outage never reached the log, and after a failover the member was given the partition back
    in the same epoch)."""
    env, store = await _join_landed_then_refused()
    try:
        answer = await _cs_heartbeat_waiting_for_the_repair(env)
        store.refusing = not written
        await env.advance(FIRST_RETRY_MS)
        assert answer.done() and _repairs_of(store, "d") == 2
        assert (answer.result().error == Errors.NONE) is written
    finally:
        await env.close()


async def test_an_answer_waiting_for_a_repair_owed_is_not_overtaken_by_a_later_write() -> None:
    """Writes and the answers that wait for them go in one order per partition, as Kafka's runtime completes a
    request that wrote nothing at the commit of the last offset written before it. c's heartbeat, read from memory
    while d's repair waits for its backoff, waits for the repair; e's join, made after it, carries the repair (d's
    tombstones, ahead of e's records) and answers c with its own outcome. On the code before, c waited for the
    timer's resend, queued after e's join: e (and any member given c's partitions by a later write) was answered
    first, and c was told its older assignment after them (seed 365 of --protocol consumer: a member told its
    partition after its own leave was written and the partition given to another member)."""
    env, store = await _join_landed_then_refused()
    try:
        c_answer = await _cs_heartbeat_waiting_for_the_repair(env)
        store.refusing = False
        e_answer = _consumer_join(env, "e")
        while not e_answer.done():
            await asyncio.sleep(0)
        assert e_answer.result().error == Errors.NONE
        await drain()  # loop turns only: the clock stays where it is, short of the repair's backoff
        assert c_answer.done() and c_answer.result().error == Errors.NONE
        carried = store.writes[-1]  # d's tombstones went with e's join, ahead of its records
        first_of_e = next(i for i, r in enumerate(carried) if getattr(r, "member_id", None) == "e")
        assert any(isinstance(r, Tombstone) and r.member_id == "d" for r in carried[:first_of_e])
        assert _repairs_of(store, "d") == 2 and _tombstones_of(store, "d")
        await env.advance(30_000, step_ms=500)
        assert _repairs_of(store, "d") == 2  # written: nothing owed, no resend left
    finally:
        await env.close()


@pytest.mark.parametrize("end", ["unload", "shutdown"])
async def test_a_refused_repair_stops_when_its_partition_is_given_up(end: str) -> None:
    """No resend (and no timer) outlives the partition given up or the coordinator's shutdown: the partition's
    next owner loads what the log has."""
    env, store = await _join_landed_then_refused()
    try:
        partition = env.coordinator.shard_for("g").partition
        if end == "unload":
            await env.coordinator.unload([partition])
        else:
            await env.coordinator.shutdown()
        assert env.timer.size == 0
        attempts = len(store.writes)
        await env.advance(30_000, step_ms=500)
        assert len(store.writes) == attempts and env.timer.size == 0
    finally:
        await env.close()


async def test_a_refused_repair_of_a_group_deleted_since_is_written_once_then_stops() -> None:
    """The group gone from memory (deleted here) does not end the repair: memory's value of its keys is then a
    tombstone, and the write that ended the group may fail too (seed 86 of --protocol upgrade: a repair dropped when
    its group was downgraded, whose write then timed out, left a fenced member's records to a reload). It is
    written once, acknowledged, and nothing is left behind."""
    env, store = await _join_landed_then_refused()
    try:
        store.refusing = False
        assert (await _consumer_join(env, "c", epoch=-1)).error == Errors.NONE
        deleted = await env.coordinator.delete_groups(DeleteGroupsRequest(["g"]))
        assert deleted.results[0].error_code == Errors.NONE
        assert "g" not in env.coordinator.shard_for("g").consumer_groups
        await env.advance(FIRST_RETRY_MS)
        assert _repairs_of(store, "d") == 2 and _tombstones_of(store, "d") and env.timer.size == 0
        await env.advance(30_000, step_ms=500)
        assert _repairs_of(store, "d") == 2
    finally:
        await env.close()


def _heartbeat(env: Env, member_id: str, epoch: int = 0, instance_id: str | None = None
               ) -> asyncio.Task[HeartbeatResponse]:
    joining = epoch == 0
    return asyncio.ensure_future(env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", member_id, epoch, instance_id=instance_id, rebalance_timeout_ms=30_000 if joining else -1,
        subscribed_topic_names=("t",) if joining else None, owned=[] if joining else None, client_id=member_id,
        client_host="/127.0.0.1")))


async def _lose_as_leave_under_bs_join(env: Env, store: InMemoryGroupStore, instance_id: str | None) -> int:
    """a's leave waits in the producer's queue while b's join lands; the partition is given up, then the leave
    fails unappended (a timeout in the queue): the log holds b's join without a's leave. Returns the partition."""
    gate = store.hold_next_write()  # a's leave: waits in the producer's queue
    leaving = _heartbeat(env, "a", epoch=-1, instance_id=instance_id)
    await drain()
    assert (await _heartbeat(env, "b", instance_id=instance_id)).error == Errors.NONE  # lands
    partition = env.coordinator.shard_for("g").partition
    await env.coordinator.unload([partition])
    store.unloaded.discard(partition)
    store.fail_next_write(Errors.REQUEST_TIMED_OUT)  # not appended
    gate.set()
    await drain()
    assert (await leaving).error != Errors.NONE
    return partition


@pytest.mark.parametrize("instance_id", ["X", None])
async def test_a_members_leave_lost_under_a_later_join_is_applied_at_the_load(env: Env, instance_id: str | None
                                                                              ) -> None:
    """The log can hold a later write without an earlier one: a write that times out in the producer's queue is
    not appended while the ones queued after it are (librdkafka's idempotent producer leaves that gap). Here a's
    leave is lost while b's join (with a's instance id X, or dynamic), computed once a was gone, lands, and the
    partition is given up before the leave's failure is known, so nothing repairs it. The load finds a beside
    records that assumed it gone (two members of X; b's target over a's partitions): a goes at the load, with
    its tombstones (seed 513 of --protocol upgrade: a lost session fence, the successor's join landed, a
    shutdown; the next owner loaded both, and the uniform assignor raised over their overlapping targets; seed
    184: a member's fence owed while its writer was paused)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 4)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    a = await _heartbeat(env, "a", instance_id=instance_id)
    assert a.error == Errors.NONE and (await _heartbeat(env, "c")).error == Errors.NONE
    await drain()
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    assert group.targets["a"] and group.targets["c"]
    partition = await _lose_as_leave_under_bs_join(env, store, instance_id)
    await env.coordinator.load([partition])
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    assert set(group.members) == {"b", "c"} and group.static_members == ({"X": "b"} if instance_id else {})
    await drain()
    assert _tombstones_of(store, "a")
    # a new member's target is computed over b and c only
    assert (await _heartbeat(env, "d")).error == Errors.NONE
    await drain()
    reloaded = InMemoryGroupStore()
    reloaded.consumer_records = list(store.consumer_records)
    later = Env(store=reloaded)
    try:
        await later.coordinator.load()
        assert "a" not in later.coordinator.shard_for("g").consumer_groups["g"].members
    finally:
        await later.close()


class _LandsThenTimesOutStore(InMemoryGroupStore):
    """The next write flagged by `land_then_time_out` lands (applied) and is answered REQUEST_TIMED_OUT: a write
    whose acknowledgement was lost."""

    landing = False

    async def acknowledge(self, records: list[Record]) -> None:
        if self.landing:
            self.landing = False
            self.apply(records)
            raise StoreError(Errors.REQUEST_TIMED_OUT)
        await super().acknowledge(records)


@pytest.mark.parametrize("classic_state", ["stable", "rebalancing"])
async def test_a_failed_upgrade_whose_write_landed_writes_the_restored_classic_group_again(classic_state: str
                                                                                           ) -> None:
    """The upgrade's write (the classic group's tombstone first) lands but its answer is lost: memory reverts to
    the classic group, and the log, holding the tombstone, would reload no classic group — its generations back to
    1 while its members hold the old ones' partitions (seed 1828 of --protocol upgrade: generation 1 Stable twice).
    The classic group is written again as memory has it: its last Stable record, or, caught mid-rebalance, the
    Empty group its members rejoin, at the generation reached."""
    store = _LandsThenTimesOutStore()
    env = Env(store=store)
    try:
        _, _, _ = await _stable_group(env)
        generation = env.group().generation_id
        if classic_state == "rebalancing":
            await env.client("z").start_join()
            assert env.state() is GroupState.PREPARING_REBALANCE
        store.landing = True
        assert (await _consumer_join(env, "c")).error == Errors.COORDINATOR_NOT_AVAILABLE
        await drain()
        assert "g" not in env.coordinator.shard_for("g").consumer_groups
        assert "g" in store.groups, "the classic group's tombstone is the log's last word on it"
        assert store.groups["g"].generation == generation
        assert bool(store.groups["g"].members) == (classic_state == "stable")
    finally:
        await env.close()


@pytest.mark.parametrize("written_last", ["consumer", "classic"])
async def test_a_load_that_finds_both_types_of_one_group_keeps_the_one_written_last(written_last: str) -> None:
    """Kafka's log never holds a group id as both types; ours can, when the write that tombstoned one type was lost
    or owed while later writes of the other landed. The load keeps the type written last and tombstones the other
    (seeds 1623 and 2137 of --protocol upgrade: a classic record older than the consumer group's records reloaded as
    the classic group, and the next heartbeat converted it again over the consumer group's members)."""
    classic_env = Env()
    consumer_env = Env()
    try:
        _, _, classic_store = await _stable_group(classic_env)
        classic_record = classic_store.groups["g"]
        consumer_env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
        assert (await _consumer_join(consumer_env, "c")).error == Errors.NONE
        assert isinstance(consumer_env.store, InMemoryGroupStore)
        records = list(consumer_env.store.consumer_records)
    finally:
        await classic_env.close()
        await consumer_env.close()
    store = InMemoryGroupStore()
    store.consumer_records = records
    store.groups["g"] = classic_record
    store.classic_read_at["g"] = len(records) if written_last == "classic" else 0
    env = Env(store=store)
    try:
        env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
        await env.coordinator.load()
        await drain()
        consumer_group = env.coordinator.shard_for("g").consumer_groups.get("g")
        if written_last == "consumer":
            assert consumer_group is not None and "c" in consumer_group.members
            assert not env.group().members  # the offsets' holder only
            assert "g" not in store.groups, "the classic record is tombstoned"
        else:
            assert consumer_group is None
            assert env.state() is GroupState.STABLE and len(env.group().members) == 2
            assert _tombstones_of(store, "c"), "the consumer group's records are tombstoned"
    finally:
        await env.close()


async def test_a_refused_fence_of_a_member_written_over_is_kept_and_written_again(env: Env) -> None:
    """The load's fence of a member written over (`_fence_written_over`) is refused: memory keeps it (its state
    before the fence, two members over one partition, is one no log without a gap holds, and is never served),
    and its tombstones are written again as a repair, after the backoff. On the code before, the refused fence
    was the group's latest write and reverted: a was back beside b, both holding a's partitions in the
    coordinator's group (upgrade seed 10 with a retriable error for heartbeats waiting on a repair: consumer_owner
    after a failover whose load fenced a classic member and whose fence Kafka refused)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 4)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    assert (await _heartbeat(env, "a")).error == Errors.NONE and (await _heartbeat(env, "c")).error == Errors.NONE
    await drain()
    partition = await _lose_as_leave_under_bs_join(env, store, None)
    store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)  # the load's fence of a
    await env.coordinator.load([partition])
    await drain()
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    assert set(group.members) == {"b", "c"}
    assert not _tombstones_of(store, "a")
    assert env.coordinator.consumer_groups.repair_owed("g")
    await env.advance(FIRST_RETRY_MS)
    await drain()
    assert _tombstones_of(store, "a") and not env.coordinator.consumer_groups.repair_owed("g")
    assert set(env.coordinator.shard_for("g").consumer_groups["g"].members) == {"b", "c"}
