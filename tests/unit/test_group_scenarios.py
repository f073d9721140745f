"""Scenario tests of the classic group protocol, on a manual clock (reference §3, §4)."""
from __future__ import annotations

import logging

from coordinator.group.api import (DeleteGroupsRequest, DescribeGroupsRequest, HeartbeatRequest, LeaveGroupRequest,
                                   ListGroupsRequest, MemberIdentity)
from protocol.error_codes import Errors
from coordinator.group.state import GroupState
from tests.support.group_harness import (REBALANCE_MS, SESSION_MS, Env, advance_until_joined,  # noqa: F401  (fixture)
                                         complete_rebalance, drain, env, form_group)

STABLE, PREPARING, COMPLETING, EMPTY = (GroupState.STABLE, GroupState.PREPARING_REBALANCE,
                                        GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)


async def test_first_member_round_trip_initial_delay_and_stable(env: Env) -> None:
    c = env.client("a")
    first = await env.coordinator.join_group(c.join_request())
    assert first.error_code == Errors.MEMBER_ID_REQUIRED and first.member_id.startswith("a-")
    assert env.group().pending_members == {first.member_id}
    c.member_id = first.member_id
    await c.start_join()
    assert env.state() is PREPARING and not c.join_task.done()
    await env.advance(2_999, step_ms=2_999)
    assert not c.join_task.done()  # the initial delay is never cut short
    await env.advance(1)
    resp = c.take_join()
    assert resp.error_code == Errors.NONE and resp.generation_id == 1 and resp.leader == c.member_id
    assert resp.protocol_name == "range" and [m.member_id for m in resp.members] == [c.member_id]
    assert env.state() is COMPLETING
    await c.start_sync({c.member_id: b"A"})
    assert c.sync_task.result().error_code == Errors.NONE and c.sync_task.result().assignment == b"A"
    assert env.state() is STABLE
    record = env.store.groups["g"]
    assert record.generation == 1 and record.leader == c.member_id and record.members[0].assignment == b"A"
    assert record.members[0].client_host == "/127.0.0.1"
    transitions = [(e[2], e[3]) for e in env.observer.of("state")]
    assert transitions == [("Empty", "PreparingRebalance"), ("PreparingRebalance", "CompletingRebalance"),
                           ("CompletingRebalance", "Stable")]
    assert env.observer.of("rebalance_completed") == [("rebalance_completed", "g", 1, 1, 3_000)]


async def test_initial_delay_extends_while_new_members_arrive_up_to_rebalance_timeout() -> None:
    env = Env(group_initial_rebalance_delay_ms=3_000)
    try:
        clients = [env.client(f"c{i}", rebalance_timeout_ms=10_000) for i in range(4)]
        await clients[0].start_join()
        elapsed = 0
        for c in clients[1:]:  # a new member in every window: (3000,7000) (3000,4000) (3000,1000) (1000,0)
            await env.advance(2_000, step_ms=2_000)
            elapsed += 2_000
            await c.start_join()
            await env.advance(1_000, step_ms=1_000)
            elapsed += 1_000
        waited = await advance_until_joined(env, *clients)
        assert elapsed == 9_000 and waited == 1_000  # bounded by the first member's rebalance timeout
        assert all(c.take_join().generation_id == 1 for c in clients)
    finally:
        await env.close()


async def test_second_member_joins_stable_group(env: Env) -> None:
    a = env.client("a")
    await form_group(env, a)
    b = env.client("b")
    await b.start_join()
    assert env.state() is PREPARING
    assert await a.heartbeat() == Errors.REBALANCE_IN_PROGRESS
    await a.start_join()  # rejoin completes the join phase at once: everyone known has joined
    await drain()
    await complete_rebalance(env, a, b)
    assert a.generation == b.generation == 2 and env.state() is STABLE
    assert await a.heartbeat() == Errors.NONE and await b.heartbeat() == Errors.NONE


async def test_member_failure_logs_exact_line_and_survivors_rebalance(env: Env, caplog) -> None:
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    caplog.set_level(logging.INFO, logger="coordinator.group")
    for _ in range(3):  # a keeps heartbeating, b is silent
        await env.advance(3_000)
        assert await a.heartbeat() == Errors.NONE
    assert env.state() is STABLE
    await env.advance(SESSION_MS - 9_000)
    assert env.state() is PREPARING
    line = f"Member {b.member_id} in group g has failed, removing it from the group"
    assert line in [r.getMessage() for r in caplog.records if r.name == "coordinator.group"]
    assert ("failed", "g", b.member_id, None, "session timeout") in env.observer.events
    assert await a.heartbeat() == Errors.REBALANCE_IN_PROGRESS
    await a.start_join()
    await complete_rebalance(env, a)
    assert a.generation == 2 and list(env.group().members) == [a.member_id]


async def test_leader_failure_elects_a_new_leader(env: Env) -> None:
    a, b, c = env.client("a"), env.client("b"), env.client("c")
    await form_group(env, a, b, c)
    leader = next(x for x in (a, b, c) if x.is_leader)
    survivors = [x for x in (a, b, c) if x is not leader]
    for _ in range(4):
        await env.advance(3_000)
        for s in survivors:
            await s.heartbeat()
    assert leader.member_id not in env.group().members
    for s in survivors:
        await s.start_join()
    await complete_rebalance(env, *survivors)
    assert survivors[0].leader in {s.member_id for s in survivors}
    assert survivors[0].generation == 2


async def test_batch_leave_group(env: Env) -> None:
    a, b, c = env.client("a"), env.client("b"), env.client("c")
    await form_group(env, a, b, c)
    resp = await env.coordinator.leave_group(LeaveGroupRequest("g", [
        MemberIdentity(a.member_id, reason="bye"), MemberIdentity(b.member_id), MemberIdentity("nobody")]))
    assert resp.error_code == Errors.NONE
    assert [m.error_code for m in resp.members] == [Errors.NONE, Errors.NONE, Errors.UNKNOWN_MEMBER_ID]
    assert list(env.group().members) == [c.member_id] and env.state() is PREPARING
    assert [e[2] for e in env.observer.of("left")] == [a.member_id, b.member_id]
    await c.start_join()
    await complete_rebalance(env, c)
    assert c.is_leader and c.generation == 2
    assert await c.leave() == Errors.NONE
    await drain()
    assert env.state() is EMPTY and env.group().generation_id == 3


async def test_static_member_restart_keeps_assignment_and_fences_old_id(env: Env) -> None:
    a, b = env.client("a", instance_id="ia"), env.client("b", instance_id="ib")
    await form_group(env, a, b)
    follower = a if not a.is_leader else b
    old_id = follower.member_id
    restarted = env.client(follower.name, instance_id=follower.instance_id)
    await restarted.start_join()
    resp = restarted.take_join()
    assert resp.error_code == Errors.NONE and resp.member_id != old_id and resp.generation_id == 1
    assert env.state() is STABLE and not resp.skip_assignment and resp.members == []
    assert env.store.groups["g"].members[[m.group_instance_id for m in env.store.groups["g"].members]
                                         .index(follower.instance_id)].member_id == resp.member_id
    assert await follower.heartbeat() == Errors.FENCED_INSTANCE_ID
    await restarted.start_sync()
    assert restarted.sync_task.result().assignment == f"assignment-{follower.name}".encode()
    assert env.observer.of("rebalance_started") == [("rebalance_started", "g", 0, env.observer.of(
        "rebalance_started")[0][3])]


async def test_static_leader_restart_v9_skips_assignment_and_v8_is_told_old_leader(env: Env) -> None:
    a, b = env.client("a", instance_id="ia"), env.client("b", instance_id="ib")
    await form_group(env, a, b)
    leader = a if a.is_leader else b
    v9 = env.client(leader.name, instance_id=leader.instance_id, version=9)
    await v9.start_join()
    resp = v9.take_join()
    assert resp.skip_assignment and resp.leader == resp.member_id and len(resp.members) == 2
    v8 = env.client(leader.name, instance_id=leader.instance_id, version=8)
    await v8.start_join()
    resp8 = v8.take_join()
    assert not resp8.skip_assignment and resp8.leader == resp.member_id != resp8.member_id
    assert resp8.members == [] and env.state() is STABLE


async def test_member_that_never_syncs_is_removed_by_delayed_sync(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    for c in (a, b):
        await c.start_join()
    await advance_until_joined(env, a, b)
    a.take_join(), b.take_join()
    leader, follower = (a, b) if a.is_leader else (b, a)
    await leader.start_sync({a.member_id: b"1", b.member_id: b"2"})
    assert env.state() is STABLE
    for _ in range(REBALANCE_MS // 3_000):  # the follower heartbeats but never sends SyncGroup
        await env.advance(3_000)
        await leader.heartbeat()
        await follower.heartbeat()
    assert follower.member_id not in env.group().members and env.state() is PREPARING


async def test_member_that_never_rejoins_is_dropped_at_rebalance_timeout_static_kept(env: Env) -> None:
    a, b, s = env.client("a"), env.client("b"), env.client("s", instance_id="is")
    await form_group(env, a, b, s)
    c = env.client("c")
    await c.start_join()
    await a.start_join()
    for _ in range(REBALANCE_MS // 3_000 - 1):  # b and s heartbeat but never rejoin
        await env.advance(3_000)
        assert await b.heartbeat() == Errors.REBALANCE_IN_PROGRESS
        await s.heartbeat()
    await env.advance(3_000)
    assert b.member_id not in env.group().members and s.member_id in env.group().members
    assert env.state() is COMPLETING
    ra, rc = a.take_join(), c.take_join()
    leader_resp = ra if ra.leader == ra.member_id else rc
    assert {m.member_id for m in leader_resp.members} == {a.member_id, c.member_id, s.member_id}


async def test_group_becomes_empty_then_dead_on_delete(env: Env) -> None:
    a = env.client("a")
    await form_group(env, a)
    resp = await env.coordinator.delete_groups(DeleteGroupsRequest(["g", "g", "missing"]))
    assert [(r.group_id, r.error_code) for r in resp.results] == [("g", Errors.NON_EMPTY_GROUP),
                                                                 ("missing", Errors.GROUP_ID_NOT_FOUND)]
    await a.leave()
    await drain()
    assert env.state() is EMPTY
    resp = await env.coordinator.delete_groups(DeleteGroupsRequest(["g"]))
    assert resp.results[0].error_code == Errors.NONE and env.group() is None
    assert "g" not in env.store.groups  # generation > 0: group tombstone written
    assert env.observer.of("state")[-1][2:] == ("Empty", "Dead", 2)
    described = (await env.coordinator.describe_groups(DescribeGroupsRequest(["g"]))).groups[0]
    assert described.error_code == Errors.NONE and described.group_state == "Dead"


async def test_store_failure_during_sync_errors_every_parked_sync_and_rebalances(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    for c in (a, b):
        await c.start_join()
    await advance_until_joined(env, a, b)
    a.take_join(), b.take_join()
    leader, follower = (a, b) if a.is_leader else (b, a)
    await follower.start_sync()
    assert not follower.sync_task.done()  # followers wait for the leader
    gate = env.store.hold_next_write()
    env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    await leader.start_sync({a.member_id: b"1", b.member_id: b"2"})
    assert not leader.sync_task.done() and env.state() is COMPLETING
    gate.set()
    await drain()
    for c in (leader, follower):
        assert c.sync_task.result().error_code == Errors.COORDINATOR_NOT_AVAILABLE
        assert c.sync_task.result().assignment == b""
    assert env.state() is PREPARING


async def test_sync_store_timeout_maps_to_rebalance_in_progress(env: Env) -> None:
    a = env.client("a")
    await a.start_join()
    await advance_until_joined(env, a)
    a.take_join()
    env.store.fail_next_write(Errors.REQUEST_TIMED_OUT)
    await a.start_sync({a.member_id: b"x"})
    assert a.sync_task.result().error_code == Errors.REBALANCE_IN_PROGRESS


async def test_pending_member_blocks_join_until_its_session_expires(env: Env) -> None:
    a = env.client("a")
    await form_group(env, a)
    pending = await env.coordinator.join_group(env.client("p").join_request())
    assert pending.error_code == Errors.MEMBER_ID_REQUIRED
    await a.start_join()  # leader rejoin: rebalance
    await env.advance(SESSION_MS - 500)
    assert not a.join_task.done()
    await env.advance(1_000)
    assert a.take_join().generation_id == 2 and not env.group().pending_members


async def test_new_member_parked_in_join_expires_after_new_member_join_timeout() -> None:
    env = Env(new_member_join_timeout_ms=60_000)
    try:
        a = env.client("a")
        await form_group(env, a)
        b = env.client("b", rebalance_timeout_ms=600_000, session_timeout_ms=SESSION_MS)
        await b.start_join()
        for _ in range(20):  # a never rejoins but keeps heartbeating; b waits parked
            await env.advance(3_000)
            await a.heartbeat()
        assert b.join_task.done() and b.join_task.result().error_code == Errors.UNKNOWN_MEMBER_ID
        assert b.member_id not in env.group().members
    finally:
        await env.close()


async def test_group_max_size_rejects_and_removes() -> None:
    env = Env(group_max_size=1)
    try:
        a, b = env.client("a"), env.client("b")
        await form_group(env, a)
        await b.start_join()
        resp = b.take_join()
        assert resp.error_code == Errors.GROUP_MAX_SIZE_REACHED and resp.member_id == ""
        assert env.state() is STABLE
    finally:
        await env.close()


async def test_protocol_vote_and_inconsistent_protocol(env: Env) -> None:
    a = env.client("a", protocols=[("range", b"r"), ("roundrobin", b"x")])
    b = env.client("b", protocols=[("roundrobin", b"y"), ("range", b"r")])
    c = env.client("c", protocols=[("roundrobin", b"z")])
    for x in (a, b, c):
        await x.start_join()
    await advance_until_joined(env, a, b, c)
    assert {x.take_join().protocol_name for x in (a, b, c)} == {"roundrobin"}
    d = env.client("d", protocols=[("sticky", b"")])
    resp = await env.coordinator.join_group(d.join_request(member_id=""))
    assert resp.error_code == Errors.INCONSISTENT_GROUP_PROTOCOL
    resp = await env.coordinator.join_group(d.join_request(protocol_type="connect"))
    assert resp.error_code == Errors.INCONSISTENT_GROUP_PROTOCOL


async def test_invalid_session_timeout_and_group_id(env: Env) -> None:
    c = env.client("a")
    assert (await env.coordinator.join_group(c.join_request(session_timeout_ms=5_999))).error_code == \
        Errors.INVALID_SESSION_TIMEOUT
    assert (await env.coordinator.join_group(c.join_request(session_timeout_ms=1_800_001))).error_code == \
        Errors.INVALID_SESSION_TIMEOUT
    assert (await env.coordinator.join_group(c.join_request(group_id=""))).error_code == Errors.INVALID_GROUP_ID
    hb = await env.coordinator.heartbeat(HeartbeatRequest("", 1, "m"))
    assert hb.error_code == Errors.INVALID_GROUP_ID


async def test_describe_and_list_groups(env: Env) -> None:
    a = env.client("a")
    await form_group(env, a)
    other = env.client("o", group_id="other")
    await other.start_join()
    d = (await env.coordinator.describe_groups(DescribeGroupsRequest(["g", "other"]))).groups
    assert (d[0].group_state, d[0].protocol_data, d[0].members[0].member_assignment) == ("Stable", "range",
                                                                                          b"assignment-a")
    assert d[0].members[0].client_host == "/127.0.0.1" and d[0].members[0].member_metadata
    assert (d[1].group_state, d[1].protocol_data, d[1].members[0].member_metadata) == ("PreparingRebalance", "",
                                                                                       b"")
    listed = await env.coordinator.list_groups(ListGroupsRequest(states_filter=["STABLE"]))
    assert [g.group_id for g in listed.groups] == ["g"]
    listed = await env.coordinator.list_groups(ListGroupsRequest(types_filter=["consumer"]))
    assert listed.groups == []
    listed = await env.coordinator.list_groups(ListGroupsRequest(types_filter=["Classic"]))
    assert {g.group_id for g in listed.groups} == {"g", "other"}


async def test_leader_join_in_stable_triggers_rebalance_follower_does_not(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    leader, follower = (a, b) if a.is_leader else (b, a)
    await follower.start_join()
    resp = follower.take_join()
    assert resp.error_code == Errors.NONE and resp.generation_id == 1 and env.state() is STABLE
    await leader.start_join()
    assert env.state() is PREPARING


async def test_static_replacement_in_completing_rebalance_rebalances(env: Env) -> None:
    a, s = env.client("a"), env.client("s", instance_id="is")
    for c in (a, s):  # a joins first and leads
        await c.start_join()
    await advance_until_joined(env, a, s)
    a.take_join(), s.take_join()
    assert a.is_leader and env.state() is COMPLETING
    await s.start_sync()
    restarted = env.client("s", instance_id="is")
    await restarted.start_join()
    assert env.state() is PREPARING and not restarted.join_task.done()
    assert s.sync_task.result().error_code == Errors.FENCED_INSTANCE_ID
    assert await s.heartbeat() == Errors.FENCED_INSTANCE_ID
    await a.start_join()
    await complete_rebalance(env, a, restarted)
    assert restarted.generation == 2 and env.group().static_members["is"] == restarted.member_id


async def test_static_replacement_store_failure_reverts(env: Env) -> None:
    a, s = env.client("a"), env.client("s", instance_id="is")
    await form_group(env, a, s)
    env.store.fail_next_write(Errors.NOT_LEADER_OR_FOLLOWER)
    restarted = env.client("s", instance_id="is")
    await restarted.start_join()
    resp = restarted.take_join()
    assert resp.error_code == Errors.NOT_COORDINATOR and resp.member_id == ""
    assert env.group().static_members["is"] == s.member_id and env.state() is STABLE
    assert await s.heartbeat() == Errors.NONE


async def test_follower_parked_in_sync_outlives_its_session_and_gets_rebalance_error(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    for c in (a, b):
        await c.start_join()
    await advance_until_joined(env, a, b)
    a.take_join(), b.take_join()
    leader, follower = (a, b) if a.is_leader else (b, a)
    await follower.start_sync()
    await env.advance(SESSION_MS + 1_000)  # the silent leader expires; the parked follower does not
    assert leader.member_id not in env.group().members and follower.member_id in env.group().members
    assert follower.sync_task.result().error_code == Errors.REBALANCE_IN_PROGRESS
    assert env.state() is PREPARING
    await follower.start_join()
    await complete_rebalance(env, follower)
    assert follower.is_leader and follower.generation == 2


async def test_heartbeat_in_completing_rebalance_keeps_member_alive(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    for c in (a, b):
        await c.start_join()
    await advance_until_joined(env, a, b)
    a.take_join(), b.take_join()
    for _ in range(5):  # nobody syncs yet; heartbeats in CompletingRebalance answer NONE and restart the session
        await env.advance(3_000)
        assert await a.heartbeat() == Errors.NONE and await b.heartbeat() == Errors.NONE
    assert env.state() is COMPLETING and env.group().size == 2


async def test_rejoin_with_changed_metadata_in_completing_rebalance_rebalances(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    for c in (a, b):
        await c.start_join()
    await advance_until_joined(env, a, b)
    a.take_join(), b.take_join()
    follower = b if a.is_leader else a
    await follower.start_join()  # same metadata: answered at once with the current generation
    assert follower.take_join().generation_id == 1 and env.state() is COMPLETING
    follower.protocols = [("range", b"changed")]
    await follower.start_join()
    assert env.state() is PREPARING


async def test_join_below_v4_needs_no_member_id_round_trip(env: Env) -> None:
    old = env.client("old", version=3)
    await old.start_join()
    assert not old.join_task.done() and env.state() is PREPARING
    assert env.observer.of("joined")[0][1:] == ("g", env.group().leader_id, None, "old", "/127.0.0.1")
    await advance_until_joined(env, old)
    assert old.take_join().generation_id == 1


async def test_second_join_of_a_parked_member_supersedes_the_first(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    leader = a if a.is_leader else b
    await leader.start_join()
    first = leader.join_task
    await leader.start_join()  # e.g. the client retried on a new connection
    assert first.result().error_code == Errors.REBALANCE_IN_PROGRESS and not leader.join_task.done()
    assert env.group().num_members_awaiting_join == 1


async def test_pending_member_id_claimed_by_static_member_is_a_server_error(env: Env) -> None:
    pending = await env.coordinator.join_group(env.client("p").join_request())
    c = env.client("x", instance_id="ix")
    resp = await env.coordinator.join_group(c.join_request(member_id=pending.member_id))
    assert resp.error_code == Errors.UNKNOWN_SERVER_ERROR and env.group().members == {}


async def test_join_during_in_flight_assignment_write_discards_the_write_result(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    for c in (a, b):
        await c.start_join()
    await advance_until_joined(env, a, b)
    a.take_join(), b.take_join()
    leader, follower = (a, b) if a.is_leader else (b, a)
    gate = env.store.hold_next_write()
    await follower.start_sync()
    await leader.start_sync({a.member_id: b"1", b.member_id: b"2"})
    newcomer = env.client("n")
    await newcomer.start_join()  # CompletingRebalance -> PreparingRebalance while the write is in flight
    for c in (leader, follower):
        assert c.sync_task.result().error_code == Errors.REBALANCE_IN_PROGRESS
    gate.set()
    await drain()
    assert env.state() is PREPARING and all(m.assignment == b"" for m in env.group().members.values())
    for c in (leader, follower):
        await c.start_join()
    await advance_until_joined(env, a, b, newcomer)
    await complete_rebalance(env, a, b, newcomer)
    assert newcomer.generation == 2 and env.state() is STABLE


async def test_members_given_nothing_are_counted_in_one_line_not_warned_about(env: Env, caplog) -> None:
    """More members than partitions is normal: Kafka fills in empty assignments and logs nothing. We count them in
    the rebalance's one assignment line (named at DEBUG), never a WARNING per member."""
    clients = [env.client(name) for name in "abcd"]
    for c in clients:
        await c.start_join()
    await advance_until_joined(env, *clients)
    for c in clients:
        assert c.take_join().error_code == Errors.NONE
    leader = next(c for c in clients if c.is_leader)
    others = [c for c in clients if c is not leader]
    caplog.set_level(logging.DEBUG, logger="coordinator.group")
    # the leader assigns to itself, names one member with nothing and leaves two out altogether
    await leader.start_sync({leader.member_id: b"all", others[0].member_id: b""})
    for c in others:
        await c.start_sync()
    await drain()
    assert env.state() is STABLE
    assert [c.sync_task.result().assignment for c in others] == [b"", b"", b""]
    group_records = [r for r in caplog.records if r.name.startswith("coordinator.group")]
    assert [r.getMessage() for r in group_records if r.levelno >= logging.WARNING] == []
    received = [r.getMessage() for r in group_records if "event=assignment_received" in r.getMessage()]
    assert len(received) == 1 and "members=4" in received[0] and "unassigned=3" in received[0], received
    named = [r for r in group_records if "event=empty_assignments" in r.getMessage()]
    assert len(named) == 1 and named[0].levelno == logging.DEBUG and "omitted_by_leader=2" in named[0].getMessage()
    assert all(c.member_id in named[0].getMessage() for c in others)
