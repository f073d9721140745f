"""The storage interface of the group coordinator, and an in-memory implementation for unit tests.

Records mirror Kafka's `__consumer_offsets` values: `GroupRecord` is GroupMetadataValue v3, `OffsetRecord` is
OffsetCommitValue (v3, or v1 when it carries an expire timestamp). The Kafka-backed store (coordinator/storage)
implements `GroupStore`.

Contract for implementations:
- `store_group` / `store_offsets` return only once the write is acknowledged (acks=all) and raise
  `StoreError(<raw Kafka append error>)` on failure, including `REQUEST_TIMED_OUT` after
  `offsets.commit.timeout.ms`. The coordinator maps raw errors to the API's error code (errors.py).
- `delete_group` / `delete_offsets` are fire-and-forget (Kafka appends them with acks=0): failures are logged by
  the implementation and never raised.
"""
from __future__ import annotations

import asyncio
import copy
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from protocol.error_codes import Errors

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
    current_state_timestamp_ms: int  # -1 = unknown
    members: list[MemberRecord] = field(default_factory=list)


@dataclass(slots=True)
class OffsetRecord:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1
    expire_timestamp_ms: int | None = None


class GroupStore(ABC):
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
        """Tombstone the offsets and, if asked, the group record. Never raises."""

    @abstractmethod
    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> None:
        """Tombstone expired offsets. Never raises."""


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
