"""A consumer group's target to compute tells the store a write of its partition comes (`GroupShard.expect_write`,
the runtime's `GroupStore.expect_append`): when the heartbeat that needs the target is read, before the target's
computation and its write, so a transactional writer registers the partition with Kafka's transaction coordinator
meanwhile (transactions.py `open_ahead`). A heartbeat that computes no target (an acknowledgement, a steady one)
tells it nothing. Through the runtime on a manual clock and the in-memory store."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.consumer_group_env import FOO, GROUP, Env


@pytest.fixture
async def env():  # type: ignore[no-untyped-def]
    environment = Env(offsets_topic_num_partitions=1)
    yield environment
    await environment.close()


def expecting(env: Env) -> list[int]:
    """The store writes made before each time the shard said a write comes (the runtime's seam, recorded)."""
    told: list[int] = []
    shard = env.runtime.shard_for(GROUP)
    shard.expect_write = lambda: told.append(len(env.store.writes))
    return told


async def test_a_join_tells_the_store_before_its_target_is_computed_and_written(env: Env) -> None:
    told = expecting(env)
    joined = asyncio.ensure_future(env.heartbeat("a", 0))
    await asyncio.sleep(0)  # the join read: its target is computed in a later loop turn
    assert told == [0] and env.store.writes == []
    first = await joined
    assert first.member_epoch == 1 and len(env.store.writes) == 1

    second = await env.heartbeat("b", 0)  # the next join: told again, before its write
    assert told == [0, 1] and len(env.store.writes) == 2 and second.member_epoch == 2


async def test_a_heartbeat_with_no_target_to_compute_tells_nothing(env: Env) -> None:
    told = expecting(env)
    first = await env.heartbeat("a", 0)
    assert told == [0]
    owned = {FOO: tuple(sorted(first.assignment[FOO]))} if first.assignment else {}
    await env.heartbeat("a", first.member_epoch, owned=owned)  # the acknowledgement
    await env.heartbeat("a", first.member_epoch)  # a steady one
    assert told == [0]
