"""Giving shards up is not one long loop callback (GroupRuntime.shutdown and GroupRuntime.unload, a group at a
time from coordinator/group/residency.py): the groups are unloaded a slice per loop turn, the shards given up first,
and what the unload guarantees still holds: every group gone, every parked request answered NOT_COORDINATOR
although the groups' timers run out while the unload is under way, a write whose outcome comes meanwhile settled
after the unload (at shutdown as the cancel of its task settles it), the store told to stop writing only once the
groups are gone.

Before, `GroupRuntime.shutdown` unloaded every group of every shard in one callback (~490 ms of CPU at 100k
members in `coordinator serve`); a ticker rescheduled every turn here splits the unloads by the turn that made them.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any

import pytest
import uvloop

from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.group.records import Record
from coordinator.group.status import ShardStatus
from coordinator.group.store import InMemoryGroupStore
from coordinator.runtime_health import CallbackTimer
from coordinator.storage.outcome import Outcome
from coordinator.topics import StaticTopics, TopicImage
from protocol.error_codes import Errors
from tests.support.group_harness import Env, commit, errors_of
from tests.support.unload_turns import Turns, group_records, parked_joins

GROUP_SIZE = 3
SLICE = 200  # groups and members unloaded between two turns in these tests (the service's: UNLOAD_SLICE)
MOST_GROUPS_A_TURN = SLICE // (1 + GROUP_SIZE) + 1


async def _shutdown_in_turns() -> None:
    groups = 1_500
    env = Env()
    env.coordinator.unload_slice = SLICE
    await env.load(group_records(groups, env.clock.now_ms()))
    late = [f"group-{g}" for g in (3, 700, groups - 2)]
    joins = await parked_joins(env, late)
    expired: list[tuple[Any, ...]] = []
    env.observer.on_member_session_expired = lambda *args: expired.append(args)  # type: ignore[method-assign]
    # an offset commit whose write is acknowledged while the unload is under way
    gate = env.store.hold_next_write()
    committed = asyncio.ensure_future(env.coordinator.commit_offsets(
        commit("group-1200", 1, "group-1200-member-0", {("orders", 0): 5})))
    await asyncio.sleep(0)
    assert not committed.done()

    def each_turn(turn: int) -> None:
        # every session and rebalance timeout runs out between two slices: the groups not reached yet must not
        # act on it (a rebalance completed, members failed); their unload answers for them
        env.clock.advance(40_000)
        env.timer.advance_clock()
        if turn == 2:
            gate.set()

    turns = Turns(env.observer, each_turn)
    try:
        await env.coordinator.shutdown()
    finally:
        turns.stop()
        await env.timer.close()
    per_turn = [n for n in turns.unloaded if n]
    assert sum(per_turn) == groups, per_turn
    assert max(per_turn) <= MOST_GROUPS_A_TURN, per_turn  # before: every group in one turn
    assert len(per_turn) >= groups * (1 + GROUP_SIZE) // SLICE
    assert len(env.coordinator.groups) == 0
    assert all(shard.status is ShardStatus.STOPPED for shard in env.coordinator.shards)
    assert [join.result().error_code for join in joins] == [Errors.NOT_COORDINATOR] * len(joins)
    assert expired == []
    assert not env.observer.of("failed")
    # its outcome came during the unload: settled after it, as the cancel of its task would have
    assert errors_of(await asyncio.wait_for(committed, 10)) == [Errors.COORDINATOR_NOT_AVAILABLE]


async def test_shutdown_unloads_a_slice_of_groups_per_turn_and_answers_as_in_one() -> None:
    await _shutdown_in_turns()


def test_shutdown_unloads_a_slice_of_groups_per_turn_on_uvloop() -> None:
    uvloop.run(_shutdown_in_turns())


class _OutcomeStore(InMemoryGroupStore):
    """The in-memory store answering as the Kafka store does: an Outcome whose listeners run in the call that
    settles it (coordinator/storage/outcome.py), so the runtime settles the writes without a task of its own."""

    def append(self, partition: int, records: Sequence[Record]) -> Awaitable[None]:
        outcome: Outcome[None] = Outcome(loop=asyncio.get_running_loop())
        appended = asyncio.ensure_future(self._append(partition, list(records)))

        def settle(done: asyncio.Future[None]) -> None:
            if done.cancelled():
                outcome.cancel()
            elif done.exception() is not None:
                outcome.set_exception(done.exception())  # type: ignore[arg-type]
            else:
                outcome.set_result(None)

        appended.add_done_callback(settle)
        return outcome


@pytest.mark.parametrize("store", ["task", "outcome"])
async def test_a_revoked_partition_is_unloaded_a_slice_per_turn_given_up_first(store: str) -> None:
    """GroupRuntime.unload (a partition revoked, lost or fenced): every request meets NOT_COORDINATOR from the
    first slice on, a write acknowledged meanwhile is settled with its outcome once the groups are gone, and the
    store stops writing to the partition only then; with a store whose outcomes settle the writes themselves too."""
    groups = 600
    env = Env(offsets_topic_num_partitions=1, store=_OutcomeStore() if store == "outcome" else None)
    env.coordinator.unload_slice = SLICE
    await env.load(group_records(groups, env.clock.now_ms()))
    [join] = await parked_joins(env, [f"group-{groups - 1}"])
    gate = env.store.hold_next_write()
    committed = asyncio.ensure_future(env.coordinator.commit_offsets(
        commit("group-500", 1, "group-500-member-0", {("orders", 0): 5})))
    await asyncio.sleep(0)
    shard = env.coordinator.shards[0]
    heartbeats: list[tuple[Errors, bool]] = []  # (its answer, the store told to stop) while groups remain
    commit_answer: list[tuple[Errors, int]] = []  # (its answer, groups left when it came)

    def each_turn(turn: int) -> None:
        if shard.groups:
            heartbeats.append((env.coordinator.handle_heartbeat(f"group-{groups - 1}", 1,
                                                                f"group-{groups - 1}-member-1"),
                               0 in env.store.unloaded))
        if turn == 2:
            gate.set()

    committed.add_done_callback(lambda done: commit_answer.append((errors_of(done.result())[0], len(shard.groups))))
    turns = Turns(env.observer, each_turn)
    try:
        await env.coordinator.unload([0])
        await asyncio.wait_for(committed, 10)
    finally:
        turns.stop()
    per_turn = [n for n in turns.unloaded if n]
    assert sum(per_turn) == groups and max(per_turn) <= MOST_GROUPS_A_TURN, per_turn
    assert len(per_turn) >= 3
    assert heartbeats and heartbeats == [(Errors.NOT_COORDINATOR, False)] * len(heartbeats)
    assert commit_answer == [(Errors.NONE, 0)]  # acknowledged meanwhile: answered once every group is gone
    assert join.result().error_code == Errors.NOT_COORDINATOR
    assert 0 in env.store.unloaded and not shard.groups
    await env.close()


async def test_an_unload_cancelled_between_slices_finishes_before_it_raises() -> None:
    """The task unloading is cancelled after its first slice (an instance closing): no shard is left half
    unloaded; the parked request is answered, the held write settled."""
    groups = 300
    env = Env(offsets_topic_num_partitions=1)
    env.coordinator.unload_slice = SLICE
    await env.load(group_records(groups, env.clock.now_ms()))
    [join] = await parked_joins(env, [f"group-{groups - 1}"])
    gate = env.store.hold_next_write()
    committed = asyncio.ensure_future(env.coordinator.commit_offsets(
        commit("group-200", 1, "group-200-member-0", {("orders", 0): 5})))
    await asyncio.sleep(0)
    unloading = asyncio.ensure_future(env.coordinator.unload([0]))
    while len(env.coordinator.shards[0].groups) == groups:
        await asyncio.sleep(0)
    gate.set()
    await asyncio.sleep(0)
    unloading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await unloading
    assert not env.coordinator.shards[0].groups
    assert join.result().error_code == Errors.NOT_COORDINATOR
    assert errors_of(await asyncio.wait_for(committed, 10)) == [Errors.NONE]
    await env.close()


async def test_consumer_protocol_groups_are_unloaded_a_slice_per_turn_too() -> None:
    """KIP-848 groups (coordinator/group/modern) go the same way, after the shard's classic groups: a slice per
    turn, every one gone with its members' timers."""
    groups = 150
    env = Env(offsets_topic_num_partitions=1)
    env.coordinator.unload_slice = SLICE
    service = env.coordinator.consumer_groups
    service.topics = StaticTopics([TopicImage(uuid.UUID(int=0xF00), "orders", 8)])
    for g in range(groups):
        for m in range(GROUP_SIZE):
            answer = await env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
                f"consumer-{g}", f"consumer-{g}-member-{m}", 0, rebalance_timeout_ms=30_000,
                subscribed_topic_names=("orders",), owned=[], client_id="client", client_host="/127.0.0.1"))
            assert answer.error == Errors.NONE
    shard = env.coordinator.shards[0]
    assert len(shard.consumer_groups) == groups
    left: list[int] = []
    loop = asyncio.get_running_loop()

    def tick() -> None:
        left.append(len(shard.consumer_groups))
        ticker[0] = loop.call_soon(tick)

    ticker = [loop.call_soon(tick)]
    try:
        await env.coordinator.shutdown()
        await asyncio.sleep(0)
    finally:
        ticker[0].cancel()
        await env.timer.close()
    counts = [groups, *left]  # before the shutdown, then at each turn after the one it started in
    taken = [before - after for before, after in zip(counts, counts[1:]) if before != after]
    assert sum(taken) == groups and not shard.consumer_groups, left
    assert max(taken) <= MOST_GROUPS_A_TURN and len(taken) >= 3, taken  # before: every one in one turn
    assert not service._timers  # every member's timers cancelled


async def _longest_shutdown_callback(groups: int) -> float:
    env = Env()
    await env.load(group_records(groups, env.clock.now_ms(), size=10))
    callbacks = CallbackTimer(log_above_ms=float("inf"))
    assert callbacks.install(asyncio.get_running_loop()), "asyncio's own loop"
    try:
        await asyncio.sleep(0)  # the shutdown starts in a callback the timer times
        started = time.thread_time()
        await env.coordinator.shutdown()
        spent = time.thread_time() - started
        await asyncio.sleep(0)  # and ends in one
    finally:
        callbacks.uninstall()
        await env.timer.close()
    assert len(env.coordinator.groups) == 0
    print(f"{groups} groups of 10: shutdown {spent * 1000:.1f} ms CPU, longest callback "
          f"{callbacks.longest_s * 1000:.2f} ms ({callbacks.longest})")
    return callbacks.longest_s


async def test_longest_shutdown_callback_does_not_grow_with_the_groups() -> None:
    small_s = await _longest_shutdown_callback(500)
    large_s = await _longest_shutdown_callback(2_500)
    # before: the shutdown's one callback, 5x as long for 5x the groups
    assert large_s < 2 * small_s + 0.002, (small_s, large_s)
