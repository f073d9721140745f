"""A consumer group's write that fails goes back to the group as it was before (GroupUndo: the earlier values of
what the write touched, not a copy of the group): every field, index and count equal to a full copy taken before
the write, for each kind of change. Through the runtime on a manual clock and the in-memory store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordinator.group.errors import kafka4_append_error
from coordinator.group.modern.group import ConsumerGroup
from protocol.error_codes import Errors
from tests.support.consumer_group_env import Env


@pytest.fixture
async def env():  # type: ignore[no-untyped-def]
    environment = Env()
    yield environment
    await environment.close()


def state(group: ConsumerGroup) -> dict[str, Any]:
    return {name: getattr(group, name) for name in (
        "group_epoch", "metadata_hash", "assignment_epoch", "deleted", "members", "static_members", "targets",
        "_partition_epochs", "_subscriptions", "_regex_subscribers", "resolved_regexes")}


async def failing(env: Env, *heartbeats: Any) -> None:
    """The heartbeats, answered together, their write refused: the group is as before them."""
    before = state(env.group().snapshot())
    env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    answers = await asyncio.gather(*heartbeats)
    assert {a.error for a in answers} == {kafka4_append_error(Errors.NOT_ENOUGH_REPLICAS)}
    assert state(env.group()) == before


async def test_each_kind_of_failed_write_leaves_the_group_as_a_full_copy_had_it(env: Env) -> None:
    def beat(member_id: str, **fields: Any):  # type: ignore[no-untyped-def]
        member = env.group().members[member_id]  # what the client owns: what it was last told
        return env.heartbeat(member_id, member.member_epoch, owned=member.assigned, **fields)

    await env.heartbeat("a", 0, instance_id="ia")
    await env.heartbeat("b", 0, topics=("foo", "bar"))
    await failing(env, env.heartbeat("c", 0), env.heartbeat("d", 0, topics=("bar",)))  # joins, one batch
    for _ in range(2):  # a told to revoke, then revoking
        await failing(env, beat("a", instance_id="ia"))
        await beat("a", instance_id="ia")
    assert env.group().members["b"].state.value == 2  # waiting for what a released
    await failing(env, beat("b"))  # b gets what a released
    await beat("b")
    assert env.group().state.value == "Stable"
    await failing(env, env.heartbeat("b", -1))  # a leave
    await failing(env, beat("a", topics=("foo", "bar"), instance_id="ia"))  # a subscription change
    await env.heartbeat("a", -2, instance_id="ia")  # a static member leaves for now ...
    target = env.group().target_of("a")
    await failing(env, env.heartbeat("a2", 0, instance_id="ia"))  # ... and another takes its place
    replaced = await env.heartbeat("a2", 0, instance_id="ia")
    assert replaced.error is Errors.NONE and "a" not in env.group().members
    assert env.group().target_of("a2") == target  # the successor inherits the target


async def test_a_failed_write_that_emptied_the_group_brings_it_back(env: Env) -> None:
    await env.heartbeat("a", 0)
    group = env.group()
    before = state(group.snapshot())
    env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    left = await env.heartbeat("a", -1)
    assert left.error is kafka4_append_error(Errors.NOT_ENOUGH_REPLICAS)
    assert env.group() is group and state(group) == before
