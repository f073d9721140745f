"""Transactions of a state-topic partition tracked from its log, read read_uncommitted (Kafka's
CoordinatorLoaderImpl: FetchIsolation.LOG_END, control batches replayed as end-transaction markers).

Per producer id, the transactional batches since its last marker are held; a COMMIT marker releases them to be
applied in their log order, an ABORT drops them. Non-transactional batches apply at once. At the end of a load
the batches still held are either ours (our producer is fenced by the load, which aborts them: dropped) or a
client's, whose transaction includes our partition (returned as `PendingClientTransaction`, with the offset
commits they carry decoded; the shard keeps them pending until the transaction coordinator's marker arrives,
which `tail_events` reports).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field, replace

from coordinator.storage.records import (OffsetCommitKey, OffsetRecord, RecordFormatError, decode_key,
                                         decode_offset_commit_value)
from protocol.client import KafkaClient
from protocol.fetch_reader import FetchedBatch, FetchedPartition, FetchedRecord, MarkerType, fetch

log = logging.getLogger("coordinator.storage")

ApplyRecord = Callable[[FetchedRecord], None]


@dataclass(frozen=True, slots=True)
class TransactionalOffsetCommit:
    """An offset commit record of a client's transactional batch: `offset` is its place in our log, which
    decides against a regular commit of the same partition (Kafka keeps the one with the higher record offset).
    `value` None is a tombstone."""
    offset: int
    key: OffsetCommitKey
    value: OffsetRecord | None


@dataclass(slots=True)
class PendingClientTransaction:
    """A client producer's transactional batches on our partition with no marker yet, in log order."""
    producer_id: int
    producer_epoch: int
    batches: list[FetchedBatch] = field(default_factory=list)

    @property
    def offset_commits(self) -> list[TransactionalOffsetCommit]:
        commits = []
        for batch in self.batches:
            for record in batch.records:
                commit = decode_offset_commit(record)
                if commit is not None:
                    commits.append(commit)
        return commits


def decode_offset_commit(record: FetchedRecord) -> TransactionalOffsetCommit | None:
    """The record as an offset commit, or None (another key type, or malformed: logged)."""
    if record.key is None:
        return None
    try:
        key = decode_key(record.key)
        if not isinstance(key, OffsetCommitKey):
            return None
        value = None if record.value is None else decode_offset_commit_value(record.value)
    except RecordFormatError as exc:
        log.warning("event=transactional_record_skipped reason=malformed offset=%d detail=%s", record.offset, exc)
        return None
    return TransactionalOffsetCommit(record.offset, key, value)


class TransactionTracker:
    """Feeds one partition's batches in log order to `apply`, holding transactional ones until their marker."""

    def __init__(self, apply: ApplyRecord) -> None:
        self._apply = apply
        self._open: dict[int, PendingClientTransaction] = {}  # producer id -> its batches since its last marker
        # producer id -> the last data batch of its last settled transaction: its sequence, which a new owner must
        # continue from (TV1 keeps the epoch, and so the sequence, across transactions)
        self._settled_last: dict[int, FetchedBatch] = {}
        self.committed_batches = 0
        self.aborted_batches = 0

    def feed(self, batch: FetchedBatch) -> None:
        if batch.is_control:
            held = self._open.pop(batch.producer_id, None)
            if held is None or batch.marker is None:
                return  # a marker of a transaction with nothing here (an empty one), or an unknown control type
            self._settled_last[batch.producer_id] = held.batches[-1]
            if batch.marker == MarkerType.COMMIT:
                self.committed_batches += len(held.batches)
                for committed in held.batches:
                    self._apply_all(committed)
            else:
                self.aborted_batches += len(held.batches)
        elif batch.is_transactional:
            held = self._open.setdefault(batch.producer_id,
                                         PendingClientTransaction(batch.producer_id, batch.producer_epoch))
            held.producer_epoch = batch.producer_epoch
            held.batches.append(batch)
        else:
            self._apply_all(batch)

    def _apply_all(self, batch: FetchedBatch) -> None:
        for record in batch.records:
            self._apply(record)
        if self._open:
            self._drop_tombstoned(batch)

    def _drop_tombstoned(self, batch: FetchedBatch) -> None:
        """As Kafka's replay of an offset tombstone: the partition's offsets pending in open transactions before
        it go too, so a deleted offset does not come back with the COMMIT of a transaction that carried it
        earlier. Batch headers stay (they tell where each producer's sequence stands)."""
        deleted = {commit.key: commit.offset for record in batch.records
                   if record.value is None and (commit := decode_offset_commit(record)) is not None}
        if not deleted:
            return
        for held in self._open.values():
            held.batches = [replace(b, records=tuple(r for r in b.records if not _deleted_after(r, deleted)))
                            for b in held.batches]

    def open_producers(self) -> set[int]:
        return set(self._open)

    def settled_sequences(self, our_producer_ids: Collection[int]) -> list[FetchedBatch]:
        """The last batch (header only) of each client producer whose transactions here are all settled, in log
        order: where its sequence stands on the partition. Call before `finish`."""
        return sorted((replace(batch, records=()) for pid, batch in self._settled_last.items()
                       if pid not in our_producer_ids and pid not in self._open), key=lambda b: b.base_offset)

    def finish(self, our_producer_ids: Collection[int]) -> list[PendingClientTransaction]:
        """The end of a load: our open batches are dropped (the load's fence aborts them), the clients' are
        returned, first-opened first."""
        pending = [held for pid, held in self._open.items() if pid not in our_producer_ids]
        self._open.clear()
        return sorted(pending, key=lambda held: held.batches[0].base_offset)


def _deleted_after(record: FetchedRecord, deleted: dict[OffsetCommitKey, int]) -> bool:
    """Whether the record is an offset commit of a partition tombstoned later in the log."""
    if record.key is None:
        return False
    try:
        key = decode_key(record.key)
    except RecordFormatError:
        return False  # left to the replay, which logs it
    return isinstance(key, OffsetCommitKey) and deleted.get(key, -1) > record.offset


FetchAt = Callable[[int], Awaitable[FetchedPartition]]  # one read_uncommitted fetch of a partition from an offset


async def read_to(fetch_at: FetchAt, start: int, end: int, tracker: TransactionTracker) -> int:
    """Feed the partition from `start` until the position reaches `end` (read_uncommitted: no transaction
    below `end` can hold it back); the position reached."""
    position = start
    while position < end:
        answer = await fetch_at(position)
        for batch in answer.batches:
            tracker.feed(batch)
        if answer.next_offset == position and answer.log_start_offset > position:
            position = answer.log_start_offset  # deleted below us meanwhile (retention, compaction)
        elif answer.next_offset == position and answer.high_watermark <= position:
            raise TimeoutError(f"the log ends at {answer.high_watermark}, below the end {end} it had")
        else:
            position = answer.next_offset
    return position


@dataclass(frozen=True, slots=True)
class TransactionalBatch:
    """A transactional data batch read by the tail: a client's (a TxnOffsetCommit landed in our partition), or one
    of ours when our writer is transactional (the caller tells them apart by producer id)."""
    batch: FetchedBatch


@dataclass(frozen=True, slots=True)
class TransactionMarker:
    """A COMMIT or ABORT marker read by the tail: `producer_id`'s held batches are settled by it."""
    offset: int
    producer_id: int
    producer_epoch: int
    marker: MarkerType


TailEvent = TransactionalBatch | TransactionMarker


async def tail_events(client: KafkaClient, topic: str, partition: int, start: int, *, max_bytes: int = 1 << 20,
                      max_wait_ms: int = 500) -> AsyncIterator[tuple[int, list[TailEvent]]]:
    """From `start` (a load's end position) on, forever: after every fetch, (the next position, the transactional
    batches and markers it read, in log order). Non-transactional batches are ours, already applied by the
    shard that wrote them; they are skipped. The fetch long-polls `max_wait_ms` at the end of the log."""
    position = start
    while True:
        answer = await fetch(client, topic, partition, position, max_bytes=max_bytes, max_wait_ms=max_wait_ms)
        events: list[TailEvent] = []
        for batch in answer.batches:
            if batch.is_control and batch.marker is not None:
                events.append(TransactionMarker(batch.base_offset, batch.producer_id, batch.producer_epoch,
                                                batch.marker))
            elif batch.is_transactional and not batch.is_control:
                events.append(TransactionalBatch(batch))
        position = answer.next_offset
        yield position, events
