"""Transactional offset commits of one shard, pending until their transaction's marker (Kafka's
OffsetMetadataManager: pendingTransactionalOffsets, openTransactionsByGroup, replayEndTransactionMarker).

A TxnOffsetCommit lands in the shard's partition as a transactional batch of the client's producer; whoever
reads the partition (the loader, the partition tail) hands each such batch to `replay_transactional_offsets`
and each COMMIT/ABORT marker to `replay_end_transaction`. Offsets are held per producer id with the log offset
of the record that carried them; COMMIT makes one current only if its record is later in the log than the
current offset's record (a regular commit written after it wins), ABORT drops them.

Log order of a current offset is its `OffsetRecord.log_offset`: set by whoever read it from the log, and by the
Kafka store's append on our own commits once acknowledged (librdkafka's delivery reports). Where one is missing
(a store that reports none) the order the shard learned them in (the offset write sequence) decides.

`replay_transaction_events` is the reader's entry: the load's open client transactions, then the partition
tail's batches and markers (coordinator/storage/txn_tail.py), each with where the reader has read to.

Our own offset tombstones (OffsetDelete, DeleteGroups, expiry) drop the pending offsets memory holds when they are
issued, but a client's batch can land before one of them in the log and still be learned after it (the handler
hears its acknowledgement later, the reader reads it later). Kafka's replay drops a pending offset at any
tombstone of its key after it in the log, so the shard learns where our tombstones landed (`tombstone_landed`,
from the store's delivery reports, retries included) and keeps each until the reader has passed it: a batch
below one is dropped when it is replayed, and a pending or current offset below one when it is learned.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from coordinator.group.records import OffsetCommitRecord, OffsetRecord, TopicPartition

if TYPE_CHECKING:
    from coordinator.group.metadata import GroupMetadata
    from coordinator.group.shard import GroupShard
    from coordinator.group.store import GroupStore

log = logging.getLogger("coordinator.group")


@dataclass(slots=True)
class PendingOffset:
    record: OffsetRecord  # its log_offset is the offset of the record that carried it
    learned: int  # the shard's offset write sequence when it was read
    # the producer's earlier pending offset of the partition it replaced: a marker between the two (not read yet
    # when the TxnOffsetCommit handler replays the later batch) settles the earlier one, not this one
    earlier: PendingOffset | None = None


@dataclass(slots=True)
class OpenTransaction:
    """One producer's transactional offsets not yet settled, of every group of the shard."""

    producer_epoch: int
    offsets: dict[str, dict[TopicPartition, PendingOffset]] = field(default_factory=dict)
    # known where this instance served a TxnOffsetCommit of it (the log does not carry it)
    transactional_id: str | None = None
    # the highest record offset replayed: the handler (at the Produce answer) and the partition's reader both
    # replay a batch, each in log order, so a record at or below it is one already replayed
    replayed_to: int = -1


class TransactionalOffsets:
    """The shard's open transactions; mutated only through the functions below, on the shard's loop."""

    def __init__(self) -> None:
        self.by_producer: dict[int, OpenTransaction] = {}
        self.open_by_group: dict[str, set[int]] = {}
        # where the partition's reader (the load, then the tail) has read to: a record below it was replayed by
        # the reader already, with the marker that settled it if there was one
        self.read_to = -1
        # groups a client's transactional batch was sent or replayed for: only their tombstones are kept
        self.transactional_groups: set[str] = set()
        # the latest of our offset tombstones of each partition of those groups, while at or past `read_to`
        self.tombstones: dict[tuple[str, TopicPartition], int] = {}
        # the store's: a client's batch of these offsets is about to be appended, so their owed tombstones are not
        # sent again; returns what owes them again if the batch is not appended
        self.supersede_owed: Callable[[str, list[TopicPartition]], Callable[[], None]] = _nothing_owed
        # the store's: whether a tombstone of ours of the partition was sent and not answered yet, or is owed
        self.tombstone_in_flight: Callable[[str, TopicPartition], bool] = _none_in_flight
        # the store's: None if no tombstone of ours of these partitions is sent and unanswered, else what completes
        # once none is
        self.tombstones_answered: Callable[[str, list[TopicPartition]], Awaitable[None] | None] = _none_unanswered
        # offsets a COMMIT settled while a tombstone of their partition was in flight: current or dropped once
        # it is answered (where it landed decides), pending meanwhile
        self.held: dict[tuple[str, TopicPartition], list[PendingOffset]] = {}

    def clear(self) -> None:
        self.by_producer.clear()
        self.open_by_group.clear()
        self.read_to = -1
        self.transactional_groups.clear()
        self.tombstones.clear()
        self.supersede_owed = _nothing_owed
        self.tombstone_in_flight = _none_in_flight
        self.tombstones_answered = _none_unanswered
        self.held.clear()

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        return (group_id, tp) in self.held or any(tp in self.by_producer[pid].offsets.get(group_id, {})
                                                  for pid in self.open_by_group.get(group_id, ()))

    def has_open_transactions(self, group_id: str) -> bool:
        """Open, or committed and held (the group stays until they are settled)."""
        return group_id in self.open_by_group or any(held_group == group_id for held_group, _ in self.held)

    def pending_partitions(self, group_id: str) -> list[TopicPartition]:
        """Sorted: the tombstones written for them come in this order (a set of strings' order is the process's)."""
        held = {tp for held_group, tp in self.held if held_group == group_id} if self.held else set()
        return sorted(held | {tp for pid in self.open_by_group.get(group_id, ())
                              for tp in self.by_producer[pid].offsets.get(group_id, {})})

    def pending_offset(self, producer_id: int, group_id: str, tp: TopicPartition) -> OffsetRecord | None:
        txn = self.by_producer.get(producer_id)
        pending = None if txn is None else txn.offsets.get(group_id, {}).get(tp)
        return None if pending is None else pending.record

    def drop_partitions(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """A tombstone of these partitions removes their pending offsets too (the transactions stay open)."""
        wanted = set(partitions)
        for tp in wanted:
            self.held.pop((group_id, tp), None)
        for pid in self.open_by_group.get(group_id, ()):
            group_offsets = self.by_producer[pid].offsets.get(group_id)
            if group_offsets is not None:
                for tp in wanted & group_offsets.keys():
                    del group_offsets[tp]

    def sending(self, group_id: str, partitions: list[TopicPartition]) -> Callable[[], None]:
        """A client's batch of these offsets is about to be appended: our tombstones of the group that land
        meanwhile are kept (the batch may land before them), and the owed ones are superseded; returns what owes
        them again if the batch is not appended."""
        self.transactional_groups.add(group_id)
        return self.supersede_owed(group_id, partitions)

    async def sending_after_our_tombstones(self, group_id: str, partitions: list[TopicPartition]
                                           ) -> Callable[[], None]:
        """`sending`, once no tombstone of ours of these offsets is unanswered: the client's batch goes out on
        another connection than our writes, and Kafka appends in the order it handles requests and never sends a
        failed tombstone again, so one sent before the batch must land before it or be superseded by it. Bounded
        by our producer's delivery timeout per attempt."""
        while (unanswered := self.tombstones_answered(group_id, partitions)) is not None:
            await unanswered
        return self.sending(group_id, partitions)

    def tombstoned_after(self, group_id: str, tp: TopicPartition, log_offset: int) -> bool:
        """Whether one of our tombstones of the partition lies after `log_offset` in the log."""
        return self.tombstones.get((group_id, tp), -1) > log_offset

    def forget_passed_tombstones(self) -> None:
        """The reader has read past them: a batch below one is not replayed again."""
        if self.tombstones:
            self.tombstones = {key: t for key, t in self.tombstones.items() if t >= self.read_to}


def _nothing_owed(group_id: str, partitions: list[TopicPartition]) -> Callable[[], None]:
    return nothing_to_restore


def nothing_to_restore() -> None:
    """What a supersession that found no owed tombstone restores."""


def _none_in_flight(group_id: str, tp: TopicPartition) -> bool:
    return False


def _none_unanswered(group_id: str, partitions: list[TopicPartition]) -> Awaitable[None] | None:
    return None


def follow_own_tombstones(shard: GroupShard, store: GroupStore) -> None:
    """The store tells the shard where its offset tombstones land, and a client's batch supersedes the owed ones."""
    partition, txns = shard.partition, shard.transactional_offsets
    store.follow_tombstones(partition, lambda group_id, tp, log_offset: tombstone_landed(shard, group_id, tp,
                                                                                          log_offset))
    txns.supersede_owed = lambda group_id, tps: store.supersede_tombstones(partition, group_id, tps)
    txns.tombstone_in_flight = store.tombstone_in_flight
    txns.tombstones_answered = store.tombstones_answered


def tombstone_landed(shard: GroupShard, group_id: str, tp: TopicPartition, log_offset: int | None) -> None:
    """One of our tombstones of `tp` is in the partition at `log_offset` (None: that attempt failed): as Kafka's
    replay, it drops every pending offset of it carried by a record before it, and the current offset if that
    record is before it (a COMMIT marker read before this report made it current). Kept while the reader has not
    passed it, for a group with clients' transactions (another group's tombstones would pile up: its partition's
    reader hands over nothing and so does not move). Offsets a COMMIT settled meanwhile are current once no
    tombstone of the partition is in flight or owed, unless one dropped them (a failed attempt may have landed
    all the same: its retry, later in the log, decides)."""
    txns = shard.transactional_offsets
    held = txns.held.pop((group_id, tp), [])
    if log_offset is not None:
        held = [pending for pending in held if not _before(pending, log_offset)]
        _tombstone_at(shard, group_id, tp, log_offset)
    if held and txns.tombstone_in_flight(group_id, tp):
        txns.held[(group_id, tp)] = held
    elif held:
        group = shard.add_group(group_id)
        for pending in held:
            _make_current(group, tp, pending, -1)


def _tombstone_at(shard: GroupShard, group_id: str, tp: TopicPartition, log_offset: int) -> None:
    txns = shard.transactional_offsets
    for producer_id in txns.open_by_group.get(group_id, ()):
        group_offsets = txns.by_producer[producer_id].offsets.get(group_id, {})
        pending = group_offsets.get(tp)
        if pending is not None:
            kept = _after_tombstone(pending, log_offset)
            if kept is None:
                del group_offsets[tp]
            else:
                group_offsets[tp] = kept
    group = shard.groups.get(group_id)
    current = None if group is None else group.offsets.get(tp)
    if group is not None and current is not None and current.log_offset is not None \
            and current.log_offset < log_offset:
        log.info("event=txn_offset_tombstoned group=%s topic=%s partition=%d record_offset=%d tombstone_offset=%d",
                 group_id, tp[0], tp[1], current.log_offset, log_offset)
        del group.offsets[tp]
        group.offset_versions.pop(tp, None)
    if log_offset >= txns.read_to and group_id in txns.transactional_groups:
        txns.tombstones[(group_id, tp)] = max(txns.tombstones.get((group_id, tp), -1), log_offset)


def _before(pending: PendingOffset, tombstone_offset: int) -> bool:
    return pending.record.log_offset is not None and pending.record.log_offset < tombstone_offset


def _after_tombstone(pending: PendingOffset, tombstone_offset: int) -> PendingOffset | None:
    """The pending offset with the offsets of records before the tombstone left out of its chain (None: all)."""
    if _before(pending, tombstone_offset):
        return None
    if pending.earlier is not None:
        pending.earlier = _after_tombstone(pending.earlier, tombstone_offset)
    return pending


def replay_transactional_offsets(shard: GroupShard, producer_id: int, producer_epoch: int,
                                 records: Sequence[tuple[int, OffsetCommitRecord]], *,
                                 transactional_id: str | None = None) -> None:
    """The offset commit records of one transactional batch read from the partition, each with its own log
    offset (records of other key types left out by the reader). A tombstone removes the current and pending
    offsets at once, as Kafka's replay does whatever batch carries it. Groups not known yet are created as
    simple groups, as Kafka's replay does; call it after the load's groups are loaded (load_group skips a
    group already cached). Idempotent: a record the partition's reader has read past, or one at or below the
    last record replayed for the producer, was replayed already and is skipped; but the content of a pending
    offset replayed again at its own log offset is taken from the later replay (the reader's read-back comes
    after the handler's answer: the log's content has the last word)."""
    txns = shard.transactional_offsets
    for log_offset, replayed in records:
        txn = txns.by_producer.get(producer_id)
        if log_offset < txns.read_to:
            continue
        if txn is not None and log_offset <= txn.replayed_to:
            _read_again(txn, producer_id, log_offset, replayed)
            continue
        tp = (replayed.topic, replayed.partition)
        group = shard.add_group(replayed.group_id) if replayed.value is not None else shard.groups.get(replayed.group_id)
        if replayed.value is None:
            if group is not None:
                group.remove_offsets([tp])
            txns.drop_partitions(replayed.group_id, [tp])
            continue
        if txn is None:
            txn = txns.by_producer[producer_id] = OpenTransaction(producer_epoch)
        txn.producer_epoch = producer_epoch
        txn.replayed_to = log_offset
        group_offsets = txn.offsets.setdefault(replayed.group_id, {})
        txns.open_by_group.setdefault(replayed.group_id, set()).add(producer_id)
        txns.transactional_groups.add(replayed.group_id)
        if txns.tombstoned_after(replayed.group_id, tp, log_offset):  # dropped by it in the log: never pending
            log.info("event=txn_offset_tombstoned group=%s topic=%s partition=%d producer_id=%d record_offset=%d",
                     replayed.group_id, tp[0], tp[1], producer_id, log_offset)
            continue
        record = replace(replayed.value, log_offset=log_offset)
        group_offsets[tp] = PendingOffset(record, shard.next_offset_write_seq(), group_offsets.get(tp))
    named = txns.by_producer.get(producer_id) if transactional_id is not None else None
    if named is not None:  # also when the partition's reader replayed the batch first
        named.transactional_id = transactional_id


def _read_again(txn: OpenTransaction, producer_id: int, log_offset: int, replayed: OffsetCommitRecord) -> None:
    """A record replayed before: if its pending offset is still the one of that record, the log's content is
    kept. Other content at the same offset means another writer (a former owner) used our sequence, and the
    broker answered our batch as its duplicate."""
    pending = txn.offsets.get(replayed.group_id, {}).get((replayed.topic, replayed.partition))
    if pending is None or pending.record.log_offset != log_offset or replayed.value is None:
        return
    before, after = pending.record, replayed.value
    if (before.offset, before.metadata, before.leader_epoch) != (after.offset, after.metadata, after.leader_epoch):
        log.warning("event=txn_offset_replaced_by_log group=%s topic=%s partition=%d producer_id=%d "
                    "record_offset=%d offset=%d log_offset_value=%d", replayed.group_id, replayed.topic,
                    replayed.partition, producer_id, log_offset, before.offset, after.offset)
    pending.record = replace(after, log_offset=log_offset)


def replay_end_transaction(shard: GroupShard, producer_id: int, producer_epoch: int, commit: bool,
                           log_offset: int) -> int:
    """A COMMIT (`commit`) or ABORT marker of this producer read from the partition at `log_offset`: its
    pending offsets become current (each only if later in the log than the current one) or are dropped.
    Returns how many offsets became current. A marker of a producer with nothing pending changes nothing. Offsets
    of records after the marker stay pending: the producer's next transaction, which the TxnOffsetCommit handler
    replays as soon as its batch is acknowledged, maybe before the partition's reader reached this marker."""
    txns = shard.transactional_offsets
    txn = txns.by_producer.pop(producer_id, None)
    if txn is None:
        return 0
    following = _after_marker(txn, log_offset)
    if following is not None:
        txns.by_producer[producer_id] = following
    for group_id in txn.offsets:
        open_ids = txns.open_by_group.get(group_id)
        if open_ids is not None and (following is None or group_id not in following.offsets):
            open_ids.discard(producer_id)
            if not open_ids:
                del txns.open_by_group[group_id]
    for group_id, offsets in txn.offsets.items():
        first_ms = min((p.record.commit_timestamp_ms for p in offsets.values()
                        if p.record.commit_timestamp_ms >= 0), default=None)
        shard.observer.on_txn_group_offsets_settled(group_id, txn.transactional_id, producer_id, producer_epoch,
                                                    commit, len(offsets), first_ms)
    if not commit:
        log.info("event=txn_offsets_aborted producer_id=%d producer_epoch=%d marker_offset=%d groups=%d",
                 producer_id, producer_epoch, log_offset, len(txn.offsets))
        shard.observer.on_txn_offsets_settled(producer_id, producer_epoch, False, 0)
        return 0
    made_current = 0
    for group_id, offsets in txn.offsets.items():
        if not offsets:  # deleted while the transaction was open
            continue
        group = shard.add_group(group_id)
        for tp, pending in offsets.items():
            if txns.tombstone_in_flight(group_id, tp):  # where it lands decides (tombstone_landed)
                txns.held.setdefault((group_id, tp), []).append(pending)
            else:
                made_current += _make_current(group, tp, pending, producer_id)
    log.info("event=txn_offsets_committed producer_id=%d producer_epoch=%d marker_offset=%d offsets=%d",
             producer_id, producer_epoch, log_offset, made_current)
    shard.observer.on_txn_offsets_settled(producer_id, producer_epoch, True, made_current)
    return made_current


def _after_marker(txn: OpenTransaction, marker_offset: int) -> OpenTransaction | None:
    """Splits `txn` at the marker: it keeps the latest pending offset of each partition from before the marker
    (what the marker settles); the offsets after it are returned as the producer's next transaction (None if
    nothing after it was replayed)."""
    following = OpenTransaction(txn.producer_epoch, transactional_id=txn.transactional_id,
                                replayed_to=txn.replayed_to)
    for group_id, offsets in txn.offsets.items():
        for tp, pending in list(offsets.items()):
            if not _after(pending, marker_offset):
                continue
            last_after = pending
            while last_after.earlier is not None and _after(last_after.earlier, marker_offset):
                last_after = last_after.earlier
            settled, last_after.earlier = last_after.earlier, None
            following.offsets.setdefault(group_id, {})[tp] = pending
            if settled is None:
                del offsets[tp]
            else:
                offsets[tp] = settled
    # records after the marker replayed already, their offsets deleted since: still replayed (not again)
    return following if following.offsets or txn.replayed_to > marker_offset else None


def _make_current(group: GroupMetadata, tp: TopicPartition, pending: PendingOffset, producer_id: int) -> int:
    """A committed offset becomes current if its record is later than the current one's; 1 if it did."""
    if _is_later(group, tp, pending):
        group.offsets[tp] = pending.record
        group.offset_versions[tp] = pending.learned
        return 1
    log.info("event=txn_offset_superseded group=%s topic=%s partition=%d producer_id=%d record_offset=%s",
             group.group_id, tp[0], tp[1], producer_id, pending.record.log_offset)
    return 0


def _after(pending: PendingOffset, marker_offset: int) -> bool:
    return pending.record.log_offset is not None and pending.record.log_offset > marker_offset


def _is_later(group: GroupMetadata, tp: TopicPartition, pending: PendingOffset) -> bool:
    current = group.offsets.get(tp)
    if current is None:
        return True
    if current.log_offset is not None and pending.record.log_offset is not None:
        return pending.record.log_offset > current.log_offset
    return pending.learned > group.offset_versions.get(tp, -1)


@dataclass(frozen=True, slots=True)
class ClientTransactionalBatch:
    """A client producer's transactional batch read from the shard's partition (one TxnOffsetCommit): its offset
    commit records with their log offsets (records of other key types left out)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_commits: tuple[tuple[int, OffsetCommitRecord], ...]


@dataclass(frozen=True, slots=True)
class EndTransactionMarker:
    """A COMMIT or ABORT marker the transaction coordinator wrote into the shard's partition at `offset`."""

    producer_id: int
    producer_epoch: int
    commit: bool
    offset: int


@dataclass(frozen=True, slots=True)
class OwnOffsetTombstone:
    """One of our offset tombstones read from the shard's partition: its record at `offset`, in effect from
    `settled_at` on (its own offset; a transactional writer's: its COMMIT marker's)."""

    group_id: str
    tp: TopicPartition
    offset: int
    settled_at: int


TransactionEvent = ClientTransactionalBatch | EndTransactionMarker | OwnOffsetTombstone


def replay_transaction_events(shard: GroupShard, events: Iterable[TransactionEvent], read_to: int | None = None
                              ) -> None:
    """What the partition's reader read, in log order (the load's open client transactions, then the tail's
    batches and markers), into the shard's pending offsets and client producer sequences; `read_to`: where the
    reader has read to (a batch the handler replays later below it is one replayed here already)."""
    txns = shard.transactional_offsets
    for event in events:
        if isinstance(event, ClientTransactionalBatch):
            replay_transactional_offsets(shard, event.producer_id, event.producer_epoch, event.offset_commits)
            shard.producer_sequences.observed_batch(event.producer_id, event.producer_epoch, event.last_sequence)
            txns.read_to = max(txns.read_to, event.last_offset + 1)
        elif isinstance(event, OwnOffsetTombstone):
            if event.settled_at >= txns.read_to and event.group_id in txns.transactional_groups:
                tombstone_landed(shard, event.group_id, event.tp, event.offset)
            txns.read_to = max(txns.read_to, event.settled_at + 1)
        elif event.offset >= txns.read_to:  # below it: read before (a reader starting again from the log start)
            replay_end_transaction(shard, event.producer_id, event.producer_epoch, event.commit, event.offset)
            shard.producer_sequences.observed_marker(event.producer_id, event.producer_epoch)
            txns.read_to = event.offset + 1
    if read_to is not None:
        txns.read_to = max(txns.read_to, read_to)
    txns.forget_passed_tombstones()
