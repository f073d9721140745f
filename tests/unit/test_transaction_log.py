"""coordinator/storage/transaction_log.py's TransactionTracker on batches made here: held per producer id until its
marker, COMMIT applies them in log order, ABORT drops them, a plain batch applies at once; at the end ours are
dropped and the clients' returned, with their offset commits decoded."""

from __future__ import annotations

from coordinator.group.records import OffsetRecord
from coordinator.storage.records import OffsetCommitKey, encode_key, encode_offset_commit_value
from coordinator.storage.transaction_log import TransactionTracker
from protocol.fetch_reader import FetchedBatch, FetchedRecord, MarkerType


def data(offset: int, producer_id: int, value: int, *, transactional: bool = True) -> FetchedBatch:
    key = encode_key(OffsetCommitKey("g", "orders", 0))
    record = FetchedRecord(offset, key, encode_offset_commit_value(OffsetRecord(value, commit_timestamp_ms=value)))
    return FetchedBatch(offset, offset, producer_id, 3, 0, transactional, False, None, (record,))


def marker(offset: int, producer_id: int, kind: MarkerType) -> FetchedBatch:
    return FetchedBatch(offset, offset, producer_id, 3, -1, True, True, kind, ())


def test_commit_applies_in_log_order_abort_drops_plain_at_once() -> None:
    applied: list[int] = []
    tracker = TransactionTracker(lambda record: applied.append(record.offset))
    for batch in (data(0, 1, 10), data(1, 2, 20), data(2, 1, 11), data(3, -1, 30, transactional=False),
                  marker(4, 2, MarkerType.ABORT), marker(5, 1, MarkerType.COMMIT), marker(6, 9, MarkerType.COMMIT)):
        tracker.feed(batch)
    assert applied == [3, 0, 2]
    assert (tracker.committed_batches, tracker.aborted_batches, tracker.open_producers()) == (2, 1, set())


def test_at_the_end_ours_are_dropped_the_clients_returned_first_opened_first() -> None:
    applied: list[int] = []
    tracker = TransactionTracker(lambda record: applied.append(record.offset))
    for batch in (data(0, 7, 1), data(1, 5, 2), data(2, 6, 3), data(3, 5, 4)):
        tracker.feed(batch)
    pending = tracker.finish(our_producer_ids={6})
    assert applied == []
    assert [(p.producer_id, [b.base_offset for b in p.batches]) for p in pending] == [(7, [0]), (5, [1, 3])]
    commits = pending[1].offset_commits
    assert [(c.offset, c.key, c.value.offset if c.value else None) for c in commits] == [
        (1, OffsetCommitKey("g", "orders", 0), 2), (3, OffsetCommitKey("g", "orders", 0), 4)]
    assert tracker.open_producers() == set()


def test_a_settled_producers_last_batch_tells_where_its_sequence_stands() -> None:
    """A TV1 producer keeps its epoch (and so its sequence on our partition) across transactions: a new owner must
    continue after the last batch of its settled transactions, aborted ones included, without their offsets."""
    tracker = TransactionTracker(lambda record: None)
    for batch in (data(0, 1, 10), marker(1, 1, MarkerType.COMMIT), data(2, 1, 11), marker(3, 1, MarkerType.ABORT),
                  data(4, 2, 20), marker(5, 2, MarkerType.COMMIT), data(6, 2, 21), data(7, 6, 60),
                  marker(8, 6, MarkerType.COMMIT)):
        tracker.feed(batch)
    settled = tracker.settled_sequences(our_producer_ids={6})
    assert [(b.producer_id, b.base_offset, b.records) for b in settled] == [(1, 2, ())]  # 2 has one open
    assert [p.producer_id for p in tracker.finish(our_producer_ids={6})] == [2]


def tombstone(offset: int, *, producer_id: int = -1) -> FetchedBatch:
    record = FetchedRecord(offset, encode_key(OffsetCommitKey("g", "orders", 0)), None)
    return FetchedBatch(offset, offset, producer_id, 3, 0, producer_id != -1, False, None, (record,))


def test_a_tombstone_drops_the_partitions_offsets_pending_before_it() -> None:
    """Kafka's replay of an offset tombstone removes the partition's pending transactional offsets too: an
    OffsetDelete between a client's TxnOffsetCommit and its COMMIT is not undone by the COMMIT (nor by a load that
    ends with the transaction still open). A commit after the tombstone stays, and so do the batch headers."""
    applied: list[int] = []
    tracker = TransactionTracker(lambda record: applied.append(record.offset))
    for batch in (data(0, 1, 10), data(1, 2, 20), tombstone(2), data(3, 1, 11), marker(4, 1, MarkerType.COMMIT)):
        tracker.feed(batch)
    assert applied == [2, 3]  # the tombstone, then producer 1's commit made after it; its first one is gone
    [pending] = tracker.finish(our_producer_ids=())
    assert (pending.producer_id, [b.base_offset for b in pending.batches], pending.offset_commits) == (2, [1], [])
    assert [b.base_offset for b in tracker.settled_sequences(())] == [3]


def test_a_tombstone_committed_later_drops_only_what_came_before_it() -> None:
    """Our own transactional writer's tombstone applies at its COMMIT marker, but only to pending offsets
    written before the tombstone itself."""
    applied: list[int] = []
    tracker = TransactionTracker(lambda record: applied.append(record.offset))
    for batch in (data(0, 1, 10), tombstone(1, producer_id=6), data(2, 1, 11), marker(3, 6, MarkerType.COMMIT),
                  marker(4, 1, MarkerType.COMMIT)):
        tracker.feed(batch)
    assert applied == [1, 2]
