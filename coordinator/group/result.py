"""What a request handler hands back to the runtime: the records to append and the response.

Kafka 4's coordinator calls this `CoordinatorResult(records, response)`. A handler mutates its shard
synchronously and returns a `Result`; the runtime appends `writes` to the shard's partition, runs each write's
`then(error)` on the loop once Kafka has acknowledged it (or it failed), and only then sends the response, so no
client hears of a state that is not in Kafka. `then` is bookkeeping that must happen whatever becomes of the
request (it may have been cancelled meanwhile); a response that depends on the outcome (OffsetCommit) is built
by `respond(errors)`; a parked JoinGroup/SyncGroup is an asyncio.Future that group logic answers later.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

from coordinator.group.records import (GroupMetadataRecord, GroupRecord, OffsetRecord, Record, TopicPartition,
                                      offset_commits, tombstones)
from protocol.error_codes import Errors

R = TypeVar("R")


@dataclass(slots=True, eq=False)
class Write:
    """Records of one group, for its shard's partition, appended all or nothing. `then(error)` runs on the
    loop once the append is acknowledged (Errors.NONE) or failed (the raw Kafka append error); then `done`
    resolves to that error."""

    group_id: str
    records: list[Record]
    then: Callable[[Errors], object] | None = None
    done: asyncio.Future[Errors] | None = None  # set by the runtime when it queues the append
    # set by the runtime once the records went to the store: until then (a write waiting for the end of its loop
    # turn, GroupRuntime.append_in_turn) its owner may still add records of the same group to it
    sealed: bool = False
    # a classic group's record (`Write.group`): the runtime tells the consumer groups as it appends it
    # (ConsumerGroupService.classic_record_written)
    classic_group_record: bool = False

    def then_also(self, after: Callable[[Errors], object]) -> None:
        """`after(error)` runs once the write's own `then` has, even if that raised (an answer owed to a client
        must go out whatever the bookkeeping did)."""
        then = self.then

        def both(error: Errors) -> None:
            try:
                if then is not None:
                    then(error)
            finally:
                after(error)

        self.then = both

    @classmethod
    def group(cls, group_id: str, record: GroupRecord, then: Callable[[Errors], object] | None = None) -> Write:
        return cls(group_id, [GroupMetadataRecord(group_id, record)], then, classic_group_record=True)

    @classmethod
    def offset_commit(cls, group_id: str, offsets: dict[TopicPartition, OffsetRecord],
                      then: Callable[[Errors], object] | None = None) -> Write:
        return cls(group_id, offset_commits(group_id, offsets), then)

    @classmethod
    def tombstones(cls, group_id: str, removed: list[TopicPartition], group_tombstone: bool,
                   then: Callable[[Errors], object] | None = None) -> Write:
        return cls(group_id, tombstones(group_id, removed, group_tombstone), then)


@dataclass(slots=True)
class Result(Generic[R]):
    """`response`: the answer, or a parked future; `writes`: appended first; `respond(errors)`, if given, builds
    the response from the writes' outcomes (one error per write, in order)."""

    response: R | asyncio.Future[R] | None = None
    writes: list[Write] = field(default_factory=list)
    respond: Callable[[list[Errors]], R] | None = None
