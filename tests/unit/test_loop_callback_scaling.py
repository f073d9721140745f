"""No loop callback of the coordinator may cost more with more groups: periodic work runs in bounded slices.

The real runtime (GroupRuntime, SystemTimer with its batched expiry, purgatories, the census of telemetry) on
the default asyncio loop, with a manual clock so a minute of sessions passes in seconds: groups loaded from the
in-memory store with offsets, every member heartbeating every few seconds, offset expiry and census running as
the service runs them. Every loop callback is timed in this thread's CPU time (a loaded machine does not change
it); the longest one at 5x the members must not be anywhere near 5x as long.
"""
from __future__ import annotations

import asyncio
import gc

from coordinator.config import CoordinatorConfig
from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.runtime_health import CallbackTimer, GcPolicy
from coordinator.telemetry.metrics import GroupCensus
from coordinator.timer import ManualClock, SystemTimer
from protocol.error_codes import Errors
from tests.support.group_harness import subscription

GROUP_SIZE = 10
SESSION_MS = 30_000
HEARTBEAT_MS = 3_000
STEP_MS = 20
RETENTION_CHECK_MS = 5_000
SUBSCRIPTION = subscription("orders")


def _records(members: int, now_ms: int) -> InMemoryGroupStore:
    store = InMemoryGroupStore()
    for g in range(members // GROUP_SIZE):
        group_id = f"group-{g}"
        member_records = [MemberRecord(f"{group_id}-member-{m}", None, "client", "/127.0.0.1", 60_000, SESSION_MS,
                                       SUBSCRIPTION, b"assignment") for m in range(GROUP_SIZE)]
        store.groups[group_id] = GroupRecord("consumer", 1, "range", member_records[0].member_id, now_ms,
                                             member_records)
        # half the groups hold an offset of a topic they no longer subscribe to, expiring during the run, so
        # the cleanup has work to do (a subscribed topic's offsets never expire in a non-empty group)
        commit_ms = now_ms - 60_000 if g % 2 else now_ms
        store.offsets[group_id] = {("payments", 0): OffsetRecord(7, -1, "", commit_ms, None),
                                   ("orders", 0): OffsetRecord(9, -1, "", now_ms, None)}
    return store


async def _longest_callback(members: int, run_ms: int = 40_000) -> tuple[float, str, int]:
    """Loads `members`, heartbeats them all for `run_ms` of manual time; (longest callback s, its repr, expired
    offsets). The driver itself only schedules: every piece of work is a loop callback of its own."""
    clock = ManualClock(1_700_000_000_000)
    timer = SystemTimer("scaling", clock=clock)
    config = CoordinatorConfig(offsets_retention_minutes=1, offsets_retention_check_interval_ms=RETENTION_CHECK_MS)
    runtime = GroupRuntime(config, timer, _records(members, clock.now_ms()), clock)
    await runtime.load()
    census = GroupCensus(runtime, wait_s=0.0)
    loop = asyncio.get_running_loop()
    ids = [(group_id, group.generation_id, member_id)
           for group_id, group in runtime.groups.items() for member_id in group.members]
    assert len(ids) == members
    per_step = len(ids) * STEP_MS // HEARTBEAT_MS
    expired = 0
    errors: list[Errors] = []

    async def expire() -> None:
        nonlocal expired
        expired += await runtime.expire_offsets()

    def beat(first: int) -> None:
        for group_id, generation, member_id in ids[first:first + per_step]:
            error = runtime.handle_heartbeat(group_id, generation, member_id)
            if error != Errors.NONE:
                errors.append(error)

    gc.collect()
    gc.freeze()  # the loaded state is long-lived: the service's collector policy would have frozen it
    policy = GcPolicy(young_interval_s=0.02)  # as the service runs it (timed young collections, then freezes)
    policy.install()
    policy.start_young_collections()
    callbacks = CallbackTimer(log_above_ms=float("inf"))
    assert callbacks.install(loop), "the test runs on asyncio's own loop"
    try:
        cursor = 0
        for step in range(run_ms // STEP_MS):
            clock.advance(STEP_MS)
            loop.call_soon(timer.advance_clock)
            loop.call_soon(beat, cursor)
            cursor = cursor + per_step if cursor + per_step < len(ids) else 0
            if step * STEP_MS % RETENTION_CHECK_MS == 0:
                loop.create_task(expire())
                loop.call_soon(census.read)
            await asyncio.sleep(0)
        for _ in range(len(ids) // 100):  # let sliced work finish
            await asyncio.sleep(0)
    finally:
        callbacks.uninstall()
        policy.stop_young_collections()
        policy.uninstall()
        gc.unfreeze()
        await runtime.shutdown()
        await timer.close()
    assert not errors, errors[:5]
    return callbacks.longest_s, callbacks.longest, expired


async def test_longest_loop_callback_does_not_grow_with_the_groups() -> None:
    small_s, small_what, small_expired = await _longest_callback(10_000)
    large_s, large_what, large_expired = await _longest_callback(50_000)
    print(f"longest callback: 10k members {small_s * 1000:.2f} ms ({small_what}); "
          f"50k members {large_s * 1000:.2f} ms ({large_what})")
    assert small_expired == 10_000 // GROUP_SIZE // 2 and large_expired == 50_000 // GROUP_SIZE // 2
    # Proportional growth is 5x (main before the slicing: 5.5x); what is left grows ~2x (young collections).
    assert large_s < 3 * small_s + 0.002, (small_s, small_what, large_s, large_what)
