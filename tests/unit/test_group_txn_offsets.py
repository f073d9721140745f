"""Transactional offsets pending until their marker (Kafka's OffsetMetadataManager rules) and TxnOffsetCommit's
KIP-447 checks, on a real runtime with a manual clock."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.topics import StaticTopics, TopicImage
from coordinator.group.api import DeleteGroupsRequest, OffsetDeleteRequest, OffsetDeleteRequestTopic
from coordinator.group.records import OffsetCommitRecord, OffsetRecord
from coordinator.group.shard import GroupShard
from coordinator.group.state import GroupState
from coordinator.group.status import ShardStatus
from coordinator.group.txn_commit import TxnOffsetCommitIdentity, txn_append_error, validate_transactional_offset_commit
from coordinator.group.txn_offsets import (ClientTransactionalBatch, EndTransactionMarker, OwnOffsetTombstone,
                                            replay_end_transaction, replay_transaction_events,
                                            nothing_to_restore, replay_transactional_offsets, tombstone_landed)
from protocol.error_codes import Errors
from tests.support.group_harness import Env, commit, env, errors_of, fetch, form_group  # noqa: F401

PID, OTHER_PID, EPOCH = 4000, 4001, 0


def offset_records(group_id: str, offsets: dict[tuple[str, int], int], base_offset: int,
                   commit_ms: int = 1_000_000) -> list[tuple[int, OffsetCommitRecord]]:
    """A batch's offset commit records at consecutive log offsets from `base_offset`."""
    return [(base_offset + i, OffsetCommitRecord(group_id, topic, partition,
                                                 OffsetRecord(offset, commit_timestamp_ms=commit_ms)))
            for i, ((topic, partition), offset) in enumerate(offsets.items())]


def shard_of(env: Env, group_id: str) -> GroupShard:
    return env.coordinator.shard_for(group_id)


async def test_pending_offsets_are_invisible_until_commit_and_unstable_for_require_stable(env: Env) -> None:
    shard = shard_of(env, "s")
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 5, ("t", 1): 6}, 10))
    assert env.state("s") is GroupState.EMPTY  # a simple group, as Kafka's replay creates
    assert await fetch(env, "s", {"t": [0, 1, 2]}) == {
        ("t", 0): (-1, "", Errors.NONE), ("t", 1): (-1, "", Errors.NONE), ("t", 2): (-1, "", Errors.NONE)}
    assert await fetch(env, "s", {"t": [0, 2]}, require_stable=True) == {
        ("t", 0): (-1, "", Errors.UNSTABLE_OFFSET_COMMIT), ("t", 2): (-1, "", Errors.NONE)}
    assert replay_end_transaction(shard, PID, EPOCH, True, 12) == 2
    assert await fetch(env, "s", {"t": [0, 1]}, require_stable=True) == {
        ("t", 0): (5, "", Errors.NONE), ("t", 1): (6, "", Errors.NONE)}
    assert env.group("s").offsets[("t", 0)].log_offset == 10
    assert env.group("s").offsets[("t", 1)].log_offset == 11


async def test_abort_drops_pending_offsets_and_keeps_the_current_one(env: Env) -> None:
    await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 3}))
    shard = shard_of(env, "s")
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 9}, 20))
    assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (3, "", Errors.NONE)}
    assert replay_end_transaction(shard, PID, EPOCH, False, 21) == 0
    assert await fetch(env, "s", {"t": [0]}, require_stable=True) == {("t", 0): (3, "", Errors.NONE)}
    assert not shard.transactional_offsets.has_open_transactions("s")


async def test_commit_keeps_the_offset_whose_record_is_later_in_the_log(env: Env) -> None:
    shard = shard_of(env, "s")
    group = shard.add_group("s")
    group.offsets[("t", 0)] = OffsetRecord(7, log_offset=50)  # loaded: a regular commit at offset 50
    group.offsets[("t", 1)] = OffsetRecord(7, log_offset=30)
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 4, ("t", 1): 4}, 40))
    assert replay_end_transaction(shard, PID, EPOCH, True, 60) == 1
    assert group.offsets[("t", 0)].offset == 7  # the regular commit after the transactional one wins
    assert group.offsets[("t", 1)].offset == 4


async def test_a_regular_commit_made_after_the_pending_offset_wins_over_it(env: Env) -> None:
    shard = shard_of(env, "s")
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 4}, 10))
    await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 8}))
    replay_end_transaction(shard, PID, EPOCH, True, 11)
    assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (8, "", Errors.NONE)}


async def test_producers_are_settled_independently_and_a_stray_marker_changes_nothing(env: Env) -> None:
    shard = shard_of(env, "s")
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 1}, 10))
    replay_transactional_offsets(shard, OTHER_PID, EPOCH, offset_records("s", {("t", 0): 2, ("t", 1): 2}, 11))
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 3}, 13))  # same txn, later
    assert replay_end_transaction(shard, 9999, EPOCH, True, 14) == 0
    replay_end_transaction(shard, OTHER_PID, EPOCH, False, 15)
    assert await fetch(env, "s", {"t": [0, 1]}, require_stable=True) == {
        ("t", 0): (-1, "", Errors.UNSTABLE_OFFSET_COMMIT), ("t", 1): (-1, "", Errors.NONE)}
    replay_end_transaction(shard, PID, EPOCH, True, 16)
    assert await fetch(env, "s", {"t": [0, 1]}, require_stable=True) == {
        ("t", 0): (3, "", Errors.NONE), ("t", 1): (-1, "", Errors.NONE)}


async def test_a_tombstone_in_the_log_drops_current_and_pending_offsets(env: Env) -> None:
    shard = shard_of(env, "s")
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 1, ("t", 1): 1}, 10))
    replay_transactional_offsets(shard, OTHER_PID, EPOCH, [(12, OffsetCommitRecord("s", "t", 0, None))])
    assert not shard.transactional_offsets.has_pending("s", ("t", 0))
    replay_end_transaction(shard, PID, EPOCH, True, 13)
    assert await fetch(env, "s", {"t": [0, 1]}) == {("t", 0): (-1, "", Errors.NONE), ("t", 1): (1, "", Errors.NONE)}


async def test_expiry_skips_partitions_with_pending_offsets_and_keeps_the_group() -> None:
    env = Env(offsets_retention_minutes=1)
    try:
        await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1, ("t", 1): 1}))
        shard = shard_of(env, "s")
        replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 2, ("u", 0): 2}, 10))
        await env.advance(61_000, step_ms=10_000)
        assert await env.coordinator.expire_offsets() == 1  # ("t", 1) only
        assert env.group("s") is not None and list(env.group("s").offsets) == [("t", 0)]
        replay_end_transaction(shard, PID, EPOCH, False, 11)
        assert await env.coordinator.expire_offsets() == 1
        assert env.group("s") is None  # Empty, no offsets and no open transaction: retired
    finally:
        await env.close()


async def test_an_open_transaction_keeps_an_empty_group_without_offsets() -> None:
    env = Env(offsets_retention_minutes=1)
    try:
        shard = shard_of(env, "s")
        replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 2}, 10))
        await env.advance(61_000, step_ms=10_000)
        assert await env.coordinator.expire_offsets() == 0
        assert env.group("s") is not None
        replay_end_transaction(shard, PID, EPOCH, True, 11)
        assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (2, "", Errors.NONE)}
    finally:
        await env.close()


async def test_offset_delete_writes_a_tombstone_for_a_pending_only_partition_and_drops_it(env: Env) -> None:
    shard = shard_of(env, "s")
    await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 1): 1}))
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 2}, 10))
    writes_before = len(env.store.writes)
    resp = await env.coordinator.delete_offsets(OffsetDeleteRequest("s", [OffsetDeleteRequestTopic("t", [0, 2])]))
    assert [p.error_code for t in resp.topics for p in t.partitions] == [Errors.NONE, Errors.NONE]
    tombstoned = [(r.topic, r.partition) for w in env.store.writes[writes_before:] for r in w
                  if isinstance(r, OffsetCommitRecord) and r.value is None]
    assert tombstoned == [("t", 0)]  # pending only: tombstoned; ("t", 2) had nothing
    replay_end_transaction(shard, PID, EPOCH, True, 12)
    assert await fetch(env, "s", {"t": [0, 1]}) == {("t", 0): (-1, "", Errors.NONE), ("t", 1): (1, "", Errors.NONE)}


async def test_delete_groups_tombstones_pending_offsets_and_a_late_commit_does_not_revive_the_group(env: Env) -> None:
    shard = shard_of(env, "s")
    await env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 1}))
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 2, ("t", 1): 2}, 10))
    writes_before = len(env.store.writes)
    resp = await env.coordinator.delete_groups(DeleteGroupsRequest(["s"]))
    assert [r.error_code for r in resp.results] == [Errors.NONE]
    tombstoned = sorted((r.topic, r.partition) for w in env.store.writes[writes_before:] for r in w
                        if isinstance(r, OffsetCommitRecord) and r.value is None)
    assert tombstoned == [("t", 0), ("t", 1)]
    assert replay_end_transaction(shard, PID, EPOCH, True, 12) == 0
    assert env.group("s") is None


async def test_unloading_forgets_pending_offsets(env: Env) -> None:
    shard = shard_of(env, "s")
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 2}, 10))
    shard.producer_sequences.observed_batch(PID, EPOCH, 0)
    for _ in shard.unload_stepwise():
        pass
    assert not shard.transactional_offsets.has_open_transactions("s")
    assert shard.producer_sequences.next_sequence(PID, EPOCH) == 0


# --- KIP-447 validation ------------------------------------------------------------------------------------
def identity(group_id: str, generation: int = -1, member_id: str = "", instance_id: str | None = None,
             version: int = 3) -> TxnOffsetCommitIdentity:
    return TxnOffsetCommitIdentity("txn", PID, EPOCH, group_id, generation, member_id, instance_id, version)


async def test_unknown_group_by_generation(env: Env) -> None:
    group, error = validate_transactional_offset_commit(shard_of(env, "new"), identity("new"))
    assert error is None and group is env.group("new") and group.is_in(GroupState.EMPTY)
    group, error = validate_transactional_offset_commit(shard_of(env, "other"), identity("other", generation=1))
    assert (group, error) == (None, Errors.ILLEGAL_GENERATION) and env.group("other") is None


async def test_members_generations_and_instances_of_a_classic_group(env: Env) -> None:
    a = env.client("a")
    await form_group(env, a)
    shard = shard_of(env, "g")
    cases = [(identity("g", a.generation, a.member_id), None),
             (identity("g", a.generation + 1, a.member_id), Errors.ILLEGAL_GENERATION),
             (identity("g", a.generation, "stranger"), Errors.UNKNOWN_MEMBER_ID),
             (identity("g", a.generation, a.member_id, instance_id="unknown-instance"), Errors.UNKNOWN_MEMBER_ID),
             # v0-2 carry no member: accepted on a non-empty group (unlike OffsetCommit)
             (identity("g", version=2), None),
             (identity("", version=3), Errors.INVALID_GROUP_ID)]
    for request, expected in cases:
        assert validate_transactional_offset_commit(shard_of(env, request.group_id), request)[1] == expected, request
    await env.client("b").start_join()  # a rebalance in progress does not refuse a transactional commit
    assert env.state() is GroupState.PREPARING_REBALANCE
    assert validate_transactional_offset_commit(shard, identity("g", a.generation, a.member_id))[1] is None


async def test_static_member_fenced(env: Env) -> None:
    a = env.client("a", instance_id="i-a")
    await form_group(env, a)
    error = validate_transactional_offset_commit(shard_of(env, "g"), identity("g", a.generation, "other", "i-a"))[1]
    assert error == Errors.FENCED_INSTANCE_ID


async def test_coordinator_status_errors(env: Env) -> None:
    for status, expected in [(ShardStatus.LOADING, Errors.COORDINATOR_LOAD_IN_PROGRESS),
                             (ShardStatus.UNOWNED, Errors.NOT_COORDINATOR)]:
        env.set_status(status, "g")
        assert validate_transactional_offset_commit(shard_of(env, "g"), identity("g"))[1] == expected


def test_append_errors_per_version() -> None:
    assert txn_append_error(Errors.TRANSACTION_ABORTABLE, 3) == Errors.INVALID_TXN_STATE
    assert txn_append_error(Errors.TRANSACTION_ABORTABLE, 4) == Errors.TRANSACTION_ABORTABLE
    assert txn_append_error(Errors.PRODUCER_FENCED, 2) == Errors.INVALID_PRODUCER_EPOCH
    assert txn_append_error(Errors.PRODUCER_FENCED, 5) == Errors.PRODUCER_FENCED
    assert txn_append_error(Errors.REQUEST_TIMED_OUT, 3) == Errors.COORDINATOR_NOT_AVAILABLE
    assert txn_append_error(Errors.NOT_LEADER_OR_FOLLOWER, 5) == Errors.NOT_COORDINATOR
    assert txn_append_error(Errors.INVALID_PRODUCER_EPOCH, 3) == Errors.INVALID_PRODUCER_EPOCH


async def test_a_consumer_groups_stale_member_epoch_is_an_illegal_generation() -> None:
    env = Env()
    try:
        env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(uuid.UUID(int=0xF00), "t", 2)])
        joined = await env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
            "cg", "m1", 0, subscribed_topic_names=("t",), owned=[], client_id="m1", client_host="/127.0.0.1",
            rebalance_timeout_ms=30_000))
        assert joined.error == Errors.NONE and joined.member_epoch > 0
        shard = shard_of(env, "cg")
        cases = [(identity("cg", joined.member_epoch, "m1", version=3), None),  # no OffsetCommit v9 floor
                 (identity("cg", joined.member_epoch + 1, "m1"), Errors.ILLEGAL_GENERATION),
                 (identity("cg", joined.member_epoch, "m2"), Errors.UNKNOWN_MEMBER_ID)]
        for request, expected in cases:
            assert validate_transactional_offset_commit(shard, request)[1] == expected, request
    finally:
        await env.close()


async def test_a_marker_settles_only_what_came_before_it_in_the_log(env: Env) -> None:
    """The handler replays a producer's next transaction (its batch acknowledged) before the partition's reader
    reached the previous transaction's COMMIT marker: the marker makes the earlier offsets current and leaves the
    later ones pending for their own marker (an ABORT here)."""
    shard = shard_of(env, "s")
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 11}, 50))  # transaction 1
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 12, ("t", 1): 12}, 58))
    assert replay_end_transaction(shard, PID, EPOCH, True, 51) == 1  # transaction 1's COMMIT
    assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (11, "", Errors.NONE)}
    assert await fetch(env, "s", {"t": [0, 1]}, require_stable=True) == {
        ("t", 0): (-1, "", Errors.UNSTABLE_OFFSET_COMMIT), ("t", 1): (-1, "", Errors.UNSTABLE_OFFSET_COMMIT)}
    assert replay_end_transaction(shard, PID, EPOCH, False, 60) == 0  # transaction 2's ABORT
    assert await fetch(env, "s", {"t": [0, 1]}, require_stable=True) == {
        ("t", 0): (11, "", Errors.NONE), ("t", 1): (-1, "", Errors.NONE)}
    assert not shard.transactional_offsets.has_open_transactions("s")


async def test_a_batch_below_our_tombstone_replayed_after_it_is_never_pending(env: Env) -> None:
    """The handler hears the batch's acknowledgement after the tombstone of its partition landed after it: Kafka's
    replay dropped it at the tombstone, so it is neither pending nor made current by its COMMIT."""
    shard = shard_of(env, "s")
    shard.transactional_offsets.read_to = 10
    shard.transactional_offsets.sending("s", [("t", 0)])  # the TxnOffsetCommit's Produce goes
    tombstone_landed(shard, "s", ("t", 0), 12)
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 7, ("t", 1): 7}, 10))
    assert shard.transactional_offsets.pending_partitions("s") == [("t", 1)]
    assert replay_end_transaction(shard, PID, EPOCH, True, 13) == 1
    assert await fetch(env, "s", {"t": [0, 1]}) == {("t", 0): (-1, "", Errors.NONE), ("t", 1): (7, "", Errors.NONE)}


async def test_a_tombstone_reported_after_the_commit_deletes_what_came_before_it_only(env: Env) -> None:
    """The tail read the COMMIT before the tombstone's delivery report came: the offset current by it is deleted
    (its record is before the tombstone); a pending offset after the tombstone and a regular commit after it stay."""
    shard = shard_of(env, "s")
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 7}, 10))
    replay_transactional_offsets(shard, OTHER_PID, EPOCH, offset_records("s", {("t", 0): 8, ("t", 1): 8}, 20))
    replay_end_transaction(shard, PID, EPOCH, True, 11)
    tombstone_landed(shard, "s", ("t", 0), 15)
    tombstone_landed(shard, "s", ("t", 1), 15)
    assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (-1, "", Errors.NONE)}
    assert replay_end_transaction(shard, OTHER_PID, EPOCH, True, 22) == 2
    assert await fetch(env, "s", {"t": [0, 1]}) == {("t", 0): (8, "", Errors.NONE), ("t", 1): (8, "", Errors.NONE)}


async def test_our_tombstones_are_kept_until_the_reader_passes_them(env: Env) -> None:
    """Only for groups with clients' transactions: a partition without them has no reader that moves on."""
    shard = shard_of(env, "s")
    txns = shard.transactional_offsets
    replay_transaction_events(shard, [], 10)
    tombstone_landed(shard, "plain", ("t", 0), 11)
    txns.sending("s", [("t", 0)])
    tombstone_landed(shard, "s", ("t", 0), 12)
    tombstone_landed(shard, "s", ("t", 0), 5)  # already passed: nothing below it is replayed again
    assert txns.tombstones == {("s", ("t", 0)): 12}
    replay_transaction_events(shard, [], 12)
    assert txns.tombstones == {("s", ("t", 0)): 12}
    replay_transaction_events(shard, [], 13)
    assert txns.tombstones == {}


async def test_a_batch_deleted_after_the_handler_replayed_it_stays_deleted_when_the_reader_reads_it(env: Env) -> None:
    """Seed 18: the handler replays a producer's next batch (82) before the reader reached the previous
    transaction's ABORT (81); a delete drops it; the ABORT settles nothing else, and the reader then reads the
    batch: replayed once already, it is not pending again, and its COMMIT makes nothing current."""
    shard = shard_of(env, "s")
    replay_transaction_events(shard, [], 80)
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 68}, 82))
    await env.coordinator.delete_offsets(OffsetDeleteRequest("s", [OffsetDeleteRequestTopic("t", [0])]))
    replay_transaction_events(shard, [EndTransactionMarker(PID, EPOCH, False, 81),
                                      ClientTransactionalBatch(PID, EPOCH, 0, 82, tuple(offset_records(
                                          "s", {("t", 0): 68}, 82)))], 83)
    assert not shard.transactional_offsets.has_pending("s", ("t", 0))
    replay_transaction_events(shard, [EndTransactionMarker(PID, EPOCH, True, 90)], 91)
    assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (-1, "", Errors.NONE)}


async def test_a_commit_read_while_our_tombstone_is_in_flight_waits_for_where_it_landed(env: Env) -> None:
    """Seed 362: the tail read the COMMIT (11) that follows our tombstone (10) before the tombstone's
    acknowledgement came; the offset the COMMIT settles (9) stays pending until the tombstone is answered, then
    is dropped by it (before it in the log) or made current (after it, or the attempt failed)."""
    shard = shard_of(env, "s")
    txns = shard.transactional_offsets
    in_flight = {("s", ("t", 0)), ("s", ("t", 1))}
    txns.tombstone_in_flight = lambda group_id, tp: (group_id, tp) in in_flight
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 4, ("t", 1): 4}, 8))
    assert replay_end_transaction(shard, PID, EPOCH, True, 11) == 0
    assert txns.has_open_transactions("s")  # the group is not retired meanwhile (seed 1818)
    assert await fetch(env, "s", {"t": [0, 1]}, require_stable=True) == {
        ("t", 0): (-1, "", Errors.UNSTABLE_OFFSET_COMMIT), ("t", 1): (-1, "", Errors.UNSTABLE_OFFSET_COMMIT)}
    in_flight.clear()
    tombstone_landed(shard, "s", ("t", 0), 10)  # after its record (8): dropped
    tombstone_landed(shard, "s", ("t", 1), None)  # that attempt failed: the offset stands
    assert await fetch(env, "s", {"t": [0, 1]}, require_stable=True) == {
        ("t", 0): (-1, "", Errors.NONE), ("t", 1): (4, "", Errors.NONE)}


async def test_our_tombstone_read_by_the_tail_drops_what_came_before_it_whatever_its_acknowledgement_said(
        env: Env) -> None:
    """Seed 442: our tombstone (58) landed after the client's batch (57) but its acknowledgement was lost, and the
    application's next TxnOffsetCommit superseded its retry: memory heard only "failed". The tail reads it in log
    order, so the COMMIT (59) makes nothing current; on a partition whose COMMIT was read first and held for a
    tombstone in flight (then superseded), the tail's read of the tombstone after it deletes the offset."""
    shard = shard_of(env, "s")
    txns = shard.transactional_offsets
    in_flight = {("s", ("t", 0)), ("s", ("t", 1))}
    txns.tombstone_in_flight = lambda group_id, tp: (group_id, tp) in in_flight
    replay_transaction_events(shard, [], 50)
    txns.sending("s", [("t", 0), ("t", 1)])
    replay_transactional_offsets(shard, PID, EPOCH, offset_records("s", {("t", 0): 11}, 57))  # the handler's
    replay_transaction_events(shard, [
        ClientTransactionalBatch(PID, EPOCH, 0, 57, tuple(offset_records("s", {("t", 0): 11}, 57))),
        OwnOffsetTombstone("s", ("t", 0), 58, 58), EndTransactionMarker(PID, EPOCH, True, 59)], 60)
    in_flight.discard(("s", ("t", 0)))
    tombstone_landed(shard, "s", ("t", 0), None)  # the lost acknowledgement, then the retry superseded
    assert await fetch(env, "s", {"t": [0]}, require_stable=True) == {("t", 0): (-1, "", Errors.NONE)}

    replay_transaction_events(shard, [
        ClientTransactionalBatch(OTHER_PID, EPOCH, 0, 61, tuple(offset_records("s", {("t", 1): 12}, 61))),
        EndTransactionMarker(OTHER_PID, EPOCH, True, 62)], 63)
    assert await fetch(env, "s", {"t": [1]}, require_stable=True) == {
        ("t", 1): (-1, "", Errors.UNSTABLE_OFFSET_COMMIT)}  # held: our tombstone of it is in flight
    in_flight.clear()
    replay_transaction_events(shard, [OwnOffsetTombstone("s", ("t", 1), 64, 64)], 65)
    tombstone_landed(shard, "s", ("t", 1), None)
    assert await fetch(env, "s", {"t": [1]}, require_stable=True) == {("t", 1): (-1, "", Errors.NONE)}
    replay_transaction_events(shard, [OwnOffsetTombstone("s", ("t", 0), 40, 40)], 66)  # read before: ignored
    assert not txns.tombstones and not txns.held


async def test_a_clients_batch_goes_out_only_once_our_tombstones_of_its_offsets_are_answered(env: Env) -> None:
    """Kafka appends in the order it handles requests and never sends a failed tombstone again: a tombstone of
    ours already sent lands before the client's batch (or fails and is superseded by it), never after it."""
    shard = shard_of(env, "s")
    txns = shard.transactional_offsets
    answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    asked: list[list[tuple[str, int]]] = []

    def unanswered(group_id: str, partitions: list[tuple[str, int]]) -> asyncio.Future[None] | None:
        asked.append(partitions)
        return None if answered.done() else answered

    txns.tombstones_answered = unanswered
    superseded: list[list[tuple[str, int]]] = []

    def supersede(group_id: str, partitions: list[tuple[str, int]]) -> Callable[[], None]:
        superseded.append(partitions)
        return nothing_to_restore

    txns.supersede_owed = supersede
    sending = asyncio.ensure_future(txns.sending_after_our_tombstones("s", [("t", 0)]))
    await asyncio.sleep(0)
    assert not sending.done() and not superseded
    answered.set_result(None)
    await asyncio.wait_for(sending, 5)
    assert superseded == [[("t", 0)]] and asked == [[("t", 0)], [("t", 0)]]
