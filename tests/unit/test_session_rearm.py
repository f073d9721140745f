"""A session's timeout is re-armed with the operation (and timer entry) that expired, not a new one: the same
object waits again for the rest of the moved deadline, and a member that stops heartbeating still expires."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.group.delayed import DelayedHeartbeat, member_key
from coordinator.group.records import GroupRecord, MemberRecord
from coordinator.group.runtime import GroupRuntime
from coordinator.group.sessions import SessionTracking
from coordinator.group.store import InMemoryGroupStore
from coordinator.purgatory import CallbackOperation, DelayedOperationPurgatory
from coordinator.timer import ManualClock, SystemTimer
from coordinator.timer.testing import manual_timer
from protocol.error_codes import Errors
from tests.support.group_harness import subscription

SESSION_MS = 10_000
STEP_MS = 1_000
GROUP = "rearm"
MEMBERS = ("steady", "stops", "silent")


def _store(now_ms: int) -> InMemoryGroupStore:
    store = InMemoryGroupStore()
    records = [MemberRecord(member_id, None, "client", "/127.0.0.1", 60_000, SESSION_MS, subscription("t"),
                            b"") for member_id in MEMBERS]
    store.groups[GROUP] = GroupRecord("consumer", 1, "range", MEMBERS[0], now_ms, records)
    return store


async def _advance(clock: ManualClock, timer: SystemTimer, ms: int) -> None:
    clock.advance(ms)
    timer.advance_clock()
    for _ in range(10):  # expired buckets are drained in loop callbacks
        await asyncio.sleep(0)


async def test_an_expired_session_timeout_is_re_armed_with_the_same_operation() -> None:
    clock = ManualClock(1_700_000_000_000)
    timer = SystemTimer("rearm", clock=clock)
    runtime = GroupRuntime(CoordinatorConfig(), timer, _store(clock.now_ms()), clock)
    await runtime.load()
    try:
        group = runtime.groups[GROUP]
        shard = runtime.shard_for(GROUP)
        purgatory = shard.heartbeat_purgatory
        steady = group.members["steady"]
        first_op = steady.heartbeat_op
        assert first_op is not None
        first_entry = first_op._entry
        removed_at: dict[str, int] = {}
        for second in range(1, 61):
            await _advance(clock, timer, STEP_MS)
            if second % 3 == 0:
                assert runtime.handle_heartbeat(GROUP, group.generation_id, "steady") in (
                    Errors.NONE, Errors.REBALANCE_IN_PROGRESS)
                if second <= 15:
                    runtime.handle_heartbeat(GROUP, group.generation_id, "stops")
            for member_id in ("stops", "silent"):
                if member_id not in group.members and member_id not in removed_at:
                    removed_at[member_id] = second
            if second < 30:  # re-armed at least twice by now, still the very same operation and entry
                assert steady.heartbeat_op is first_op and first_op._entry is first_entry
                assert not first_op.is_completed and first_op.is_scheduled
        assert "steady" in group.members
        assert group.members["steady"].heartbeat_op is first_op
        # the silent member expires one session after loading, the other one session after its last heartbeat
        # (a timer tick late at most)
        assert SESSION_MS // 1000 <= removed_at["silent"] <= SESSION_MS // 1000 + 2, removed_at
        assert 15 + SESSION_MS // 1000 <= removed_at["stops"] <= 15 + SESSION_MS // 1000 + 2, removed_at
        assert purgatory.watched_under(member_key(GROUP, "steady")) == 1
    finally:
        await runtime.shutdown()
        await timer.close()


def test_rearm_refuses_an_operation_still_pending() -> None:
    timer, _ = manual_timer()
    purgatory: DelayedOperationPurgatory[CallbackOperation] = DelayedOperationPurgatory("test", timer)
    op = CallbackOperation(1_000, lambda _op: False, lambda _op: None, lambda _op: None)  # never completes
    purgatory.try_complete_else_watch(op, ["key"])
    with pytest.raises(ValueError):
        purgatory.rearm(op, "key")


async def test_a_heartbeating_members_session_operation_waits_for_its_moved_deadline_without_running(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer moves a session operation to the member's latest deadline as it cascades it (TimerTask.postponable):
    while heartbeats keep coming it never runs, and a member that stops still expires at its deadline."""
    runs: list[str] = []
    original = SessionTracking.on_expire_heartbeat

    def counted(self: SessionTracking, op: DelayedHeartbeat) -> None:
        runs.append(op.member_id)
        original(self, op)

    monkeypatch.setattr(SessionTracking, "on_expire_heartbeat", counted)
    clock = ManualClock(1_700_000_000_000)
    timer = SystemTimer("postpone", clock=clock)
    runtime = GroupRuntime(CoordinatorConfig(), timer, _store(clock.now_ms()), clock)
    await runtime.load()
    try:
        group = runtime.groups[GROUP]
        steady_op = group.members["steady"].heartbeat_op
        stops_last_ms = 0
        removed_ms = None
        for step in range(1, 601):  # 60 s in 100 ms steps
            await _advance(clock, timer, 100)
            if step % 30 == 0:  # every 3 s
                runtime.handle_heartbeat(GROUP, group.generation_id, "steady")
                if step <= 150:
                    runtime.handle_heartbeat(GROUP, group.generation_id, "stops")
                    stops_last_ms = clock.now_ms()
            if removed_ms is None and "stops" not in group.members:
                removed_ms = clock.now_ms()
        assert "steady" not in runs  # followed its deadline: never ran, never re-armed
        assert group.members["steady"].heartbeat_op is steady_op and steady_op.is_scheduled
        assert steady_op.expiration_ms is not None
        assert steady_op.expiration_ms <= group.members["steady"].heartbeat_deadline_ms
        # expired one session after its last heartbeat, within the 100 ms step
        assert removed_ms is not None and 0 <= removed_ms - (stops_last_ms + SESSION_MS) < 100, \
            (removed_ms, stops_last_ms)
        assert "silent" not in group.members
    finally:
        await runtime.shutdown()
        await timer.close()
