"""The shard runtime's seams (coordinator/group/runtime.py): routing by Kafka's partitioner, per-partition
status, load and unload of partitions, responses only after the records are acknowledged."""
from __future__ import annotations

import asyncio

from coordinator.group.api import DeleteGroupsRequest, ListGroupsRequest
from protocol.error_codes import Errors
from coordinator.group.partitioner import partition_cache, partition_for
from coordinator.group.status import ShardStatus
from coordinator.group.state import GroupState
from tests.support.group_harness import Env, commit, drain, env, errors_of, fetch, form_group  # noqa: F401


def other_partition_group(env: Env, group_id: str) -> str:
    """A group id whose partition differs from `group_id`'s."""
    runtime = env.coordinator
    return next(f"other-{i}" for i in range(1000)
                if runtime.partition_for(f"other-{i}") != runtime.partition_for(group_id))


async def test_groups_live_in_the_shard_of_their_kafka_partition(env: Env) -> None:
    a = env.client("a")
    await form_group(env, a)
    runtime = env.coordinator
    partition = partition_for("g", env.config.offsets_topic_num_partitions)
    assert runtime.shard_for("g").partition == partition and "g" in runtime.shards[partition].groups
    assert [p for p, shard in enumerate(runtime.shards) if shard.groups] == [partition]
    await drain()
    assert env.store.partition_of["g"] == partition  # the group record went to that partition


async def test_a_heartbeat_finds_its_shard_whether_the_partition_cache_keeps_its_group_or_not(env: Env) -> None:
    """The heartbeat reads the cache's kept ids itself (no call); kept or not, or the cache started over, it
    reaches the group's own shard (a wrong shard would answer UNKNOWN_MEMBER_ID and count nothing)."""
    a = env.client("a")
    await form_group(env, a)
    runtime = env.coordinator
    partition = partition_for("g", env.config.offsets_topic_num_partitions)
    shard = runtime.shards[partition]
    kept = partition_cache(env.config.offsets_topic_num_partitions).kept
    other = other_partition_group(env, "g")
    for keeps in (False, True, False):
        kept.pop("g", None)
        kept[other] = partition_for(other, env.config.offsets_topic_num_partitions)
        if keeps:  # as the cache keeps an id clients come back to
            kept["g"] = partition
        counted = shard.heartbeat_count
        assert await a.heartbeat() == Errors.NONE
        assert shard.heartbeat_count == counted + 1
        assert runtime.shard_for("g") is shard and runtime.shard_for(other) is not shard
    kept.clear()  # the cache starting over, in place


async def test_a_loading_partition_does_not_stop_the_others(env: Env) -> None:
    other = other_partition_group(env, "g")
    runtime = env.coordinator
    runtime.begin_loading([runtime.partition_for("g")])
    assert errors_of(await runtime.commit_offsets(commit("g", -1, "", {("t", 0): 1}))) == [
        Errors.COORDINATOR_LOAD_IN_PROGRESS]
    assert errors_of(await runtime.commit_offsets(commit(other, -1, "", {("t", 0): 1}))) == [Errors.NONE]
    assert (await runtime.list_groups(ListGroupsRequest())).error_code == Errors.COORDINATOR_LOAD_IN_PROGRESS
    await runtime.load([runtime.partition_for("g")])
    assert runtime.shard_for("g").status is ShardStatus.ACTIVE and not runtime.is_loading


async def test_unload_answers_parked_requests_and_refuses_the_partition_until_loaded_again(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    assert errors_of(await env.coordinator.commit_offsets(
        commit("g", a.generation, a.member_id, {("t", 0): 7}))) == [Errors.NONE]
    leader = a if a.is_leader else b
    await leader.start_join()  # parked: the leader's rejoin starts a rebalance
    partition = env.coordinator.partition_for("g")
    await env.coordinator.unload([partition])
    await drain()
    assert leader.take_join().error_code == Errors.NOT_COORDINATOR
    assert env.group() is None and env.coordinator.shards[partition].status is ShardStatus.UNOWNED
    assert await a.heartbeat() == Errors.NOT_COORDINATOR
    assert errors_of(await env.coordinator.commit_offsets(commit("g", -1, "", {("t", 0): 1}))) == [
        Errors.NOT_COORDINATOR]
    assert partition in env.store.unloaded  # the store refuses writes to it meanwhile

    await env.coordinator.load([partition])  # taken back: the group comes back from the store, Stable
    assert env.state() is GroupState.STABLE and env.group().generation_id == a.generation
    assert await fetch(env, "g", {"t": [0]}) == {("t", 0): (7, "", Errors.NONE)}


async def test_delete_groups_answers_only_once_the_tombstones_are_acknowledged(env: Env) -> None:
    assert errors_of(await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1}))) == [Errors.NONE]
    gate = env.store.hold_next_write()
    deleting = asyncio.ensure_future(env.coordinator.delete_groups(DeleteGroupsRequest(["s"])))
    await drain()
    assert not deleting.done() and env.group("s") is None  # gone from memory, not yet answered
    gate.set()
    response = await deleting
    assert [(r.group_id, r.error_code) for r in response.results] == [("s", Errors.NONE)]
    assert "s" not in env.store.offsets


def test_a_shards_futures_belong_to_the_running_loop_each_time() -> None:
    """GroupShard.new_future keeps the loop it found (no getpid() per JoinGroup/SyncGroup): still a future of the
    loop running now, after the first loop stopped and another one runs, and no future without a running loop."""
    from coordinator.config import CoordinatorConfig
    from coordinator.group.runtime import GroupRuntime
    from coordinator.group.store import InMemoryGroupStore
    from coordinator.timer import SystemTimer

    runtime = GroupRuntime(CoordinatorConfig(), SystemTimer(), InMemoryGroupStore())
    shard = runtime.shards[0]

    async def made_on_this_loop() -> bool:
        first, second = shard.new_future(), shard.new_future()
        loop = asyncio.get_running_loop()
        return first.get_loop() is loop and second.get_loop() is loop

    loops = [asyncio.new_event_loop() for _ in range(2)]
    try:
        for loop in loops:
            assert loop.run_until_complete(made_on_this_loop())
    finally:
        for loop in loops:
            loop.close()
    try:
        shard.new_future()
    except RuntimeError:
        pass
    else:
        raise AssertionError("a future made with no loop running")
