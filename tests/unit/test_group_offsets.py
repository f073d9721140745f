"""OffsetCommit/OffsetFetch rules, offset expiry, loading and unloading (reference §3.5, §3.6, §7.3–§7.5)."""
from __future__ import annotations

import asyncio

from coordinator.group.api import ListGroupsRequest
from protocol.error_codes import Errors
from coordinator.group.state import GroupState
from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord
from tests.support.group_harness import (SESSION_MS, Env, advance_until_joined, commit, drain, env,  # noqa: F401
                                         errors_of, fetch, form_group, subscription)


async def test_simple_consumer_commit_creates_empty_group(env: Env) -> None:
    resp = await env.coordinator.commit_offsets(commit("simple", -1, "", {("t", 0): 5, ("t", 1): 7}))
    assert errors_of(resp) == [Errors.NONE, Errors.NONE]
    assert env.state("simple") is GroupState.EMPTY
    assert await fetch(env, "simple", {"t": [0, 1, 2]}) == {
        ("t", 0): (5, "", Errors.NONE), ("t", 1): (7, "", Errors.NONE), ("t", 2): (-1, "", Errors.NONE)}
    assert env.store.offsets["simple"][("t", 0)].offset == 5
    resp = await env.coordinator.commit_offsets(commit("nogroup", 3, "m", {("t", 0): 1}))
    assert errors_of(resp) == [Errors.ILLEGAL_GENERATION] and env.group("nogroup") is None


async def test_commit_validation_by_member_and_generation(env: Env) -> None:
    a = env.client("a")
    await form_group(env, a)
    ok = await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id, {("t", 0): 1}))
    assert errors_of(ok) == [Errors.NONE]
    cases = [(a.generation + 1, a.member_id, Errors.ILLEGAL_GENERATION),
             (a.generation, "stranger", Errors.UNKNOWN_MEMBER_ID),
             (-1, "", Errors.UNKNOWN_MEMBER_ID)]  # generation -1 only for Empty groups
    for generation, member_id, expected in cases:
        resp = await env.coordinator.commit_offsets(commit("g", generation, member_id, {("t", 0): 2}))
        assert errors_of(resp) == [expected], (generation, member_id)


async def test_commit_in_completing_rebalance_and_preparing(env: Env) -> None:
    a = env.client("a")
    await a.start_join()
    await advance_until_joined(env, a)
    a.take_join()
    assert env.state() is GroupState.COMPLETING_REBALANCE
    resp = await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id, {("t", 0): 1}))
    assert errors_of(resp) == [Errors.REBALANCE_IN_PROGRESS]
    await a.start_sync({a.member_id: b""})
    await env.client("b").start_join()
    assert env.state() is GroupState.PREPARING_REBALANCE
    resp = await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id, {("t", 0): 1}))
    assert errors_of(resp) == [Errors.NONE]  # previous generation may still commit while preparing


async def test_metadata_too_large_and_store_errors(env: Env) -> None:
    big = "x" * (env.config.offset_metadata_max_bytes + 1)
    resp = await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1}, metadata=big))
    assert errors_of(resp) == [Errors.OFFSET_METADATA_TOO_LARGE] and env.store.writes == []
    env.store.fail_next_write(Errors.MESSAGE_TOO_LARGE)
    resp = await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1}))
    assert errors_of(resp) == [Errors.INVALID_COMMIT_OFFSET_SIZE]
    env.store.fail_next_write(Errors.REQUEST_TIMED_OUT)  # passed through for offsets (3.9)
    resp = await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1}))
    assert errors_of(resp) == [Errors.REQUEST_TIMED_OUT]
    assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (-1, "", Errors.NONE)}


async def test_require_stable_sees_pending_commit(env: Env) -> None:
    gate = env.store.hold_next_write()
    import asyncio
    task = asyncio.ensure_future(env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 9})))
    await drain()
    assert (await fetch(env, "s", {"t": [0]}, require_stable=True))[("t", 0)][2] == Errors.UNSTABLE_OFFSET_COMMIT
    assert (await fetch(env, "s", {"t": [0]}))[("t", 0)] == (-1, "", Errors.NONE)
    gate.set()
    await task
    assert await fetch(env, "s", None, require_stable=True) == {("t", 0): (9, "", Errors.NONE)}


async def test_fetch_unknown_group_answers_minus_one(env: Env) -> None:
    assert await fetch(env, "nobody", {"t": [0]}) == {("t", 0): (-1, "", Errors.NONE)}
    assert await fetch(env, "nobody", None) == {}


async def test_offsets_expire_from_empty_group_and_group_is_retired() -> None:
    env = Env(offsets_retention_minutes=1)
    try:
        a = env.client("a", topics=("t",))
        await form_group(env, a)
        await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id, {("t", 0): 1}))
        await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id, {("u", 0): 1}))
        for _ in range(20):
            assert await a.heartbeat() == Errors.NONE
            await env.advance(3_000)
        # Stable consumer group: only offsets of topics nobody subscribes to expire (by commit time).
        assert await env.coordinator.expire_offsets() == 1
        assert set(env.group().offsets) == {("t", 0)} and ("u", 0) not in env.store.offsets["g"]
        await a.leave()
        await drain()
        await env.advance(59_000)
        assert await env.coordinator.expire_offsets() == 0  # Empty: retention counts from becoming Empty
        await env.advance(1_000)
        assert await env.coordinator.expire_offsets() == 1
        assert env.group() is None and "g" not in env.store.groups and "g" not in env.store.offsets
    finally:
        await env.close()


async def test_simple_group_offsets_expire_by_commit_time_and_explicit_retention() -> None:
    env = Env(offsets_retention_minutes=1)
    try:
        await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1}, retention_time_ms=10_000))
        await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 1): 1}))
        await env.advance(10_000)
        assert await env.coordinator.expire_offsets() == 1  # explicit expire timestamp (v2-v4 retention)
        await env.advance(50_000)
        assert await env.coordinator.expire_offsets() == 1
        assert env.group("s") is None
    finally:
        await env.close()


async def test_a_failed_commit_is_tombstoned_when_its_group_is_retired() -> None:
    """A commit whose write failed may be in the log all the same (a failure after the append, a timeout):
    never served, but the retirement of its Empty group tombstones it, so a reload does not bring the group back."""
    env = Env(offsets_retention_minutes=1)
    try:
        await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1}))
        env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        resp = await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 1): 5}))
        assert errors_of(resp) == [Errors.COORDINATOR_NOT_AVAILABLE]
        assert await fetch(env, "s", {"t": [0, 1]}) == {("t", 0): (1, "", Errors.NONE), ("t", 1): (-1, "", Errors.NONE)}
        await env.advance(60_000)
        assert await env.coordinator.expire_offsets() == 2  # the expired offset and the possibly written one
        assert env.group("s") is None
        assert [(r.topic, r.partition, r.value) for r in env.store.writes[-1]] == [("t", 0, None), ("t", 1, None)]
    finally:
        await env.close()


def loaded_record(now_ms: int) -> GroupRecord:
    members = [MemberRecord(f"m{i}", None, f"c{i}", "/10.0.0.1", 30_000, SESSION_MS, subscription("t"),
                            f"as{i}".encode()) for i in range(2)]
    return GroupRecord("consumer", 7, "range", "m1", now_ms, members)


async def test_loading_reports_load_in_progress_then_materialises_stable_group(env: Env) -> None:
    coord = env.coordinator
    coord.begin_loading()
    a = env.client("a")
    assert (await coord.join_group(a.join_request())).error_code == Errors.COORDINATOR_LOAD_IN_PROGRESS
    assert await a.heartbeat() == Errors.NONE  # answered blindly while loading
    await a.start_sync()
    assert a.sync_task.result().error_code == Errors.REBALANCE_IN_PROGRESS
    assert (await coord.list_groups(ListGroupsRequest())).error_code == Errors.COORDINATOR_LOAD_IN_PROGRESS
    env.store.groups["gone"] = loaded_record(0)
    await env.load({"g": loaded_record(env.clock.now_ms()), "gone": None},
                   {"g": {("t", 0): OffsetRecord(42, -1, "meta", env.clock.now_ms())}})
    group = env.group()
    assert group.state is GroupState.STABLE and group.generation_id == 7 and group.leader_id == "m1"
    assert group.get("m0").assignment == b"as0" and group.get("m0").client_host == "/10.0.0.1"
    assert env.group("gone") is None
    assert await fetch(env, "g", {"t": [0]}) == {("t", 0): (42, "meta", Errors.NONE)}
    m0 = env.client("x")
    m0.member_id, m0.generation = "m0", 7
    for _ in range(4):  # m0 heartbeats, m1 must within a session timeout of the load or be expired
        await env.advance(3_000)
        assert await m0.heartbeat() == Errors.NONE or env.state() is GroupState.PREPARING_REBALANCE
    assert "m1" not in group.members and group.leader_id == "m0"


async def test_unload_answers_parked_requests_with_not_coordinator(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    leader, follower = (a, b) if a.is_leader else (b, a)
    await leader.start_join()  # the leader's rejoin in Stable parks it and starts a rebalance
    assert not leader.join_task.done()
    await env.coordinator.shutdown()
    await drain()
    assert leader.join_task.result().error_code == Errors.NOT_COORDINATOR
    assert env.coordinator.groups == {}
    assert await follower.heartbeat() == Errors.COORDINATOR_NOT_AVAILABLE


async def test_shutdown_answers_a_commit_whose_write_it_cancels_before_the_write_started(env: Env) -> None:
    """The commit is handled and its write sent in the loop turn the runtime shuts down in: the task awaiting the
    write is cancelled before its first step, so its body (which settles the write) never ran and the commit was
    never answered (seeds 12526, 13380 and 15486 of the simulator, once a paused instance read its requests before
    shutting down)."""
    committing = asyncio.ensure_future(env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1})))
    await asyncio.sleep(0)  # the commit runs up to its write's outcome; the write's task has not started
    assert not committing.done() and env.store.writes == []
    await env.coordinator.shutdown()
    await drain()
    assert committing.done() and errors_of(committing.result()) == [Errors.COORDINATOR_NOT_AVAILABLE]


async def test_shutdown_answers_the_writes_of_its_loop_turn(env: Env) -> None:
    """A commit whose partition has a write in flight waits for the end of the loop turn to go with the turn's
    other writes; shutdown sends the turn and cancels its task before it starts: answered too."""
    held = env.store.hold_next_write()
    first = asyncio.ensure_future(env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1})))
    await drain()
    assert not first.done() and len(env.store.writes) == 1  # in flight, held
    second = asyncio.ensure_future(env.coordinator.commit_offsets(commit("s", -1, "", {("t", 1): 1})))
    await asyncio.sleep(0)  # queued for the end of this turn
    assert not second.done() and len(env.store.writes) == 1
    await env.coordinator.shutdown()
    held.set()
    await drain()
    assert errors_of(first.result()) == [Errors.COORDINATOR_NOT_AVAILABLE]
    assert second.done() and errors_of(second.result()) == [Errors.COORDINATOR_NOT_AVAILABLE]
