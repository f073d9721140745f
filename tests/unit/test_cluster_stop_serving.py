"""Stopping serving a partition at once without a loop callback that grows with its groups (Ownership._stop_serving:
a partition lost or fenced, the instance stalled, a load stopped). The callback gives the shards up
(GroupRuntime.give_up): from then on their requests get NOT_COORDINATOR, their groups' timers do nothing and their
writes' outcomes are held; the groups, classic and consumer-protocol, are unloaded by a task a slice per loop turn,
each parked request answered NOT_COORDINATOR as the task reaches its group. The transition queued behind (its
`runtime.unload`) and a later load of the partition wait for that task.

Before, the callback unloaded every classic group of the partitions in one loop callback and left the
consumer-protocol groups to the transition queued behind, which runs only after the transitions ahead of it (a load
of other partitions can take minutes)."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from coordinator.cluster.ownership import Ownership
from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.group.records import GroupRecord
from coordinator.group.state import DEAD
from coordinator.group.status import ShardStatus
from coordinator.runtime_health import CallbackTimer
from coordinator.topics import StaticTopics, TopicImage
from protocol.error_codes import Errors
from tests.support.group_harness import Env, commit, errors_of
from tests.support.ownership import STALL_MS, Confirmations, ScriptedMembership, StuckLoads, started_ownership
from tests.support.polling import wait_until
from tests.support.unload_turns import Turns, group_records, parked_joins

GROUP_SIZE = 3
SLICE = 200  # groups and members unloaded between two turns here (the service's: UNLOAD_SLICE)
MOST_GROUPS_A_TURN = SLICE // (1 + GROUP_SIZE) + 1
TOPIC = TopicImage(uuid.UUID(int=0xF00), "orders", 8)


def _ids_on(env: Env, partition: int, prefix: str, count: int) -> list[str]:
    """`count` group ids of `partition`."""
    ids: list[str] = []
    i = 0
    while len(ids) < count:
        if env.coordinator.partition_for(f"{prefix}-{i}") == partition:
            ids.append(f"{prefix}-{i}")
        i += 1
    return ids


async def _instance(env: Env, classic: dict[str, GroupRecord]) -> tuple[Ownership, ScriptedMembership, Confirmations]:
    """The classic groups put in the store, every partition given up (an instance among several, before Kafka
    assigns it anything), and the instance's ownership started."""
    runtime = env.coordinator
    store: Any = env.store
    for group_id, record in classic.items():
        store.groups[group_id] = record
        store.partition_of[group_id] = runtime.partition_for(group_id)
    return await started_ownership(env)


async def _served(env: Env, classic: dict[str, GroupRecord],
                  partitions: set[int]) -> tuple[Ownership, ScriptedMembership, Confirmations]:
    ownership, membership, confirmations = await _instance(env, classic)
    await membership.assign(partitions)
    await asyncio.wait_for(ownership.settled.wait(), 10)
    assert all(ownership.serving(p) for p in partitions)
    return ownership, membership, confirmations


async def _consumer_groups(env: Env, group_ids: list[str]) -> None:
    """KIP-848 groups of GROUP_SIZE members each, joined through ConsumerGroupHeartbeat (their records written)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TOPIC])
    for group_id in group_ids:
        for m in range(GROUP_SIZE):
            answer = await env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
                group_id, f"{group_id}-member-{m}", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("orders",),
                owned=[], client_id="client", client_host="/127.0.0.1"))
            assert answer.error == Errors.NONE


def _stop_serving(how: str, env: Env, ownership: Ownership, membership: ScriptedMembership) -> Any:
    """Partition 0 stops being served as `how` says; the callback's own coroutine, if it has one."""
    if how == "lost":
        return asyncio.ensure_future(membership.on_lost({0}))
    if how == "fenced":
        ownership.on_fenced(0)
        return None
    env.clock.advance(STALL_MS)  # the loop did not run for a third of the session: every partition suspended
    ownership.guard.check()
    assert ownership.guard.suspended
    return None


@pytest.mark.parametrize("how", ["lost", "fenced", "stalled"])
async def test_stopping_serving_unloads_a_slice_per_turn_and_answers_as_if_at_once(how: str) -> None:
    """From the callback on nothing is served; between slices every session and rebalance timeout runs out and no
    group acts on it; the parked JoinGroup is answered NOT_COORDINATOR, a commit acknowledged mid-unload once every
    group is gone, and the consumer-protocol groups go too."""
    groups = 600
    env = Env(offsets_topic_num_partitions=1)
    env.coordinator.unload_slice = SLICE
    ownership, membership, _ = await _served(env, group_records(groups, env.clock.now_ms(), GROUP_SIZE), {0})
    await _consumer_groups(env, [f"consumer-{i}" for i in range(20)])
    shard = env.coordinator.shards[0]
    last = f"group-{groups - 1}"
    [join] = await parked_joins(env, [last])
    gate = env.store.hold_next_write()  # type: ignore[attr-defined]
    committed = asyncio.ensure_future(env.coordinator.commit_offsets(
        commit("group-500", 1, "group-500-member-0", {("orders", 0): 5})))
    await asyncio.sleep(0)
    assert not committed.done()
    commit_answer: list[tuple[Errors, int]] = []  # (its answer, classic groups left when it came)
    committed.add_done_callback(lambda done: commit_answer.append((errors_of(done.result())[0], len(shard.groups))))
    expired: list[tuple[Any, ...]] = []
    env.observer.on_member_session_expired = lambda *args: expired.append(args)  # type: ignore[method-assign]
    heartbeats: list[Errors] = []

    def each_turn(turn: int) -> None:
        env.clock.advance(40_000)  # every session and rebalance timeout runs out between two slices
        env.timer.advance_clock()
        if shard.groups:
            heartbeats.append(env.coordinator.handle_heartbeat(last, 1, f"{last}-member-1"))
        if turn == 1:
            gate.set()  # the commit's write acknowledged after the first slice

    turns = Turns(env.observer, each_turn)
    try:
        stopping = _stop_serving(how, env, ownership, membership)
        if stopping is not None:
            await asyncio.sleep(0)  # the callback's first step
        assert not ownership.serving(0)
        assert env.coordinator.handle_heartbeat(last, 1, f"{last}-member-1") == Errors.NOT_COORDINATOR
        await wait_until(lambda: not shard.groups and not shard.consumer_groups and committed.done(), 10.0,
                         "every group of both kinds gone, the commit answered", 0.01)
        if stopping is not None:
            await asyncio.wait_for(stopping, 10)
    finally:
        turns.stop()
    per_turn = [n for n in turns.unloaded if n]
    assert sum(per_turn) == groups and max(per_turn) <= MOST_GROUPS_A_TURN, per_turn  # before: 600 in the callback
    assert len(per_turn) >= 3
    assert heartbeats and set(heartbeats) == {Errors.NOT_COORDINATOR}
    assert join.result().error_code == Errors.NOT_COORDINATOR
    assert expired == [] and not env.observer.of("failed")
    assert commit_answer == [(Errors.NONE, 0)]
    assert not env.coordinator.consumer_groups._timers  # every consumer-protocol member's timers cancelled
    await ownership.close()
    await env.close()


async def test_a_lost_partition_is_unloaded_while_a_load_holds_the_transitions() -> None:
    """The loss's own transition (which tells the store) waits behind a load of another partition that Kafka's
    transaction coordinator holds; the lost partition's groups of both kinds go meanwhile, its parked JoinGroup
    answered."""
    env = Env(offsets_topic_num_partitions=2)
    classic = _ids_on(env, 0, "group", 50)
    ownership, membership, _ = await _served(env, group_records(classic, env.clock.now_ms(), GROUP_SIZE), {0})
    await _consumer_groups(env, _ids_on(env, 0, "consumer", 10))
    shard = env.coordinator.shards[0]
    [join] = await parked_joins(env, [classic[-1]])
    loads = StuckLoads(env)
    await membership.assign({1})
    await wait_until(lambda: loads.started == [{1}], 5.0, "loads.started == [{1}]", 0.01)
    losing = asyncio.ensure_future(membership.on_lost({0}))
    await wait_until(lambda: not shard.groups and not shard.consumer_groups and join.done(), 5.0,
                     "both kinds of groups of the lost partition gone", 0.01)
    assert not losing.done() and 0 not in env.store.unloaded  # type: ignore[attr-defined]
    assert join.result().error_code == Errors.NOT_COORDINATOR
    loads.gate.set()
    await asyncio.wait_for(losing, 5)
    assert 0 in env.store.unloaded and ownership.serving(1)  # type: ignore[attr-defined]
    await ownership.close()
    await env.close()


async def test_a_stopped_load_leaves_no_group_of_either_kind() -> None:
    """A load stopped (its partitions all revoked) after it made partition 0's consumer-protocol groups and while it
    makes partition 1's classic groups: none of either kind stays in the shards, which serve nothing."""
    env = Env(offsets_topic_num_partitions=2)
    env.coordinator.load_slice = 10  # the load yields every 10 classic groups
    consumer = _ids_on(env, 0, "consumer", 10)
    await _consumer_groups(env, consumer)  # in the store, partition 0
    ownership, membership, _ = await _instance(env, group_records(_ids_on(env, 1, "group", 100), env.clock.now_ms()))
    runtime = env.coordinator
    await membership.assign({0, 1})
    for _ in range(10_000):  # the turn after one of the load's yields within partition 1
        if runtime.shards[0].consumer_groups and runtime.shards[1].groups:
            break
        await asyncio.sleep(0)
    assert len(runtime.shards[0].consumer_groups) == len(consumer) and runtime.shards[1].status is ShardStatus.LOADING
    await asyncio.wait_for(membership.on_revoked({0, 1}), 5)
    assert ownership.loads == 0
    for shard in runtime.shards:
        assert shard.status is ShardStatus.UNOWNED and not shard.groups and not shard.consumer_groups
    assert {0, 1} <= env.store.unloaded  # type: ignore[attr-defined]
    await ownership.close()
    await env.close()


async def test_a_partition_taken_back_is_read_again_only_once_its_old_groups_are_gone() -> None:
    """A fence that Kafka's assignment undoes: the partition is read again and served, the load starting only once
    the unload of the fenced groups, a slice per turn, is over."""
    groups = 600
    env = Env(offsets_topic_num_partitions=1)
    env.coordinator.unload_slice = SLICE
    ownership, _, confirmations = await _served(env, group_records(groups, env.clock.now_ms(), GROUP_SIZE), {0})
    shard = env.coordinator.shards[0]
    before = list(shard.groups.values())
    at_load: list[tuple[int, int]] = []  # (groups in the shard, old groups not unloaded) when the read starts
    load = env.store.load

    async def recorded(partitions: Any) -> Any:
        at_load.append((len(shard.groups), sum(group.state is not DEAD for group in before)))
        return await load(partitions)

    env.store.load = recorded  # type: ignore[method-assign]
    confirmations.answer = {0}  # Kafka still assigns it to us
    ownership.on_fenced(0)
    await wait_until(lambda: ownership.loads == 2 and ownership.serving(0), 10.0, "read again and served", 0.01)
    assert at_load == [(0, 0)]
    assert len(shard.groups) == groups and not any(group in before for group in shard.groups.values())
    await ownership.close()
    await env.close()


async def test_the_runtime_loads_a_partition_given_up_only_once_its_groups_are_gone() -> None:
    groups = 600
    env = Env(offsets_topic_num_partitions=1)
    env.coordinator.unload_slice = SLICE
    await env.load(group_records(groups, env.clock.now_ms(), GROUP_SIZE))
    runtime = env.coordinator
    before = list(runtime.shards[0].groups.values())
    runtime.give_up([0])
    assert runtime.shards[0].status is ShardStatus.UNOWNED and len(runtime.shards[0].groups) == groups
    loaded = await runtime.load([0])
    assert loaded == groups and all(group.state is DEAD for group in before)
    assert runtime.shards[0].status is ShardStatus.ACTIVE
    assert not any(group in before for group in runtime.shards[0].groups.values())
    await env.close()


async def _longest_stop_serving_callback(groups: int) -> float:
    env = Env(offsets_topic_num_partitions=1)
    ownership, membership, _ = await _served(env, group_records(groups, env.clock.now_ms(), size=10), {0})
    callbacks = CallbackTimer(log_above_ms=float("inf"))
    assert callbacks.install(asyncio.get_running_loop()), "asyncio's own loop"
    try:
        await asyncio.sleep(0)  # the loss comes in a callback the timer times
        started = time.thread_time()
        await membership.on_lost({0})  # returns once its transition is over: every group gone
        spent = time.thread_time() - started
        await asyncio.sleep(0)
    finally:
        callbacks.uninstall()
    assert not env.coordinator.shards[0].groups
    print(f"{groups} groups of 10 lost: {spent * 1000:.1f} ms CPU, longest callback "
          f"{callbacks.longest_s * 1000:.2f} ms ({callbacks.longest})")
    await ownership.close()
    await env.close()
    return callbacks.longest_s


async def test_longest_callback_of_a_loss_does_not_grow_with_the_groups() -> None:
    small_s = await _longest_stop_serving_callback(500)
    large_s = await _longest_stop_serving_callback(2_500)
    # before: the callback that learnt the loss unloaded every group, 5x as long for 5x the groups
    assert large_s < 2 * small_s + 0.002, (small_s, large_s)
