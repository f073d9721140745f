"""What the partition tail hands a shard (coordinator/storage/txn_tail.py → group/txn_offsets.py
`replay_transaction_events`): fetched batches named a client's or ours, the handler's replay at the Produce answer
and the tail's read-back of the same batch applied once, a late replay below the tail's position ignored, and
our own regular commits ordered against a client's by their records' offsets (the append reports them)."""
from __future__ import annotations

import asyncio

from coordinator.group.records import OffsetCommitRecord, OffsetRecord, Record
from coordinator.group.store import InMemoryGroupStore
from coordinator.group.txn_offsets import (ClientTransactionalBatch, EndTransactionMarker, OwnOffsetTombstone,
                                           replay_transaction_events, replay_transactional_offsets)
from coordinator.storage.records import OffsetCommitKey, encode_key, encode_offset_commit_value
from coordinator.storage.txn_tail import ProducerOwners, TailReader, transaction_events
from protocol.error_codes import Errors
from protocol.fetch_reader import FetchedBatch, FetchedRecord, MarkerType
from tests.support.group_harness import Env, commit, drain, env, fetch  # noqa: F401

CLIENT, OURS, EPOCH = 4000, 17, 0


def records_at(base_offset: int, offsets: dict[int, int], group_id: str = "s"
               ) -> tuple[tuple[int, OffsetCommitRecord], ...]:
    return tuple((base_offset + i, OffsetCommitRecord(group_id, "t", partition, OffsetRecord(offset)))
                 for i, (partition, offset) in enumerate(offsets.items()))


def batch_at(base_offset: int, offsets: dict[int, int], producer_id: int = CLIENT) -> ClientTransactionalBatch:
    records = records_at(base_offset, offsets)
    return ClientTransactionalBatch(producer_id, EPOCH, len(records) - 1, records[-1][0], records)


async def test_the_tails_read_back_of_a_batch_the_handler_replayed_changes_nothing(env: Env) -> None:
    shard = env.coordinator.shard_for("s")
    replay_transactional_offsets(shard, CLIENT, EPOCH, records_at(10, {0: 5, 1: 6}))  # at the Produce answer
    learned = shard.transactional_offsets.by_producer[CLIENT].offsets["s"][("t", 0)].learned
    replay_transaction_events(shard, [batch_at(10, {0: 5, 1: 6})], 12)  # the tail reads it back
    pending = shard.transactional_offsets.by_producer[CLIENT].offsets["s"]
    assert pending[("t", 0)].learned == learned and len(pending) == 2
    assert shard.producer_sequences.next_sequence(CLIENT, EPOCH) == 2  # the log's sequence, from the read-back
    replay_transaction_events(shard, [EndTransactionMarker(CLIENT, EPOCH, True, 12)], 13)
    assert await fetch(env, "s", {"t": [0, 1]}, require_stable=True) == {
        ("t", 0): (5, "", Errors.NONE), ("t", 1): (6, "", Errors.NONE)}


async def test_the_log_has_the_last_word_on_a_record_replayed_twice(env: Env) -> None:
    """Another writer took our sequence: the broker answered our batch as the duplicate of its batch at 10."""
    shard = env.coordinator.shard_for("s")
    replay_transactional_offsets(shard, CLIENT, EPOCH, records_at(10, {0: 5}))  # what we sent, at the answer
    replay_transaction_events(shard, [batch_at(10, {0: 4})], 11)  # what the log holds there
    replay_transaction_events(shard, [EndTransactionMarker(CLIENT, EPOCH, True, 11)], 12)
    assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (4, "", Errors.NONE)}


async def test_a_replay_below_the_tails_position_is_one_it_settled_already(env: Env) -> None:
    shard = env.coordinator.shard_for("s")
    replay_transaction_events(shard, [batch_at(10, {0: 5}), EndTransactionMarker(CLIENT, EPOCH, False, 11)], 12)
    replay_transactional_offsets(shard, CLIENT, EPOCH, records_at(10, {0: 5}))  # the handler's answer, late
    assert not shard.transactional_offsets.has_open_transactions("s")  # not pending forever after its ABORT
    assert await fetch(env, "s", {"t": [0]}, require_stable=True) == {("t", 0): (-1, "", Errors.NONE)}


async def test_a_batch_the_tail_reads_after_the_handlers_later_one_is_not_replayed_over_it(env: Env) -> None:
    shard = env.coordinator.shard_for("s")
    replay_transaction_events(shard, [], 5)
    replay_transactional_offsets(shard, CLIENT, EPOCH, records_at(10, {0: 5}))
    replay_transactional_offsets(shard, CLIENT, EPOCH, records_at(11, {0: 6}))
    replay_transaction_events(shard, [batch_at(10, {0: 5}), batch_at(11, {0: 6})], 12)
    replay_transaction_events(shard, [EndTransactionMarker(CLIENT, EPOCH, True, 12)], 13)
    assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (6, "", Errors.NONE)}


async def test_a_marker_read_again_below_the_tails_position_settles_nothing(env: Env) -> None:
    """A tail that starts again from the log start reads a producer's old markers: its open transaction stays."""
    shard = env.coordinator.shard_for("s")
    replay_transaction_events(shard, [batch_at(10, {0: 5}), EndTransactionMarker(CLIENT, EPOCH, True, 11),
                                      batch_at(20, {0: 6})], 21)
    replay_transaction_events(shard, [batch_at(10, {0: 5}), EndTransactionMarker(CLIENT, EPOCH, True, 11)], 12)
    assert await fetch(env, "s", {"t": [0]}, require_stable=True) == {("t", 0): (-1, "", Errors.UNSTABLE_OFFSET_COMMIT)}
    replay_transaction_events(shard, [EndTransactionMarker(CLIENT, EPOCH, True, 21)], 22)
    assert await fetch(env, "s", {"t": [0]}, require_stable=True) == {("t", 0): (6, "", Errors.NONE)}


class OffsetReportingStore(InMemoryGroupStore):
    """Acknowledges with the records' log offsets, as the Kafka store's append reports them."""

    def __init__(self) -> None:
        super().__init__()
        self.next_log_offset = 0

    async def acknowledge(self, records: list[Record]) -> None:
        await super().acknowledge(records)
        for record in records:
            if isinstance(record, OffsetCommitRecord) and record.value is not None:
                record.value.log_offset = self.next_log_offset
                self.next_log_offset += 1


async def test_a_regular_commit_acknowledged_after_the_marker_but_later_in_the_log_wins() -> None:
    store = OffsetReportingStore()
    env = Env(store=store)
    try:
        shard = env.coordinator.shard_for("s")
        held = store.hold_next_write()
        regular = asyncio.ensure_future(env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 30})))
        await drain()
        replay_transaction_events(shard, [batch_at(10, {0: 9}), EndTransactionMarker(CLIENT, EPOCH, True, 12)], 13)
        assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (9, "", Errors.NONE)}
        store.next_log_offset = 15  # our record landed after the marker; its acknowledgement came later still
        held.set()
        await regular
        assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (30, "", Errors.NONE)}
    finally:
        await env.close()


async def test_a_regular_commit_earlier_in_the_log_loses_to_the_committed_transaction() -> None:
    store = OffsetReportingStore()
    env = Env(store=store)
    try:
        shard = env.coordinator.shard_for("s")
        held = store.hold_next_write()
        store.next_log_offset = 8
        regular = asyncio.ensure_future(env.coordinator.commit_offsets(commit("s", -1, "", {("t", 0): 30})))
        await drain()
        replay_transaction_events(shard, [batch_at(10, {0: 9})], 11)  # read before our acknowledgement
        held.set()
        await regular
        replay_transaction_events(shard, [EndTransactionMarker(CLIENT, EPOCH, True, 12)], 13)
        assert await fetch(env, "s", {"t": [0]}) == {("t", 0): (9, "", Errors.NONE)}
    finally:
        await env.close()


def fetched_batch(base_offset: int, producer_id: int, *, control: MarkerType | None = None,
                  transactional: bool = True, group: str = "s") -> FetchedBatch:
    records = () if control is not None else (FetchedRecord(
        base_offset, encode_key(OffsetCommitKey(group, "t", 0)), encode_offset_commit_value(OffsetRecord(4))),
        FetchedRecord(base_offset + 1, encode_key(OffsetCommitKey(group, "t", 1)), None))
    last = base_offset if control is not None else base_offset + 1
    return FetchedBatch(base_offset, last, producer_id, EPOCH, 3, transactional, control is not None, control,
                        records)


def test_fetched_batches_become_a_clients_batches_and_markers_ours_and_plain_ones_left_out() -> None:
    events = transaction_events([
        fetched_batch(0, OURS), fetched_batch(2, OURS, control=MarkerType.COMMIT),
        fetched_batch(3, -1, transactional=False),
        fetched_batch(5, CLIENT), fetched_batch(7, CLIENT, control=MarkerType.ABORT)], lambda pid: pid == OURS)
    assert events == [
        ClientTransactionalBatch(CLIENT, EPOCH, 4, 6, (
            (5, OffsetCommitRecord("s", "t", 0, OffsetRecord(4))), (6, OffsetCommitRecord("s", "t", 1, None)))),
        EndTransactionMarker(CLIENT, EPOCH, False, 7)]


def test_a_producer_the_load_left_pending_is_settled_by_its_marker_even_if_the_tail_names_it_ours(env: Env) -> None:
    """The load cannot wait for a producer no broker lists and leaves its open transaction pending as a client's;
    if the tail then names it ours (listed again), its marker must still settle those offsets, or they stay
    pending (UNSTABLE_OFFSET_COMMIT) for good. Its later transactions are ours again."""
    ours = lambda pid: pid == OURS  # noqa: E731
    reader = TailReader(settling=[OURS])
    assert reader.wants_records(ours)(OURS, True)  # read as a client's until its marker
    events = reader.events([fetched_batch(10, OURS), fetched_batch(12, OURS, control=MarkerType.ABORT),
                            fetched_batch(13, OURS), fetched_batch(15, OURS, control=MarkerType.COMMIT)], ours)
    # after the marker the producer's batch is ours: only its offset tombstone, at its own COMMIT
    assert [type(e) for e in events] == [ClientTransactionalBatch, EndTransactionMarker, OwnOffsetTombstone]
    assert events[1] == EndTransactionMarker(OURS, EPOCH, False, 12) and not reader.settling
    assert events[2] == OwnOffsetTombstone("s", ("t", 1), 14, 15)
    shard = env.coordinator.shard_for("s")
    replay_transaction_events(shard, [batch_at(8, {0: 3})], 9)  # what the load left pending
    producer = shard.transactional_offsets.by_producer
    assert ("t", 0) in producer[CLIENT].offsets["s"]
    settled = TailReader(settling=[CLIENT]).events([fetched_batch(20, CLIENT, control=MarkerType.COMMIT)],
                                                   lambda pid: True)  # the tail names every producer ours
    replay_transaction_events(shard, settled, 21)
    assert CLIENT not in producer and not shard.transactional_offsets.has_pending("s", ("t", 0))


def test_producer_owners_are_asked_once_and_remembered_within_bounds() -> None:
    owners = ProducerOwners(lambda transactional_id: transactional_id.startswith("coordinator-"), capacity=2)
    batches = [fetched_batch(0, OURS), fetched_batch(2, CLIENT), fetched_batch(4, -1, transactional=False)]
    assert owners.unknown(batches) == {OURS, CLIENT}
    owners.learn({OURS, CLIENT}, {OURS: ("coordinator-p0", "Ongoing"), CLIENT: ("app", "Ongoing")})
    assert owners.unknown(batches) == set() and owners.ours == {OURS} and not owners.is_ours(CLIENT)
    owners.learn({99}, {99: ("app-2", "Empty")})
    assert not owners.is_ours(99) and len(owners.unknown(batches)) == 1  # the oldest one forgotten


def test_a_producer_no_broker_lists_stays_unknown_until_its_grace_has_passed() -> None:
    """A broker shutting down answers ListTransactions with NONE and without the transactions of the partitions
    it resigned (seen: our own producer named a client's just before the broker stopped, so our commits stayed
    pending and OffsetFetch answered UNSTABLE_OFFSET_COMMIT after the restart). Unlisted is not named."""
    now = [100.0]
    owners = ProducerOwners(lambda transactional_id: transactional_id.startswith("coordinator-"),
                            unlisted_grace_s=120, clock=lambda: now[0])
    batches = [fetched_batch(0, OURS), fetched_batch(2, CLIENT)]
    owners.learn({OURS, CLIENT}, {})
    assert owners.unknown(batches) == {OURS, CLIENT}  # asked again, neither taken for a client's
    now[0] += 60
    owners.learn({OURS, CLIENT}, {OURS: ("coordinator-0", "CompleteCommit")})  # the broker is back
    assert owners.unknown(batches) == {CLIENT} and owners.ours == {OURS}
    now[0] += 59.9
    owners.learn({CLIENT}, {})
    assert owners.unknown(batches) == {CLIENT}
    now[0] += 0.1  # unlisted for the whole grace: a client's whose transactional id expired
    owners.learn({CLIENT}, {})
    assert owners.unknown(batches) == set() and not owners.is_ours(CLIENT)


def test_our_offset_tombstones_are_read_in_log_order_once_a_clients_batch_was() -> None:
    """Before any client's batch our tombstones concern nothing (ours are read by header only); after one, a plain
    batch's tombstone counts where it is, a transactional one of ours at our COMMIT, not at all after our ABORT."""
    reader = TailReader()
    ours = lambda pid: pid == OURS  # noqa: E731
    wants = reader.wants_records(ours)
    assert not wants(-1, False) and not wants(OURS, True)
    assert reader.events([fetched_batch(0, -1, transactional=False)], ours) == []
    wants = reader.wants_records(ours)
    assert not wants(OURS, True) and wants(CLIENT, True) and wants(OURS, True) and wants(-1, False)
    events = reader.events([
        fetched_batch(3, CLIENT), fetched_batch(5, -1, transactional=False), fetched_batch(7, OURS),
        fetched_batch(9, CLIENT, control=MarkerType.COMMIT), fetched_batch(10, OURS, control=MarkerType.COMMIT),
        fetched_batch(11, OURS), fetched_batch(13, OURS, control=MarkerType.ABORT)], ours)
    assert events[1:] == [OwnOffsetTombstone("s", ("t", 1), 6, 6), EndTransactionMarker(CLIENT, EPOCH, True, 9),
                          OwnOffsetTombstone("s", ("t", 1), 8, 10)]
    assert reader.wants_records(ours)(OURS, True)  # from now on in every fetch
