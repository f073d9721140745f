"""The storage interface of the group coordinator, and an in-memory implementation for unit tests.

Records are Kafka's `__consumer_offsets` values, field for field: `GroupRecord`/`MemberRecord` are
GroupMetadataValue (written as v3), `OffsetRecord` is OffsetCommitValue (v3, or v1 when it carries an expire
timestamp; None = no expire timestamp). The state-topic codec (coordinator/storage/records.py) encodes and
decodes these very types. The Kafka-backed store (coordinator/storage) implements `GroupStore`.

Contract for implementations:
- `load(partitions)` reads those state-topic partitions to their end and returns the latest group record and
  offsets of every group in them; `unload(partitions)` stops writing to them (appends fail NOT_COORDINATOR
  until they are loaded again: the seam for fencing when several instances share the topic).
- `append(partition, write)` queues one group's records for that partition before it returns (a partition's
  writes are stored in the order they were queued: one ordered path per partition, tombstones and their
  retries included); the awaitable it returns completes once they are acknowledged (acks=all) and raises `StoreError(<raw Kafka append error>)` on failure, including
  `REQUEST_TIMED_OUT` after `offsets.commit.timeout.ms`. The runtime hands the raw error to the write's owner,
  which maps it to the API's error code (errors.py). The partition is the runtime's to choose (partitioner.py).
- Tombstones (deleted groups, expired offsets) are appended the same way and awaited; one that fails is kept
  owed by the store and sent again until written (unless a newer write of its key supersedes it).
- `store_group` / `store_offsets` / `delete_group` / `delete_offsets` are the same appends addressed by group id
  alone (the store places them with Kafka's partitioner), for tools and tests that hold no runtime.
"""
from __future__ import annotations

import asyncio
import copy
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protocol.error_codes import Errors

if TYPE_CHECKING:
    from coordinator.group.result import Write

log = logging.getLogger("coordinator.group.store")

TopicPartition = tuple[str, int]


class StoreError(Exception):
    """A failed append, carrying Kafka's error code."""

    def __init__(self, error: Errors, message: str = "") -> None:
        super().__init__(f"{error.name}: {message}" if message else error.name)
        self.error = error


@dataclass(slots=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes  # metadata of the selected protocol
    assignment: bytes


@dataclass(slots=True)
class GroupRecord:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int = -1  # -1 = unknown (v0-1 records)
    members: list[MemberRecord] = field(default_factory=list)


@dataclass(slots=True)
class OffsetRecord:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1
    expire_timestamp_ms: int | None = None


@dataclass(slots=True)
class LoadedGroups:
    """The latest group record and offsets of every group of the partitions loaded."""

    groups: dict[str, GroupRecord] = field(default_factory=dict)
    offsets: dict[str, dict[TopicPartition, OffsetRecord]] = field(default_factory=dict)

    def group_ids(self) -> list[str]:
        """Groups with a record or offsets (offset-only groups load as Empty groups)."""
        return list(dict.fromkeys([*self.groups, *(g for g, o in self.offsets.items() if o)]))


class GroupStore(ABC):
    partitions: int | None = None  # the state topic's partition count, when the store has one

    @abstractmethod
    async def load(self, partitions: Collection[int]) -> LoadedGroups:
        """Read these partitions to their end; they are written to again from now on."""

    @abstractmethod
    async def unload(self, partitions: Collection[int]) -> None:
        """Stop writing to these partitions: appends to them fail with NOT_COORDINATOR."""

    @abstractmethod
    def append(self, partition: int, write: Write) -> Awaitable[None]:
        """Queue `write` (one group's records) for `partition` before returning, after every write queued for it
        before (the order Kafka stores them in); the awaitable completes once they are acknowledged, all or
        nothing, or raises StoreError."""

    async def _store(self, write: Write) -> None:
        """One write addressed by kind (the in-memory store's dispatch)."""
        from coordinator.group.result import GROUP, OFFSETS

        if write.kind == GROUP:
            assert write.record is not None
            await self.store_group(write.group_id, write.record)
        elif write.kind == OFFSETS:
            await self.store_offsets(write.group_id, write.offsets)
        else:
            await self.delete_group(write.group_id, write.removed, write.group_tombstone)

    @abstractmethod
    async def store_group(self, group_id: str, record: GroupRecord) -> None:
        """Write the group's metadata record; raises StoreError."""

    @abstractmethod
    async def store_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetRecord]) -> None:
        """Write one offset record per partition in a single batch; raises StoreError."""

    @abstractmethod
    async def delete_group(
        self, group_id: str, offsets_to_tombstone: list[TopicPartition], write_group_tombstone: bool
    ) -> None:
        """Tombstone the offsets and, if asked, the group record; returns after the first attempt and never
        raises (a failed tombstone stays owed)."""

    @abstractmethod
    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> None:
        """Tombstone offsets; returns after the first attempt and never raises (a failed one stays owed)."""


class InMemoryGroupStore(GroupStore):
    """Keeps the latest records in dicts, with failure injection for tests.

    `fail_next_write(error)` makes the next store_group/store_offsets raise StoreError(error);
    `hold_next_write()` makes the next one wait until the returned event is set (a slow append).
    """

    def __init__(self) -> None:
        self.groups: dict[str, GroupRecord] = {}
        self.offsets: dict[str, dict[TopicPartition, OffsetRecord]] = {}
        self.writes: list[tuple[str, str]] = []  # (kind, group_id) in order, for assertions
        self._failures: list[Errors] = []
        self._holds: list[asyncio.Event] = []
        self.partition_of: dict[str, int] = {}  # where the runtime put each group
        self.unloaded: set[int] = set()

    async def load(self, partitions: Collection[int]) -> LoadedGroups:
        wanted = set(partitions)
        self.unloaded -= wanted
        mine = [g for g in dict.fromkeys([*self.groups, *self.offsets]) if self.partition_of.get(g, 0) in wanted]
        return LoadedGroups({g: copy.deepcopy(self.groups[g]) for g in mine if g in self.groups},
                            {g: copy.deepcopy(self.offsets[g]) for g in mine if g in self.offsets})

    async def unload(self, partitions: Collection[int]) -> None:
        self.unloaded.update(partitions)

    def append(self, partition: int, write: Write) -> Awaitable[None]:
        return asyncio.ensure_future(self._append(partition, write))

    async def _append(self, partition: int, write: Write) -> None:
        if partition in self.unloaded:
            raise StoreError(Errors.NOT_COORDINATOR, f"partition {partition} is not ours")
        self.partition_of[write.group_id] = partition
        await self._store(write)

    def fail_next_write(self, error: Errors) -> None:
        self._failures.append(error)

    def hold_next_write(self) -> asyncio.Event:
        gate = asyncio.Event()
        self._holds.append(gate)
        return gate

    async def _acknowledge(self) -> None:
        if self._holds:
            await self._holds.pop(0).wait()
        if self._failures:
            raise StoreError(self._failures.pop(0))

    async def store_group(self, group_id: str, record: GroupRecord) -> None:
        self.writes.append(("group", group_id))
        await self._acknowledge()
        self.groups[group_id] = copy.deepcopy(record)

    async def store_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetRecord]) -> None:
        self.writes.append(("offsets", group_id))
        await self._acknowledge()
        self.offsets.setdefault(group_id, {}).update(copy.deepcopy(offsets))

    async def delete_group(
        self, group_id: str, offsets_to_tombstone: list[TopicPartition], write_group_tombstone: bool
    ) -> None:
        self.writes.append(("delete_group", group_id))
        await self.delete_offsets(group_id, offsets_to_tombstone)
        if write_group_tombstone:
            self.groups.pop(group_id, None)

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> None:
        self.writes.append(("delete_offsets", group_id))
        stored = self.offsets.get(group_id, {})
        for tp in partitions:
            stored.pop(tp, None)
        if not stored:
            self.offsets.pop(group_id, None)
