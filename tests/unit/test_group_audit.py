"""Findings of the audit against Kafka 3.9's GroupRuntime.scala (one test per finding), and odd inputs
that must never escape a handler or wedge a group. Manual clock throughout."""
from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.group.api import (DeleteGroupsRequest, DescribeGroupsRequest, JoinGroupProtocol, JoinGroupRequest,
                                   LeaveGroupRequest, MemberIdentity, OffsetCommitRequest,
                                   OffsetCommitRequestPartition, OffsetCommitRequestTopic, OffsetFetchRequest,
                                   OffsetFetchRequestTopic, SyncGroupRequest, SyncGroupRequestAssignment)
from protocol.error_codes import Errors
from coordinator.group.metadata import parse_subscription_topics
from coordinator.group.state import GroupState
from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord, Record
from coordinator.group.store import InMemoryGroupStore
from tests.support.group_harness import (REBALANCE_MS, Client, Env, advance_until_joined, commit, drain,  # noqa: F401
                                         env, errors_of, fetch, form_group, subscription)
from tests.support.group_invariants import check_group

STABLE, PREPARING, COMPLETING, EMPTY = (GroupState.STABLE, GroupState.PREPARING_REBALANCE,
                                        GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)


async def test_pending_member_expiration_is_completed_when_the_member_joins(env: Env) -> None:
    # Kafka: the join's completeAndScheduleNextExpiration checks the member key, which completes the
    # KIP-394 pending-member DelayedHeartbeat (tryCompleteHeartbeat: a pending id that is now a member).
    a = env.client("a")
    await a.start_join()
    assert a.member_id in env.group().members
    assert env.coordinator.heartbeat_purgatory.delayed == 1  # only the new-member join timeout
    assert env.timer.size == 2  # that and the InitialDelayedJoin


async def test_duplicate_protocol_names_do_not_wedge_the_group(env: Env) -> None:
    # A member listing one protocol twice still supports it once: the vote must find it, the join phase
    # must complete (Kafka counts it twice and its selectProtocol throws, leaving the group stuck).
    meta = subscription("t")
    a = env.client("a", protocols=[("range", meta), ("range", meta)])
    b = env.client("b", protocols=[("range", meta), ("roundrobin", meta)])
    await a.start_join()
    await b.start_join()
    await advance_until_joined(env, a, b)
    ra, rb = a.take_join(), b.take_join()
    assert ra.error_code == rb.error_code == Errors.NONE
    assert ra.protocol_name == rb.protocol_name == "range" and env.state() is COMPLETING


class SlowDeleteStore(InMemoryGroupStore):
    """Tombstone writes wait for `gate`; writes for groups in `failing` raise (a broken store)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.failing: set[str] = set()

    async def acknowledge(self, records: list[Record]) -> None:
        if all(r.value is None for r in records):  # tombstones
            if self.gate is not None:
                await self.gate.wait()
            if records[0].group_id in self.failing:
                raise RuntimeError(f"cannot write tombstones of {records[0].group_id}")
        await super().acknowledge(records)


def use_store(env: Env, store: InMemoryGroupStore) -> InMemoryGroupStore:
    env.store = env.coordinator.store = store
    return store


async def test_group_unloaded_during_an_expiry_run_gets_no_tombstone() -> None:
    # Kafka's cleanupGroupMetadata writes the group tombstone only when it removed the group from the cache
    # itself (`groupMetadataCache.remove(groupId, group)`); a group unloaded meanwhile belongs elsewhere.
    env = Env(offsets_retention_minutes=1)
    try:
        store = use_store(env, SlowDeleteStore())
        await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1}))
        a = env.client("a")
        await form_group(env, a)
        for _ in range(12):  # "s" comes due; "g" stays Stable
            await env.advance(5_000)
            assert await a.heartbeat() == Errors.NONE
        store.gate = asyncio.Event()
        expiry = asyncio.ensure_future(env.coordinator.expire_offsets())
        await drain()
        env.coordinator.unload_group(env.group("g"))
        store.gate.set()
        assert await expiry == 1
        tombstoned = {r.group_id for records in store.writes for r in records if r.value is None}
        assert "s" in tombstoned and "g" not in tombstoned
        assert "g" in store.groups
    finally:
        await env.close()


async def test_failing_tombstone_write_neither_escapes_nor_leaves_dead_groups_in_memory(env: Env) -> None:
    store = use_store(env, SlowDeleteStore())
    for group_id in ("x", "y"):
        await env.coordinator.commit_offsets(commit(group_id, -1, "", {("t", 0): 1}))
    store.failing.add("x")
    resp = await env.coordinator.delete_groups(DeleteGroupsRequest(["x", "y"]))
    # x's tombstones failed: not reported deleted (Kafka 4 answers a failed write with an error)
    assert [(r.group_id, r.error_code) for r in resp.results] == [("x", Errors.UNKNOWN_SERVER_ERROR),
                                                                  ("y", Errors.NONE)]
    assert env.group("x") is None and env.group("y") is None
    assert "y" not in store.offsets
    # A new simple consumer of "x" starts from scratch instead of meeting a Dead group.
    resp = await env.coordinator.commit_offsets(commit("x", -1, "", {("t", 0): 2}))
    assert errors_of(resp) == [Errors.NONE] and env.state("x") is EMPTY


async def test_cancelled_offset_commit_still_finishes_its_write(env: Env) -> None:
    # The append belongs to the coordinator, not to the request (Kafka's callback runs whatever happens to
    # the connection): a cancelled OffsetCommit must not leave its partitions pending forever, which would
    # make require_stable fetches answer UNSTABLE_OFFSET_COMMIT and keep the offsets from ever expiring.
    gate = env.store.hold_next_write()
    request = asyncio.ensure_future(env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 9})))
    await drain()
    assert env.group("s").has_pending_offset_commit(("t", 0))
    request.cancel()
    await drain()
    gate.set()
    await drain()
    assert not env.group("s").has_pending_offset_commit(("t", 0))
    assert await fetch(env, "s", {"t": [0]}, require_stable=True) == {("t", 0): (9, "", Errors.NONE)}


async def test_offset_metadata_limit_counts_java_chars(env: Env) -> None:
    # Kafka compares String.length(), UTF-16 code units: a character outside the BMP counts twice.
    limit = env.config.offset_metadata_max_bytes
    ok = await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1}, metadata="é" * limit))
    too_large = await env.coordinator.commit_offsets(
        commit("s", -1, "", {("t", 1): 1}, metadata="\U0001F600" * (limit // 2 + 1)))
    assert errors_of(ok) == [Errors.NONE]
    assert errors_of(too_large) == [Errors.OFFSET_METADATA_TOO_LARGE]


# --- odd inputs: nothing escapes, bookkeeping stays consistent, every parked request is answered ------------
GROUP_IDS = ["g1", "g1", "g2", "", "unknown"]
PROTOCOL_LISTS = [[], [("range", b"")], [("range", b"x"), ("range", b"y")], [("roundrobin", b"\x00" * 3)],
                  [("r" * 300, b"\xff" * 2000), ("range", b"")]]
ODD_ACTIONS = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(GROUP_IDS), st.integers(0, 5), st.sampled_from([None, "s1", "s2"]),
              st.sampled_from(PROTOCOL_LISTS), st.sampled_from([5_999, 6_000, 10_000, 10_000, 1_800_001]),
              st.sampled_from([-1, 0, 20_000, 20_000, 20_000, 2**31 - 1]), st.sampled_from([0, 3, 4, 8, 9])),
    st.tuples(st.sampled_from(["sync", "heartbeat", "leave", "commit"]), st.sampled_from(GROUP_IDS),
              st.integers(0, 5), st.sampled_from([None, "s1", "s2"]), st.integers(-1, 3)),
    st.tuples(st.sampled_from(["describe", "delete", "expire"]), st.sampled_from(GROUP_IDS)),
    st.tuples(st.just("cooperate"), st.sampled_from(["g1", "g2"])),
    st.tuples(st.just("live"), st.sampled_from([600, 3_000, 11_000])),  # time passes, members cooperate
    st.tuples(st.just("advance"), st.sampled_from([0, 600, 3_000, 11_000, 40_000])),
)


def member_id_pool(env: Env) -> list[str]:
    """"", a made-up id, then every member and pending id of every group (so ids of the wrong group too)."""
    ids = ["", "nobody"]
    for group in env.coordinator.groups.values():
        ids.extend(group.members)
        ids.extend(sorted(group.pending_members))
    return ids


async def run_odd_history(history: list[tuple]) -> None:
    env = Env(group_initial_rebalance_delay_ms=500, group_max_size=3)
    coord, parked = env.coordinator, []
    try:  # a Stable group to start from: a dynamic leader and the static member "s1"
        await form_group(env, env.client("a", group_id="g1"), env.client("s", group_id="g1", instance_id="s1"))
        for action, *args in history:
            if action == "advance":
                await env.advance(args[0], step_ms=5_000)
                continue
            if action == "live":
                for _ in range(0, args[0], 200):
                    await env.advance(200, step_ms=200)
                    for group_id in ("g1", "g2"):
                        parked.extend(await cooperate(env, group_id))
                continue
            group_id = args[0]
            if action == "describe":
                await coord.describe_groups(DescribeGroupsRequest([group_id, group_id]))
            elif action == "delete":
                await coord.delete_groups(DeleteGroupsRequest([group_id, "g1", group_id]))
            elif action == "expire":
                await coord.expire_offsets()
            elif action == "cooperate":
                parked.extend(await cooperate(env, group_id))
            else:
                pool = member_id_pool(env)
                member_id, instance_id = pool[args[1] % len(pool)], args[2]
                parked.extend(await odd_request(env, action, group_id, member_id, instance_id, *args[3:]))
            await drain()
            for group in coord.groups.values():
                check_group(group)
    finally:
        await env.close()
    await drain()
    assert all(task.done() for task in parked), "a parked request was never answered"
    for task in parked:
        task.result()  # nothing escaped


async def cooperate(env: Env, group_id: str) -> list[asyncio.Task]:
    """The well-behaved part of the group: its leader syncs, its members heartbeat (so Stable is reached)."""
    group = env.group(group_id)
    if group is None or group.leader_id is None:
        return []
    for member_id in list(group.members):
        env.coordinator.handle_heartbeat(group_id, group.generation_id, member_id,
                                         group.members[member_id].group_instance_id)
    if group.state is not COMPLETING:
        return []
    leader = group.members[group.leader_id]
    req = SyncGroupRequest(group_id, group.generation_id, leader.member_id, leader.group_instance_id, "consumer",
                           group.protocol_name, [SyncGroupRequestAssignment(m, b"a") for m in group.members])
    return [asyncio.ensure_future(env.coordinator.sync_group(req))]


async def odd_request(env: Env, action: str, group_id: str, member_id: str, instance_id: str | None,
                      *args) -> list[asyncio.Task]:
    coord = env.coordinator
    if action == "join":
        protocols, session_ms, rebalance_ms, version = args
        req = JoinGroupRequest(group_id, session_ms, rebalance_ms, member_id, instance_id, "consumer",
                               [JoinGroupProtocol(n, m) for n, m in protocols], version=version)
        return [asyncio.ensure_future(coord.join_group(req))]
    generation = args[0]
    if action == "sync":
        assignments = [SyncGroupRequestAssignment(m, b"a") for m in member_id_pool(env)]
        req = SyncGroupRequest(group_id, generation, member_id, instance_id, "consumer", None, assignments)
        return [asyncio.ensure_future(coord.sync_group(req))]
    if action == "heartbeat":
        coord.handle_heartbeat(group_id, generation, member_id, instance_id)
    elif action == "leave":
        await coord.leave_group(LeaveGroupRequest(group_id, [MemberIdentity(member_id, instance_id),
                                                             MemberIdentity("", instance_id)]))
    else:
        await coord.commit_offsets(OffsetCommitRequest(
            group_id, generation, member_id, [OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 1)])],
            group_instance_id=instance_id))
    return []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ODD_ACTIONS, max_size=30))
def test_odd_requests_never_escape_and_never_hang(history: list[tuple]) -> None:
    asyncio.run(run_odd_history(history))


async def test_failed_static_replacement_write_does_not_undo_a_later_replacement(env: Env) -> None:
    # The instance restarts twice while the first replacement's write is in flight; that write then fails.
    # Reverting must not touch the member, which now belongs to the second replacement: its JoinGroup is
    # answered once its own write succeeds (Kafka's revert throws here and drops the second callback).
    a, s = env.client("a"), env.client("s", instance_id="is")
    await form_group(env, a, s)
    first_gate, second_gate = env.store.hold_next_write(), env.store.hold_next_write()
    env.store.fail_next_write(Errors.NOT_LEADER_OR_FOLLOWER)
    first, second = env.client("s", instance_id="is"), env.client("s", instance_id="is")
    await first.start_join()
    await second.start_join()
    assert first.take_join().error_code == Errors.FENCED_INSTANCE_ID
    first_gate.set()
    await drain()
    second_gate.set()
    await drain()
    resp = second.take_join()
    assert resp.error_code == Errors.NONE and env.group().static_members["is"] == resp.member_id
    assert env.state() is STABLE and await second.heartbeat() == Errors.NONE


async def test_failed_static_replacement_write_after_a_completed_rebalance_keeps_the_new_member(env: Env) -> None:
    # Seed 17830: the replacement's write times out only after a rebalance completed with the member under its new
    # id (its JoinGroup answered by that rebalance) and the new generation's record, naming the new id, was
    # acknowledged. Going back would leave memory with a generation no record holds and fence the live member with
    # the gone process's id; the newer generation's record already stores the new id: nothing to undo.
    a, s = env.client("a"), env.client("s", instance_id="is")
    await form_group(env, a, s)
    generation = s.generation
    gate = env.store.hold_next_write()
    restarted = env.client("s", instance_id="is")
    await restarted.start_join()  # Stable, same protocol: the replacement is written, no rebalance
    assert restarted.join_task is not None and not restarted.join_task.done()
    assert await a.leave() == Errors.NONE  # a rebalance while the replacement's write is in flight
    await advance_until_joined(env, restarted)
    joined = restarted.take_join()
    assert joined.error_code == Errors.NONE and joined.generation_id == generation + 1
    await restarted.start_sync({restarted.member_id: b"assignment"})
    await drain()
    assert restarted.sync_task is not None and restarted.sync_task.result().error_code == Errors.NONE
    assert env.state() is STABLE
    env.store.fail_next_write(Errors.REQUEST_TIMED_OUT)
    gate.set()  # the replacement's write fails now
    await drain()
    assert env.group().static_members["is"] == restarted.member_id
    assert [m.member_id for m in env.store.groups[env.group().group_id].members] == [restarted.member_id]
    assert env.state() is STABLE and await restarted.heartbeat() == Errors.NONE


async def _two_replacements_in_flight(env: Env) -> tuple[Client, Client, Client, Client, asyncio.Event,
                                                               asyncio.Event]:
    """Static members x and y Stable; both restart: x's replacement write A, then y's B (whose record carries
    x's new id), both in flight."""
    x, y = env.client("x", instance_id="ix"), env.client("y", instance_id="iy")
    await form_group(env, x, y)
    gate_a, gate_b = env.store.hold_next_write(), env.store.hold_next_write()
    x2, y2 = env.client("x", instance_id="ix"), env.client("y", instance_id="iy")
    await x2.start_join()
    await y2.start_join()
    assert x2.join_task is not None and not x2.join_task.done()
    assert y2.join_task is not None and not y2.join_task.done()
    return x, y, x2, y2, gate_a, gate_b


def _stored_member_ids(env: Env) -> set[str]:
    return {m.member_id for m in env.store.groups[env.group().group_id].members}


@pytest.mark.parametrize("later", ["acked_first", "acked_after", "failed_after"])
async def test_failed_static_replacement_write_is_held_by_a_later_write_carrying_its_id(env: Env,
                                                                                        later: str) -> None:
    # Seed 36710: x's replacement write A times out while y's replacement write B, whose record names x's new id,
    # is in flight. Reverting x at once left memory (x's old id, y's new id), a state no record holds, and B, if
    # acknowledged, stores x's new id all the same. The revert waits for B: B acknowledged (before or after A's
    # failure), x's new id is stored and x2 is answered with it; B failed too, both go back.
    x, y, x2, y2, gate_a, gate_b = await _two_replacements_in_flight(env)
    group = env.group()
    holds = list(group.replacement_holds or ())
    assert len(holds) == 2
    new_x, new_y = group.static_members["ix"], group.static_members["iy"]
    assert {new_x, new_y} & {x.member_id, y.member_id} == set()
    if later == "acked_first":
        gate_b.set()
        await drain()
        assert y2.take_join().error_code == Errors.NONE and _stored_member_ids(env) == {new_x, new_y}
    env.store.fail_next_write(Errors.REQUEST_TIMED_OUT)
    gate_a.set()  # A fails (its outcome unknown)
    await drain()
    if later != "acked_first":
        # held: memory is B's record, still in flight; x2 waits for B's outcome
        assert (group.static_members["ix"], group.static_members["iy"]) == (new_x, new_y)
        assert x2.join_task is not None and not x2.join_task.done()
        if later == "failed_after":
            env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
        gate_b.set()
        await drain()
    if later == "failed_after":
        assert x2.take_join().error_code == Errors.REBALANCE_IN_PROGRESS  # A's own error (3.9's mapping)
        assert y2.take_join().error_code == Errors.COORDINATOR_NOT_AVAILABLE
        assert (group.static_members["ix"], group.static_members["iy"]) == (x.member_id, y.member_id)
        assert _stored_member_ids(env) == {x.member_id, y.member_id}
        assert await x.heartbeat() == Errors.NONE and await y.heartbeat() == Errors.NONE
    else:
        if later == "acked_after":
            assert y2.take_join().error_code == Errors.NONE
        joined = x2.take_join()
        assert joined.error_code == Errors.NONE and joined.member_id == new_x
        assert (group.static_members["ix"], group.static_members["iy"]) == (new_x, new_y)
        assert _stored_member_ids(env) == {new_x, new_y}
        assert await x2.heartbeat() == Errors.NONE and await x.heartbeat() == Errors.FENCED_INSTANCE_ID
    assert env.state() is STABLE and group.replacement_holds is None
    # a decided hold lets go of the join's decision, which refers to it: no cycle for the collector to find
    assert all(hold.on_settled is None for hold in holds)
    check_group(group)


async def test_earlier_static_replacement_write_does_not_answer_the_later_join(env: Env) -> None:
    # Same double restart, both writes succeed: the first write's completion must not hand its (fenced)
    # member id to the second JoinGroup, which is now the member's parked request (Kafka answers the
    # member's current callback, so the second client would be told the first, fenced, id).
    a, s = env.client("a"), env.client("s", instance_id="is")
    await form_group(env, a, s)
    first_gate, second_gate = env.store.hold_next_write(), env.store.hold_next_write()
    first, second = env.client("s", instance_id="is"), env.client("s", instance_id="is")
    await first.start_join()
    await second.start_join()
    assert first.take_join().error_code == Errors.FENCED_INSTANCE_ID
    first_gate.set()
    await drain()
    second_gate.set()
    await drain()
    resp = second.take_join()
    assert resp.error_code == Errors.NONE and resp.member_id == env.group().static_members["is"]
    assert await second.heartbeat() == Errors.NONE


async def test_duplicate_partitions_are_answered_once(env: Env) -> None:
    # Kafka keys a request's partitions by TopicPartition (the last duplicate wins) and answers each once.
    req = OffsetCommitRequest("s", -1, "", [
        OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 1), OffsetCommitRequestPartition(0, 2)]),
        OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(1, 3)])])
    resp = await env.coordinator.commit_offsets(req)
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in resp.topics] == [("t", [0, 1])]
    fetched = await env.coordinator.fetch_offsets(OffsetFetchRequest("s", [OffsetFetchRequestTopic("t", [0, 0, 1])]))
    assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in fetched.topics] == [
        ("t", [(0, 2), (1, 3)])]
    too_large = "x" * (env.config.offset_metadata_max_bytes + 1)
    resp = await env.coordinator.commit_offsets(OffsetCommitRequest("s", -1, "", [OffsetCommitRequestTopic("t", [
        OffsetCommitRequestPartition(0, 7), OffsetCommitRequestPartition(0, 8, committed_metadata=too_large)])]))
    assert errors_of(resp) == [Errors.OFFSET_METADATA_TOO_LARGE] and env.group("s").offsets[("t", 0)].offset == 2


async def test_join_phase_ending_after_unload_reports_no_member_failures(env: Env) -> None:
    # Kafka's onCompleteJoin on an unloaded (Dead) group drops the non-rejoined members silently; here that
    # must not reach the observer as member failures (the event topic would record failures that never were).
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    leader = a if a.is_leader else b
    await leader.start_join()  # a rebalance the follower never joins
    assert env.state() is PREPARING
    env.coordinator.unload_group(env.group())
    await drain()
    assert leader.take_join().error_code == Errors.NOT_COORDINATOR
    await env.advance(REBALANCE_MS + 1_000, step_ms=5_000)
    assert env.observer.of("failed") == []
    assert env.coordinator.rebalance_purgatory.delayed == 0


async def test_initial_delay_is_not_extended_for_an_unloaded_group(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    await a.start_join()
    await b.start_join()  # a new member during the first window: the delay would be extended
    assert env.group().new_member_added
    env.coordinator.unload_group(env.group())
    await env.advance(env.config.group_initial_rebalance_delay_ms)
    assert env.coordinator.rebalance_purgatory.delayed == 0 and env.timer.size == 0


async def test_unload_leaves_no_timer_entries(env: Env) -> None:
    # Everything the group had in the timer (its join phase, member sessions, KIP-394 pending members) goes
    # with it; Kafka leaves them to expire later against the Dead group.
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    leader = a if a.is_leader else b
    await leader.start_join()
    pending = await env.coordinator.join_group(env.client("p").join_request())
    assert pending.error_code == Errors.MEMBER_ID_REQUIRED and env.state() is PREPARING
    env.coordinator.unload_group(env.group())
    await drain()
    assert env.coordinator.rebalance_purgatory.delayed == 0
    assert env.coordinator.heartbeat_purgatory.delayed == 0
    assert env.timer.size == 0


async def test_deleting_a_group_with_pending_members_leaves_no_timer_entries(env: Env) -> None:
    pending = await env.coordinator.join_group(env.client("p").join_request())
    assert pending.error_code == Errors.MEMBER_ID_REQUIRED and env.state() is EMPTY
    resp = await env.coordinator.delete_groups(DeleteGroupsRequest(["g"]))
    assert resp.results[0].error_code == Errors.NONE and env.group() is None
    assert env.coordinator.heartbeat_purgatory.delayed == 0 and env.timer.size == 0


async def test_heartbeats_touch_the_timer_once_per_session_timeout(env: Env) -> None:
    # The per-heartbeat cost guard: a heartbeat moves a deadline; the timer sees one DelayedHeartbeat per
    # member per session timeout, however often the member heartbeats.
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    purgatory, watches = env.coordinator.heartbeat_purgatory, []
    original = purgatory.try_complete_else_watch

    def counting(op, keys):
        watches.append(op)
        return original(op, keys)

    purgatory.try_complete_else_watch = counting
    timer_size = env.timer.size
    for _ in range(200):  # 20 s of heartbeats every 100 ms: two session timeouts
        for c in (a, b):
            assert env.coordinator.handle_heartbeat("g", c.generation, c.member_id) == Errors.NONE
        env.clock.advance(100)
        env.timer.advance_clock()
    assert len(watches) <= 2 * 2 and env.timer.size == timer_size and env.state() is STABLE


async def test_stable_group_without_protocol_name_keeps_its_offsets() -> None:
    # Kafka's computeSubscribedTopics is None (unknown) when a consumer group has members but no protocol
    # name (an old or odd record): then nothing expires while the group is Stable.
    env = Env(offsets_retention_minutes=1)
    try:
        coord, now_ms = env.coordinator, env.clock.now_ms()
        member = MemberRecord("m0", None, "c0", "/10.0.0.1", 30_000, 10_000, subscription("t"), b"")
        coord.begin_loading()
        await env.load({"g": GroupRecord("consumer", 3, None, "m0", now_ms, [member])},
                       {"g": {("u", 0): OffsetRecord(5, -1, "", now_ms)}})
        assert env.state() is STABLE and env.group().subscribed_topics is None
        for _ in range(13):
            env.clock.advance(5_000)
            assert coord.handle_heartbeat("g", 3, "m0") == Errors.NONE
        assert await coord.expire_offsets() == 0 and ("u", 0) in env.group().offsets
    finally:
        await env.close()


def test_malformed_subscriptions_leave_the_topics_unknown() -> None:
    # Kafka parses ConsumerProtocolSubscription v0 (topics, then user data); what does not parse leaves the
    # subscribed topics unknown (None), so no offset expires while the group is Stable. A null topic array
    # is malformed, not "no topics" (which would let every offset of a Stable group expire).
    good = subscription("a", "b")
    assert parse_subscription_topics(good) == ["a", "b"]
    assert parse_subscription_topics(struct.pack(">hi", 0, -1) + struct.pack(">i", -1)) is None
    assert parse_subscription_topics(good[:-4]) is None  # user data missing
    assert parse_subscription_topics(good[:-4] + struct.pack(">i", 5) + b"ab") is None  # user data cut short
    assert parse_subscription_topics(struct.pack(">hih", 1, 1, 2) + b"\xff\xfe" + struct.pack(">i", -1)) == [
        "\ufffd\ufffd"]  # Java decodes malformed UTF-8 with replacement characters


async def test_one_corrupt_group_record_does_not_stop_the_load(env: Env) -> None:
    # Two members claiming one group.instance.id cannot be materialised (Kafka's loadGroup throws and the
    # whole partition's load fails); the other groups still load.
    coord, now_ms = env.coordinator, env.clock.now_ms()
    twins = [MemberRecord(f"m{i}", "same", f"c{i}", "/10.0.0.1", 30_000, 10_000, subscription("t"), b"")
             for i in range(2)]
    good = MemberRecord("m0", None, "c0", "/10.0.0.1", 30_000, 10_000, subscription("t"), b"")
    coord.begin_loading()
    await env.load({"bad": GroupRecord("consumer", 2, "range", "m0", now_ms, twins),
                    "good": GroupRecord("consumer", 2, "range", "m0", now_ms, [good])},
                   {"simple": {("t", 0): OffsetRecord(1, -1, "", now_ms)}})
    assert not coord.is_loading and env.group("bad") is None
    assert env.state("good") is STABLE and env.state("simple") is EMPTY


async def test_reverted_static_replacement_is_announced(env: Env) -> None:
    # The observer heard "replaced old -> new" when the replacement was made; when its write fails and the
    # replacement is undone, it hears "replaced new -> old", so the event stream ends where the group does.
    a, s = env.client("a"), env.client("s", instance_id="is")
    await form_group(env, a, s)
    env.store.fail_next_write(Errors.NOT_LEADER_OR_FOLLOWER)
    restarted = env.client("s", instance_id="is")
    await restarted.start_join()
    assert restarted.take_join().error_code == Errors.NOT_COORDINATOR
    (_, _, old, new, instance), (_, _, back_from, back_to, _) = env.observer.of("replaced")
    assert (old, instance) == (s.member_id, "is") and (back_from, back_to) == (new, old)
