"""The storage interface of the group coordinator, and an in-memory implementation for unit tests.

A shard's state changes leave it as records (coordinator/group/records.py: `GroupMetadataRecord`,
`OffsetCommitRecord`, value None = tombstone); the Kafka-backed store (coordinator/storage) encodes them in
Kafka's `__consumer_offsets` formats and implements `GroupStore`.

Contract for implementations:
- `load(partitions)` reads those state-topic partitions to their end and returns the latest group record and
  offsets of every group in them; `unload(partitions)` stops writing to them (appends fail NOT_COORDINATOR
  until they are loaded again: the seam for fencing when several instances share the topic).
- `append(partition, records)` is the only write (`append_together`: several at once, possibly as one). It
  queues the records for that partition before it returns:
  a partition's records are stored in the order they were queued (one ordered path per partition, tombstones
  and their retries included). The awaitable it returns completes once they are acknowledged (acks=all), all
  or nothing, and raises `StoreError(<raw Kafka append error>)` on failure, including `REQUEST_TIMED_OUT` after
  `offsets.commit.timeout.ms`. The runtime hands the raw error to the write's owner, which maps it to the
  API's error code (errors.py). The partition is the runtime's to choose (partitioner.py).
- A write of tombstones only (deleted groups, expired or deleted offsets) that fails is kept owed by the store
  and sent again until written, unless a newer write of its key supersedes it.
"""
from __future__ import annotations

import asyncio
import copy
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

from coordinator.group.modern.records import CONSUMER_GROUP_RECORD_CLASSES, ConsumerGroupRecord
from coordinator.group.records import (GroupMetadataRecord, GroupRecord, OffsetRecord, Record, TopicPartition,
                                      offset_commits)
from coordinator.group.txn_offsets import TransactionEvent, nothing_to_restore
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group.store")


class StoreError(Exception):
    """A failed append, carrying Kafka's error code."""

    def __init__(self, error: Errors, message: str = "") -> None:
        super().__init__(f"{error.name}: {message}" if message else error.name)
        self.error = error


@dataclass(slots=True)
class LoadedGroups:
    """The latest group record and offsets of every group of the partitions loaded, and what the read saw
    (records read, skipped as unknown or malformed: for logs)."""

    groups: dict[str, GroupRecord] = field(default_factory=dict)
    offsets: dict[str, dict[TopicPartition, OffsetRecord]] = field(default_factory=dict)
    consumer_records: list[ConsumerGroupRecord] = field(default_factory=list)  # KIP-848 groups', to replay
    # stores with a log: where each classic group's record was read among `consumer_records` (how many came
    # before it), so a load that finds a group id of both types keeps the one written last
    classic_read_at: dict[str, int] = field(default_factory=dict)
    records: int = 0
    unknown_records: int = 0
    malformed_records: int = 0
    # stores with a log: the clients' transactions still open at the end of the read (their batches, per
    # partition, in log order), and where each partition's read ended (its tail of markers starts there)
    open_transactions: dict[int, list[TransactionEvent]] = field(default_factory=dict)
    read_to: dict[int, int] = field(default_factory=dict)

    def records_of(self, group_id: str) -> list[Record]:
        """The group's records as loading replays them: its metadata (if any), then its offsets."""
        record = self.groups.get(group_id)
        head: list[Record] = [] if record is None else [GroupMetadataRecord(group_id, record)]
        return head + offset_commits(group_id, self.offsets.get(group_id, {}))

    def group_ids(self) -> list[str]:
        """Groups with a record or offsets (offset-only groups load as Empty groups)."""
        return list(dict.fromkeys([*self.groups, *(g for g, o in self.offsets.items() if o)]))


class GroupStore(ABC):
    partitions: int | None = None  # the state topic's partition count, when the store has one
    topic: str | None = None  # the state topic's name, when the store has one

    @abstractmethod
    async def load(self, partitions: Collection[int]) -> LoadedGroups:
        """Read these partitions to their end; they are written to again from now on."""

    @abstractmethod
    async def unload(self, partitions: Collection[int]) -> None:
        """Stop writing to these partitions: appends to them fail with NOT_COORDINATOR."""

    @abstractmethod
    def append(self, partition: int, records: Sequence[Record]) -> Awaitable[None]:
        """Queue `records` (one group's) for `partition` before returning, after every record queued for it
        before; the awaitable completes once they are acknowledged, all or nothing, or raises StoreError."""

    def append_together(self, partition: int, writes: Sequence[Sequence[Record]]) -> Sequence[Awaitable[None]]:
        """Several writes (of any groups) queued for `partition` in order, as `append` would one after another, one
        awaitable per write. A store may append them as one (one transaction, one produce): writes that share an
        append share its outcome, all or nothing, and their awaitables may be the same object."""
        return [self.append(partition, records) for records in writes]

    def expect_append(self, partition: int) -> None:
        """A write to `partition` is expected soon (a group whose join completed writes its assignment once the
        leader sends it): a store may get ready for it now. Changes nothing a reader sees; a hint only."""

    def follow_transactions(self, partition: int, start: int,
                            deliver: Callable[[list[TransactionEvent], int], None]) -> None:
        """Read the partition's clients' transactional batches and markers from `start` on, handing them to
        `deliver(events, read_to)` on this loop, until the partition is unloaded. A store without a log (whose
        writes carry no client transaction) has none to read."""

    def follow_tombstones(self, partition: int, landed: Callable[[str, TopicPartition, int | None], None]) -> None:
        """Call `landed(group_id, tp, log_offset)` on this loop for each attempt of an offset tombstone of ours
        to the partition (retries of owed ones too) once answered, with its offset (None: that attempt failed, or
        an owed one was superseded), until it is unloaded. A store without a log has no offsets to tell."""

    def tombstone_in_flight(self, group_id: str, tp: TopicPartition) -> bool:
        """Whether an offset tombstone of ours of `tp` was sent and is not answered yet, or is owed."""
        return False

    def tombstones_answered(self, group_id: str, partitions: Collection[TopicPartition]
                            ) -> Awaitable[None] | None:
        """None if no offset tombstone of ours of these partitions was sent and is unanswered, else an awaitable
        that completes once none is."""
        return None

    def unwritten_tombstones_of(self, group_id: str) -> set[TopicPartition]:
        """The group's offsets whose latest tombstone of ours is not acknowledged yet (sent and unanswered, or
        owed a retry) and not superseded by a newer write: gone from memory, perhaps still in the log."""
        return set()

    def unwritten_group_tombstones_of(self, group_id: str) -> list[Record]:
        """The tombstones of the group's own records (a classic group's metadata, a consumer group's records: not
        its offsets) whose latest tombstone of ours is not acknowledged yet (sent and unanswered, or owed a retry)
        and not superseded by a newer write, as records to write again: gone from memory, perhaps still in the log."""
        return []

    def supersede_tombstones(self, partition: int, group_id: str, partitions: Collection[TopicPartition]
                             ) -> Callable[[], None]:
        """A client's transactional batch of these offsets is about to be appended to the partition: their owed
        tombstones are not sent again, as when a newer write of ours supersedes them. Returns what owes them
        again if the batch is not appended."""
        return nothing_to_restore


class InMemoryGroupStore(GroupStore):
    """Keeps the latest records in dicts, with failure injection for tests.

    `fail_next_write(error)` makes the next append raise StoreError(error); `hold_next_write()` makes the next
    one wait until the returned event is set (a slow append). `writes` lists every append's records in order.
    """

    def __init__(self) -> None:
        self.groups: dict[str, GroupRecord] = {}
        self.offsets: dict[str, dict[TopicPartition, OffsetRecord]] = {}
        self.writes: list[list[Record]] = []
        self.consumer_records: list[ConsumerGroupRecord] = []  # every one acknowledged, in order (not compacted)
        self._failures: list[Errors] = []
        self._holds: list[asyncio.Event] = []
        self.partition_of: dict[str, int] = {}  # where the runtime put each group
        self.unloaded: set[int] = set()
        self.classic_read_at: dict[str, int] = {}  # as a log read would place each classic record (LoadedGroups)

    async def load(self, partitions: Collection[int]) -> LoadedGroups:
        wanted = set(partitions)
        self.unloaded -= wanted
        mine = [g for g in dict.fromkeys([*self.groups, *self.offsets]) if self.partition_of.get(g, 0) in wanted]
        consumer_records = [r for r in self.consumer_records if self.partition_of.get(r.group_id, 0) in wanted]
        read_at = {g: sum(1 for r in self.consumer_records[:at] if self.partition_of.get(r.group_id, 0) in wanted)
                   for g, at in self.classic_read_at.items() if g in mine and g in self.groups}
        return LoadedGroups({g: copy.deepcopy(self.groups[g]) for g in mine if g in self.groups},
                            {g: copy.deepcopy(self.offsets[g]) for g in mine if g in self.offsets},
                            consumer_records, classic_read_at=read_at)

    async def unload(self, partitions: Collection[int]) -> None:
        self.unloaded.update(partitions)

    def append(self, partition: int, records: Sequence[Record]) -> Awaitable[None]:
        return asyncio.ensure_future(self._append(partition, list(records)))

    def append_together(self, partition: int, writes: Sequence[Sequence[Record]]) -> Sequence[Awaitable[None]]:
        """One append of every write's records (one entry in `writes`, one acknowledgement or failure)."""
        together = self.append(partition, [record for records in writes for record in records])
        return [together] * len(writes)

    async def _append(self, partition: int, records: list[Record]) -> None:
        if partition in self.unloaded:
            raise StoreError(Errors.NOT_COORDINATOR, f"partition {partition} is not ours")
        for record in records:
            self.partition_of[record.group_id] = partition
        self.writes.append(records)
        await self.acknowledge(records)
        self.apply(records)

    def fail_next_write(self, error: Errors) -> None:
        self._failures.append(error)

    def hold_next_write(self) -> asyncio.Event:
        gate = asyncio.Event()
        self._holds.append(gate)
        return gate

    async def acknowledge(self, records: list[Record]) -> None:
        """Waits for a held write, raises an injected failure (subclasses slow or fail appends here)."""
        if self._holds:
            await self._holds.pop(0).wait()
        if self._failures:
            raise StoreError(self._failures.pop(0))

    def apply(self, records: list[Record]) -> None:
        for record in records:
            if isinstance(record, CONSUMER_GROUP_RECORD_CLASSES):
                self.consumer_records.append(record)
            elif isinstance(record, GroupMetadataRecord):
                if record.value is None:
                    self.groups.pop(record.group_id, None)
                    self.classic_read_at.pop(record.group_id, None)
                else:
                    self.groups[record.group_id] = copy.deepcopy(record.value)
                    self.classic_read_at[record.group_id] = len(self.consumer_records)
            elif record.value is None:
                stored = self.offsets.get(record.group_id, {})
                stored.pop((record.topic, record.partition), None)
                if not stored:
                    self.offsets.pop(record.group_id, None)
            else:
                self.offsets.setdefault(record.group_id, {})[(record.topic, record.partition)] = copy.deepcopy(
                    record.value)
