"""OffsetDelete (api key 47) against Kafka 3.9's handleDeleteOffsets: group errors, unknown and Dead groups,
Empty groups (offsets deleted, a group left without offsets retired), non-empty consumer groups (subscribed
topics kept with GROUP_SUBSCRIBED_TO_TOPIC) and non-empty groups of other protocol types (NON_EMPTY_GROUP)."""
from __future__ import annotations

from coordinator.group.status import ShardStatus
from coordinator.group.api import OffsetDeleteRequest, OffsetDeleteRequestTopic, OffsetDeleteResponse
from protocol.error_codes import Errors
from coordinator.group.state import GroupState
from tests.support.group_harness import Env, advance_until_joined, commit, drain, env, fetch, form_group  # noqa: F401


def delete_request(group_id: str, partitions: list[tuple[str, int]]) -> OffsetDeleteRequest:
    topics: dict[str, list[int]] = {}
    for topic, partition in partitions:
        topics.setdefault(topic, []).append(partition)
    return OffsetDeleteRequest(group_id, [OffsetDeleteRequestTopic(t, ps) for t, ps in topics.items()])


async def delete(env: Env, group_id: str, partitions: list[tuple[str, int]]) -> OffsetDeleteResponse:
    return await env.coordinator.delete_offsets(delete_request(group_id, partitions))


def partition_errors(resp: OffsetDeleteResponse) -> dict[tuple[str, int], Errors]:
    assert resp.error_code == Errors.NONE, resp
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


async def simple_group(env: Env, group_id: str, partitions: list[tuple[str, int]]) -> None:
    """A group used by a "simple" consumer for offsets only: Empty, no generation."""
    resp = await env.coordinator.commit_offsets(commit(group_id, -1, "", dict.fromkeys(partitions, 10)))
    assert all(p.error_code == Errors.NONE for t in resp.topics for p in t.partitions)


async def test_group_status_errors_answer_without_partitions(env: Env) -> None:
    await simple_group(env, "s", [("t", 0)])
    resp = await delete(env, "", [("t", 0)])
    assert (resp.error_code, resp.topics) == (Errors.INVALID_GROUP_ID, [])  # OffsetDelete needs a non-empty id
    env.set_status(ShardStatus.UNOWNED, "s")
    assert (await delete(env, "s", [("t", 0)])).error_code == Errors.NOT_COORDINATOR
    env.set_status(ShardStatus.STOPPED)
    assert (await delete(env, "s", [("t", 0)])).error_code == Errors.COORDINATOR_NOT_AVAILABLE
    env.set_status(ShardStatus.ACTIVE)
    env.coordinator.begin_loading()
    resp = await delete(env, "s", [("t", 0)])
    assert (resp.error_code, resp.topics) == (Errors.COORDINATOR_LOAD_IN_PROGRESS, [])
    env.set_status(ShardStatus.ACTIVE)


async def test_unknown_and_dead_groups_are_not_found(env: Env) -> None:
    resp = await delete(env, "nobody", [("t", 0)])
    assert (resp.error_code, resp.topics) == (Errors.GROUP_ID_NOT_FOUND, [])
    assert env.group("nobody") is None  # no group is created by asking
    await simple_group(env, "s", [("t", 0)])
    env.group("s").transition_to(GroupState.DEAD, env.clock.now_ms())  # Dead but not yet out of the cache
    assert (await delete(env, "s", [("t", 0)])).error_code == Errors.GROUP_ID_NOT_FOUND
    assert ("t", 0) in env.group("s").offsets and ("t", 0) in env.store.offsets["s"]


async def test_empty_group_deletes_the_listed_partitions_and_keeps_the_rest(env: Env) -> None:
    await simple_group(env, "s", [("t", 0), ("t", 1), ("u", 0)])
    resp = await delete(env, "s", [("t", 0), ("u", 0), ("u", 0), ("never", 3)])
    # Every listed partition is answered once with NONE, whether or not it had an offset.
    assert partition_errors(resp) == {("t", 0): Errors.NONE, ("u", 0): Errors.NONE, ("never", 3): Errors.NONE}
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in resp.topics] == [
        ("t", [0]), ("u", [0]), ("never", [3])]
    assert set(env.group("s").offsets) == {("t", 1)} and set(env.store.offsets["s"]) == {("t", 1)}
    assert env.state("s") is GroupState.EMPTY
    assert await fetch(env, "s", {"t": [0, 1]}) == {("t", 0): (-1, "", Errors.NONE), ("t", 1): (10, "", Errors.NONE)}


async def test_empty_group_left_without_offsets_becomes_dead_and_is_removed(env: Env) -> None:
    a = env.client("a", topics=("t",))
    await form_group(env, a)
    await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id, {("t", 0): 1, ("t", 1): 2}))
    assert await a.leave() == Errors.NONE
    await drain()
    assert env.state() is GroupState.EMPTY and "g" in env.store.groups
    # Empty: the group no longer consumes anything, so even its subscribed topic's offsets go.
    assert partition_errors(await delete(env, "g", [("t", 0), ("t", 1)])) == {
        ("t", 0): Errors.NONE, ("t", 1): Errors.NONE}
    assert env.group() is None
    assert "g" not in env.store.groups and "g" not in env.store.offsets  # offsets and group tombstoned
    assert (await delete(env, "g", [("t", 0)])).error_code == Errors.GROUP_ID_NOT_FOUND


async def test_stable_consumer_group_keeps_offsets_of_subscribed_topics(env: Env) -> None:
    a = env.client("a", topics=("t",))
    await form_group(env, a)
    await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id, {("t", 0): 1, ("u", 0): 2}))
    resp = await delete(env, "g", [("t", 0), ("u", 0)])
    assert partition_errors(resp) == {("t", 0): Errors.GROUP_SUBSCRIBED_TO_TOPIC, ("u", 0): Errors.NONE}
    assert set(env.group().offsets) == {("t", 0)} and set(env.store.offsets["g"]) == {("t", 0)}
    assert env.state() is GroupState.STABLE and await a.heartbeat() == Errors.NONE


async def test_rebalancing_consumer_group_keeps_offsets_of_subscribed_topics(env: Env) -> None:
    a, b = env.client("a", topics=("t",)), env.client("b", topics=("v",))
    await form_group(env, a)
    await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id,
                                                {("t", 0): 1, ("u", 0): 2, ("v", 0): 3, ("w", 0): 4}))
    await b.start_join()
    assert env.state() is GroupState.PREPARING_REBALANCE
    # Subscriptions are those of the generation in force: b's "v" is not one of them yet.
    assert partition_errors(await delete(env, "g", [("t", 0), ("u", 0)])) == {
        ("t", 0): Errors.GROUP_SUBSCRIBED_TO_TOPIC, ("u", 0): Errors.NONE}
    await a.start_join()
    await advance_until_joined(env, a, b)
    a.take_join(), b.take_join()
    assert env.state() is GroupState.COMPLETING_REBALANCE
    assert partition_errors(await delete(env, "g", [("v", 0), ("w", 0)])) == {
        ("v", 0): Errors.GROUP_SUBSCRIBED_TO_TOPIC, ("w", 0): Errors.NONE}
    assert set(env.group().offsets) == {("t", 0), ("v", 0)}
    assert set(env.store.offsets["g"]) == {("t", 0), ("v", 0)}


async def test_unknown_subscriptions_count_as_subscribed_to_every_topic(env: Env) -> None:
    a = env.client("a", protocols=[("range", b"\xff\xff not a subscription")])
    await form_group(env, a)
    await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id, {("t", 0): 1, ("u", 0): 2}))
    assert partition_errors(await delete(env, "g", [("t", 0), ("u", 0)])) == {
        ("t", 0): Errors.GROUP_SUBSCRIBED_TO_TOPIC, ("u", 0): Errors.GROUP_SUBSCRIBED_TO_TOPIC}
    assert set(env.group().offsets) == {("t", 0), ("u", 0)}


async def test_non_empty_group_of_another_protocol_type_is_non_empty_group(env: Env) -> None:
    await simple_group(env, "g", [("t", 0)])  # offsets first: then a Connect worker joins the group
    worker = env.client("w")
    await worker.start_join(protocol_type="connect")
    await advance_until_joined(env, worker)
    assert worker.take_join().error_code == Errors.NONE
    resp = await delete(env, "g", [("t", 0), ("u", 0)])
    assert (resp.error_code, resp.topics) == (Errors.NON_EMPTY_GROUP, [])
    assert set(env.group().offsets) == {("t", 0)} and set(env.store.offsets["g"]) == {("t", 0)}
