"""Ownership's timing and ordering logic (coordinator/cluster/ownership.py) on a manual clock: the zombie guard's
deadline, suspension and confirmation, and what assign/revoke/lost/fenced do to the shards. Kafka's side (the
membership consumer, DescribeGroups) is exercised against a real broker in
tests/integration/test_instances_ownership.py; here the membership's callbacks are called by the test."""
from __future__ import annotations

import asyncio
import gc

import pytest

from coordinator.cluster.ownership import Ownership, ZombieGuard
from coordinator.group.api import OffsetFetchRequest, OffsetFetchRequestTopic
from coordinator.group.status import ShardStatus
from coordinator.timer import ManualClock
from protocol.error_codes import Errors
from tests.support.group_harness import Env, drain, form_group
from tests.support.ownership import (SESSION_MS, STALL_MS, Confirmations, ScriptedMembership, StuckLoads,
                                     formed_then_owned, heartbeat)
from tests.support.polling import wait_until


def test_guard_deadline_moves_with_ticks_and_a_late_request_finds_the_stall() -> None:
    clock = ManualClock(1_000)
    stalls: list[int] = []
    guard = ZombieGuard(clock, STALL_MS, stalls.append)
    for _ in range(10):  # ticking keeps it alive however long it runs
        clock.advance(STALL_MS // 4)
        guard.tick()
        guard.check()
    assert not guard.suspended and stalls == []
    clock.advance(STALL_MS - 1)
    guard.check()
    assert not guard.suspended  # one millisecond short of the threshold
    clock.advance(1)
    guard.check()  # the loop did not tick for STALL_MS: the first request after it sees the deadline passed
    assert guard.suspended and guard.stalls == 1 and stalls == [STALL_MS]
    guard.tick()
    guard.check()
    assert guard.suspended and guard.stalls == 1  # stays out of service until resumed, whatever ticks
    guard.resume()
    guard.check()
    assert not guard.suspended


def test_guard_tick_itself_detects_a_stall_when_no_request_comes() -> None:
    clock = ManualClock(0)
    guard = ZombieGuard(clock, STALL_MS, lambda _: None)
    clock.advance(STALL_MS + 500)
    guard.tick()
    assert guard.suspended and guard.stalls == 1


def test_a_stall_while_suspended_counts_again() -> None:
    clock = ManualClock(0)
    guard = ZombieGuard(clock, STALL_MS, lambda _: None)
    clock.advance(STALL_MS)
    guard.check()
    guard.tick()
    clock.advance(STALL_MS)  # paused again while confirming: a confirmation started before is stale
    guard.check()
    assert guard.stalls == 2


@pytest.fixture
async def cluster():  # type: ignore[no-untyped-def]
    env = Env()
    yield env
    await env.close()


async def test_assigned_partition_is_loaded_and_served_others_answer_not_coordinator(cluster: Env) -> None:
    ownership, _, _, partition = await formed_then_owned(cluster)
    assert ownership.owned == {partition} and ownership.serving(partition)
    assert heartbeat(ownership, cluster) == Errors.NONE  # the group came back from the store, Stable
    other = next(p for p in range(cluster.coordinator.num_partitions) if p != partition)
    assert cluster.coordinator.shards[other].status is ShardStatus.UNOWNED
    await ownership.close()


async def test_revoke_unloads_before_returning_and_the_store_stops_writing(cluster: Env) -> None:
    ownership, membership, _, partition = await formed_then_owned(cluster)
    await membership.on_revoked({partition})  # returns only once unloaded: Kafka may hand it on after this
    assert not ownership.serving(partition) and partition in cluster.store.unloaded
    assert heartbeat(ownership, cluster) == Errors.NOT_COORDINATOR
    assert cluster.group("g") is None
    await ownership.close()


async def test_stall_suspends_service_until_kafka_confirms_the_assignment(cluster: Env) -> None:
    ownership, _, confirmations, partition = await formed_then_owned(cluster)
    cluster.clock.advance(STALL_MS)  # the loop did not run for a third of the session (SIGSTOP, VM freeze)
    assert heartbeat(ownership, cluster) == Errors.NOT_COORDINATOR
    fetched = await ownership.service.fetch_offsets(OffsetFetchRequest("g", [OffsetFetchRequestTopic("t", [0])]))
    assert fetched.error_code == Errors.NOT_COORDINATOR
    # rebalancing (None): asked again
    await wait_until(lambda: confirmations.calls >= 2, 5.0, "confirmations.calls >= 2", 0.01)
    assert heartbeat(ownership, cluster) == Errors.NOT_COORDINATOR
    assert cluster.group("g") is None  # dropped at once: none of its timers runs while it may be another's
    confirmations.answer = {partition}
    await wait_until(lambda: ownership.serving(partition), 5.0, "ownership.serving(partition)", 0.01)
    assert not ownership.guard.suspended and ownership.loads == 2  # read again, then served
    assert heartbeat(ownership, cluster) == Errors.NONE  # the same group and generation, from the state topic
    assert ownership.owned == {partition}
    await ownership.close()


async def test_stall_then_kafka_says_the_partition_moved_unloads_it(cluster: Env) -> None:
    ownership, _, confirmations, partition = await formed_then_owned(cluster)
    cluster.clock.advance(STALL_MS + 10)
    assert heartbeat(ownership, cluster) == Errors.NOT_COORDINATOR
    confirmations.answer = set()  # our member id holds nothing (or is gone): another instance owns it now
    await wait_until(lambda: partition in cluster.store.unloaded, 5.0, "partition in cluster.store.unloaded", 0.01)
    assert ownership.owned == set() and cluster.group("g") is None
    assert not ownership.guard.suspended and heartbeat(ownership, cluster) == Errors.NOT_COORDINATOR
    await ownership.close()


async def test_fenced_write_stops_serving_the_partition_at_once(cluster: Env) -> None:
    ownership, _, confirmations, partition = await formed_then_owned(cluster)
    ownership.on_fenced(partition)
    assert heartbeat(ownership, cluster) == Errors.NOT_COORDINATOR  # before the unload has even run
    await wait_until(lambda: partition in cluster.store.unloaded, 5.0, "partition in cluster.store.unloaded", 0.01)
    # rebalancing (None): Kafka's word awaited, not served meanwhile
    await wait_until(lambda: confirmations.calls >= 2, 5.0, "confirmations.calls >= 2", 0.01)
    assert heartbeat(ownership, cluster) == Errors.NOT_COORDINATOR and cluster.group("g") is None
    confirmations.answer = set()  # another instance owns it now: given up
    await wait_until(lambda: ownership.owned == set(), 5.0, "ownership.owned == set()", 0.01)
    assert ownership.loads == 1 and heartbeat(ownership, cluster) == Errors.NOT_COORDINATOR
    await ownership.close()


async def test_fenced_partition_kafka_still_says_is_ours_is_taken_back(cluster: Env) -> None:
    """The fence came from the other side (a previous owner's producer initialised again after an outage, or a
    fatal producer error): Kafka's assignment wins, the partition is fenced again by us, read again and served."""
    ownership, _, confirmations, partition = await formed_then_owned(cluster)
    confirmations.answer = {partition}
    ownership.on_fenced(partition)
    ownership.on_fenced(partition)  # a second failed write of the same fence: one confirmation, one reload
    assert heartbeat(ownership, cluster) == Errors.NOT_COORDINATOR
    await wait_until(lambda: ownership.serving(partition), 5.0, "ownership.serving(partition)", 0.01)
    assert ownership.loads == 2 and ownership.owned == {partition}
    assert heartbeat(ownership, cluster) == Errors.NONE  # the same group and generation, from the state topic
    await ownership.close()


async def test_fenced_partition_revoked_while_confirming_is_not_taken_back(cluster: Env) -> None:
    ownership, membership, confirmations, partition = await formed_then_owned(cluster)
    ownership.on_fenced(partition)
    await wait_until(lambda: confirmations.calls >= 1, 5.0, "confirmations.calls >= 1", 0.01)
    await membership.on_revoked({partition})
    confirmations.answer = {partition}  # a description from before the revoke would still list it
    await wait_until(lambda: ownership._confirming_fences is not None and ownership._confirming_fences.done(), 5.0,
                     "ownership._confirming_fences is not None and ownership._confirming_fences.done()", 0.01)
    assert ownership.owned == set() and ownership.loads == 1 and not ownership.serving(partition)
    await ownership.close()


async def test_partition_lost_while_loading_is_never_served(cluster: Env) -> None:
    runtime = cluster.coordinator
    await runtime.unload(range(runtime.num_partitions))
    ownership = Ownership(runtime, instance_id="i1", group_id="g.coordinators", topic="state",
                          session_timeout_ms=SESSION_MS, clock=cluster.clock, gc_after_moves=False,
                          guard_ticks=False)
    membership = ScriptedMembership(ownership.on_assigned, ownership.on_revoked, ownership.on_lost)
    gate = asyncio.Event()
    load = cluster.store.load

    async def slow_load(partitions):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await load(partitions)

    cluster.store.load = slow_load  # type: ignore[method-assign]
    await ownership.start(membership, Confirmations())  # type: ignore[arg-type]
    await membership.assign({0})
    await wait_until(lambda: runtime.shards[0].status is ShardStatus.LOADING, 5.0,
                     "runtime.shards[0].status is ShardStatus.LOADING", 0.01)
    # session expired meanwhile: another owner already; the load is stopped (its producer would fence that owner),
    # so the loss is processed at once
    await asyncio.wait_for(membership.on_lost({0}), 5)
    assert runtime.shards[0].status is ShardStatus.UNOWNED and ownership.owned == set()
    gate.set()
    await drain()
    assert runtime.shards[0].status is ShardStatus.UNOWNED and ownership.loads == 0
    await ownership.close()


async def _owned_nothing_yet(env: Env) -> tuple[Ownership, ScriptedMembership]:
    runtime = env.coordinator
    await runtime.unload(range(runtime.num_partitions))
    ownership = Ownership(runtime, instance_id="i1", group_id="g.coordinators", topic="state",
                          session_timeout_ms=SESSION_MS, clock=env.clock, gc_after_moves=False, guard_ticks=False)
    membership = ScriptedMembership(ownership.on_assigned, ownership.on_revoked, ownership.on_lost)
    await ownership.start(membership, Confirmations())  # type: ignore[arg-type]
    return ownership, membership


async def test_close_stops_the_load_under_way_and_loads_nothing_more(cluster: Env) -> None:
    """A SIGTERM while a load waits for its producers' initialisation: the close does not wait for it (the
    membership consumer stops heartbeating as its close begins, so a long unload could outlast the session and
    the partitions move before we leave; the load's producers would then fence their new owner's)."""
    runtime = cluster.coordinator
    loads = StuckLoads(cluster)
    ownership, membership = await _owned_nothing_yet(cluster)
    await membership.assign({0})
    await membership.assign({1})  # queued behind the first
    await wait_until(lambda: loads.started == [{0}], 5.0, "loads.started == [{0}]", 0.01)
    await asyncio.wait_for(ownership.close(), 5)  # the load is never let through
    assert loads.stopped == [{0}] and loads.started == [{0}]  # stopped, and the queued one never started
    assert ownership.owned == set() and ownership.loads == 0
    assert all(shard.status is ShardStatus.UNOWNED for shard in runtime.shards)
    await ownership.on_assigned({2})  # an assignment that reaches a closing instance is not taken
    assert ownership.owned == set() and loads.started == [{0}]


async def test_a_load_whose_partitions_are_all_revoked_is_stopped(cluster: Env) -> None:
    """The revoke returns without waiting for a load of nothing still ours; a load of which something is still
    ours goes on, and the revoked part is unloaded after it."""
    runtime = cluster.coordinator
    loads = StuckLoads(cluster)
    ownership, membership = await _owned_nothing_yet(cluster)
    await membership.assign({0})
    await wait_until(lambda: loads.started == [{0}], 5.0, "loads.started == [{0}]", 0.01)
    await asyncio.wait_for(membership.on_revoked({0}), 5)
    assert loads.stopped == [{0}] and ownership.loads == 0 and runtime.shards[0].status is ShardStatus.UNOWNED
    await membership.assign({1, 2})
    await wait_until(lambda: loads.started == [{0}, {1, 2}], 5.0, "loads.started == [{0}, {1, 2}]", 0.01)
    revoking = asyncio.ensure_future(membership.on_revoked({1}))
    await drain()
    assert not revoking.done() and loads.stopped == [{0}]  # 2 is still ours: its load goes on
    loads.gate.set()
    await asyncio.wait_for(revoking, 5)
    assert ownership.serving(2) and not ownership.serving(1) and ownership.loads == 1
    await ownership.close()


async def test_close_revokes_everything_owned(cluster: Env) -> None:
    ownership, _, _, partition = await formed_then_owned(cluster)
    await ownership.close()
    assert ownership.owned == set() and partition in cluster.store.unloaded


def test_unloaded_groups_leave_no_cyclic_garbage() -> None:
    """The collector policy relies on it: an unloaded group is freed by reference counting, so freezing what is
    loaded never keeps a dropped group alive (nothing thaws and collects after an unload)."""

    async def scenario() -> None:
        env = Env()
        clients = [env.client(f"m{i}", group_id=f"g{i}") for i in range(20)]
        for c in clients:
            await form_group(env, c)
        del clients
        await env.advance(1_000)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            await env.coordinator.unload(range(env.coordinator.num_partitions))
            await env.advance(60_000)
            gc.collect()
            leaked = [type(o).__name__ for o in gc.garbage
                      if type(o).__name__ in ("GroupMetadata", "MemberMetadata")]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert leaked == []
        await env.close()

    asyncio.run(scenario())


async def test_a_load_finishing_while_suspended_waits_for_the_confirmation(cluster: Env) -> None:
    ownership, membership, confirmations, partition = await formed_then_owned(cluster)
    other = next(p for p in range(cluster.coordinator.num_partitions) if p != partition)
    cluster.clock.advance(STALL_MS)
    ownership.guard.tick()  # the stall, seen by the tick
    await membership.assign({other})  # assigned meanwhile: loaded, but not served before Kafka confirms
    await wait_until(lambda: ownership.loads == 2 and cluster.coordinator.shards[other].status is ShardStatus.UNOWNED,
                     5.0, "the second load, the partition not served", 0.01)
    assert ownership.owned == {partition, other} and not ownership.serving(other)
    confirmations.answer = {partition, other}
    await wait_until(lambda: ownership.serving(partition) and ownership.serving(other), 5.0,
                     "ownership.serving(partition) and ownership.serving(other)", 0.01)
    assert heartbeat(ownership, cluster) == Errors.NONE
    await ownership.close()


def test_a_busy_loop_is_no_stall_while_the_watcher_pulses() -> None:
    """The loop checks late (it was busy for longer than the threshold), but the watcher thread pulsed all along:
    the process ran, the membership consumer kept heartbeating, nothing is suspended."""
    clock = ManualClock(0)
    guard = ZombieGuard(clock, STALL_MS, lambda _: None)
    for _ in range(12):  # 3 thresholds of loop silence, the pulse every quarter threshold
        clock.advance(STALL_MS // 4)
        guard.pulse()
    guard.check()
    assert not guard.suspended and guard.stalls == 0


def test_a_gap_in_the_pulse_is_reported_at_the_next_check_even_if_pulses_resumed() -> None:
    """SIGCONT: the watcher may run before the loop; its gap must not be covered by its next pulses."""
    clock = ManualClock(0)
    seen: list[int] = []
    guard = ZombieGuard(clock, STALL_MS, seen.append)
    clock.advance(STALL_MS * 3)
    guard.pulse()  # the watcher wakes first and sees the pause
    clock.advance(STALL_MS // 4)
    guard.pulse()  # and pulses on before the loop runs
    guard.check()
    assert guard.suspended and guard.stalls == 1 and seen == [STALL_MS * 3]
