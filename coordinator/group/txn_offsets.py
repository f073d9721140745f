"""Transactional offset commits of one shard, pending until their transaction's marker (Kafka's
OffsetMetadataManager: pendingTransactionalOffsets, openTransactionsByGroup, replayEndTransactionMarker).

A TxnOffsetCommit lands in the shard's partition as a transactional batch of the client's producer; whoever
reads the partition (the loader, the partition tail) hands each such batch to `replay_transactional_offsets`
and each COMMIT/ABORT marker to `replay_end_transaction`. Offsets are held per producer id with the log offset
of the record that carried them; COMMIT makes one current only if its record is later in the log than the
current offset's record (a regular commit written after it wins), ABORT drops them.

Log order of a current offset is its `OffsetRecord.log_offset`, set by whoever read it from the log. An offset
our own write path committed while the shard serves has none (the store acknowledges without an offset); then
the order the shard learned them in (the offset write sequence) decides, which is the log order unless our
acknowledgement and the tail's read-back of the client's batch cross.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from coordinator.group.records import OffsetCommitRecord, OffsetRecord, TopicPartition

if TYPE_CHECKING:
    from coordinator.group.metadata import GroupMetadata
    from coordinator.group.shard import GroupShard

log = logging.getLogger("coordinator.group")


@dataclass(slots=True)
class PendingOffset:
    record: OffsetRecord  # its log_offset is the offset of the record that carried it
    learned: int  # the shard's offset write sequence when it was read


@dataclass(slots=True)
class OpenTransaction:
    """One producer's transactional offsets not yet settled, of every group of the shard."""

    producer_epoch: int
    offsets: dict[str, dict[TopicPartition, PendingOffset]] = field(default_factory=dict)


class TransactionalOffsets:
    """The shard's open transactions; mutated only through the functions below, on the shard's loop."""

    def __init__(self) -> None:
        self.by_producer: dict[int, OpenTransaction] = {}
        self.open_by_group: dict[str, set[int]] = {}

    def clear(self) -> None:
        self.by_producer.clear()
        self.open_by_group.clear()

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        return any(tp in self.by_producer[pid].offsets.get(group_id, {})
                   for pid in self.open_by_group.get(group_id, ()))

    def has_open_transactions(self, group_id: str) -> bool:
        return group_id in self.open_by_group

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        return {tp for pid in self.open_by_group.get(group_id, ())
                for tp in self.by_producer[pid].offsets.get(group_id, {})}

    def pending_offset(self, producer_id: int, group_id: str, tp: TopicPartition) -> OffsetRecord | None:
        txn = self.by_producer.get(producer_id)
        pending = None if txn is None else txn.offsets.get(group_id, {}).get(tp)
        return None if pending is None else pending.record

    def drop_partitions(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """A tombstone of these partitions removes their pending offsets too (the transactions stay open)."""
        wanted = set(partitions)
        for pid in self.open_by_group.get(group_id, ()):
            group_offsets = self.by_producer[pid].offsets.get(group_id)
            if group_offsets is not None:
                for tp in wanted & group_offsets.keys():
                    del group_offsets[tp]


def replay_transactional_offsets(shard: GroupShard, producer_id: int, producer_epoch: int,
                                 records: Sequence[tuple[int, OffsetCommitRecord]]) -> None:
    """The offset commit records of one transactional batch read from the partition, each with its own log
    offset (records of other key types left out by the reader). A tombstone removes the current and pending
    offsets at once, as Kafka's replay does whatever batch carries it. Groups not known yet are created as
    simple groups, as Kafka's replay does; call it after the load's groups are loaded (load_group skips a
    group already cached)."""
    txns = shard.transactional_offsets
    for log_offset, replayed in records:
        tp = (replayed.topic, replayed.partition)
        group = shard.add_group(replayed.group_id) if replayed.value is not None else shard.groups.get(replayed.group_id)
        if replayed.value is None:
            if group is not None:
                group.remove_offsets([tp])
            txns.drop_partitions(replayed.group_id, [tp])
            continue
        txn = txns.by_producer.get(producer_id)
        if txn is None:
            txn = txns.by_producer[producer_id] = OpenTransaction(producer_epoch)
        txn.producer_epoch = producer_epoch
        record = replace(replayed.value, log_offset=log_offset)
        txn.offsets.setdefault(replayed.group_id, {})[tp] = PendingOffset(record, shard.next_offset_write_seq())
        txns.open_by_group.setdefault(replayed.group_id, set()).add(producer_id)


def replay_end_transaction(shard: GroupShard, producer_id: int, producer_epoch: int, commit: bool,
                           log_offset: int) -> int:
    """A COMMIT (`commit`) or ABORT marker of this producer read from the partition at `log_offset`: its
    pending offsets become current (each only if later in the log than the current one) or are dropped.
    Returns how many offsets became current. A marker of a producer with nothing pending changes nothing."""
    txns = shard.transactional_offsets
    txn = txns.by_producer.pop(producer_id, None)
    if txn is None:
        return 0
    for group_id in txn.offsets:
        open_ids = txns.open_by_group.get(group_id)
        if open_ids is not None:
            open_ids.discard(producer_id)
            if not open_ids:
                del txns.open_by_group[group_id]
    if not commit:
        log.info("event=txn_offsets_aborted producer_id=%d producer_epoch=%d marker_offset=%d groups=%d",
                 producer_id, producer_epoch, log_offset, len(txn.offsets))
        return 0
    made_current = 0
    for group_id, offsets in txn.offsets.items():
        if not offsets:  # deleted while the transaction was open
            continue
        group = shard.add_group(group_id)
        for tp, pending in offsets.items():
            if _is_later(group, tp, pending):
                group.offsets[tp] = pending.record
                group.offset_versions[tp] = pending.learned
                made_current += 1
            else:
                log.info("event=txn_offset_superseded group=%s topic=%s partition=%d producer_id=%d "
                         "record_offset=%s", group_id, tp[0], tp[1], producer_id, pending.record.log_offset)
    log.info("event=txn_offsets_committed producer_id=%d producer_epoch=%d marker_offset=%d offsets=%d",
             producer_id, producer_epoch, log_offset, made_current)
    return made_current


def _is_later(group: GroupMetadata, tp: TopicPartition, pending: PendingOffset) -> bool:
    current = group.offsets.get(tp)
    if current is None:
        return True
    if current.log_offset is not None and pending.record.log_offset is not None:
        return pending.record.log_offset > current.log_offset
    return pending.learned > group.offset_versions.get(tp, -1)
